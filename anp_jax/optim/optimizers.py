"""``config.optimizer`` as an optax transformation, with weight decay and gradient clipping.

Weight decay skips BatchNorm parameters and biases (every parameter with fewer than 2 dims), and
so do the layer-wise trust ratios of LARS and LAMB.
"""

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ('sgd', 'nesterov', 'adamw', 'lars', 'lamb')


def decay_mask(params):
  """True for parameters that take weight decay: kernels, not BN scales/offsets or biases."""
  return jax.tree.map(lambda p: p.ndim > 1, params)


def base_optimizer(config, schedule: optax.Schedule,
                   clip: bool = True) -> optax.GradientTransformation:
  """config.optimizer with weight decay at one rate for every parameter, after clipping to
  config.grad_clip_norm (``clip``; the fine-tuning partition, `anp_jax.optim.create_optimizer`,
  clips once over all its groups and passes ``clip=False``)."""
  name = config.optimizer
  wd = config.weight_decay
  if name in ('sgd', 'nesterov'):
    tx = optax.chain(
        optax.add_decayed_weights(wd, mask=decay_mask),
        optax.sgd(schedule, momentum=config.momentum or None, nesterov=name == 'nesterov'))
  elif name == 'adamw':
    tx = optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2, weight_decay=wd,
                     mask=decay_mask)
  elif name == 'lars':
    tx = optax.lars(schedule, weight_decay=wd, weight_decay_mask=decay_mask,
                    trust_coefficient=config.lars_trust_coefficient,
                    trust_ratio_mask=decay_mask, momentum=config.momentum)
  elif name == 'lamb':
    # optax.lamb with the trust ratio restricted to decay_mask, as LARS above and reference LAMB
    # (You et al. 2020; exclude_from_layer_adaptation): BN scales/offsets and biases take the
    # plain Adam step (optax.lamb's mask covers weight decay only).
    tx = optax.chain(
        optax.scale_by_adam(b1=config.adam_b1, b2=config.adam_b2, eps=1e-6),
        optax.add_decayed_weights(wd, mask=decay_mask),
        optax.masked(optax.scale_by_trust_ratio(), decay_mask),
        optax.scale_by_learning_rate(schedule))
  else:
    raise ValueError(f'config.optimizer={name!r}; choose one of {OPTIMIZERS}.')
  if clip and config.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx


def global_norm_sq(tree) -> jax.Array:
  return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))
