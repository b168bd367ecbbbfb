"""Many training runs from one command: grid, runner, results (the experiment scripts' library).

Two layers:

* **Shared by every experiment that trains a grid of runs** (``experiments/batch_size_sweep.py``,
  ``experiments/sync_async_mixed.py``): `parse_command_line` (absl flags + a preset config file
  from ``anp_jax/configs/<prefix>_<preset>.py`` with ``--config.x=y`` overrides through
  ``ml_collections.config_flags``; bad input is a `SweepError`, exit 2), `check_existing` (a run
  directory trained with other settings is refused), `run_grid` (skip finished runs, resume
  interrupted ones from their checkpoints, record a NaN/Inf loss as a diverged outcome, stop
  between runs on a preemption signal), `target_crossing` and `select_best_lr` (Shallue et al.'s
  per-arm learning-rate choice), `estimate_seconds` and atomic result writes.
* **The batch-size sweep** (global batch sizes × scaling-rule/warmup arms × seeds × learning-rate
  multipliers): `resolve`, `plan_runs`, `summarize_run`, `collect_results`, `write_results`,
  `sweep` / `main`; `check_sweep_directory` refuses to add runs to a directory whose other runs
  (of other batch sizes, seeds...) were trained with other settings, since the results and the
  report fit every run there together. The command line and what it writes are documented in
  ``experiments/batch_size_sweep.py``; the presets are ``anp_jax/configs/sweep_*.py``.

Results stay readable across versions: run names (``b00032-linear-warmup-lrx1-s0``),
``sweep_run.json``, ``results.csv`` / ``results.json`` columns and ``sweep.json`` are the formats
of the first sweeps, and a finished run (one with ``final_metrics.json``) is never retrained.
"""

import csv
import dataclasses
import io
import itertools
import json
import math
import os
import runpy
import sys
import time
import types
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jax
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from anp_jax import (checkpointing, cli, distributed, errors, metrics_io, noise_scale, optim,
                     preemption, reporting, trainer)
from anp_jax.configs import default as default_config
from anp_jax.data import pipeline
from anp_jax.setup import flat_fields, resolve_setup, validate_config

CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           'configs')


class SweepError(ValueError):
  """Bad sweep input, reported before any training (exit 2)."""


# ----------------------------------------------------------------------------------------------
# Command line: absl flags and a preset config file with --config.x=y overrides.


def preset_path(prefix: str, name: str) -> str:
  """The config file of preset `name`: ``anp_jax/configs/<prefix>_<name>.py``."""
  return os.path.join(CONFIGS_DIR, f'{prefix}_{name}.py')


def preset_names(prefix: str) -> List[str]:
  return sorted(f[len(prefix) + 1:-3] for f in os.listdir(CONFIGS_DIR)
                if f.startswith(prefix + '_') and f.endswith('.py'))


def load_preset(prefix: str, name: str) -> Tuple[ml_collections.ConfigDict, Dict]:
  """(get_config(), get_sweep()) of a preset file."""
  path = preset_path(prefix, name)
  if name not in preset_names(prefix):
    raise SweepError(f'Unknown preset {name!r}; choose one of {preset_names(prefix)}.')
  module = runpy.run_path(path)
  return module['get_config'](), dict(module['get_sweep']())


def _override_items(fv) -> List[Tuple[str, object]]:
  """(dotted key, parsed value) of every config field the command line set, in order.

  Read from the parsed config flag (``ml_collections``' `override_values`), not from argv: every
  absl form counts once with the value absl gave it (``--config.x=y``, ``--config.x y``, a bare
  boolean ``--config.x``, ``--noconfig.x``, one dash, a ``--flagfile``), and a repeated field
  has its last value.
  """
  return list(fv['config'].override_values.items())


def override_args(overrides: Sequence[Tuple[str, object]]) -> List[str]:
  """`overrides` as ``--config.x=value`` arguments that give the same config again (sweep.json's
  record of an invocation, in the format of the first sweeps; a boolean as ``=True``/``=False``
  and a tuple as ``=(1, 2)``, which absl and ml_collections accept)."""
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
  """(flag values, config, overrides) of an experiment's `argv` (program name excluded).

  ``--preset NAME`` picks ``anp_jax/configs/<prefix>_NAME.py``; ``--config.x=y`` overrides its
  get_config() through ``ml_collections.config_flags`` (typed, unknown fields refused with a
  suggestion). `define_flags(flag_values)` adds the script's own flags. A fresh
  `absl.flags.FlagValues` per call: parsing twice in one process (tests) starts from scratch.
  Returns None after printing the help for ``--help``. Raises SweepError on bad input.
  """
  argv = list(argv)
  name = cli._config_spec(argv, 'preset', default_preset)  # The value of --preset.
  config_file = preset_path(prefix, name)
  fv = flags.FlagValues()
  flags.DEFINE_string('preset', default_preset, f'Preset: anp_jax/configs/{prefix}_<NAME>.py '
                      f'({", ".join(preset_names(prefix))}).', flag_values=fv)
  define_flags(fv)
  if '--help' in argv or '-h' in argv or '--helpfull' in argv:
    print(doc)
    print(fv.get_help())
    return None
  if name not in preset_names(prefix):
    raise SweepError(f'Unknown preset {name!r}; choose one of {preset_names(prefix)}.')
  message = cli.check_config_argv(argv, 'config', config_file)  # Every absl form of a field.
  if message:
    raise SweepError(message)
  config_flags.DEFINE_config_file('config', config_file, 'The preset config; override with '
                                  '--config.x=y.', flag_values=fv, sys_argv=['prog'] + argv,
                                  lock_config=True)
  try:
    rest = fv(['prog'] + argv)
  except flags.IllegalFlagValueError as e:
    raise SweepError(_value_error(e, config_file)) from None
  except flags.Error as e:
    raise SweepError(cli.explain_flag_error(e, argv, 'config', config_file)) from None
  if rest[1:]:
    raise SweepError(f'unrecognized argument(s) {rest[1:]} (config overrides are '
                     '--config.x.y=value).')
  return fv, fv.config, _override_items(fv)


