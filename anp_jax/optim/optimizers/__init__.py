"""``config.optimizer``: a registry of optax optimizers, one module per entry, with weight decay
and gradient clipping applied the same way to all.

An optimizer is one module in this folder (found by itself: `anp_jax.registry.OPTIMIZERS`)
calling `register_optimizer` on a factory ``factory(args: OptimizerArgs) ->
optax.GradientTransformation``; see docs/optim.md. The factory gets the learning-rate schedule,
the weight decay and the mask of the parameters it applies to (every parameter of 2 or more
dimensions: kernels, not BatchNorm scales/offsets or biases; LARS and LAMB restrict their
layer-wise trust ratios to the same mask), and the values of the options it declared. Clipping
to ``config.grad_clip_norm`` is added around every optimizer here (`base_optimizer`).
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from anp_jax import registry
from anp_jax.registry import Option

# Options several optimizers share (declared alike: one field, one meaning).
MOMENTUM = Option(0.9, '[0, 1)', '0 = plain SGD')
ADAM_B1 = Option(0.9, '[0, 1)', "Adam's first-moment decay")
ADAM_B2 = Option(0.999, '[0, 1)', "Adam's second-moment decay")


@dataclasses.dataclass(frozen=True)
class OptimizerArgs:
  """What an optimizer's factory builds from.

  Attributes:
    learning_rate: the schedule (`anp_jax.optim.create_lr_schedule`), step -> rate.
    weight_decay: ``config.weight_decay``: decay only the parameters of `decay_mask`.
    decay_mask: params -> a tree of bools, True for the parameters that take weight decay.
    options: the values of the options the optimizer declared, by field name.
  """
  learning_rate: optax.Schedule
  weight_decay: float
  decay_mask: Callable[[Any], Any]
  options: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """A registered optimizer: its factory, its options and the facts other parts read.

  Attributes:
    name: the ``config.optimizer`` that selects it.
    factory: ``factory(args: OptimizerArgs) -> optax.GradientTransformation``.
    options: the config fields it reads (`Option`), by name.
    explicit_momentum: it applies ``config.momentum`` as an explicit momentum, which
      ``async_sgd.momentum='compensate'`` may lower (`anp_jax.methods`).
    description: one line for the docs (default: the factory's docstring's first line).
  """
  name: str
  factory: Callable[[OptimizerArgs], optax.GradientTransformation]
  options: Mapping[str, Option]
  explicit_momentum: bool = False
  description: str = ''


def register_optimizer(name: str, *, options: Optional[Mapping[str, Any]] = None,
                       explicit_momentum: bool = False, description: str = '',
                       replace: bool = False):
  """Registers an optimizer factory under ``name`` (``config.optimizer``); a decorator::

    @optim.register_optimizer('lion', options={'lion_b1': optim.Option(0.9, '[0, 1)')})
    def lion(args: optim.OptimizerArgs) -> optax.GradientTransformation:
      return optax.lion(args.learning_rate, b1=args.options['lion_b1'],
                        weight_decay=args.weight_decay, mask=args.decay_mask)

  ``options`` are config fields (top level, e.g. ``config.lion_b1``) with their defaults and
  ranges: every config gets them, validation checks them. Returns the factory unchanged.
  """
  def add(factory):
    if not callable(factory):
      raise ValueError(f'register_optimizer({name!r}): the factory {factory!r} is not callable.')
    declared = {k: registry.as_option(v) for k, v in dict(options or {}).items()}
    doc = description or (factory.__doc__ or '').strip().split('\n')[0]
    registry.OPTIMIZERS.register(
        name, OptimizerSpec(name=name, factory=factory, options=declared,
                            explicit_momentum=explicit_momentum, description=doc),
        options=declared, replace=replace)
    return factory
  return add


# A live, sorted view of the registered names (`anp_jax.setup.CHOICES` holds it).
OPTIMIZERS = registry.OPTIMIZERS.view()


def names() -> Tuple[str, ...]:
  """The registered optimizers, sorted (every module of this package imported first)."""
  return registry.OPTIMIZERS.names()


def spec(name: str) -> OptimizerSpec:
  """The optimizer registered as `name`; ConfigError listing the names if none is."""
  return registry.OPTIMIZERS.get(name)


def decay_mask(params):
  """True for parameters that take weight decay: kernels, not BN scales/offsets or biases."""
  return jax.tree.map(lambda p: p.ndim > 1, params)


def base_optimizer(config, schedule: optax.Schedule,
                   clip: bool = True) -> optax.GradientTransformation:
  """config.optimizer with weight decay at one rate for every parameter, after clipping to
  config.grad_clip_norm (``clip``; the fine-tuning partition, `anp_jax.optim.create_optimizer`,
  clips once over all its groups and passes ``clip=False``)."""
  chosen = spec(config.optimizer)
  tx = chosen.factory(OptimizerArgs(
      learning_rate=schedule, weight_decay=config.weight_decay, decay_mask=decay_mask,
      options=registry.option_values(config, chosen.options)))
  if clip and config.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx


def global_norm_sq(tree) -> jax.Array:
  return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))
