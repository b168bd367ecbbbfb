"""The evaluations a run performs, through one interface (see docs/evaluation.md).

``config.evals`` maps a metric prefix to an evaluator spec, a `kind` and the kind's options::

    c.evals = {'eval': {'kind': 'classification', 'split': 'validation'}}   # The default.
    c.evals.test = dict(kind='classification', split='test')              # Also test/...

At every evaluation step the trainer runs each of them (`create_all`, then `Evaluator.evaluate`)
and logs their metrics, ``<prefix>/<name>``, in one record. A kind is an `Evaluator` subclass
registered under its name (`register`, in `anp_jax.registry.EVALUATORS`); the module
``anp_jax/evaluators/<kind>.py`` is imported the first time the kind is asked for, so a new
evaluation is one new file and no edit elsewhere (a class registered from any other imported
module works too). An evaluation of the model's predictions on a split subclasses
`PredictionEvaluator` and writes only its metric code: what to add up per device (`sums`) and
what to make of the totals (`finish`); the executor compiles and runs it over its own state
layout (`Executor.map_eval`), the loop over the split's batches is here.

What the rest of the code asks of the evaluators: `check` (config validation, no data read),
`metric_goal` (whether higher is better, for config.target_metric and config.keep_best_metric),
`summary` (the terminal line) and `add_entries` (``--config.evals.<prefix>.<field>`` flags for
entries or options the config file lacks).
"""

import re
from typing import Any, Dict, Mapping, NamedTuple, Optional, Type

from anp_jax import registry
from anp_jax.errors import ConfigError
from anp_jax.registry import Option  # noqa: F401  (OPTIONS may declare ranges and choices)


class Goal(NamedTuple):
  """How to read a metric: ``mode`` 'max' (higher is better) or 'min'; ``best`` its best possible
  value (None: unbounded), beyond which a target is unreachable."""
  mode: str
  best: Optional[float] = None


