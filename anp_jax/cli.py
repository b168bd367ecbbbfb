"""Command-line errors as one paragraph that leads with the fix, and exit code 2.

absl + ml_collections report a misspelt ``--config.batchsize`` as a 50-line traceback whose hint
sits on its last line, a bad value as "FATAL Flags parsing error" with exit code 1, and a missing
config file as "Failed loading config file config_config". `absl_flags_parser` replaces absl's
parser in the entry points (``app.run(main, flags_parser=...)``): on any flag error it works out
what went wrong from the command line itself and exits with `EXIT_USAGE` and a message such as
``Unknown config field --config.batchsize; did you mean --config.batch_size?``. The experiment
scripts' own override parser uses `unknown_field_message` for the same wording.
"""

import difflib
import os
import re
import runpy
import sys
from typing import Callable, Dict, List, Optional, Sequence

from anp_jax import errors

EXIT_USAGE = errors.EXIT_CONFIG  # The documented exit code of bad config, input or environment.


def _disclaim_key_flags() -> None:
  """The flags this module's helpers define (`define_positive_ints`, `define_config_file`) are
  the calling entry point's key flags, listed by its ``--help``: absl credits a flag to the
  module whose code calls DEFINE, and without this it was this one, so that ``planner --help``
  hid ``--batches``, ``--nodes`` and ``--sync_periods`` (only ``--helpfull`` showed them)."""
  from absl import flags
  flags.disclaim_key_flags()


_disclaim_key_flags()


def nearest_existing(path: str) -> str:
  """`path` if it exists, else its nearest existing ancestor ('' when a relative path has none):
  where a directory would have to be created, to tell a path under a file early."""
  while path and not os.path.exists(path):
    path = os.path.dirname(path)
  return path


def output_file_error(flag: str, value: str, what: str, example: str) -> str:
  """What is wrong with `value` as the path of the file a command writes when it is done (one
  line naming `flag`), or ''. Checked, and the file's folder created, before any work, so that a
  bad path never costs the results: empty, a folder (the fix names `example` in it), a folder
  that cannot be created (e.g. under a file), a folder that is not writable."""
  if not value:
    return f'{flag} is empty: give the path of the {what} to write.'
  path = os.path.abspath(os.path.expanduser(value))
  if os.path.isdir(path):
    return (f'{flag}={value} is a directory: give the path of the {what} to write, e.g. '
            f'{os.path.join(value, example)}.')
  folder = os.path.dirname(path)
  try:
    os.makedirs(folder, exist_ok=True)
  except OSError as e:
    return f'{flag}={value}: cannot create its folder ({e}); pick another path.'
  if not os.access(folder, os.W_OK):
    return f'{flag}={value}: its folder {folder} is not writable; pick another path.'
  return ''


def refuse_extra_arguments(argv: Sequence[str]) -> Optional[int]:
  """For an absl `main(argv)`: EXIT_USAGE after one ERROR line if the command line has
  positional arguments (absl's UsageError would print the whole help text first), else None::

      if (rc := cli.refuse_extra_arguments(argv)) is not None:
        return rc
  """
  if len(argv) <= 1:
    return None
  print(f'ERROR: Unexpected arguments: {list(argv[1:])}; every setting is a --flag=value '
        '(--help lists them; config fields are --config.x=y).', file=sys.stderr, flush=True)
  return EXIT_USAGE


def config_fields(config, prefix: str = '') -> List[str]:
  """Every dotted field name of a ConfigDict (nested dicts and their leaves)."""
  out = []
  for key in config.keys():
    name = f'{prefix}{key}'
    out.append(name)
    value = config[key]
    if hasattr(value, 'keys') and hasattr(value, 'items'):
      out += config_fields(value, name + '.')
  return out


def unknown_field_message(key: str, fields: Sequence[str]) -> str:
  """``Unknown config field --config.KEY; did you mean --config.X?`` (or where to look); for a
  field that was replaced, what replaced it (`default.REPLACED_FIELDS`)."""
  from anp_jax.configs import default  # No JAX; the registry of replaced fields.
  replaced = default.replaced_field_message(key)
  if replaced:
    return f'--config.{key}: {replaced}'
  new_evaluator = _new_evaluator_message(key, fields)
  if new_evaluator:
    return new_evaluator
  # Compare within the same level first (model.nmae -> model.name), then anywhere.
  depth = key.count('.')
  same_level = [f for f in fields if f.count('.') == depth]
  match = (difflib.get_close_matches(key, same_level, n=1, cutoff=0.6) or
           difflib.get_close_matches(key, fields, n=1, cutoff=0.6))
  if match:
    return f'Unknown config field --config.{key}; did you mean --config.{match[0]}?'
  parent = key.rsplit('.', 1)[0] + '.' if '.' in key else ''
  siblings = sorted(f[len(parent):] for f in fields
                    if f.startswith(parent) and '.' not in f[len(parent):])
  return (f'Unknown config field --config.{key}; the fields at this level are: '
          f'{", ".join(siblings)}.')


