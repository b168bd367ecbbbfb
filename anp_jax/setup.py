"""From a config and the job's devices to a checked plan of the run: `validate_config`, `Setup`.

`validate_config` fails fast, before any data is read or anything compiled, with what to change
(every enumerated field through `CHOICES`, then the numbers, the method's section through
`anp_jax.methods.validate`, the fine-tuning source and the data directory); the trainer calls
it once per run. `resolve_setup` derives every batch size and duration of the run from the config,
the dataset sizes and the job's devices, and checks that they divide: durations are converted to
steps by `anp_jax.durations`, so the rest of the code only deals with steps.
"""

import collections.abc
import dataclasses
import json
from typing import Any, Dict, Iterator, Mapping, Optional

import jax

from anp_jax import durations, evaluators, methods, models, optim, pretrained, ranges, registry
from anp_jax.configs import default as default_config
from anp_jax.data import pipeline, synthetic, windows
from anp_jax.errors import ConfigError
from anp_jax.ranges import Range  # noqa: F401  (the parsed form of a RANGES entry)


@dataclasses.dataclass(frozen=True)
class Setup:
  """Every size the run derives from the config and the job's devices (logged at start-up)."""
  process_count: int
  local_devices: int
  devices: int
  batch_size: int  # Global examples per optimizer step.
  per_process_batch: int
  per_device_batch: int
  accum_steps: int
  per_device_micro_batch: int
  eval_per_process_batch: int
  num_eval_batches: int
  steps_per_epoch: float  # train_size / batch_size: an epoch is train_size examples.
  total_steps: int
  eval_every_steps: int
  train_size: int

  def steps(self, epochs: float, rounding: str = 'round', minimum: int = 0) -> int:
    """A duration in epochs (of train_size examples) in this run's steps."""
    return durations.to_steps(steps_per_epoch=self.steps_per_epoch, epochs=epochs,
                              rounding=rounding, minimum=minimum)

  def progress(self, step: int, prefix: str) -> Dict[str, float]:
    """``prefix/examples_seen``, ``prefix/passes`` (and ``prefix/epoch`` = passes) at `step`."""
    seen = durations.examples_seen(step, self.batch_size)
    passes = durations.passes(step, self.batch_size, self.train_size)
    return {f'{prefix}/examples_seen': float(seen), f'{prefix}/passes': passes,
            f'{prefix}/epoch': passes}

  def describe(self) -> str:
    micro = (f', {self.accum_steps} micro-batches of {self.per_device_micro_batch}/device'
             if self.accum_steps > 1 else '')
    return (f'{self.process_count} process(es) x {self.local_devices} device(s) = '
            f'{self.devices} devices; global batch {self.batch_size} -> '
            f'{self.per_process_batch}/process -> {self.per_device_batch}/device{micro}; '
            f'{self.steps_per_epoch:.4g} steps/epoch, {self.total_steps} steps = '
            f'{self.total_steps * self.batch_size} examples '
            f'({self.total_steps * self.batch_size / self.train_size:.3g} passes); eval '
            f'{self.num_eval_batches} batches of {self.eval_per_process_batch}/process')


class _WithDeclared(collections.abc.Mapping):
  """A table of config fields: `own` entries, then those the registered entries' options
  declare (`anp_jax.registry.declared_options`, through `declared`). Live: an option of a model,
  optimizer or schedule registered after import is in it too."""

  def __init__(self, own: Mapping[str, Any], declared):
    self.own, self._declared = dict(own), declared

  def _all(self) -> Dict[str, Any]:
    return {**self.own, **self._declared()}

  def __getitem__(self, field: str):
    return self._all()[field]

  def __iter__(self) -> Iterator[str]:
    return iter(self._all())

  def __len__(self) -> int:
    return len(self._all())


def _declared_choices() -> Dict[str, Any]:
  return {field: tuple(o.choices) for field, o in registry.declared_options().items()
          if o.choices}


def _declared_ranges() -> Dict[str, Any]:
  return {field: (o.range, o.doc) for field, o in registry.declared_options().items()
          if o.range}


# Every enumerated config field (dotted path) and its allowed values: `validate_config` checks
# them all in one loop, before anything is read or compiled. The tuples live next to the code
# that dispatches on them; the registries' names are live views (a model, optimizer or schedule
# registered later is valid too), and the choices of their entries' options join the table.
CHOICES = _WithDeclared({
    'dataset': pipeline.DATASETS,
    'augment': pipeline.AUGMENTS,
    'input_backend': windows.BACKENDS,
    'model.name': models.NAMES,
    'model.dtype': tuple(models.DTYPES),
    'bn_mode': models.BN_MODES,
    'optimizer': optim.OPTIMIZERS,
    'lr_scaling': optim.SCALING_RULES,
    'schedule': optim.SCHEDULES,
    'executor': methods.EXECUTORS,
    'method': methods.METHODS,
    'async_sgd.staleness': methods.STALENESS,
    'async_sgd.momentum': methods.MOMENTUM_MODES,
}, _declared_choices)
# Why a value someone may expect is refused (appended to the message).
_CHOICE_HINTS = {'model.dtype': models.DTYPE_HINTS}


