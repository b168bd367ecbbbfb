"""AdamW (Loshchilov and Hutter 2019): ``config.optimizer='adamw'``, decoupled weight decay on
the decay mask's parameters, ``config.adam_b1`` / ``adam_b2``."""

import optax

from anp_jax.optim.optimizers import ADAM_B1, ADAM_B2, OptimizerArgs, register_optimizer


@register_optimizer('adamw', options={'adam_b1': ADAM_B1, 'adam_b2': ADAM_B2})
def adamw(args: OptimizerArgs) -> optax.GradientTransformation:
  """Adam with decoupled weight decay (Loshchilov and Hutter 2019)."""
  return optax.adamw(args.learning_rate, b1=args.options['adam_b1'], b2=args.options['adam_b2'],
                     weight_decay=args.weight_decay, mask=args.decay_mask)
