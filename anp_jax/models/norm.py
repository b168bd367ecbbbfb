"""BatchNorm whose statistics batch is an explicit choice.

Three semantics are offered (``config.bn_mode``, resolved by `anp_jax.models.norm_settings`):

* ``global``: statistics over the whole (global) batch. Under `jax.jit` with a batch sharded on
  the mesh's ``data`` axis this is what a plain mean over axis 0 computes — XLA inserts the
  cross-device reduction. Under `pmap` it needs ``axis_name``.
* ``ghost``: statistics over consecutive groups of ``group_size`` examples (Hoffer et al. 2017;
  Goyal et al. 2017 use 32 images per worker). Groups never straddle a device because the
  trainer checks that the per-device (micro-)batch is a multiple of the group size, so the result
  is independent of the device count and of gradient accumulation.
* ``per_device``: statistics over each device's shard. The trainer implements it as ghost BN with
  ``group_size`` = per-device micro-batch, which is exactly what each device sees.

Running averages are the mean of the group statistics, so a ghost-BN step on a batch of k·b equals
the average of k steps on micro-batches of b that start from the same running statistics.

A *frozen* layer (``config.freeze`` matches its ``scale``, `param_names.is_frozen_batchnorm`)
behaves as torchvision's ``FrozenBatchNorm2d`` in every mode: it normalises with its running
statistics in training too and never updates them, so a frozen backbone computes in training
exactly what it computes in evaluation.
"""

import dataclasses
import functools
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from anp_jax import param_names


@dataclasses.dataclass(frozen=True)
class BatchNormSettings:
  """The semantics every BatchNorm of a model shares (one hashable module field).

  Attributes:
    group_size: examples per statistics group (None: the whole batch of the call).
    axis_name: pmap / shard_map axis to average statistics over (global BN in a per-device
      step); None: no communication.
    momentum: decay of the running averages.
    epsilon: added to the variance.
    freeze: ``config.freeze``, the regex of frozen parameter names: a layer whose ``scale``
      matches it is frozen.
  """
  group_size: Optional[int] = None
  axis_name: Optional[str] = None
  momentum: float = 0.9
  epsilon: float = 1e-5
  freeze: str = ''

  def layer(self, train: bool, dtype: Any = jnp.float32):
    """A `BatchNorm` constructor with these settings for a call in train or eval mode
    (``layer(train)(name='bn_init')(x)``; ``scale_init`` and ``name`` are still free)."""
    return functools.partial(BatchNorm, use_running_average=not train, momentum=self.momentum,
                             epsilon=self.epsilon, dtype=dtype, group_size=self.group_size,
                             axis_name=self.axis_name, freeze=self.freeze)


class BatchNorm(nn.Module):
  """BatchNorm over NHWC (or NC) inputs with global, ghost or per-device statistics."""

  use_running_average: bool = False
  momentum: float = 0.9
  epsilon: float = 1e-5
  group_size: Optional[int] = None  # None: one group (the whole batch seen by this call).
  axis_name: Optional[str] = None  # pmap axis to average statistics over (global BN under pmap).
  dtype: Any = jnp.float32
  scale_init: Any = nn.initializers.ones
  freeze: str = ''  # config.freeze: frozen if it matches this layer's '<path>/scale'.

  def is_frozen(self) -> bool:
    """Whether config.freeze freezes this layer (decided from its name, at trace time)."""
    return param_names.is_frozen_batchnorm(param_names.compile_patterns('freeze', self.freeze),
                                           '/'.join(self.path))

  @nn.compact
  def __call__(self, x):
    features = x.shape[-1]
    scale = self.param('scale', self.scale_init, (features,), jnp.float32)
    bias = self.param('bias', nn.initializers.zeros, (features,), jnp.float32)
    ra_mean = self.variable('batch_stats', 'mean', lambda: jnp.zeros((features,), jnp.float32))
    ra_var = self.variable('batch_stats', 'var', lambda: jnp.ones((features,), jnp.float32))

    if self.use_running_average or self.is_frozen():
      mean, var = ra_mean.value, ra_var.value
      y = (x.astype(jnp.float32) - mean) * jax.lax.rsqrt(var + self.epsilon)
      return (y * scale + bias).astype(self.dtype)

    xf = x.astype(jnp.float32)
    batch = x.shape[0]
    group = batch if self.group_size is None else self.group_size
    if batch % group:
      raise ValueError(f'BatchNorm: batch of {batch} is not a multiple of group_size={group}.')
    # (G, group, ...) — reduce over everything but the group and channel axes.
    xg = xf.reshape((batch // group, group) + x.shape[1:])
    axes = tuple(range(1, xg.ndim - 1))
    # Two passes (mean, then mean squared deviation): robust when |mean| >> std.
    mean = jnp.mean(xg, axis=axes, keepdims=True)
    cross_device = self.axis_name is not None and not self.is_initializing()
    if cross_device:
      mean = jax.lax.pmean(mean, axis_name=self.axis_name)
    var = jnp.mean(jnp.square(xg - mean), axis=axes, keepdims=True)
    if cross_device:
      var = jax.lax.pmean(var, axis_name=self.axis_name)
    y = (xg - mean) * jax.lax.rsqrt(var + self.epsilon)
    y = y.reshape(x.shape)

    if not self.is_initializing():
      reduce_axes = tuple(range(mean.ndim - 1))
      ra_mean.value = (self.momentum * ra_mean.value +
                       (1 - self.momentum) * jnp.mean(mean, axis=reduce_axes))
      ra_var.value = (self.momentum * ra_var.value +
                      (1 - self.momentum) * jnp.mean(var, axis=reduce_axes))
    return (y * scale + bias).astype(self.dtype)