def _check_choices(config) -> None:
  registries = registry.by_field()
  for field, allowed in CHOICES.items():
    node = config
    for part in field.split('.'):
      if part not in node:  # A config without the section keeps the code's default.
        break
      node = node[part]
    else:
      if node not in allowed:
        if field in registries:  # The names there are, and how to add one.
          raise ConfigError(registries[field].unknown(node))
        hint = _CHOICE_HINTS.get(field, {}).get(node, '') if isinstance(node, str) else ''
        raise ConfigError(f'config.{field}={node!r} is unknown; choose one of {allowed}.'
                         + (f' {hint}' if hint else ''))


flat_fields = default_config.flat_fields  # Re-exported (the runner imports it from here).


# What one process of a job may set for itself: a node-local copy of the data, its terminal.
PER_PROCESS_FIELDS = ('data_dir', 'progress_bar')


def job_identity(config, workdir: str) -> Dict[str, Any]:
  """What every process of a job must agree on (`distributed.check_same_everywhere`): every
  config field but `PER_PROCESS_FIELDS`, and the workdir."""
  fields = flat_fields(json.loads(config.to_json_best_effort()))
  return {**{k: v for k, v in fields.items() if k not in PER_PROCESS_FIELDS}, 'workdir': workdir}


def validate_config(config) -> None:
  """Fails fast, before any data is read or anything compiled, with what to change."""
  for field in default_config.REPLACED_FIELDS:
    if field in config:  # A config file or a caller that still sets it: it would do nothing.
      raise ConfigError(default_config.replaced_field_message(field))
  _check_choices(config)
  check_ranges(config)  # Every number, before any check below computes with one.
  min_size = models.spec(config.model.name).min_image_size
  if config.image_size < min_size:
    fitting = [n for n in models.names() if models.spec(n).min_image_size <= config.image_size]
    raise ConfigError(f'config.image_size={config.image_size} is too small for '
                     f'{config.model.name} (needs >= {min_size} px); raise image_size or pick a '
                     f'model that accepts it ({", ".join(fitting) or "none is registered"}).')
  if config.num_train_steps == 0:
    raise ConfigError('Nothing to train: config.num_train_steps=0; use -1 to train '
                      f'config.num_epochs (={config.num_epochs}) epochs, or a step count > 0.')
  if config.num_train_steps < 0 and config.num_epochs <= 0:
    raise ConfigError('Nothing to train: set config.num_epochs > 0 or config.num_train_steps > 0 '
                     f'(got num_epochs={config.num_epochs}, '
                     f'num_train_steps={config.num_train_steps}).')
  _check_evaluation(config)
  if config.augment == 'cifar' and not config.crop_padding < config.image_size:
    raise ConfigError(f'config.crop_padding={config.crop_padding} must be in [0, image_size) '
                      f'= [0, {config.image_size}) for the cifar augmentation.')
  methods.validate(config)
  optim.validate(config)
  pretrained.validate(config)
  pipeline.check_data_dir(config)
  windows.check_backend(config)


