"""The command lines of studies: a preset file with ``--config.x=y`` overrides, the flags every
study shares, and the command of any study preset (``experiments/study.py``).

* `parse_command_line`: absl flags and a preset config file ``anp_jax/configs/<prefix>_<name>.py``
  (``--preset NAME``, a variant ``NAME:VARIANT``) with ``--config.x=y`` overrides through
  ``ml_collections.config_flags``; bad input is a `StudyError`, exit 2.
* `define_runner_flags`: ``--out``, ``--seeds``, the rate grid, ``--lr_extensions``, ``--ci``,
  ``--cpu_devices``, ``--stop_at_target``, ``--dry_run``, ``--no_report``, ``--seeds_at_once``
  (a point's seeds as one computation, `anp_jax.seed_group`), ``--confirm_seeds``
  (a fresh-seed confirmation of the chosen configurations, `runner.confirmation_study`).
* `main`: a study preset ``anp_jax/configs/study_<name>.py`` (get_config() with its
  ``target_metric`` / ``target_value``, get_sweep() its points, seeds and rate grid) run by
  `anp_jax.research.runner.run_study`; `run_command` is the same for studies with their own
  flags (the batch-size sweep, sync/async/mixed).
"""

import os
import runpy
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import ml_collections
from absl import app, flags, logging

from anp_jax import cli, distributed, preemption
from anp_jax.research import runner, stats
from anp_jax.research.study import Study, StudyError, from_preset

CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           'configs')
STUDY_PREFIX = 'study'  # Study presets: anp_jax/configs/study_<name>.py.


# ----------------------------------------------------------------------------------------------
# Command line: absl flags and a preset config file with --config.x=y overrides.


def preset_path(prefix: str, name: str) -> str:
  """The config file spec of preset `name`: ``anp_jax/configs/<prefix>_<name>.py``, with a
  variant ``NAME:VARIANT`` passed on as ``get_config(VARIANT)`` (``path.py:VARIANT``)."""
  base, _, variant = name.partition(':')
  path = os.path.join(CONFIGS_DIR, f'{prefix}_{base}.py')
  return f'{path}:{variant}' if variant else path


def preset_names(prefix: str) -> List[str]:
  return sorted(f[len(prefix) + 1:-3] for f in os.listdir(CONFIGS_DIR)
                if f.startswith(prefix + '_') and f.endswith('.py'))


def _check_preset(prefix: str, name: str):
  if name.partition(':')[0] not in preset_names(prefix):
    raise StudyError(f'Unknown preset {name!r}; choose one of {preset_names(prefix)}.')


def load_preset(prefix: str, name: str) -> Tuple[ml_collections.ConfigDict, Dict]:
  """(get_config(), get_sweep()) of a preset file (a variant ``NAME:VARIANT`` goes to both)."""
  _check_preset(prefix, name)
  path, _, variant = preset_path(prefix, name).partition(':')
  module = runpy.run_path(path)
  args = (variant,) if variant else ()
  return module['get_config'](*args), dict(module['get_sweep'](*args))


def override_args(overrides: Sequence[Tuple[str, object]]) -> List[str]:
  """`overrides` as ``--config.x=value`` arguments that give the same config again (the record
  of an invocation; a boolean as ``=True``/``=False`` and a tuple as ``=(1, 2)``, which absl and
  ml_collections accept)."""
  return [f'--config.{k}={v}' for k, v in overrides]


def _value_error(error: flags.Error, config_file: str) -> str:
  """A bad ``--config.x=value`` as "expected <type> (like the current value ...)"."""
  text = ' '.join(str(error).split())
  if text.startswith('flag --config.') and '=' in text:
    key, rest = text[len('flag --config.'):].split('=', 1)
    raw, _, why = rest.partition(': ')
    node = cli.load_config_file(config_file)
    for part in key.split('.'):
      node = node[part]
    return (f'--config.{key}={raw!r}: expected {type(node).__name__} (like the current value '
            f'{node!r}); {why}.')
  return cli.explain_flag_error(error, [], 'config', config_file)