def run_cli(main: Callable[[List[str]], int]):
  """`absl.app.run` for an experiment script: absl's start-up and error reporting, with the
  flags parsed by `main(argv after the program name)` itself (through `parse_command_line`, so
  that tests call the same `main` in-process)."""
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
    raise SweepError(f'--{name} must be a comma-separated list of {kind.__name__}s, got '
                     f'{",".join(items)!r}.') from None


def simulate_cpu_devices(n: int):
  """Asks XLA for n host devices; effective only before JAX's backends start (else ignored)."""
  flags_now = os.environ.get('XLA_FLAGS', '')
  if n > 0 and 'xla_force_host_platform_device_count' not in flags_now:
    os.environ['XLA_FLAGS'] = f'{flags_now} --xla_force_host_platform_device_count={n}'.strip()


# ----------------------------------------------------------------------------------------------
# Run directories: identity, atomic writes, the runner.


# Fields that do not change what a run computes; they may differ between invocations.
NEUTRAL_FIELDS = ('progress_bar', 'data_dir', 'checkpoint_every_steps',
                  'checkpoint_every_minutes', 'async_checkpointing', 'keep_checkpoints',
                  'log_every_steps', 'keep_best_metric', 'eval_only')


def config_diff(old: Dict, config) -> Dict[str, Tuple]:
  """(value there, value now) of every field but the `NEUTRAL_FIELDS` where a run's recorded
  ``config.json`` (`old`, as loaded) and `config` differ. A field added to the config after that
  run was trained counts as its default value there."""
  old = flat_fields(old)
  new = flat_fields(json.loads(config.to_json_best_effort()))
  defaults = flat_fields(json.loads(default_config.get_config().to_json_best_effort()))
  old.update({k: defaults[k] for k in new if k not in old and k in defaults})
  return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
          if k not in NEUTRAL_FIELDS and old.get(k) != new.get(k)}


def default_cadences(config, setup, user_fields, *, checkpoint_epochs: float,
                     log_epochs: float, log_cap: int) -> None:
  """Sets a grid run's checkpoint and training-log cadences unless the user's --config gave them
  (`user_fields`): a checkpoint every `checkpoint_epochs` (0: none), a training-log record every
  `log_epochs` (at least every step, at most every `log_cap` steps)."""
  if 'checkpoint_every_steps' not in user_fields:
    config.checkpoint_every_steps = (setup.steps(checkpoint_epochs, minimum=1)
                                     if checkpoint_epochs > 0 else 0)
  if 'log_every_steps' not in user_fields:
    config.log_every_steps = max(1, min(log_cap, setup.steps(log_epochs, rounding='floor')))


def check_existing(run_dir: str, config):
  """A run directory already trained with other settings is an error, not silently reused.

  Stricter than the checkpoint's identity (`checkpointing.identity`, the fields a checkpoint
  must share to be *restorable*: model, data, batch): a grid point is one computation, so every
  field but the `NEUTRAL_FIELDS` (logging, paths, checkpoint cadence) must match the run's
  ``config.json`` — another schedule, lr or epoch budget is another grid point. A field added
  to the config after that run was trained counts as its default value there.
  """
  path = os.path.join(run_dir, 'config.json')
  if not os.path.exists(path):
    return
  with open(path) as f:
    diff = config_diff(json.load(f), config)
  if diff:
    detail = ', '.join(f'{k}: {a!r} there vs {b!r} now' for k, (a, b) in diff.items())
    raise SweepError(f'{run_dir} was trained with other settings ({detail}). Use another --out, '
                     'or the settings of that sweep.')


def write_text_atomic(path: str, text: str):
  """`text` to `path` through a temporary file and os.replace (readers never see half)."""
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)


def is_finished(run_dir: str) -> bool:
  """A run with ``final_metrics.json`` (trained to the end, or diverged) is never retrained."""
  return os.path.exists(os.path.join(run_dir, 'final_metrics.json'))


@dataclasses.dataclass
class GridRun:
  """One training run of a grid: its directory name, config, sizes, and a record to keep."""
  name: str
  config: ml_collections.ConfigDict
  setup: object  # anp_jax.setup.Setup
  info: Optional[Dict] = None  # Written to run_dir/sweep_run.json before training.


