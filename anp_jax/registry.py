"""The extension points a config value selects, in one table, and what their entries declare.

Four kinds of entry are chosen by name from the config: a model (``config.model.name``), an
evaluation (``config.evals.<prefix>.kind``), an optimizer (``config.optimizer``) and a learning-rate
schedule (``config.schedule``). Each kind has one `Registry` here (`MODELS`, `EVALUATORS`,
`OPTIMIZERS`, `SCHEDULES`): its entries by name, the package they are found in, and how to add
one (the sentence an unknown name's error ends with). Adding an entry is one module:

* **Found by itself.** The first lookup of a kind imports every module of its package
  (``anp_jax/models/``, ``anp_jax/optim/optimizers/``, ``anp_jax/optim/schedules/``; an
  evaluator kind's module ``anp_jax/evaluators/<kind>.py`` when the kind is first asked for), so
  a module dropped there needs no import anywhere. An entry registered from any other module
  (a notebook, a test file) counts once that module is imported.
* **Describes itself.** An entry declares the config fields it reads (`Option`: the default, the
  range or the choices, what it means) and the facts other parts need (whether a schedule
  decays, whether an optimizer has an explicit momentum). The options of models, optimizers
  and schedules are part of every config (`add_options`, from
  `anp_jax.configs.default.get_config`), so ``--config.model.patch_size=2`` works with no edit
  to default.py; an evaluator's options are those of its ``config.evals`` entry. Config
  validation (`anp_jax.setup.CHOICES`, ``RANGES``), the planner and the docs' tables read them
  from here.

Plain Python (the packages are imported by name when first needed): the planner reads the
schedules' facts without JAX, as long as schedule modules import optax inside their factory.
"""

import dataclasses
import importlib
import os
import pkgutil
import re
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from anp_jax import ranges
from anp_jax.errors import ConfigError

_FIELD = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$')


@dataclasses.dataclass(frozen=True)
class Option:
  """A config field a registered entry reads: its default, the values it allows, what it means.

  Attributes:
    default: the value when the config does not set it (every config gets it, see `add_options`).
    range: for a number (or a sequence of numbers), the values allowed, in `anp_jax.ranges`'
      syntax: ``'> 0'``, ``'integer >= 1'``, ``'[0, 1)'``, ``'each >= 0'``.
    doc: what it means, for the docs and the error messages.
    choices: for an enumerated value, the values allowed (instead of a range).

  ``Option(0.9, '[0, 1)', "Adam's first-moment decay")``; ``Option('xla', choices=('xla',
  'im2col'))``; ``Option(True)`` (a switch).
  """
  default: Any
  range: str = ''
  doc: str = ''
  choices: Tuple[Any, ...] = ()

  def __post_init__(self):
    if self.range and self.choices:
      raise ValueError('An Option has a range or choices, not both.')
    if self.range:
      problem = ranges.error('<option>', self.parsed(), self.default)
      if problem:
        raise ValueError(f'The default of an Option is out of its own range: {problem}')
    if self.choices and self.default not in self.choices:
      raise ValueError(f'The default {self.default!r} of an Option is not one of its choices '
                       f'{tuple(self.choices)}.')

  def parsed(self) -> Optional[ranges.Range]:
    """The range as a `ranges.Range` (with `doc` as its note), None without one."""
    return ranges.parse((self.range, self.doc)) if self.range else None

  def error(self, field: str, value) -> str:
    """Why `value` is not allowed in ``config.<field>`` ('' if it is)."""
    if self.range:
      return ranges.error(field, self.parsed(), value)
    if self.choices and value not in self.choices:
      return f'config.{field}={value!r} is unknown; choose one of {tuple(self.choices)}.'
    return ''


def as_option(value) -> Option:
  """`value` if it is an `Option`, else an Option with `value` as its default (an evaluator's
  ``OPTIONS`` may list plain defaults)."""
  return value if isinstance(value, Option) else Option(value)