def parse_command_line(argv: Sequence[str], prefix: str, define_flags: Callable, doc: str,
                       default_preset: str = 'cpu'):
  """(flag values, config, overrides) of a study's `argv` (program name excluded).

  ``--preset NAME`` picks ``anp_jax/configs/<prefix>_NAME.py`` (``NAME:VARIANT`` a variant of
  it); ``--config.x=y`` overrides its get_config() through ``ml_collections.config_flags``
  (typed, unknown fields refused with a suggestion). `define_flags(flag_values)` adds the
  study's own flags. A fresh `absl.flags.FlagValues` per call: parsing twice in one process
  (tests) starts from scratch. The overrides are read from the parsed config flag
  (``override_values``), not from argv: every absl form counts once with the value absl gave it
  (``--config.x=y``, ``--config.x y``, a bare boolean, ``--noconfig.x``, one dash, a
  ``--flagfile``), and a repeated field has its last value. Returns None after printing the
  help for ``--help``. Raises StudyError on bad input.
  """
  argv = list(argv)
  name = cli._config_spec(argv, 'preset', default_preset)  # The value of --preset.
  config_file = preset_path(prefix, name)
  fv = flags.FlagValues()
  flags.DEFINE_string('preset', default_preset, f'Preset: anp_jax/configs/{prefix}_<NAME>.py '
                      f'({", ".join(preset_names(prefix))}); NAME:VARIANT for a variant.',
                      flag_values=fv)
  define_flags(fv)
  if '--help' in argv or '-h' in argv or '--helpfull' in argv:
    print(doc)
    print(fv.get_help())
    return None
  _check_preset(prefix, name)
  message = cli.check_config_argv(argv, 'config', config_file)  # Every absl form of a field.
  if message:
    raise StudyError(message)
  cli.define_config_flag('config', config_file, 'The preset config; override with '
                         '--config.x=y.', flag_values=fv, sys_argv=['prog'] + argv,
                         lock_config=True)
  try:
    rest = fv(['prog'] + argv)
  except flags.IllegalFlagValueError as e:
    raise StudyError(_value_error(e, config_file)) from None
  except flags.Error as e:
    raise StudyError(cli.explain_flag_error(e, argv, 'config', config_file)) from None
  if rest[1:]:
    raise StudyError(f'unrecognized argument(s) {rest[1:]} (config overrides are '
                     '--config.x.y=value).')
  return fv, fv.config, list(fv['config'].override_values.items())


def run_cli(main: Callable[[List[str]], int]):
  """`absl.app.run` for a study script: absl's start-up and error reporting, with the flags
  parsed by `main(argv after the program name)` itself (through `parse_command_line`, so that
  tests call the same `main` in-process)."""
  def keep_argv(argv):
    flags.FLAGS.mark_as_parsed()  # absl's own flags keep their defaults...
    logging.set_verbosity(logging.WARNING)  # ...but orbax/TFDS INFO lines would drown the log.
    return argv
  app.run(lambda argv: sys.exit(main(argv[1:])), flags_parser=keep_argv)


def list_flag(fv, name: str, kind):
  """A comma-separated absl list flag as a list of `kind` (None when not given)."""
  items = fv[name].value
  if items is None:
    return None
  try:
    return [kind(t.strip()) for t in items if t.strip()]
  except ValueError:
    raise StudyError(f'--{name} must be a comma-separated list of {kind.__name__}s, got '
                     f'{",".join(items)!r}.') from None


def define_runner_flags(fv, lr_flag: str = 'lr_grid'):
  """The flags every study shares: --out, --seeds, the rate grid (--<lr_flag>,
  --lr_extensions), --ci, --cpu_devices, --stop_at_target, --dry_run, --no_report,
  --seeds_at_once, --confirm_seeds."""
  def define(kind, name, help_string):
    getattr(flags, f'DEFINE_{kind}')(name, False if kind == 'bool' else None, help_string,
                                      flag_values=fv)
  define('string', 'out', 'Study directory (runs/, results.*, points.*, report). Required.')
  define('list', 'seeds', 'Seeds of every point (config.seed; statistics are over seeds).')
  define('list', lr_flag, 'Multipliers of config.base_lr tried at every point; the chosen one '
         'is the fewest steps to the target on validation.')
  define('integer', 'lr_extensions', 'Most factor-2 steps beyond the edge of the rate grid per '
         'point whose chosen rate lies at that edge (0: none).')
  flags.DEFINE_enum('ci', 't', list(stats.CI_METHODS), 'Confidence intervals over seeds: '
                    "Student's t, or a percentile bootstrap.", flag_values=fv)
  define('integer', 'cpu_devices', 'Simulated CPU devices (XLA flag, set before JAX starts); '
         '0: none.')
  # No default: without the flag the preset config's own stop_at_target holds
  # (`runner.stops_at_target`).
  flags.DEFINE_bool('stop_at_target', None, 'Stop each run at the first evaluation where the '
                    'target is reached on validation and, when the runs evaluate the test split, '
                    'on test too (time-to-accuracy; the budget becomes a cap). Default: the '
                    "preset config's stop_at_target.", flag_values=fv)
  define('bool', 'dry_run', 'Validate, print the runs and the time estimate; train nothing.')
  define('bool', 'no_report', 'Write the results but not the report.')
  flags.DEFINE_enum('seeds_at_once', 'auto', ['auto', 'on', 'off'], 'Train the seeds of a '
                    'point as one computation (anp_jax/seed_group.py; each its own run '
                    'directory): on wherever it can, off, or auto: where a committed measurement '
                    'found it faster on this platform (experiments/results/seeds_at_once/).',
                    flag_values=fv)
  define('list', 'confirm_seeds', 'Fresh-seed confirmation of a finished study in --out: every '
         'point at its chosen rate with these seeds (none the selection used), into '
         f'--out/{runner.CONFIRMATION_DIR}/; the report shows them beside the selection.')