# Every numeric field of the config (dotted path) and the values it allows, in one table that
# `validate_config` applies before any other check computes with a number (`check_ranges`). A
# value out of range would otherwise fail late (a traceback at the first batch or log, after the
# workdir is written) or run silently wrong (a negative clip norm or loss weight turns descent
# into ascent, a width of 0 gives 1-channel layers, a seed past 32 bits repeats a smaller one).
# A range is written `'> a'`, `'>= a'` or an interval `'[a, b)'` (brackets as in mathematics),
# prefixed `'integer '` for an integer field or `'each '` for a sequence of numbers; a float is
# also always finite (NaN passes every comparison, inf overflows) (`anp_jax.ranges`). With a
# reason: (range, why). Ranges that depend on other fields (image_size on the model,
# crop_padding < image_size, ghost groups dividing the micro-batch, tau <= max_tau, ...) are
# checked after, where they are used.
_OWN_RANGES: Dict[str, Any] = {
    'seed': ('integer in [0, 4294967295]', "JAX keeps a seed's low 32 bits: a larger one would "
             'repeat a smaller one'),
    # The generated dataset (checked again, with num_pairs against the other two, by
    # `synthetic.make_config`).
    'synthetic.num_adjectives': f'integer in [1, {len(synthetic.ADJECTIVES)}]',
    'synthetic.num_nouns': f'integer in [1, {len(synthetic.NOUNS)}]',
    'synthetic.num_pairs': ('integer >= 1', 'at most num_adjectives x num_nouns'),
    'synthetic.image_size': 'integer >= 16',
    'synthetic.train_per_class': 'integer >= 1',
    'synthetic.eval_per_class': 'integer >= 1',
    'synthetic.test_per_class': ('integer >= 0', '0: eval_per_class'),
    'synthetic.label_noise': '[0, 1)',
    'synthetic.seed': 'integer >= 0',
    'image_size': 'integer >= 1',
    'crop_padding': 'integer >= 0',
    'crop_fraction': ('(0, 1]', "the centre crop's share of the image"),
    # The model and the loss.
    'model.width': ('> 0', 'the channel multiplier; 1.0 = the published widths'),
    'loss_weights.anp': ('>= 0', "a negative weight ascends that head's loss"),
    'loss_weights.adjective': ('>= 0', "a negative weight ascends that head's loss"),
    'loss_weights.noun': ('>= 0', "a negative weight ascends that head's loss"),
    'label_smoothing': '[0, 1)',
    'bn_group_size': ('integer >= 1', 'examples per ghost BatchNorm group'),
    'bn_momentum': ('[0, 1]', "the running statistics' decay"),
    # The optimisation.
    'batch_size': 'integer >= 1',
    'eval_batch_size': 'integer >= 1',
    'grad_accum_steps': 'integer >= 1',
    'base_batch_size': 'integer >= 1',
    'weight_decay': '>= 0',
    'base_lr': '> 0',
    'warmup_epochs': '>= 0',
    'grad_clip_norm': ('>= 0', '0 disables clipping'),
    'num_epochs': ('>= 0', 'unused when num_train_steps > 0'),
    'num_train_steps': ('integer >= -1', '-1: train num_epochs'),
    # Evaluation, logging, methods, fine-tuning, checkpoints.
    'target_value': ('>= 0', '0: no target'),
    'log_every_steps': 'integer >= 1',
    'eval_every_epochs': ('>= 0', '0: evaluate at the end only'),
    'noise_scale_ema': '[0, 1)',
    'async_sgd.tau': ('>= 0', 'an integer for the constant staleness, the mean for the geometric'),
    'async_sgd.max_tau': ('integer >= 0', 'the parameter history kept'),
    'async_sgd.workers': 'integer >= 1',
    'async_sgd.compute_cv': '>= 0',
    'async_sgd.seed': 'integer >= 0',
    'local_sgd.nodes': ('integer >= 0', '0 = one node per JAX process'),
    'local_sgd.sync_every': ('integer >= 1', 'steps between parameter averages'),
    'backbone_lr_multiplier': ('>= 0', 'the fraction of the learning rate for loaded parameters'),
    'checkpoint_every_steps': ('integer >= 0', '0 disables step-based saves'),
    'checkpoint_every_minutes': ('>= 0', '0 disables time-based saves'),
    'keep_checkpoints': ('integer >= 1', '0 would delete the last checkpoint too, so a preempted '
                         'run could not resume'),
}
# Numeric fields of the config any value of which is valid, and why (none today; the tests walk
# every numeric field of the default config: each is in RANGES or here).
UNCONSTRAINED: Dict[str, str] = {}
# The table `check_ranges` applies: the config's own fields above, then the ranges of the options
# the registered models, optimizers and schedules declare (`anp_jax.registry.Option`: e.g.
# momentum, adam_b1, step_epochs).
RANGES = _WithDeclared(_OWN_RANGES, _declared_ranges)


def range_of(field: str) -> Range:
  """The parsed `RANGES` entry of `field` (dotted)."""
  return ranges.parse(RANGES[field])


def check_ranges(config) -> None:
  """Raises ConfigError naming the first field of `RANGES` whose value `config` has out of its
  range (a field the config lacks keeps the code's default, as in `_check_choices`)."""
  for field, entry in RANGES.items():
    node = config
    for part in field.split('.'):
      if not hasattr(node, 'keys') or part not in node:
        break
      node = node[part]
    else:
      error = ranges.error(field, ranges.parse(entry), node)
      if error:
        raise ConfigError(error)