class Registry:
  """The entries of one kind, by name (see the module docstring).

  Args:
    kind: what an entry is ('model', 'optimizer', ...), for messages.
    field: the config field that names an entry (``'model.name'``), for messages.
    package: the package whose modules are imported to find the entries.
    how: how to add an entry (the end of an unknown name's error).
    option_scope: the prefix of the config fields an entry's options are (``'model.'``: a
      model's option ``patch_size`` is ``config.model.patch_size``); None: per use (an
      evaluator's options are the fields of its ``config.evals`` entry), not in `add_options`.
    by_name: find an entry by importing ``<package>.<name>`` when it is first asked for (an
      evaluator kind's module is named after it), instead of every module of the package.
  """

  def __init__(self, kind: str, *, field: str, package: str, how: str,
               option_scope: Optional[str] = '', by_name: bool = False):
    self.kind, self.field, self.package, self.how = kind, field, package, how
    self.option_scope, self.by_name = option_scope, by_name
    self._entries: Dict[str, Any] = {}
    self._options: Dict[str, Dict[str, Option]] = {}
    self._discovered = False

  def register(self, name: str, entry: Any, *, options: Optional[Mapping[str, Any]] = None,
               replace: bool = False, where: str = '') -> Any:
    """Adds `entry` under `name` with the config fields it reads (`options`: field name, inside
    `option_scope`, -> `Option` or a plain default); returns `entry`. A name registered twice
    is an error (two entries would answer to one config), unless ``replace=True``; so is a
    config field (`option_scope` not None) another entry declares with another default, range
    or choices (one field, one meaning)."""
    if not isinstance(name, str) or not name:
      raise ValueError(f'A {self.kind} name must be a non-empty string, got {name!r}.')
    old = self._entries.get(name)
    if old is not None and old is not entry and not replace:
      raise ValueError(f'A {self.kind} named {name!r} is already registered (by '
                       f'{_where(old)}); pick another name or pass replace=True.')
    declared = {}
    for key, value in dict(options or {}).items():
      if not isinstance(key, str) or not _FIELD.match(key):
        raise ValueError(f'{self.kind} {name!r}: the option name {key!r} must be a (dotted) '
                         'Python identifier.')
      option = as_option(value)
      for other, theirs in self._options.items():  # Config fields shared by every entry.
        if (self.option_scope is not None and other != name and key in theirs
            and theirs[key] != option):
          raise ValueError(f'{self.kind} {name!r} declares the option {self._full(key)} as '
                           f'{option}, and {other!r} as {theirs[key]}: declare it alike (one '
                           'field, one meaning) or pick another name.')
      declared[key] = option
    self._entries[name] = entry
    self._options[name] = declared
    return entry

  def _full(self, key: str) -> str:
    return f'{self.option_scope or ""}{key}'

  def discover(self) -> None:
    """Imports every public module of the package (once): their registrations run."""
    if self._discovered or self.by_name:
      return
    self._discovered = True
    package = importlib.import_module(self.package)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
      if not info.name.startswith('_'):
        importlib.import_module(f'{self.package}.{info.name}')

  def _import_by_name(self, name) -> None:
    if name in self._entries or not isinstance(name, str) or not _FIELD.match(name):
      return
    if '.' in name:
      return
    try:
      importlib.import_module(f'{self.package}.{name}')
    except ModuleNotFoundError as e:
      if e.name != f'{self.package}.{name}':  # The module exists but imports something missing.
        raise

  def _files(self) -> set:
    folder = os.path.dirname(importlib.import_module(self.package).__file__)
    return {n[:-3] for n in os.listdir(folder) if n.endswith('.py') and not n.startswith('_')}

  def names(self) -> Tuple[str, ...]:
    """The registered names, sorted (for a `by_name` kind, also the modules not imported yet)."""
    self.discover()
    found = set(self._entries) | (self._files() if self.by_name else set())
    return tuple(sorted(found))

  def __contains__(self, name) -> bool:
    self.discover()
    if self.by_name:
      self._import_by_name(name)
    return isinstance(name, str) and name in self._entries

  def get(self, name: str) -> Any:
    """The entry registered as `name`; ConfigError listing the names and how to add one."""
    if name not in self:
      raise ConfigError(self.unknown(name))
    return self._entries[name]

  def unknown(self, name) -> str:
    """The error for an unknown name: the names there are, and how to add one."""
    return (f'config.{self.field}={name!r} is unknown; choose one of {self.names()} '
            f'({self.how}).')

  def options_of(self, name: str) -> Dict[str, Option]:
    """The options `name` declares, by field name inside `option_scope`."""
    self.get(name)
    return dict(self._options[name])

  def options(self) -> Dict[str, Option]:
    """Every option of every entry, by full dotted field (`option_scope` + name)."""
    self.discover()
    out = {}
    for declared in self._options.values():
      out.update({self._full(key): option for key, option in declared.items()})
    return out

  def view(self) -> 'Names':
    """A live view of `names` (a sequence that also holds names registered later)."""
    return Names(self)


