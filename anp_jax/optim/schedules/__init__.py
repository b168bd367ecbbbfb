"""Learning-rate scaling rules and schedules: ``config.lr_scaling``, ``config.schedule``.

The global batch size is the knob: ``peak_lr = base_lr * rule(batch_size / base_batch_size)``
with rule ``linear`` (Goyal et al. 2017), ``sqrt`` (Krizhevsky 2014; Hoffer et al. 2017) or
``none``; warmup and decay are given in epochs (of train_size examples, see
`anp_jax.durations`), so a batch-size sweep changes one number.

A schedule is one module in this folder (found by itself: `anp_jax.registry.SCHEDULES`) calling
`register_schedule` on a factory ``factory(args: ScheduleArgs) -> optax.Schedule``: the rate
after the warmup, from the scaled peak (`create_lr_schedule` adds the linear warmup in front).
Its registration says whether it decays (the planner's budget reads it: a target crossed deep in
a decay leans on the schedule's end). This package and its modules import no JAX at the top
(optax inside the factories), so that the planner reads those facts without JAX.
"""

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional, Tuple

from anp_jax import durations, registry
from anp_jax.registry import Option

SCALING_RULES = ('linear', 'sqrt', 'none')


@dataclasses.dataclass(frozen=True)
class ScheduleArgs:
  """What a schedule's factory builds from (all in steps).

  Attributes:
    peak: the scaled peak rate (`scaled_lr`), where the warmup ends.
    warmup_steps: the warmup's steps (``config.warmup_epochs``; at most `total_steps`).
    total_steps: the run's steps.
    steps_per_epoch: train_size / batch_size: converts an option in epochs to steps
      (`epochs_to_steps`).
    options: the values of the options the schedule declared, by field name.
  """
  peak: float
  warmup_steps: int
  total_steps: int
  steps_per_epoch: float
  options: Mapping[str, Any]

  @property
  def decay_steps(self) -> int:
    """The steps after the warmup (at least 1): what the factory's schedule spans."""
    return max(1, self.total_steps - self.warmup_steps)

  def epochs_to_steps(self, epochs: float) -> int:
    """A duration in epochs in this run's steps (`anp_jax.durations`)."""
    return durations.to_steps(steps_per_epoch=self.steps_per_epoch, epochs=epochs)


@dataclasses.dataclass(frozen=True)
class Decay:
  """A factory's schedule with the rate the warmup rises to when it is not the peak (a step
  decay whose boundaries lie inside the warmup lowers the ramp's top)."""
  schedule: Callable
  top: float


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
  """A registered schedule: its factory, its options and the facts other parts read.

  Attributes:
    name: the ``config.schedule`` that selects it.
    factory: ``factory(args: ScheduleArgs) -> optax.Schedule`` (or a `Decay`): the rate from
      the first step after the warmup (its step 0) on.
    decays: whether the rate falls over the run (the planner flags a target crossed after 60 %
      of a decaying schedule's budget as 'late', `anp_jax.research.planner.budget`).
    options: the config fields it reads (`Option`), by name.
    description: one line for the docs (default: the factory's docstring's first line).
  """
  name: str
  factory: Callable[[ScheduleArgs], Any]
  decays: bool
  options: Mapping[str, Option]
  description: str = ''


def register_schedule(name: str, *, decays: bool, options: Optional[Mapping[str, Any]] = None,
                      description: str = '', replace: bool = False):
  """Registers a schedule factory under ``name`` (``config.schedule``); a decorator::

    @optim.register_schedule('linear', decays=True)
    def linear(args: optim.ScheduleArgs):
      \"\"\"Linear decay from the peak to 0 at the run's last step.\"\"\"
      import optax  # Inside: the planner reads `decays` without JAX.
      return optax.linear_schedule(args.peak, 0.0, args.decay_steps)

  ``decays`` is required: whether the rate falls over the run. ``options`` are config fields
  (top level) with their defaults and ranges. Returns the factory unchanged.
  """
  if not isinstance(decays, bool):
    raise ValueError(f'register_schedule({name!r}): decays={decays!r} must be True or False.')

  def add(factory):
    if not callable(factory):
      raise ValueError(f'register_schedule({name!r}): the factory {factory!r} is not callable.')
    declared = {k: registry.as_option(v) for k, v in dict(options or {}).items()}
    doc = description or (factory.__doc__ or '').strip().split('\n')[0]
    registry.SCHEDULES.register(
        name, ScheduleSpec(name=name, factory=factory, decays=decays, options=declared,
                           description=doc),
        options=declared, replace=replace)
    return factory
  return add


# A live, sorted view of the registered names (`anp_jax.setup.CHOICES` holds it).
SCHEDULES = registry.SCHEDULES.view()


def names() -> Tuple[str, ...]:
  """The registered schedules, sorted (every module of this package imported first)."""
  return registry.SCHEDULES.names()


def spec(name: str) -> ScheduleSpec:
  """The schedule registered as `name`; ConfigError listing the names if none is."""
  return registry.SCHEDULES.get(name)


def decays(name: str) -> bool:
  """Whether schedule `name` lowers the rate over the run (its registration says)."""
  return spec(name).decays


def scaled_lr(config) -> float:
  ratio = config.batch_size / config.base_batch_size
  rule = config.lr_scaling
  if rule == 'linear':
    return config.base_lr * ratio
  if rule == 'sqrt':
    return config.base_lr * math.sqrt(ratio)
  if rule == 'none':
    return config.base_lr
  raise ValueError(f'config.lr_scaling={rule!r}; choose one of {SCALING_RULES}.')


def create_lr_schedule(config, steps_per_epoch: float, total_steps: int):
  """Linear warmup from 0 to the scaled peak, then ``config.schedule`` (its factory).

  ``steps_per_epoch`` = train_size / batch_size (need not be an integer); warmup is converted
  to steps by `anp_jax.durations`. A run shorter than its warmup (e.g. a ``num_train_steps``
  override) ramps to the peak over the whole run (warmup = min(warmup, total_steps)), so it is
  not a prefix of the longer run; neither is any run of another length under a schedule whose
  length is the run's (cosine). The ramp (steps 0 .. warmup - 1) rises linearly to the peak,
  or to the `Decay.top` the schedule's factory asks for; the first step already uses a non-zero
  rate, lr(0) = top / warmup.
  """
  import optax  # Here: the planner imports this package without JAX.
  peak = scaled_lr(config)
  warmup = durations.to_steps(steps_per_epoch=steps_per_epoch, epochs=config.warmup_epochs)
  warmup = min(warmup, total_steps)
  chosen = spec(config.schedule)
  made = chosen.factory(ScheduleArgs(
      peak=peak, warmup_steps=warmup, total_steps=total_steps, steps_per_epoch=steps_per_epoch,
      options=registry.option_values(config, chosen.options)))
  top, decay = (made.top, made.schedule) if isinstance(made, Decay) else (peak, made)
  if warmup == 0:
    return decay
  ramp = optax.linear_schedule(top / warmup, top, warmup - 1) if warmup > 1 else (
      optax.constant_schedule(top))
  return optax.join_schedules([ramp, decay], [warmup])