def _new_evaluator_message(key: str, fields: Sequence[str]) -> str:
  """The message for ``--config.evals.<name>...`` where `<name>` is not an evaluator of the
  config ('' otherwise): how to add one. The closest field would be another evaluator's
  (``evals.test.split`` -> ``evals.eval.split``), and following that hint moves the validation
  evaluator, on which every choice is made, onto the split the results are reported on."""
  if not key.startswith('evals.') or 'evals' not in fields:
    return ''
  name = key.split('.')[1]
  existing = sorted(f.split('.')[1] for f in fields if f.count('.') == 1 and
                    f.startswith('evals.'))
  # A misspelt option or name of an existing evaluator ('evals.eval.splt', 'evals.evl.split'):
  # the usual hint, which stays on that evaluator.
  if name in existing or difflib.get_close_matches(name, existing, n=1, cutoff=0.75):
    return ''
  split = name if name in ('test', 'train', 'validation') else 'SPLIT'
  return (f'Unknown config field --config.{key}: config.evals has no evaluator {name!r} (it has '
          f'{", ".join(existing) or "none"}). Add one by giving its kind first: '
          f'--config.evals.{name}.kind=classification --config.evals.{name}.split={split} (or '
          f"c.evals.{name} = dict(kind='classification', split='{split}') in a config file; "
          "docs/evaluation.md); keep config.evals.eval on 'validation', where choices are made.")


def load_config_file(spec: str, argv: Sequence[str] = (), flag: str = 'config'):
  """`get_config()` of a config file spec ``path.py`` or ``path.py:arg``, completed for the
  ``--<flag>.x`` fields of `argv` (`complete_config`)."""
  path, _, arg = spec.partition(':')
  module = runpy.run_path(os.path.expanduser(path))
  config = module['get_config'](arg) if arg else module['get_config']()
  return complete_config(config, argv, flag)


def evaluation_flags(argv: Sequence[str], flag: str = 'config') -> Dict[str, Optional[str]]:
  """{prefix: kind} of the ``--<flag>.evals.<prefix>.<field>`` flags of `argv`: the kind a
  ``--<flag>.evals.<prefix>.kind=K`` flag gives, None for a prefix only other fields name."""
  pattern = re.compile(rf'^--?(?:no)?{re.escape(flag)}\.evals\.([^.=]+)\.([^=]+)(?:=(.*))?$')
  out: Dict[str, Optional[str]] = {}
  for i, item in enumerate(argv):
    m = pattern.match(item)
    if m:
      prefix, field, value = m.groups()
      out.setdefault(prefix, None)
      if field == 'kind':
        out[prefix] = value if value is not None else (argv[i + 1] if i + 1 < len(argv) else None)
  return out


def complete_config(config, argv: Sequence[str], flag: str = 'config'):
  """`config` (in place) with what the ``--<flag>.x`` flags of `argv` need before they apply:
  the ``config.evals`` entries and options they name (`anp_jax.evaluators.add_entries`: e.g.
  ``--config.evals.cal.kind=calibration`` with no config file). The options of models,
  optimizers and schedules are in every config already (`anp_jax.registry.add_options`)."""
  kinds = evaluation_flags(argv, flag)
  if kinds and hasattr(config, 'keys') and 'evals' in config:
    from anp_jax import evaluators  # The kinds named: their modules only.
    evaluators.add_entries(config, kinds)
  return config


def _config_spec(argv: Sequence[str], flag: str, default: str) -> str:
  spec = default
  for i, item in enumerate(argv):
    if item.startswith(f'--{flag}='):
      spec = item.split('=', 1)[1]
    elif item == f'--{flag}' and i + 1 < len(argv):
      spec = argv[i + 1]
  return spec


def _overrides(argv: Sequence[str], flag: str) -> List[str]:
  """The fields set on the command line in every absl form: ``--config.x=y``, ``--config.x y``,
  ``-config.x``, and ``--noconfig.x`` / ``-noconfig.x`` (a boolean set False)."""
  pattern = re.compile(rf'^--?(?:no)?{re.escape(flag)}\.([^=]+)')
  return [m.group(1) for m in map(pattern.match, argv) if m]


def check_config_argv(argv: Sequence[str], flag: str = 'config',
                      default_config: str = '') -> str:
  """What is wrong with the config file or the ``--config.x`` fields of `argv` ('' if nothing).

  Checked on the command line itself: ml_collections loads the file lazily (a missing one
  surfaces long after parsing) and fails on unknown fields while the flag is being defined.
  """
  spec = _config_spec(argv, flag, default_config)
  if not spec:
    return ''
  path = os.path.expanduser(spec.partition(':')[0])
  if not os.path.isfile(path):
    return (f'Config file {path} not found (--{flag}={spec}); pass an existing file, e.g. '
            f'--{flag}=anp_jax/configs/default.py.')
  try:
    config = load_config_file(spec, argv, flag)
  except Exception as e:  # The file itself is broken: say so, not "config_config".
    return (f'Config file {path} could not be loaded ({type(e).__name__}: {e}); fix it or pass '
            f'another --{flag}.')
  fields = config_fields(config)
  for key in _overrides(argv, flag):
    if key not in fields:
      return unknown_field_message(key, fields)
  return ''


