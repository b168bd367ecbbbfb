"""Any optax optimizer by name: ``config.optimizer='optax'``, ``config.optax_name`` (e.g.
``'lion'``, ``'adafactor'``, ``'rmsprop'``: a function of `optax` taking the learning rate
first) with the keyword arguments ``config.optax_kwargs`` (a Python dict literal, e.g.
``"{'b1': 0.95}"``, text so that ``--config.optax_kwargs=...`` sets any of them).

Weight decay: an optax function with a ``weight_decay`` argument (adamw, lion, ...) gets
``config.weight_decay`` and the decay mask (decoupled, as its authors define it); any other
gets L2 decay added to the gradient first, on the same mask, as ``sgd`` does.
"""

import ast
import inspect

import optax

from anp_jax.errors import ConfigError
from anp_jax.optim.optimizers import OptimizerArgs, register_optimizer
from anp_jax.registry import Option


def _kwargs(text) -> dict:
  try:
    value = ast.literal_eval(text) if isinstance(text, str) else None
  except (ValueError, SyntaxError):
    value = None
  if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
    raise ConfigError(f'config.optax_kwargs={text!r}: write a Python dict literal of keyword '
                      "arguments, e.g. \"{'b1': 0.95, 'b2': 0.98}\".")
  return value


@register_optimizer('optax', options={
    'optax_name': Option('adamw', doc='an optax optimizer function, e.g. lion, adafactor'),
    'optax_kwargs': Option('{}', doc="its other keyword arguments, a dict literal")})
def by_name(args: OptimizerArgs) -> optax.GradientTransformation:
  """Any optax optimizer function `optax_name` with the keyword arguments `optax_kwargs`."""
  name, kwargs = args.options['optax_name'], _kwargs(args.options['optax_kwargs'])
  make = getattr(optax, name, None) if isinstance(name, str) and name.isidentifier() else None
  if not callable(make):
    raise ConfigError(f"config.optax_name={name!r} is not an optax function; use one such as "
                      "'lion', 'adafactor', 'rmsprop' (optax.<name>(learning_rate, **kwargs)).")
  accepted = inspect.signature(make).parameters
  if 'weight_decay' in accepted:
    kwargs = {'weight_decay': args.weight_decay, **kwargs}
    if 'mask' in accepted:
      kwargs = {'mask': args.decay_mask, **kwargs}
    return make(args.learning_rate, **kwargs)
  return optax.chain(optax.add_decayed_weights(args.weight_decay, mask=args.decay_mask),
                     make(args.learning_rate, **kwargs))
