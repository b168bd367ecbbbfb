"""LAMB (You et al. 2020): ``config.optimizer='lamb'``, Adam's direction (``config.adam_b1`` /
``adam_b2``) plus weight decay, scaled by the layer-wise trust ratio |w| / |u| on the decay
mask's parameters only."""

import optax

from anp_jax.optim.optimizers import ADAM_B1, ADAM_B2, OptimizerArgs, register_optimizer


@register_optimizer('lamb', options={'adam_b1': ADAM_B1, 'adam_b2': ADAM_B2})
def lamb(args: OptimizerArgs) -> optax.GradientTransformation:
  """Adam's direction scaled per layer by a trust ratio (You et al. 2020), on kernels."""
  # optax.lamb with the trust ratio restricted to decay_mask, as LARS and reference LAMB
  # (You et al. 2020; exclude_from_layer_adaptation): BN scales/offsets and biases take the
  # plain Adam step (optax.lamb's mask covers weight decay only).
  return optax.chain(
      optax.scale_by_adam(b1=args.options['adam_b1'], b2=args.options['adam_b2'], eps=1e-6),
      optax.add_decayed_weights(args.weight_decay, mask=args.decay_mask),
      optax.masked(optax.scale_by_trust_ratio(), args.decay_mask),
      optax.scale_by_learning_rate(args.learning_rate))
