"""The device's half of the input (``config.input_backend`` 'tf_device' and 'dali'): resize,
flip, normalise and cast, compiled into the training and evaluation steps.

The host (tf.data, `anp_jax.data.windows`) or DALI hands over, per example, the decoded pixels
of a window of the stored image in a fixed ``box x box`` uint8 array (top-left, zero padded),
with the ``geometry`` of the resize that turns that window into the ``image_size`` square and a
``flip`` bit. `finish` does the rest at the start of `anp_jax.steps.per_device_train_step` and
`per_device_eval_step`, on this device's shard of the batch.

The resize is TensorFlow's bicubic resize (``tf.image.resize(method='bicubic')``: Keys' cubic
convolution, a = -0.5, half-pixel centres, taps outside the image dropped and the rest
renormalised, weights read from a 1,024-step table), re-implemented tap for tap in the same
order of operations: y first, then x. So the device gives the host path's images (`pipeline`'s
``preprocess``) up to float32 rounding (a fused multiply-add where TensorFlow rounds twice),
tested in ``tests/test_device_input.py``.

Geometry, per axis (rows, then columns): ``(in_size, resized, offset, start)``. Output pixel
``o`` is pixel ``o + offset`` of the stored image of ``in_size`` pixels resized to ``resized``;
``start`` is where the window begins in that image. A training crop of ``h`` rows is
``(h, image_size, 0, 0)`` (the window is the crop); evaluation's centre crop of an image of
``H`` rows resized to ``H'`` is ``(H, H', (H' - image_size) // 2, first row of the window)``;
``(image_size, image_size, 0, 0)`` copies the window unchanged (the host's fallback, see
`anp_jax.data.windows`).
"""

from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np

MEAN_RGB = (0.485, 0.456, 0.406)
STDDEV_RGB = (0.229, 0.224, 0.225)
# Keys' cubic convolution kernel parameter of TensorFlow's half-pixel bicubic resize.
KEYS_A = -0.5
TABLE_SIZE = 1024
# The keys of a batch in the device format (besides the image, the mask and the labels).
RAW_KEYS = ('geometry', 'flip')


def _coefficient_table() -> np.ndarray:
  """TensorFlow's bicubic weights, ``[TABLE_SIZE + 1, 2]`` float32: entry i holds the kernel at
  distance i / TABLE_SIZE and at 1 + i / TABLE_SIZE, computed as TensorFlow does (the distance
  rounded to float32, the polynomial in double, the result rounded to float32)."""
  i = np.arange(TABLE_SIZE + 1)
  x = (i * 1.0 / TABLE_SIZE).astype(np.float32).astype(np.float64)
  a = KEYS_A
  near = ((a + 2) * x - (a + 3)) * x * x + 1
  x1 = (x.astype(np.float32) + np.float32(1.0)).astype(np.float64)
  far = ((a * x1 - 5 * a) * x1 + 8 * a) * x1 - 4 * a
  return np.stack([near, far], axis=1).astype(np.float32)


_TABLE = _coefficient_table()


def is_raw(batch) -> bool:
  """Whether `batch` is in the device format (uint8 windows, geometry, flip)."""
  return 'geometry' in batch


def _taps(geometry, size: int, box: int):
  """Per example and output pixel along one axis: the 4 box indices and weights of TensorFlow's
  bicubic resize (`resize_bicubic_op.cc`, ``GetWeightsAndIndices`` with Keys' kernel).

  `geometry` is ``[n, 4]`` int32 (in_size, resized, offset, start); returns ``[n, size, 4]``
  int32 indices into the box and float32 weights."""
  in_size, resized, offset, start = (geometry[:, i:i + 1] for i in range(4))
  scale = in_size.astype(jnp.float32) / resized.astype(jnp.float32)
  out = (jnp.arange(size, dtype=jnp.int32)[None, :] + offset).astype(jnp.float32)
  in_f = (out + 0.5) * scale - 0.5
  floor = jnp.floor(in_f)
  delta = in_f - floor
  step = jnp.round(delta * TABLE_SIZE).astype(jnp.int32)  # lrintf: half to even.
  table = jnp.asarray(_TABLE)
  weights = jnp.stack([table[step, 1], table[step, 0], table[TABLE_SIZE - step, 0],
                       table[TABLE_SIZE - step, 1]], axis=-1)
  index = floor.astype(jnp.int32)[..., None] + jnp.arange(-1, 3, dtype=jnp.int32)
  inside = (index >= 0) & (index < in_size[..., None])
  weights = jnp.where(inside, weights, 0.0)
  # Renormalised as TensorFlow does: by the reciprocal of the left-to-right sum, always.
  total = ((weights[..., 0] + weights[..., 1]) + weights[..., 2]) + weights[..., 3]
  tiny = 1000.0 * np.finfo(np.float32).tiny
  weights = jnp.where((jnp.abs(total) >= tiny)[..., None], weights * (1.0 / total)[..., None],
                      weights)
  index = jnp.clip(index, 0, in_size[..., None] - 1) - start[..., None]
  return jnp.clip(index, 0, box - 1), weights


