"""Optimization: learning-rate schedules, optax optimizers and the fine-tuning partition.

* `anp_jax.optim.schedules`: the learning-rate scaling rule and ``config.schedule``, a registry
  of schedules (one module each in ``schedules/``), behind a linear warmup, in epochs
  (``scaled_lr``, ``create_lr_schedule``, ``register_schedule``).
* `anp_jax.optim.optimizers`: ``config.optimizer``, a registry of optax optimizers (one module
  each in ``optimizers/``), with weight decay and clipping, one rate for every parameter
  (``base_optimizer``, ``register_optimizer``), and the masks they share.
* `anp_jax.optim.partition`: ``config.freeze`` and ``config.backbone_lr_multiplier``: which
  parameters get no update or a scaled rate, one global gradient clip over the rest
  (``create_optimizer``: the optimizer a run uses), and the guards that keep frozen parameters
  and BatchNorm statistics bit-exact.

How to add an optimizer or a schedule: docs/optim.md. The names below are loaded when first
used (PEP 562), so that importing ``anp_jax.optim.schedules`` (the planner reads which schedules
decay) imports no JAX.
"""

import importlib

from anp_jax.registry import Option  # noqa: F401

_WHERE = {
    'OPTIMIZERS': 'optimizers', 'OptimizerArgs': 'optimizers', 'base_optimizer': 'optimizers',
    'decay_mask': 'optimizers', 'global_norm_sq': 'optimizers',
    'register_optimizer': 'optimizers',
    'BACKBONE': 'partition', 'FROZEN': 'partition', 'FULL': 'partition',
    'create_optimizer': 'partition', 'freeze_summary': 'partition',
    'keep_frozen_params': 'partition', 'keep_frozen_stats': 'partition',
    'param_labels': 'partition', 'validate': 'partition',
    'SCALING_RULES': 'schedules', 'SCHEDULES': 'schedules', 'Decay': 'schedules',
    'ScheduleArgs': 'schedules', 'create_lr_schedule': 'schedules',
    'register_schedule': 'schedules', 'scaled_lr': 'schedules',
}


def __getattr__(name):
  module = _WHERE.get(name)
  if module is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  value = getattr(importlib.import_module(f'{__name__}.{module}'), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_WHERE))