class Evaluator:
  """One evaluation of a run, logged under ``<prefix>/``.

  Subclasses set `OPTIONS` (the spec's fields besides ``kind``: a default, or an `Option` with
  its default and range or choices, checked before anything runs), declare their metrics
  (`metrics`, from the config alone: the config is validated before anything is built) and
  implement `evaluate` (or, for an evaluation of the model's predictions, subclass
  `PredictionEvaluator`). They are built once per run with the run's parts: ``run`` is the
  `anp_jax.trainer.Run` (``run.config``, ``run.builder`` the dataset, ``run.setup`` the batch
  sizes, ``run.executor`` the compiled evaluation (`map_eval`) and the transfers, ``run.model``).
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


EVALUATORS = registry.EVALUATORS
_PREFIX = re.compile(r'^[A-Za-z][A-Za-z0-9_]*$')


def register(kind: str):
  """Class decorator: ``@register('my_kind') class MyEval(Evaluator)`` makes
  ``config.evals.<prefix> = dict(kind='my_kind', ...)`` run it."""
  def add(cls):
    if kind in EVALUATORS and EVALUATORS.get(kind) is not cls:
      raise ValueError(f'Evaluator kind {kind!r} is registered twice ({EVALUATORS.get(kind)} and '
                       f'{cls}).')
    EVALUATORS.register(kind, cls, options=cls.OPTIONS)
    return cls
  return add


def evaluator_class(kind: str) -> Type[Evaluator]:
  """The class registered as `kind`, importing ``anp_jax.evaluators.<kind>`` on first use."""
  if kind not in EVALUATORS:
    raise ConfigError(f'Unknown evaluator kind {kind!r}; the kinds are {list(EVALUATORS.names())} '
                      f'({EVALUATORS.how}).')
  return EVALUATORS.get(kind)


def defaults(cls: Type[Evaluator]) -> Dict[str, Any]:
  """The options of an evaluator class at their defaults."""
  return {k: registry.as_option(v).default for k, v in cls.OPTIONS.items()}


def _spec(config, prefix: str):
  """(class, options with defaults) of ``config.evals[prefix]``; ConfigError for an option the
  kind does not have or a value out of its declared range or choices."""
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
  for name, value in fields.items():
    problem = registry.as_option(cls.OPTIONS[name]).error(f'evals.{prefix}.{name}', value)
    if problem:
      raise ConfigError(problem)
  return cls, {**defaults(cls), **fields}


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


def add_entries(config, kinds: Mapping[str, str]) -> None:
  """Completes ``config.evals`` (in place) for ``--config.evals.<prefix>.<field>`` flags, before
  they are applied: `kinds` maps each prefix the flags name to the kind a
  ``--config.evals.<prefix>.kind=K`` flag gives it (None: no such flag). A prefix the config
  lacks becomes an entry of that kind; every named entry gets its kind's options it lacks, at
  their defaults. So ``--config.evals.cal.kind=calibration --config.evals.cal.bins=20`` works
  with no config file. A new prefix without a kind is left alone (the flag then names an unknown
  field)."""
  for prefix, kind in kinds.items():
    if not _PREFIX.match(prefix):
      continue
    current = config.evals.get(prefix)
    kind = kind if kind is not None else (current.get('kind') if current is not None else None)
    if kind is None or kind not in EVALUATORS:
      continue
    if current is None:
      config.evals[prefix] = {'kind': kind}
      current = config.evals[prefix]
    for name, value in defaults(EVALUATORS.get(kind)).items():
      if name not in current:
        current[name] = value


class PredictionEvaluator(Evaluator):
  """An evaluation of the model's predictions on one split (option ``split``), exact.

  Subclasses write the metric code only:

  * ``sums(outputs, batch)``, per device and traced: ``outputs`` the model's evaluation-mode
    logits per head (``outputs['anp']``: (examples, classes)), ``batch`` the device's examples
    (``label_anp``, ``label_adjective``, ``label_noun``, ``mask``); returns a pytree of arrays
    to add over every example of the split. Weight each example by ``batch['mask']``: 0 marks
    the padding that makes every process run the same number of batches.
  * ``finish(sums)``, on the host: the totals (numpy) -> ``{metric name: float}``, without the
    prefix.

  Every process reads its shard of the split (`anp_jax.data.pipeline.eval_dataset`), padded to
  the same number of batches; the executor runs ``sums`` over its state layout and adds it over
  the devices (`Executor.map_eval`: one program per kind and options, shared by the entries of
  config.evals), adding each batch's sums to the running total in the same program, fetched
  once per split. So every example
  counts once, whatever the batch size, device or process count.
  """
  OPTIONS: Mapping[str, Any] = {'split': 'validation'}

  @classmethod
  def check_options(cls, config, prefix: str, options: Mapping[str, Any]) -> None:
    if not isinstance(options['split'], str) or not options['split']:
      raise ConfigError(f'config.evals.{prefix}.split={options["split"]!r}: name a split of the '
                        "dataset, e.g. 'validation'.")

  def __init__(self, prefix: str, options: Mapping[str, Any], run):
    from anp_jax.data import pipeline  # TensorFlow: only where an evaluation is built.
    super().__init__(prefix, options, run)
    self.split = options['split']
    splits = run.builder.info.splits
    if self.split not in splits:
      raise ConfigError(f'config.evals.{prefix}.split={self.split!r}: the dataset '
                        f'{run.builder.name} has no such split; it has {sorted(splits)}.')
    size = splits[self.split].num_examples
    if size < run.setup.process_count:
      raise ConfigError(f'config.evals.{prefix}: the split {self.split!r} has {size} examples, '
                        f'fewer than the {run.setup.process_count} processes.')
    self.num_batches = pipeline.num_eval_batches(size, run.setup.process_count,
                                                 run.setup.eval_per_process_batch)
    same = sorted((k, repr(v)) for k, v in self.options.items() if k != 'split')
    self._step = run.executor.map_eval(self.sums, key=(type(self), tuple(same)))

  def sums(self, outputs, batch):
    """Per device (traced): arrays to add over the split's examples (see the class docstring)."""
    raise NotImplementedError

  def finish(self, sums) -> Dict[str, float]:
    """On the host: the split's totals -> ``{metric: value}`` (names without the prefix)."""
    raise NotImplementedError

  def evaluate(self, state) -> Dict[str, float]:
    """One program per batch computes its sums and adds them to the running total on the
    devices (`anp_jax.executors.common.EvalStep.add`, in the batches' order: the same additions
    as one by one); the total is fetched once. The host never runs more than
    `preemption.MAX_IN_FLIGHT` batches ahead of the devices: XLA:CPU runs the per-device
    launches of multi-device programs on the pool that runs the programs, and those launches
    block while a device has too many programs queued. The split's batches come decoded from
    memory after its first evaluation in this process (`pipeline.eval_batches`)."""
    from anp_jax import preemption
    from anp_jax.data import pipeline
    import jax
    run = self.run
    total, n = None, 0
    for batch in pipeline.eval_batches(run.builder, run.config, split=self.split,
                                       per_process_batch=run.setup.eval_per_process_batch,
                                       to_device=run.executor.to_device):
      total = self._step.add(state, batch, total)
      n += 1
      if n % preemption.MAX_IN_FLIGHT == 0:
        jax.block_until_ready(total)
    if n != self.num_batches:  # Every process must run the same number of collectives.
      raise RuntimeError(f'Evaluation of {self.split!r} produced {n} batches, expected '
                         f'{self.num_batches}.')
    return {f'{self.prefix}/{k}': float(v)
            for k, v in self.finish(run.executor.fetch(total)).items()}