class Names:
  """A live, sorted view of a registry's names (`anp_jax.setup.CHOICES` holds one, so a name
  registered after import is a valid value)."""

  def __init__(self, registry: Registry):
    self._registry = registry

  def __iter__(self) -> Iterator[str]:
    return iter(self._registry.names())

  def __len__(self) -> int:
    return len(self._registry.names())

  def __getitem__(self, index):
    return self._registry.names()[index]

  def __contains__(self, name) -> bool:
    return name in self._registry

  def __repr__(self) -> str:
    return repr(self._registry.names())


def _where(entry) -> str:
  target = getattr(entry, 'factory', entry)
  return f'{getattr(target, "__module__", "?")}.{getattr(target, "__qualname__", target)}'


# The extension points (the one place that names where each kind's modules live).
MODELS = Registry(
    'model', field='model.name', package='anp_jax.models', option_scope='model.',
    how='a new model is one module in anp_jax/models/ calling anp_jax.models.register, found '
        'there by itself (or any module you import before the config is checked): see '
        'docs/models.md')
EVALUATORS = Registry(
    'evaluator kind', field='evals.<prefix>.kind', package='anp_jax.evaluators',
    option_scope=None, by_name=True,
    how='a new kind is one module anp_jax/evaluators/<kind>.py registering it with '
        'anp_jax.evaluators.register, found there by its name (or a class registered from any '
        'module you import): see docs/evaluation.md')
OPTIMIZERS = Registry(
    'optimizer', field='optimizer', package='anp_jax.optim.optimizers',
    how='a new optimizer is one module in anp_jax/optim/optimizers/ calling '
        'anp_jax.optim.register_optimizer, found there by itself (or any module you import '
        'before the config is checked): see docs/optim.md')
SCHEDULES = Registry(
    'schedule', field='schedule', package='anp_jax.optim.schedules',
    how='a new schedule is one module in anp_jax/optim/schedules/ calling '
        'anp_jax.optim.register_schedule, found there by itself (or any module you import '
        'before the config is checked): see docs/optim.md')
ALL = (MODELS, EVALUATORS, OPTIMIZERS, SCHEDULES)
# The registries whose entries' options are fields of every config (`add_options`).
WITH_CONFIG_OPTIONS = (MODELS, OPTIMIZERS, SCHEDULES)


def by_field() -> Dict[str, Registry]:
  """{config field that names an entry: its registry}, for the fields of one value
  (``'model.name'``, ``'optimizer'``, ``'schedule'``)."""
  return {r.field: r for r in WITH_CONFIG_OPTIONS}


def declared_options() -> Dict[str, Option]:
  """Every option the registered models, optimizers and schedules declare, by dotted field
  (`Registry.options`); a field two kinds declare differently is an error."""
  out: Dict[str, Option] = {}
  for reg in WITH_CONFIG_OPTIONS:
    for field, option in reg.options().items():
      if field in out and out[field] != option:
        raise ValueError(f'The option {field} is declared twice, differently ({out[field]} and '
                         f'{option}, by a {reg.kind}).')
      out[field] = option
  return out


def add_options(config):
  """`config` with every `declared_options` field it lacks, at its default (in place; returned).
  A field the config already has keeps its value (a config file's choice)."""
  for field, option in declared_options().items():
    *parents, last = field.split('.')
    node = config
    for part in parents:
      if part not in node:
        node[part] = {}
      node = node[part]
    if last not in node:
      node[last] = option.default
  return config


def get_field(config, field: str, default=None):
  """``config.<field>`` (dotted) or `default` when the config lacks it."""
  node = config
  for part in field.split('.'):
    if not hasattr(node, 'keys') or part not in node:
      return default
    node = node[part]
  return node


def option_values(config, options: Mapping[str, Option], scope: str = '') -> Dict[str, Any]:
  """{name: the config's value of ``<scope><name>``, else the option's default} of `options`:
  what an entry's factory reads (a config recorded before an option existed gets the default)."""
  return {name: get_field(config, f'{scope}{name}', option.default)
          for name, option in options.items()}