def simulate_cpu_devices(n: int):
  """Asks XLA for n host devices; effective only before JAX's backends start (else ignored)."""
  flags_now = os.environ.get('XLA_FLAGS', '')
  if n > 0 and 'xla_force_host_platform_device_count' not in flags_now:
    os.environ['XLA_FLAGS'] = f'{flags_now} --xla_force_host_platform_device_count={n}'.strip()


def out_path(out: Optional[str]) -> str:
  """The absolute ``--out`` directory; StudyError when missing or empty."""
  if out is None:
    raise StudyError('--out is required: the study directory (runs/, results.*, report).')
  if not out.strip():  # '' would be the current directory.
    raise StudyError('--out is empty: give the directory for the runs and results.')
  return os.path.abspath(os.path.expanduser(out))


# ----------------------------------------------------------------------------------------------
# The command line of a study preset (experiments/study.py).


def resolve(argv: Sequence[str], doc: str = __doc__):
  """(study, base config, options, simulated CPU devices) of a study preset's command line;
  None for ``--help``."""
  parsed = parse_command_line(argv, STUDY_PREFIX, define_runner_flags, doc,
                              default_preset='ghost_bn')
  if parsed is None:
    return None
  fv, config, overrides = parsed
  out = out_path(fv.out)
  _, sweep = load_preset(STUDY_PREFIX, fv.preset)
  base = ml_collections.ConfigDict(config.to_dict())  # Unlocked, ours.
  keys = [k for k, _ in overrides]
  if 'seed' in keys:
    raise StudyError('--config.seed is an axis of the study; use --seeds.')
  seeds = list_flag(fv, 'seeds', int)
  study = from_preset(fv.preset.partition(':')[0], sweep, base, seeds=seeds,
                      lr_grid=list_flag(fv, 'lr_grid', float), lr_extensions=fv.lr_extensions)
  if runner.stops_at_target(base, fv.stop_at_target) and base.eval_every_epochs <= 0:
    raise StudyError('--stop_at_target needs periodic evaluation (eval_every_epochs > 0).')
  confirm = list_flag(fv, 'confirm_seeds', int)
  if confirm:
    study = runner.confirmation_study(study, out, confirm)
    out = os.path.join(out, runner.CONFIRMATION_DIR)
  opts = runner.Options(out=out, preset=fv.preset, stop_at_target=fv.stop_at_target, ci=fv.ci,
                        dry_run=fv.dry_run, report=not fv.no_report,
                        seeds_at_once=fv.seeds_at_once, user_fields=frozenset(keys),
                        invocation={'argv': list(argv), 'overrides': override_args(overrides)})
  cpu_devices = study.cpu_devices if fv.cpu_devices is None else fv.cpu_devices
  return study, base, opts, cpu_devices


Resolved = Optional[Tuple[Study, Any, runner.Options, int]]


def run_command(resolve: Callable[[], Resolved]) -> int:
  """A study's command: `resolve()` gives (study, base config, options, simulated CPU devices)
  from the command line (None after ``--help``); then the runner. 2 on bad input (``ERROR:``
  on stderr), 75 when preempted."""
  preemption.install()  # From here on, SIGTERM/SIGUSR1 mean "checkpoint and exit 75".
  try:
    resolved = resolve()
    if resolved is None:
      return 0
    study, base, opts, cpu_devices = resolved
    simulate_cpu_devices(cpu_devices)
    distributed.initialize()  # Multi-process jobs (SLURM / ANP_* variables); no-op otherwise.
    runner.run_study(study, base, opts)
  except StudyError as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  return 0


def main(argv: Sequence[str], doc: str = __doc__) -> int:
  """Runs (or continues) the study preset of `argv`; 2 on bad input, 75 when preempted."""
  return run_command(lambda: resolve(argv, doc))
