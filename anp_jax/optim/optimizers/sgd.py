"""SGD with (heavy-ball) momentum, and its Nesterov variant: ``config.optimizer='sgd'`` /
``'nesterov'``, ``config.momentum`` (0: plain SGD). Weight decay is added to the gradient (L2),
on the decay mask's parameters."""

import optax

from anp_jax.optim.optimizers import MOMENTUM, OptimizerArgs, register_optimizer


def _sgd(args: OptimizerArgs, nesterov: bool) -> optax.GradientTransformation:
  return optax.chain(
      optax.add_decayed_weights(args.weight_decay, mask=args.decay_mask),
      optax.sgd(args.learning_rate, momentum=args.options['momentum'] or None, nesterov=nesterov))


@register_optimizer('sgd', options={'momentum': MOMENTUM}, explicit_momentum=True)
def sgd(args: OptimizerArgs) -> optax.GradientTransformation:
  """SGD with heavy-ball momentum; L2 weight decay added to the gradient."""
  return _sgd(args, nesterov=False)


@register_optimizer('nesterov', options={'momentum': MOMENTUM}, explicit_momentum=True)
def nesterov(args: OptimizerArgs) -> optax.GradientTransformation:
  """SGD with Nesterov momentum; L2 weight decay added to the gradient."""
  return _sgd(args, nesterov=True)