def _weighted(values, weights):
  """``v0 * w0 + v1 * w1 + v2 * w2 + v3 * w3``, left to right (TensorFlow's Interpolate1D)."""
  return ((values[0] * weights[0] + values[1] * weights[1]) + values[2] * weights[2]
          ) + values[3] * weights[3]


def resize(windows, geometry, flip, size: int):
  """uint8 windows ``[n, box, box, 3]`` -> float32 ``[n, size, size, 3]``: TensorFlow's
  bicubic resize per `geometry` ``[n, 2, 4]``, then a left-right flip where `flip` ``[n]`` is
  set (the flip reorders the columns' taps: the same values as flipping the result)."""
  box = windows.shape[1]
  if windows.shape[2] != box:
    raise ValueError(f'Windows must be square boxes, got {windows.shape}.')
  rows, row_w = _taps(geometry[:, 0], size, box)
  cols, col_w = _taps(geometry[:, 1], size, box)
  flipped = flip.astype(bool)[:, None, None]
  cols = jnp.where(flipped, cols[:, ::-1], cols)
  col_w = jnp.where(flipped, col_w[:, ::-1], col_w)
  pixels = windows.astype(jnp.float32)
  # Rows first: [n, size, box, 3].
  picked = [jnp.take_along_axis(pixels, rows[:, :, k, None, None], axis=1) for k in range(4)]
  tall = _weighted(picked, [row_w[:, :, k, None, None] for k in range(4)])
  # Then columns: [n, size, size, 3].
  picked = [jnp.take_along_axis(tall, cols[:, None, :, k, None], axis=2) for k in range(4)]
  return _weighted(picked, [col_w[:, None, :, k, None] for k in range(4)])


def normalize(image, dtype=jnp.float32):
  """float RGB in [0, 255] -> (x / 255 - mean) / std in `dtype`, as `pipeline.normalize`."""
  image = image.astype(jnp.float32) / 255.0
  mean = jnp.asarray(MEAN_RGB, jnp.float32)
  std = jnp.asarray(STDDEV_RGB, jnp.float32)
  return ((image - mean) / std).astype(dtype)


def image_dtype(config):
  """The model's input dtype, as `pipeline.image_dtype` gives it on the host."""
  return jnp.bfloat16 if config.model.dtype == 'bfloat16' else jnp.float32


def finish(batch: Dict[str, Any], config) -> Dict[str, Any]:
  """A batch in the device format -> the batch the model takes (images resized, flipped,
  normalised, in the model's dtype; padding examples, ``mask == 0``, all zeros as the host
  path pads them). Any other batch is returned as it is."""
  if not is_raw(batch):
    return batch
  size = int(config.image_size)
  image = normalize(resize(batch['image'], batch['geometry'], batch['flip'], size),
                    image_dtype(config))
  keep = (batch['mask'] > 0)[:, None, None, None]
  out = {k: v for k, v in batch.items() if k not in RAW_KEYS}
  out['image'] = jnp.where(keep, image, jnp.zeros((), image.dtype))
  return out


def finish_jit(config):
  """`finish` compiled on its own (for the tools that look at the images, not the model)."""
  return jax.jit(lambda batch: finish(batch, config))
