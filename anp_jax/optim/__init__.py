"""Optimization: learning-rate schedules, optax optimizers and the fine-tuning partition.

* `anp_jax.optim.schedules`: the learning-rate scaling rule and the warmup + decay schedule, in
  epochs (``scaled_lr``, ``create_lr_schedule``).
* `anp_jax.optim.optimizers`: ``config.optimizer`` with weight decay and clipping, one rate for
  every parameter (``base_optimizer``), and the masks they share.
* `anp_jax.optim.partition`: ``config.freeze`` and ``config.backbone_lr_multiplier``: which
  parameters get no update or a scaled rate, one global gradient clip over the rest
  (``create_optimizer``: the optimizer a run uses), and the guards that keep frozen parameters
  and BatchNorm statistics bit-exact.
"""

from anp_jax.optim.optimizers import (OPTIMIZERS, base_optimizer, decay_mask,  # noqa: F401
                                      global_norm_sq)
from anp_jax.optim.partition import (BACKBONE, FROZEN, FULL, create_optimizer,  # noqa: F401
                                     freeze_summary, keep_frozen_params, keep_frozen_stats,
                                     param_labels, validate)
from anp_jax.optim.schedules import (SCALING_RULES, SCHEDULES, create_lr_schedule,  # noqa: F401
                                     scaled_lr)