def explain_flag_error(error: BaseException, argv: Sequence[str], flag: str = 'config',
                       default_config: str = '') -> str:
  """One paragraph, fix first, for a failure to parse `argv` (config flag named `flag`)."""
  message = check_config_argv(argv, flag, default_config)
  if message:
    return message
  text = ' '.join(str(error).split()).rstrip('.')  # One paragraph.
  if text.startswith('flag --'):  # absl: "flag --config.x=v: <why>".
    text = 'Invalid value: ' + text[len('flag '):]
  return f'{text}. Fix the flag (--helpfull lists every flag).'


def _fail(message: str):
  print(f'ERROR: {message}', file=sys.stderr, flush=True)
  sys.exit(EXIT_USAGE)


def define_config_flag(name: str, default: str, help_string: str, *, flag_values=None,
                       sys_argv: Optional[Sequence[str]] = None, lock_config: bool = True,
                       **kwargs):
  """`config_flags.DEFINE_config_file`, whose config is completed for the command line
  (`complete_config`) after the file is loaded and before the ``--name.x`` overrides apply.

  (ml_collections offers no hook between the two: the flag is its `_ConfigFlag` with a parser
  that completes the loaded config, as `DEFINE_config_file` builds it; ml_collections is
  pinned in requirements.txt.)
  """
  from absl import flags
  from ml_collections.config_flags import config_flags  # The module, with its flag classes.

  class Parser(config_flags.ConfigFileFlagParser):

    def parse(self, path):
      config = super().parse(path)  # Not locked yet (lock_config=False below).
      argv = sys.argv if sys_argv is None else sys_argv
      if hasattr(config, 'keys'):
        complete_config(config, list(argv)[1:], name)
      if lock_config and callable(getattr(config, 'lock', None)):
        config.lock()
      return config

  flag_values = flags.FLAGS if flag_values is None else flag_values
  flag = config_flags._ConfigFlag(  # noqa: SLF001
      parser=Parser(name=name, lock_config=False), serializer=flags.ArgumentSerializer(),
      name=name, default=default, help_string=help_string, flag_values=flag_values,
      sys_argv=None if sys_argv is None else list(sys_argv), **kwargs)
  return flags.DEFINE_flag(flag, flag_values)


def define_config_file(name: str, default: str, help_string: str, **kwargs):
  """`define_config_flag`, exiting 2 with the fix when sys.argv has a bad field.

  (ml_collections applies ``--config.x`` overrides while the flag is defined, i.e. when the
  entry point is imported, and raises a bare AttributeError for an unknown field.)
  """
  try:
    return define_config_flag(name, default, help_string, **kwargs)
  except (AttributeError, KeyError, TypeError, ValueError, OSError) as e:
    _fail(explain_flag_error(e, sys.argv[1:], name, default))


HELP_FLAGS = ('-?', '--help', '--helpshort', '--helpfull', '--helpxml')


def absl_flags_parser(flag: str = 'config', default_config: str = '') -> Callable:
  """A `flags_parser` for `absl.app.run`: flag errors exit with code 2 and a one-line fix; a
  help request exits 0 after the help (absl itself exits 1, as argparse does not). absl logging
  is set to WARNING unless ``--verbosity`` was given: JAX's, orbax's and TFDS's INFO lines would
  drown what the command prints."""
  from absl import flags, logging

  def parse(argv):
    message = check_config_argv(argv[1:], flag, default_config)
    if message:
      _fail(message)
    try:
      rest = flags.FLAGS(argv)
    except (flags.Error, OSError, AttributeError, KeyError, TypeError, ValueError) as e:
      _fail(explain_flag_error(e, argv[1:], flag, default_config))
    except SystemExit as e:
      if e.code == 1 and any(a in HELP_FLAGS for a in argv[1:]):
        sys.exit(0)
      raise
    if not flags.FLAGS['verbosity'].present:
      logging.set_verbosity(logging.WARNING)
    return rest

  return parse


def define_positive_ints(name: str, default, help_string: str):
  """An absl flag holding comma-separated positive integers (``--batches=32,64``) as a list.

  A bad value (``0``, ``a,b``) is a flag error: `absl_flags_parser` exits 2 with the reason.
  """
  from absl import flags

  class Parser(flags.ArgumentParser):

    def parse(self, argument):
      if isinstance(argument, (list, tuple)):
        values, text = list(argument), ','.join(map(str, argument))
      else:
        values, text = [v for v in argument.split(',') if v.strip()], argument
      try:
        ints = [int(v) for v in values]
      except ValueError:
        raise ValueError(f'expected comma-separated integers, got {text!r}') from None
      if not ints or min(ints) <= 0:
        raise ValueError(f'expected positive integers, got {text!r}')
      return ints

    def flag_type(self):
      return 'comma-separated positive integers'

  return flags.DEFINE(Parser(), name, default, help_string,
                      serializer=flags.CsvListSerializer(','))
