"""The evaluations a run performs, through one interface (see docs/evaluation.md).

``config.evals`` maps a metric prefix to an evaluator spec, a `kind` and the kind's options::

    c.evals = {'eval': {'kind': 'classification', 'split': 'validation'}}   # The default.
    c.evals.test = dict(kind='classification', split='test')              # Also test/...

At every evaluation step the trainer runs each of them (`create_all`, then `Evaluator.evaluate`)
and logs their metrics, ``<prefix>/<name>``, in one record. A kind is an `Evaluator` subclass
registered under its name (`register`); the module ``anp_jax/evaluators/<kind>.py`` is imported
the first time the kind is asked for, so a new evaluation is one new file and no edit elsewhere
(a class registered from any other imported module works too).

What the rest of the code asks of the evaluators: `check` (config validation, no data read),
`metric_goal` (whether higher is better, for config.target_metric and config.keep_best_metric)
and `summary` (the terminal line).
"""

import importlib
import os
import re
from typing import Any, Dict, Mapping, NamedTuple, Optional, Type

from anp_jax.errors import ConfigError


class Goal(NamedTuple):
  """How to read a metric: ``mode`` 'max' (higher is better) or 'min'; ``best`` its best possible
  value (None: unbounded), beyond which a target is unreachable."""
  mode: str
  best: Optional[float] = None


class Evaluator:
  """One evaluation of a run, logged under ``<prefix>/``.

  Subclasses set `OPTIONS` (the spec's fields besides ``kind``, with their defaults), declare
  their metrics (`metrics`, from the config alone: the config is validated before anything is
  built) and implement `evaluate`. They are built once per run with the run's parts: ``run``
  is the `anp_jax.trainer.Run` (``run.config``, ``run.builder`` the dataset, ``run.setup`` the
  batch sizes, ``run.executor`` the compiled evaluation step and the transfers, ``run.model``).
  Every process of a job runs every evaluator, in the same order (collectives inside).
  """
  OPTIONS: Mapping[str, Any] = {}

  def __init__(self, prefix: str, options: Mapping[str, Any], run):
    self.prefix = prefix
    self.options = dict(options)
    self.run = run

  @classmethod
  def check_options(cls, config, prefix: str, options: Mapping[str, Any]) -> None:
    """Raises ConfigError for options the kind cannot use (no data read: before the build)."""

  @classmethod
  def metrics(cls, config, options: Mapping[str, Any]) -> Dict[str, Goal]:
    """The metrics `evaluate` returns, by name without the prefix."""
    raise NotImplementedError

  def evaluate(self, state) -> Dict[str, float]:
    """``{'<prefix>/<name>': value}`` of the executor's `state`."""
    raise NotImplementedError

  @classmethod
  def summary(cls, prefix: str, metrics: Mapping[str, float]) -> str:
    """One line of the logged `metrics` for the terminal ('' for none)."""
    return ''


_REGISTRY: Dict[str, Type[Evaluator]] = {}
_PREFIX = re.compile(r'^[A-Za-z][A-Za-z0-9_]*$')


def register(kind: str):
  """Class decorator: ``@register('my_kind') class MyEval(Evaluator)`` makes
  ``config.evals.<prefix> = dict(kind='my_kind', ...)`` run it."""
  def add(cls):
    if kind in _REGISTRY and _REGISTRY[kind] is not cls:
      raise ValueError(f'Evaluator kind {kind!r} is registered twice ({_REGISTRY[kind]} and '
                       f'{cls}).')
    _REGISTRY[kind] = cls
    return cls
  return add


def _known_kinds():
  here = os.path.dirname(__file__)
  files = {name[:-3] for name in os.listdir(here)
           if name.endswith('.py') and not name.startswith('_')}
  return sorted(files | set(_REGISTRY))


def evaluator_class(kind: str) -> Type[Evaluator]:
  """The class registered as `kind`, importing ``anp_jax.evaluators.<kind>`` on first use."""
  if kind not in _REGISTRY and isinstance(kind, str) and _PREFIX.match(kind):
    try:
      importlib.import_module(f'{__name__}.{kind}')
    except ModuleNotFoundError as e:
      if e.name != f'{__name__}.{kind}':  # The module exists but imports something missing.
        raise
  if kind not in _REGISTRY:
    raise ConfigError(f'Unknown evaluator kind {kind!r}; the kinds are {_known_kinds()} (a new '
                      'one: anp_jax/evaluators/<kind>.py registering itself, see '
                      'docs/evaluation.md).')
  return _REGISTRY[kind]


def _spec(config, prefix: str):
  """(class, options with defaults) of ``config.evals[prefix]``."""
  spec = config.evals[prefix]
  if not isinstance(spec, Mapping) and not hasattr(spec, 'keys'):
    raise ConfigError(f'config.evals.{prefix}={spec!r} is not an evaluator spec: use e.g. '
                      "dict(kind='classification', split='validation').")
  fields = dict(spec)
  if 'kind' not in fields:
    raise ConfigError(f'config.evals.{prefix} has no kind: add e.g. '
                      f"--config.evals.{prefix}.kind=classification.")
  cls = evaluator_class(fields.pop('kind'))
  unknown = sorted(set(fields) - set(cls.OPTIONS))
  if unknown:
    raise ConfigError(f'config.evals.{prefix} sets {unknown}, which its kind does not use; the '
                      f'options of {spec["kind"]!r} are {sorted(cls.OPTIONS)}.')
  return cls, {**cls.OPTIONS, **fields}


def check(config) -> None:
  """Validates ``config.evals``: prefixes, kinds and options (raises ConfigError)."""
  if not config.evals:
    raise ConfigError("config.evals is empty: a run's results come from its evaluations; keep "
                      "at least the default {'eval': {'kind': 'classification', 'split': "
                      "'validation'}}.")
  for prefix in config.evals:
    if not _PREFIX.match(prefix) or prefix == 'train':
      raise ConfigError(f'config.evals: the metric prefix {prefix!r} must be a name (letters, '
                        "digits, '_') other than 'train' (the training metrics).")
    cls, options = _spec(config, prefix)
    cls.check_options(config, prefix, options)


def metric_goal(config, name: str) -> Goal:
  """The `Goal` of metric `name` ('<prefix>/<metric>') of config.evals; ConfigError naming the
  metrics there are if no evaluator logs it."""
  prefix, _, metric = name.partition('/')
  if prefix in config.evals:
    cls, options = _spec(config, prefix)
    goals = cls.metrics(config, options)
    if metric in goals:
      return goals[metric]
    there = sorted(f'{prefix}/{m}' for m in goals)
  else:
    there = [f'{p}/...' for p in sorted(config.evals)]
  raise ConfigError(f'{name!r} is not a metric of config.evals; they are {there}.')


def create_all(config, run) -> Dict[str, Evaluator]:
  """The evaluators of config.evals, by prefix, built for `run` (see `Evaluator`)."""
  out = {}
  for prefix in sorted(config.evals):
    cls, options = _spec(config, prefix)
    out[prefix] = cls(prefix, options, run)
  return out


def summary(config, metrics: Mapping[str, float]) -> str:
  """The terminal line of an evaluation record: each evaluator's `Evaluator.summary`, the one
  under ``eval/`` first and unlabelled."""
  parts = []
  for prefix in sorted(config.evals, key=lambda p: (p != 'eval', p)):
    cls, _ = _spec(config, prefix)
    line = cls.summary(prefix, metrics)
    if line:
      parts.append(line if prefix == 'eval' else f'{prefix}: {line}')
  return '; '.join(parts)
