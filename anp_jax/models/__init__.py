"""Model construction from a config: `create_model(config, meta)` works in IPython too."""

from typing import Optional

import jax.numpy as jnp

from anp_jax.models.norm import BatchNorm  # noqa: F401
from anp_jax.models.resnet import ARCHS, MIN_IMAGE_SIZE, ResNet, build_resnet  # noqa: F401

# Compute dtypes. float16 is deliberately absent: its 5-bit exponent makes small gradients
# underflow to zero unless the loss is scaled (dynamic loss scaling), which this trainer does not
# implement; bfloat16 has float32's exponent range and needs none.
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# Why a dtype someone may expect is refused (appended to the error message).
DTYPE_HINTS = {'float16': "float16 would need loss scaling to keep small gradients from "
                          "underflowing, which this trainer does not implement; use 'bfloat16' "
                          "(float32's exponent range, no loss scaling needed)."}
BN_MODES = ('global', 'per_device', 'ghost')


def dtype_error(dtype) -> str:
  """The message for an unsupported ``config.model.dtype``."""
  hint = DTYPE_HINTS.get(dtype, '') if isinstance(dtype, str) else ''
  return (f'config.model.dtype={dtype!r} is unknown; choose one of {tuple(DTYPES)}.'
          + (f' {hint}' if hint else ''))


def bn_settings(config, axis_name: Optional[str]):
  """(group_size, axis_name) of every BatchNorm for config.bn_mode, inside a per-device step."""
  mode = config.bn_mode
  if mode == 'global':
    return None, axis_name
  if mode == 'per_device':
    return None, None
  if mode == 'ghost':
    return config.bn_group_size, None
  raise ValueError(f'config.bn_mode={mode!r} is unknown; choose one of {BN_MODES}.')


def create_model(config, num_anps: int, num_adjectives: int = 0, num_nouns: int = 0,
                 axis_name: Optional[str] = None) -> ResNet:
  """The ResNet named by config.model, with heads sized for the dataset.

  ``axis_name`` is the mesh/pmap axis over which 'global' BatchNorm averages its statistics; leave
  it None to call the model outside a per-device step (IPython), where the batch of the call is
  the statistics batch.
  """
  m = config.model
  if m.dtype not in DTYPES:
    raise ValueError(dtype_error(m.dtype))
  group_size, bn_axis = bn_settings(config, axis_name)
  conv_impl = None
  if m.conv_impl != 'xla':
    from anp_jax.models import conv
    conv_impl = conv.get_conv_impl(m.conv_impl)
  return build_resnet(
      m.name, num_anps=num_anps,
      num_adjectives=num_adjectives if m.adjective_head else 0,
      num_nouns=num_nouns if m.noun_head else 0,
      width=m.width, dtype=DTYPES[m.dtype], zero_init_last_bn=m.zero_init_last_bn,
      bn_group_size=group_size, bn_axis_name=bn_axis, bn_momentum=config.bn_momentum,
      conv_impl=conv_impl)