def _check_evaluation(config) -> None:
  """config.evals (`evaluators.check`), the metric that keeps the best checkpoint, and the
  target: config.target_metric a higher-is-better metric of config.evals, config.target_value a
  value it can reach (0: no target), config.stop_at_target with periodic evaluations.

  The target metric is checked when there is a target (config.stop_at_target needs one), or
  when the config names one other than the default: without a target nothing reads the default
  (`default.DEFAULT_TARGET_METRIC`), so a config whose evaluators log no ``eval/`` metric needs
  no target metric."""
  evaluators.check(config)
  if config.keep_best_metric:
    try:
      evaluators.metric_goal(config, config.keep_best_metric)
    except ConfigError as e:
      raise ConfigError(f'config.keep_best_metric: {e}') from None
  metric, value = config.target_metric, float(config.target_value)
  if metric and (value or metric != default_config.DEFAULT_TARGET_METRIC):
    try:
      goal = evaluators.metric_goal(config, metric)
    except ConfigError as e:
      raise ConfigError(f'config.target_metric: {e}') from None
    if goal.mode != 'max':
      raise ConfigError(f'config.target_metric={metric!r} is lower-is-better; a target is reached '
                        'when the metric is >= config.target_value: use an evaluation accuracy, '
                        "e.g. 'eval/anp_top1', 'eval/noun_top5'.")
    if value < 0 or (goal.best is not None and value > goal.best):
      raise ConfigError(f'config.target_value={value} is an unreachable target for {metric} '
                        f'(best possible: {goal.best}); use a value in (0, {goal.best}] (or 0 '
                        'for no target).')
  elif value:
    raise ConfigError(f'config.target_value={value} needs config.target_metric (the metric it '
                      'is a value of).')
  if config.stop_at_target:
    if not value:
      raise ConfigError('config.stop_at_target=True needs a target: set config.target_value '
                        f'for config.target_metric={metric!r}.')
    if config.eval_every_epochs <= 0:
      raise ConfigError('config.stop_at_target needs periodic evaluation: set '
                        'config.eval_every_epochs > 0.')


def resolve_setup(config, train_size: int, eval_size: int, devices: Optional[int] = None,
                  local_devices: Optional[int] = None,
                  process_count: Optional[int] = None) -> Setup:
  """Derives and checks every batch size; raises with what to change."""
  devices = jax.device_count() if devices is None else devices
  local_devices = jax.local_device_count() if local_devices is None else local_devices
  process_count = jax.process_count() if process_count is None else process_count
  if config.method == 'local_sgd':
    methods.resolve_nodes(config, devices, process_count)  # Divides the job's devices?
  b, k = int(config.batch_size), int(config.grad_accum_steps)
  if b % devices:
    raise ConfigError(f'config.batch_size={b} (the global batch) is not divisible by the '
                     f'{devices} devices of this job; use a multiple of {devices}, e.g. '
                     f'{max(devices, b // devices * devices)}.')
  per_device = b // devices
  if per_device % k:
    raise ConfigError(f'The per-device batch {per_device} (= batch_size {b} / {devices} devices) '
                     f'is not divisible by config.grad_accum_steps={k}.')
  micro = per_device // k
  if config.bn_mode == 'ghost' and micro % config.bn_group_size:
    raise ConfigError(f'Ghost BatchNorm needs the per-device micro-batch ({micro}) to be a '
                     f'multiple of config.bn_group_size={config.bn_group_size}; change '
                     'batch_size, grad_accum_steps or bn_group_size.')
  eb = int(config.eval_batch_size)
  if eb % devices:
    raise ConfigError(f'config.eval_batch_size={eb} is not divisible by the {devices} devices; '
                     f'use a multiple of {devices}.')
  per_process = b // process_count
  if train_size // devices < per_device:
    raise ConfigError(f'The training split has {train_size} examples: fewer than one per-device '
                     f'batch ({per_device}) for each of the {devices} devices. Lower '
                     'batch_size or use more data.')
  if eval_size < process_count:
    raise ConfigError(f'The evaluation split has {eval_size} examples, fewer than the '
                     f'{process_count} processes.')
  # Durations are in examples: an epoch is train_size examples at any batch size (the stream
  # crosses epoch boundaries, nothing is dropped), converted to steps by `anp_jax.durations`.
  steps_per_epoch = train_size / b
  if config.num_train_steps > 0:
    total = int(config.num_train_steps)
  else:
    total = durations.to_steps(steps_per_epoch=steps_per_epoch, epochs=config.num_epochs,
                               rounding='ceil', minimum=1)
  eval_every = durations.to_steps(steps_per_epoch=steps_per_epoch,
                                  epochs=config.eval_every_epochs, minimum=1) if (
      config.eval_every_epochs > 0) else total
  eval_pp = eb // process_count
  return Setup(process_count=process_count, local_devices=local_devices, devices=devices,
               batch_size=b, per_process_batch=per_process, per_device_batch=per_device,
               accum_steps=k, per_device_micro_batch=micro, eval_per_process_batch=eval_pp,
               num_eval_batches=pipeline.num_eval_batches(eval_size, process_count, eval_pp),
               steps_per_epoch=steps_per_epoch, total_steps=total, eval_every_steps=eval_every,
               train_size=train_size)