def run_grid(runs: Sequence[GridRun], out: str, is_main: bool):
  """Trains every run of `runs` in ``out/runs/<name>`` that has not finished.

  Finished runs are skipped; an interrupted one continues from its checkpoints. A NaN/Inf loss
  is recorded as the run's outcome (``final_metrics.json`` with ``diverged``) and not retried.
  Preemption (`errors.Preempted`, or a signal between runs) propagates: exit 75.
  """
  count = len(runs)
  for i, run in enumerate(runs, 1):
    tag = f'[{i}/{count}] {run.name}'
    run_dir = os.path.join(out, 'runs', run.name)
    if is_finished(run_dir):
      if is_main:
        print(f'{tag}: finished earlier, skipped.', flush=True)
      continue
    # A signal that came after the previous run's last step check (its final evaluation, its
    # plots, this loop) is still pending: stop before starting another run.
    preemption.exit_if_requested(tag)
    if is_main:
      os.makedirs(run_dir, exist_ok=True)
      if run.info is not None:
        reporting.write_json_atomic(os.path.join(run_dir, 'sweep_run.json'), run.info)
    if is_main:
      resuming = checkpointing.has_checkpoint(run_dir)
      print(f'{tag}: {"resuming" if resuming else "training"} — {run.setup.describe()}',
            flush=True)
    try:
      result = trainer.train_and_evaluate(run.config, run_dir)
    except errors.NonFiniteLossError as e:
      if is_main:
        step = max((r['step'] for r in metrics_io.read_metrics(run_dir)), default=0)
        reporting.write_json_atomic(os.path.join(run_dir, 'final_metrics.json'),
                                    {'diverged': True, 'step': step, 'error': str(e)})
        print(f'{tag}: diverged ({e})', flush=True)
      continue
    except errors.Preempted:
      if is_main:
        print(f'{tag}: preempted; rerun the same command to continue.', flush=True)
      raise
    if is_main:
      print(f'{tag}: done in {result.wall_time_s:.0f} s, ANP top-1 '
            f'{100 * result.final_eval["eval/anp_top1"]:.2f} %', flush=True)


