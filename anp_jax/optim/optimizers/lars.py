"""LARS (You et al. 2017): ``config.optimizer='lars'``, a layer-wise trust ratio
``config.lars_trust_coefficient`` x |w| / |g + wd w| on the decay mask's parameters only (BN
scales/offsets and biases take the plain momentum step), ``config.momentum``."""

import optax

from anp_jax.optim.optimizers import MOMENTUM, OptimizerArgs, register_optimizer
from anp_jax.registry import Option


@register_optimizer('lars', explicit_momentum=True, options={
    'momentum': MOMENTUM, 'lars_trust_coefficient': Option(0.001, '> 0', 'the trust ratio')})
def lars(args: OptimizerArgs) -> optax.GradientTransformation:
  """Momentum SGD scaled per layer by a trust ratio (You et al. 2017), on kernels."""
  return optax.lars(args.learning_rate, weight_decay=args.weight_decay,
                    weight_decay_mask=args.decay_mask,
                    trust_coefficient=args.options['lars_trust_coefficient'],
                    trust_ratio_mask=args.decay_mask, momentum=args.options['momentum'])
