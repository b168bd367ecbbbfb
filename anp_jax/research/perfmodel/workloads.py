"""Workloads measured from a Flax model: FLOPs from XLA's cost analysis, parameter bytes from its
parameter tree (JAX and Flax are imported inside the functions only)."""

import math
from typing import Optional

import numpy as np

from anp_jax.flops import count_flops
from anp_jax.research.perfmodel.hardware import Workload
from anp_jax.research.perfmodel.presets import IMAGENET_TRAIN_IMAGES
from anp_jax.staleness import require_positive


def workload_from_flax(model, image_size: int, *, name: Optional[str] = None,
                       dataset_size: int = IMAGENET_TRAIN_IMAGES, channels: int = 3,
                       batch_size: int = 1, train_flops_factor: float = 3.0,
                       input_dtype=None) -> Workload:
  """A `Workload` from a Flax linen model: XLA's FLOP count of its forward pass, its parameters.

  The forward pass ``model.apply(variables, x, train=False)`` on a ``batch_size`` x image_size x
  image_size x channels batch is counted without running it (parameters stay abstract);
  `count_flops` / batch_size is the forward FLOP per image. ``param_bytes`` sums the sizes of
  the 'params' collection in their own dtypes.
  """
  import jax  # Lazily: the rest of this module runs without JAX.
  import jax.numpy as jnp

  dtype = jnp.float32 if input_dtype is None else input_dtype
  x = jax.ShapeDtypeStruct((batch_size, image_size, image_size, channels), dtype)
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros(x.shape, dtype),
                                                train=False))
  flops = count_flops(lambda v, x: model.apply(v, x, train=False), variables, x)
  if not math.isfinite(flops):
    raise ValueError('XLA cost analysis reported no FLOP count for this backend.')
  param_bytes = sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
                    for leaf in jax.tree.leaves(variables['params']))
  return Workload(name=name or type(model).__name__.lower(),
                  flops_per_image_fwd=flops / batch_size,
                  param_bytes=float(param_bytes), dataset_size=dataset_size,
                  train_flops_factor=train_flops_factor, image_size=image_size)


def flax_workload(arch: str, image_size: int = 224, width: float = 1.0, num_classes: int = 553,
                  **kwargs) -> Workload:
  """The workload of one of anp_jax.models' ResNets (``--flax_model``), from XLA's cost analysis."""
  from anp_jax import models  # Lazily: imports JAX and Flax.
  from anp_jax.configs import default
  if arch not in models.NAMES:
    raise ValueError(f'--flax_model {arch!r} is unknown; choose one of '
                     f'{list(models.names())}.')
  require_positive('--flax_model', 'image_size', image_size, integer=True)
  require_positive('--flax_model', 'width', width)
  require_positive('--flax_model', 'num_classes', num_classes, integer=True)
  config = default.get_config()
  config.model.update(dict(name=arch, width=width))
  model = models.create_model(config, models.Heads(num_classes))
  name = arch + (f'_w{width:g}' if width != 1 else '')
  return workload_from_flax(model, image_size, name=name, **kwargs)