def estimate_seconds(runs, eval_size: int, images_per_s: float, overhead_s: float) -> float:
  """Rough wall time: training images + evaluations (at 1/3 the cost) + per-run overhead."""
  total = 0.0
  for r in runs:
    s = r.setup
    evals = -(-s.total_steps // s.eval_every_steps)
    total += (s.total_steps * s.batch_size + evals * eval_size / 3) / images_per_s + overhead_s
  return total


# ----------------------------------------------------------------------------------------------
# Reading results: the target crossing and the learning-rate choice.


# Shared with the planner's pilot (`anp_jax.research.planner.load_pilot`), so one run has the same
# steps to target whether it is read as a sweep row or as a pilot; it lives in the JAX-free log
# reader, which both import.
target_crossing = metrics_io.target_crossing


def select_best_lr(rows: List[Dict], key: Callable[[Dict], object] = None) -> List[Dict]:
  """Marks (``best_lr``), per group of `key` (default: batch, rule, warmup), the lr multiplier
  with the fewest mean steps to target.

  The criterion (Shallue et al. 2018: each arm at its own best learning rate): a multiplier
  competes on steps only if all its seeds finished and reached the target; if none does, the
  best mean final top-1 wins. A diverged or unfinished run is never chosen. Within one group
  every run has the same examples per step, so fewest steps is fewest examples.

  Ties are common: a crossing at the first evaluation is not interpolated (`target_crossing`),
  so every multiplier that is already above the target there has the same steps. They go to the
  higher mean final top-1, then to the smaller multiplier (the more stable rate), never to the
  order of the rows (run names sort as strings: 'lrx10' < 'lrx2').
  """
  key = key or (lambda r: (r['batch'], r['rule'], r['warmup']))
  groups = {}
  for r in rows:
    groups.setdefault(key(r), []).append(r)
  for members in groups.values():
    by_mult = {}
    for r in members:
      by_mult.setdefault(r['lr_mult'], []).append(r)

    def score(mult):
      runs = by_mult[mult]
      if not all(r['status'] == 'finished' for r in runs):
        return (2, 0.0, 0.0, mult)
      top1 = [r['final_top1'] for r in runs]
      # A finished run without a final accuracy (no evaluation) loses every accuracy tie.
      top1 = sum(top1) / len(top1) if None not in top1 else -math.inf
      if all(r['steps_to_target'] is not None for r in runs):
        return (0, sum(r['steps_to_target'] for r in runs) / len(runs), -top1, mult)
      return (1, 0.0, -top1, mult)

    best = min(by_mult, key=score)
    if score(best)[0] == 2:
      best = None  # Nothing finished: no choice to make yet.
    for r in members:
      r['best_lr'] = r['lr_mult'] == best if best is not None else len(by_mult) == 1
  return rows


# ----------------------------------------------------------------------------------------------
# The batch-size sweep: presets, grid and plans.


WARMUP_VALUES = {'on': True, 'off': False}
SWEPT_FIELDS = {'batch_size': '--batch_sizes', 'lr_scaling': '--rules', 'seed': '--seeds'}
PREFIX = 'sweep'  # Presets: anp_jax/configs/sweep_<name>.py.

CSV_COLUMNS = (
    'name', 'batch', 'rule', 'warmup', 'seed', 'lr_mult', 'base_lr', 'lr', 'warmup_epochs',
    'epochs', 'devices', 'per_device_batch', 'accum_steps', 'steps_per_epoch', 'total_steps',
    'status', 'final_step', 'final_top1', 'final_top5', 'final_adjective_top1', 'final_noun_top1',
    'best_top1', 'target_top1', 'steps_to_target', 'examples_to_target', 'epochs_to_target',
    'eval_step_reaching_target', 'wall_time_s', 'b_simple', 'best_lr', 'error')


@dataclasses.dataclass(frozen=True)
class SweepPreset:
  """A preset file's get_sweep(): the grid and the budget (the run config is its get_config())."""
  batch_sizes: Tuple[int, ...]
  arms: Tuple[Tuple[str, bool], ...]  # (scaling rule, warmup on?)
  target_top1: float
  max_per_device_batch: int
  checkpoint_every_epochs: float
  cpu_devices: int  # Simulated CPU devices to ask XLA for (0: leave the platform alone).
  images_per_s: float  # Training throughput assumed by the --dry_run estimate (whole job).
  overhead_s: float  # Compilation and set-up per run, for the estimate.
  seeds: Tuple[int, ...] = (0,)
  lr_search: Tuple[float, ...] = (1.0,)
  images_per_s_per_device: float = 0.0  # When images_per_s is 0: this x the job's devices.

  def throughput(self, devices: int) -> float:
    return self.images_per_s or self.images_per_s_per_device * devices


def preset_config(name: str) -> ml_collections.ConfigDict:
  """The run config of a batch-size sweep preset (before the sweep's per-run fields)."""
  return load_preset(PREFIX, name)[0]


def sweep_preset(name: str) -> SweepPreset:
  return SweepPreset(**load_preset(PREFIX, name)[1])


@dataclasses.dataclass(frozen=True)
class RunSpec:
  batch: int
  rule: str
  warmup: bool
  seed: int
  lr_mult: float = 1.0

  @property
  def name(self) -> str:
    """Sorts by batch; stable across invocations, so finished runs are found again."""
    return (f'b{self.batch:05d}-{self.rule}-{"warmup" if self.warmup else "nowarmup"}-'
            f'lrx{self.lr_mult:g}-s{self.seed}')


@dataclasses.dataclass
class Plan:
  """A grid point made concrete: its config and the sizes the trainer will derive."""
  spec: RunSpec
  config: ml_collections.ConfigDict
  setup: object  # anp_jax.setup.Setup


@dataclasses.dataclass
class Sweep:
  """Resolved sweep settings (flags over preset defaults)."""
  preset: str
  out: str
  base: ml_collections.ConfigDict
  grid: List[RunSpec]
  target_top1: float
  max_per_device_batch: int
  checkpoint_every_epochs: float
  user_fields: frozenset  # Config fields the user set with --config (not recomputed per run).


def define_sweep_flags(fv):
  """The batch-size sweep's flags (besides --preset and --config)."""
  def define(kind, name, help_string):
    getattr(flags, f'DEFINE_{kind}')(name, False if kind == 'bool' else None, help_string,
                                      flag_values=fv)
  define('string', 'out', 'Sweep directory (runs/, results.*, report). Required.')
  define('list', 'batch_sizes', 'Global batch sizes.')
  define('list', 'rules', 'Learning-rate scaling rules: linear, sqrt, none.')
  define('list', 'warmup', 'Warmup arms: on, off.')
  define('list', 'seeds', 'Seeds.')
  define('float', 'epochs', 'Training epochs of every run (= --config.num_epochs).')
  define('float', 'target_top1', 'ANP top-1 fraction for steps-to-target.')
  define('list', 'lr_search', 'Multipliers of base_lr tried per batch size (best one reported).')
  define('integer', 'max_per_device_batch',
         'Largest per-device micro-batch; above it, gradient accumulation.')
  define('float', 'checkpoint_every_epochs', 'Checkpoint cadence of every run.')
  define('integer', 'cpu_devices',
         'Simulated CPU devices (XLA flag, set before JAX starts); 0: none.')
  define('bool', 'stop_at_target', 'Stop each run at the first evaluation reaching '
         '--target_top1 (time-to-accuracy; the epoch budget becomes a cap).')
  define('bool', 'dry_run', 'Validate, print the grid and the time estimate; train nothing.')
  define('bool', 'no_report', 'Skip experiments/report.py.')


def parse_args(argv: Sequence[str], doc: str = __doc__):
  """(args, base config, overrides): the flags as a namespace with the historical names (recorded
  in sweep.json), the preset config with the overrides applied, and the (key, value) overrides."""
  parsed = parse_command_line(argv, PREFIX, define_sweep_flags, doc)
  if parsed is None:
    return None
  fv, config, overrides = parsed
  if fv['out'].value is None:
    raise SweepError('--out is required: the sweep directory (runs/, results.*, report).')
  args = types.SimpleNamespace(
      preset=fv.preset, out=fv.out,
      batch_sizes=list_flag(fv, 'batch_sizes', int), rules=list_flag(fv, 'rules', str),
      warmup=list_flag(fv, 'warmup', str), seeds=list_flag(fv, 'seeds', int),
      epochs=fv.epochs, target_top1=fv.target_top1,
      lr_search=list_flag(fv, 'lr_search', float),
      max_per_device_batch=fv.max_per_device_batch,
      checkpoint_every_epochs=fv.checkpoint_every_epochs, cpu_devices=fv.cpu_devices,
      stop_at_target=fv.stop_at_target, dry_run=fv.dry_run, no_report=fv.no_report)
  return args, config, overrides


def _unique(items):
  return list(dict.fromkeys(items))


def resolve(args, base, overrides) -> Sweep:
  """Flags + preset → grid and base config; SweepError on bad input (touches no device)."""
  preset = sweep_preset(args.preset)
  base = ml_collections.ConfigDict(base.to_dict())  # Unlocked, ours.
  max_pd = preset.max_per_device_batch if args.max_per_device_batch is None else (
      args.max_per_device_batch)
  if max_pd < 0:
    raise SweepError(f'--max_per_device_batch must be >= 0 (0 disables accumulation), got '
                     f'{max_pd}.')
  for key, _ in overrides:
    if key in SWEPT_FIELDS:
      raise SweepError(f'--config.{key} is what the sweep varies; use {SWEPT_FIELDS[key]}.')
    if key == 'grad_accum_steps' and max_pd > 0:
      raise SweepError('--config.grad_accum_steps is chosen per batch size by the sweep; pass '
                       '--max_per_device_batch 0 to set it yourself.')
  if args.epochs is not None:
    base.num_epochs = float(args.epochs)
  if base.num_train_steps <= 0 and not base.num_epochs > 0:
    raise SweepError(f'--epochs must be > 0, got {base.num_epochs}.')

  target = preset.target_top1 if args.target_top1 is None else args.target_top1
  if not (isinstance(target, (int, float)) and 0.0 < target <= 1.0):
    raise SweepError(f'--target_top1={target} is an unreachable target: top-1 accuracy is a '
                     'fraction in (0, 1] (e.g. 0.3 for 30 %).')
  if getattr(args, 'stop_at_target', False):
    if base.eval_every_epochs <= 0:
      raise SweepError('--stop_at_target needs periodic evaluation (eval_every_epochs > 0).')
    base.stop_at_metric, base.stop_at_value = 'eval/anp_top1', float(target)

  batch_sizes = preset.batch_sizes if args.batch_sizes is None else args.batch_sizes
  seeds = preset.seeds if args.seeds is None else args.seeds
  lr_mults = preset.lr_search if args.lr_search is None else args.lr_search
  bad_batch = [b for b in batch_sizes if b <= 0]
  if bad_batch:
    raise SweepError(f'Batch sizes must be positive, got {bad_batch}.')
  bad_lr = [m for m in lr_mults if not m > 0]
  if bad_lr:
    raise SweepError(f'--lr_search multipliers must be > 0, got {bad_lr}.')
  if args.rules is None and args.warmup is None:
    arms = [tuple(a) for a in preset.arms]
  else:
    rules = args.rules if args.rules is not None else _unique(r for r, _ in preset.arms)
    warm = args.warmup if args.warmup is not None else _unique(
        'on' if w else 'off' for _, w in preset.arms)
    unknown = [r for r in rules if r not in optim.SCALING_RULES]
    if unknown:
      raise SweepError(f'--rules: unknown scaling rule(s) {unknown}; choose from '
                       f'{list(optim.SCALING_RULES)}.')
    unknown = [w for w in warm if w not in WARMUP_VALUES]
    if unknown:
      raise SweepError(f'--warmup: unknown value(s) {unknown}; use on and/or off.')
    arms = list(itertools.product(_unique(rules), [WARMUP_VALUES[w] for w in _unique(warm)]))
  if any(w for _, w in arms) and not base.warmup_epochs > 0:
    raise SweepError('Warmup "on" needs config.warmup_epochs > 0 (the warmup length); got '
                     f'{base.warmup_epochs}.')
  grid = [RunSpec(b, r, w, s, m) for b in sorted(set(batch_sizes)) for r, w in arms
          for s in _unique(seeds) for m in _unique(lr_mults)]
  if not grid:
    raise SweepError('The grid is empty: give at least one batch size, rule, warmup value, seed '
                     'and learning-rate multiplier.')
  ckpt = preset.checkpoint_every_epochs if args.checkpoint_every_epochs is None else (
      args.checkpoint_every_epochs)
  if ckpt < 0:
    raise SweepError(f'--checkpoint_every_epochs must be >= 0, got {ckpt}.')
  if not (args.out or '').strip():  # '' would be the current directory.
    raise SweepError('--out is empty: give the directory for the runs and results.')
  return Sweep(preset=args.preset, out=os.path.abspath(os.path.expanduser(args.out)), base=base,
               grid=grid, target_top1=float(target), max_per_device_batch=max_pd,
               checkpoint_every_epochs=ckpt, user_fields=frozenset(k for k, _ in overrides))


def choose_accum(per_device: int, max_micro: int, group: int) -> Optional[int]:
  """Fewest micro-batches k with per_device/k ≤ max_micro and a whole number of BN groups each."""
  for k in range(max(1, -(-per_device // max_micro)), per_device + 1):
    if per_device % k == 0 and (per_device // k) % group == 0:
      return k
  return None


def batch_problems(batch_sizes: Sequence[int], devices: int, max_micro: int, bn_mode: str,
                   bn_group: int, fixed_accum: int = 1) -> Dict[int, str]:
  """Batch size → why it cannot be split over `devices` x micro-batches x BN groups.

  Every bad batch size at once, before any run (`setup.resolve_setup` then checks each run's
  full setup, including the dataset, and stops at its first problem).
  """
  group = bn_group if bn_mode == 'ghost' else 1
  problems = {}
  for b in batch_sizes:
    if b % devices:
      problems[b] = f'not a multiple of the {devices} devices'
      continue
    per_device = b // devices
    if max_micro > 0:
      if choose_accum(per_device, max_micro, group) is None:
        problems[b] = (f'per-device batch {per_device} has no split into micro-batches of at '
                       f'most {max_micro} that are multiples of bn_group_size={group}')
    elif per_device % fixed_accum or (per_device // fixed_accum) % group:
      problems[b] = (f'per-device batch {per_device} does not split into {fixed_accum} '
                     f'micro-batch(es) that are multiples of bn_group_size={group}')
  return problems


def make_run_config(base, spec: RunSpec, accum_steps: int) -> ml_collections.ConfigDict:
  """The run's config: the base with the grid point's batch, rule, warmup, seed and lr."""
  c = ml_collections.ConfigDict(base.to_dict())
  c.batch_size = spec.batch
  c.lr_scaling = spec.rule
  c.warmup_epochs = float(base.warmup_epochs) if spec.warmup else 0.0
  c.seed = spec.seed
  c.base_lr = float(base.base_lr) * spec.lr_mult
  c.grad_accum_steps = accum_steps
  return c


def dataset_meta(base):
  """The dataset's sizes for `base` (SweepError if it cannot be read)."""
  try:
    return pipeline.dataset_meta(pipeline.get_builder(base), base)
  except (FileNotFoundError, ValueError) as e:
    raise SweepError(f'The dataset {base.dataset!r} is not usable: {e}') from e


# Which experiment an --out directory belongs to: each writes its own results.json (other
# columns) over the same paths, so one directory holds one kind. The marker is written before the
# first run; directories from before it are recognised by their own files.
EXPERIMENT_FILE = 'experiment.json'
_KIND_FILES = {'batch_size_sweep': 'sweep.json', 'sync_async_mixed': 'grid.json'}


def out_dir_kind(out: str) -> Optional[str]:
  """The experiment whose results `out` holds ('batch_size_sweep', 'sync_async_mixed'), or None."""
  path = os.path.join(out, EXPERIMENT_FILE)
  if os.path.exists(path):
    try:
      with open(path) as f:
        return json.load(f).get('kind')
    except (OSError, ValueError):
      return None
  return next((k for k, name in _KIND_FILES.items() if os.path.exists(os.path.join(out, name))),
              None)


def claim_out_dir(out: str, kind: str, write: bool) -> None:
  """Refuses `out` if it holds another experiment's results (SweepError: exit 2, before any
  training; its results.json would be overwritten); with `write`, marks it as `kind`'s."""
  if os.path.exists(out) and not os.path.isdir(out):
    raise SweepError(f'--out={out!r} is a file; give a directory.')
  found = out_dir_kind(out)
  if found and found != kind:
    raise SweepError(f'--out={out!r} holds the results of {found.replace("_", " ")} '
                     f'({EXPERIMENT_FILE} / {_KIND_FILES.get(found, "?")}); this '
                     f'{kind.replace("_", " ")} would overwrite its results.json: use another '
                     '--out.')
  if write and not found:
    os.makedirs(out, exist_ok=True)
    reporting.write_json_atomic(os.path.join(out, EXPERIMENT_FILE), {'kind': kind})


def check_sweep_directory(sw: Sweep, planned: Sequence[str]):
  """Refuses to add runs to ``--out`` when its other runs were trained with other settings.

  `collect_results` and the report fit every run under ``DIR/runs`` together (sweeps split over
  several jobs add up), and `check_existing` guards only the directories this invocation trains
  again. So every other run there (one with ``sweep_run.json`` and ``config.json``) is planned
  again from its grid point (batch, rule, warmup, seed, lr multiplier, and its own accumulation)
  under this invocation's settings, and must come out as the config it was trained with, up to
  the `NEUTRAL_FIELDS`: another epoch budget, base lr, model, dataset, target stop... would put
  two experiments into one fit, and the report's header would describe only the latest. Reruns
  and resumes of an invocation, and new batch sizes, rules, seeds or multipliers under the same
  settings, pass.
  """
  runs_dir = os.path.join(sw.out, 'runs')
  if not os.path.isdir(runs_dir):
    return
  planned = set(planned)
  differ = {}  # field -> (value there, value now) -> run names.
  for name in sorted(os.listdir(runs_dir)):
    info_path = os.path.join(runs_dir, name, 'sweep_run.json')
    config_path = os.path.join(runs_dir, name, 'config.json')
    if name in planned or not (os.path.exists(info_path) and os.path.exists(config_path)):
      continue
    with open(info_path) as f:
      info = json.load(f)
    with open(config_path) as f:
      old = json.load(f)
    spec = RunSpec(int(info['batch']), info['rule'], info['warmup'] in ('on', True),
                   int(info['seed']), float(info.get('lr_mult', 1.0)))
    again = make_run_config(sw.base, spec, int(old.get('grad_accum_steps', 1)))
    for key, (a, b) in config_diff(old, again).items():
      differ.setdefault(key, {}).setdefault((repr(a), repr(b)), []).append(name)
  if differ:
    def runs(names):
      return ', '.join(names[:3]) + (f' and {len(names) - 3} more' if len(names) > 3 else '')
    detail = '; '.join(f'{key}: {a} there vs {b} now ({runs(names)})'
                       for key, by_values in sorted(differ.items())
                       for (a, b), names in by_values.items())
    raise SweepError(
        f'{runs_dir} holds runs trained with other settings than this invocation, apart from '
        f'the swept batch size, rule, warmup, seed and lr multiplier ({detail}). The results and '
        'the report would fit them together with the new runs. Use another --out, or the '
        'settings of those runs.')


def plan_runs(sw: Sweep, devices: Optional[int] = None):
  """(plans, dataset meta): every grid point's config and sizes, checked before any training."""
  base = sw.base
  devices = jax.device_count() if devices is None else devices
  try:
    validate_config(base)
  except (ValueError, FileNotFoundError) as e:
    raise SweepError(f'The preset config with your overrides is invalid: {e}') from e
  batches = sorted({s.batch for s in sw.grid})
  problems = batch_problems(batches, devices, sw.max_per_device_batch, base.bn_mode,
                            base.bn_group_size, int(base.grad_accum_steps))
  if problems:
    group = base.bn_group_size if base.bn_mode == 'ghost' else 1
    listing = '; '.join(f'{b}: {why}' for b, why in sorted(problems.items()))
    raise SweepError(
        f'These batch sizes do not fit {devices} device(s) x micro-batch x BN group: {listing}. '
        f'Global batches must be multiples of devices x bn_group_size = {devices * group} '
        f'(and, with accumulation, of devices x the micro-batch); ok here: '
        f'{[b for b in batches if b not in problems] or "none"}.')
  meta = dataset_meta(base)
  plans, unfit = [], {}
  for spec in sw.grid:
    per_device = spec.batch // devices
    if sw.max_per_device_batch > 0:
      group = base.bn_group_size if base.bn_mode == 'ghost' else 1
      accum = choose_accum(per_device, sw.max_per_device_batch, group)
    else:
      accum = int(base.grad_accum_steps)
    config = make_run_config(base, spec, accum)
    try:
      setup = resolve_setup(config, meta.train_size, meta.eval_size, devices=devices)
    except ValueError as e:
      unfit[spec.batch] = str(e)
      continue
    # ~10 logs per epoch: enough B_simple samples in the second half of short runs.
    default_cadences(config, setup, sw.user_fields, checkpoint_epochs=sw.checkpoint_every_epochs,
                     log_epochs=0.1, log_cap=int(base.log_every_steps))
    plans.append(Plan(spec, config, setup))
  if unfit:
    listing = '; '.join(f'{b}: {why}' for b, why in sorted(unfit.items()))
    raise SweepError(f'These batch sizes do not fit the dataset {meta.name} '
                     f'({meta.train_size} training examples): {listing}')
  for p in plans:
    check_existing(os.path.join(sw.out, 'runs', p.spec.name), p.config)
  claim_out_dir(sw.out, 'batch_size_sweep', write=False)
  check_sweep_directory(sw, [p.spec.name for p in plans])
  return plans, meta


def run_info(p: Plan) -> Dict:
  """``sweep_run.json``: the grid point and its sizes (what `summarize_run` reads back)."""
  spec, setup = p.spec, p.setup
  return {'name': spec.name, 'batch': spec.batch, 'rule': spec.rule,
          'warmup': 'on' if spec.warmup else 'off', 'seed': spec.seed,
          'lr_mult': spec.lr_mult, 'base_lr': float(p.config.base_lr),
          'lr': float(optim.scaled_lr(p.config)),
          'warmup_epochs': float(p.config.warmup_epochs),
          'epochs': setup.total_steps * setup.batch_size / setup.train_size,
          'train_size': setup.train_size, 'devices': setup.devices,
          'per_device_batch': setup.per_device_batch, 'accum_steps': setup.accum_steps,
          'steps_per_epoch': setup.steps_per_epoch, 'total_steps': setup.total_steps,
          'eval_every_steps': setup.eval_every_steps}


# ----------------------------------------------------------------------------------------------
# The batch-size sweep: results.


def summarize_run(run_dir: str, target: float) -> Optional[Dict]:
  """One results row from a run directory's files (None if the sweep never started it)."""
  spec_path = os.path.join(run_dir, 'sweep_run.json')
  if not os.path.exists(spec_path):
    return None
  with open(spec_path) as f:
    info = json.load(f)
  final = None
  if is_finished(run_dir):
    with open(os.path.join(run_dir, 'final_metrics.json')) as f:
      final = json.load(f)
  records = metrics_io.read_metrics(run_dir)
  evals = [r for r in records if 'eval/anp_top1' in r]
  total = info['total_steps']
  # Steps are interpolated between the evaluations around the crossing (`target_crossing`).
  reached = target_crossing(evals, target)
  # Examples per pass; sweeps recorded before train_size was stored: steps_per_epoch * batch.
  train_size = info.get('train_size') or info['steps_per_epoch'] * info['batch']
  # The second half of what the run trained: with --stop_at_target that ends at the step the run
  # stopped at, not at the budget (a window after the budget's half would often be empty).
  last = max((r['step'] for r in records), default=total)
  b_simple = noise_scale.window_b_simple(records, start_step=last / 2, end_step=last)
  if final is None:
    status = 'incomplete'
  elif final.get('diverged'):
    status = 'diverged'
  else:
    status = 'finished'
  ok = status == 'finished'
  row = {k: info[k] for k in ('name', 'batch', 'rule', 'warmup', 'seed', 'lr_mult', 'base_lr',
                              'lr', 'warmup_epochs', 'epochs', 'devices', 'per_device_batch',
                              'accum_steps', 'steps_per_epoch', 'total_steps')}
  row.update(
      status=status,
      final_step=final.get('step') if final else (records[-1]['step'] if records else 0),
      final_top1=final.get('eval/anp_top1') if ok else None,
      final_top5=final.get('eval/anp_top5') if ok else None,
      final_adjective_top1=final.get('eval/adjective_top1') if ok else None,
      final_noun_top1=final.get('eval/noun_top1') if ok else None,
      best_top1=max((r['eval/anp_top1'] for r in evals), default=None),
      target_top1=target,
      steps_to_target=reached['step'] if reached else None,
      examples_to_target=reached['step'] * info['batch'] if reached else None,
      epochs_to_target=reached['step'] * info['batch'] / train_size if reached else None,
      eval_step_reaching_target=reached['eval_step'] if reached else None,
      wall_time_s=final.get('wall_time_s') if final else None,
      b_simple=b_simple,
      best_lr=True,
      error=final.get('error') if final else None)
  return row


def collect_results(out: str, target: float) -> List[Dict]:
  """One row per run found under ``out/runs`` (sweeps split over several jobs add up)."""
  runs_dir = os.path.join(out, 'runs')
  rows = []
  if os.path.isdir(runs_dir):
    for name in sorted(os.listdir(runs_dir)):
      row = summarize_run(os.path.join(runs_dir, name), target)
      if row is not None:
        rows.append(row)
  return select_best_lr(rows)


def write_results(out: str, rows: List[Dict]):
  """``out/results.csv`` (`CSV_COLUMNS`, None as '') and ``out/results.json``, atomically."""
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction='ignore')
  writer.writeheader()
  for r in rows:
    writer.writerow({k: '' if r.get(k) is None else r[k] for k in CSV_COLUMNS})
  write_text_atomic(os.path.join(out, 'results.csv'), buf.getvalue())
  reporting.write_json_atomic(os.path.join(out, 'results.json'), rows)


def _record_invocation(out, args, overrides, sw: Sweep, devices: int):
  """DIR/sweep.json: the settings of the sweep (for the report) and every invocation."""
  path = os.path.join(out, 'sweep.json')
  record = {}
  if os.path.exists(path):
    with open(path) as f:
      record = json.load(f)
  base = sw.base
  record.update(preset=sw.preset, devices=devices, epochs=base.num_epochs,
                model=f'{base.model.name} width {base.model.width}', image_size=base.image_size,
                dataset=base.dataset, target_top1=sw.target_top1)
  record.setdefault('invocations', []).append(
      {'time': time.time(), 'args': vars(args),
       'overrides': override_args(overrides)})
  write_text_atomic(path, json.dumps(record, indent=2, default=str))


# ----------------------------------------------------------------------------------------------
# The batch-size sweep: the command.


def sweep(argv: Sequence[str], make_report: Optional[Callable[[str], str]] = None,
          doc: str = __doc__) -> List[Dict]:
  """Runs (or continues) the sweep of `argv`; returns the results rows. Raises SweepError.

  `make_report(out)` (experiments/report.py's) writes the report at the end unless --no_report.
  """
  preemption.install()  # From here on, SIGTERM/SIGUSR1 mean "checkpoint and exit 75".
  parsed = parse_args(argv, doc)
  if parsed is None:
    return []
  args, config, overrides = parsed
  preset = sweep_preset(args.preset)
  simulate_cpu_devices(preset.cpu_devices if args.cpu_devices is None else args.cpu_devices)
  distributed.initialize()  # Multi-process jobs (SLURM / ANP_* variables); no-op otherwise.
  sw = resolve(args, config, overrides)
  plans, meta = plan_runs(sw)
  is_main = jax.process_index() == 0
  out = sw.out
  done = [p.spec.name for p in plans if is_finished(os.path.join(out, 'runs', p.spec.name))]
  if is_main:
    todo = [p for p in plans if p.spec.name not in done]
    ips = preset.throughput(jax.device_count())
    eta = estimate_seconds(todo, meta.eval_size, ips, preset.overhead_s)
    print(f'Sweep {out}: {len(plans)} runs ({len(done)} finished earlier), '
          f'{jax.device_count()} device(s), target top-1 {sw.target_top1:g}; '
          f'estimated {eta / 60:.0f} min for the rest at ~{ips:.0f} img/s.', flush=True)
    for p in plans:
      s = p.setup
      print(f'  {p.spec.name}: lr {optim.scaled_lr(p.config):.4g}, {s.total_steps} '
            f'steps ({s.steps_per_epoch}/epoch), {s.per_device_batch}/device'
            + (f' = {s.accum_steps} x {s.per_device_micro_batch}' if s.accum_steps > 1 else '')
            + (' [finished]' if p.spec.name in done else ''), flush=True)
  if args.dry_run:
    return []
  if is_main:
    claim_out_dir(out, 'batch_size_sweep', write=True)
    _record_invocation(out, args, overrides, sw, jax.device_count())
  run_grid([GridRun(p.spec.name, p.config, p.setup, run_info(p)) for p in plans], out, is_main)
  rows = []
  if is_main:
    rows = collect_results(out, sw.target_top1)
    write_results(out, rows)
    print(f'Results: {os.path.join(out, "results.csv")} ({len(rows)} runs)', flush=True)
    if make_report is not None and not args.no_report:
      print(f'Report: {make_report(out)}', flush=True)
  return rows


def main(argv: Sequence[str], make_report: Optional[Callable[[str], str]] = None,
         doc: str = __doc__) -> int:
  """`sweep` with bad input as ``ERROR: ...`` on stderr and exit code 2."""
  try:
    sweep(argv, make_report, doc)
  except SweepError as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  return 0
