"""The host's half of the input for ``config.input_backend`` 'tf_device', 'dali' and 'dali_cpu':
choose each example's window, and decode only it (or leave the decoding to DALI).

Backends (``config.input_backend``):

* ``'tf'``: tf.data does everything on the host (decode, crop, resize, flip, normalise, cast);
  batches of images in the model's dtype. Every augmentation.
* ``'tf_device'``: tf.data reads, chooses the window (the random-resized crop, or the region
  evaluation's centre crop reads) and decodes only it (`images.decode_window`), into a
  ``box x box`` uint8 array; the device resizes, flips, normalises and casts inside the
  compiled step (`anp_jax.data.device_input`). The Inception augmentation only.
* ``'dali'`` / ``'dali_cpu'``: as 'tf_device', but tf.data hands the *encoded* window to NVIDIA
  DALI, which decodes it on the GPU (nvJPEG, ``'dali'``) or on the CPU (``'dali_cpu'``,
  explicitly: for machines without a GPU and for the tests) (`anp_jax.data.dali_input`).

Everything random is drawn on the host from ``(seed, position)`` exactly as the 'tf' path draws
it (`images.train_window`, `images.flip_bit`), so the batches stay a pure function of
``(seed, step)`` and resume exactly, and every backend sees the same windows.

**The box.** Windows travel in a square of ``box_size`` pixels, fixed per run: ``ceil(4/3 S)``
for a dataset whose stored images have a shorter side of at most ``S`` (``prepare
--resize_short_side S``; a random-resized crop has an aspect ratio of at most 4/3, so it fits;
evaluation reads ``crop_fraction * S`` + 4 px), ``S`` for a dataset of ``S x S`` images, and at
least ``image_size``. A dataset without such a bound (prepared with ``--resize_short_side 0``)
is refused: its windows could be as large as its largest photo. A window that still does not fit
(the crop sampler's fallback to the whole image, when no crop of >= 10 % of the area with an
aspect ratio in [3/4, 4/3] fits: a photo over ~13x longer than high) is resized on the host, as
the 'tf' path does, and rounded to uint8 (within 0.5 of the host path's value, and clipped to
[0, 255] where the bicubic kernel overshoots); the device copies it unchanged (`device_input`'s
identity geometry).
"""

import math
from typing import Dict, Optional

from anp_jax.tf_import import tf

from anp_jax.data import dali_input, images
from anp_jax.data.images import BACKENDS, DEVICE_BACKENDS, backend  # noqa: F401
from anp_jax.errors import ConfigError

# What they implement of `pipeline.AUGMENTS`.
DEVICE_AUGMENTS = ('inception',)
# Of a window's row and column ranges, what evaluation reads beyond the kernel's taps (a margin
# for a float rounding on the host that differs from the device's).
EVAL_SLACK = 1


def check_backend(config) -> None:
  """Raises `ConfigError` with what to change when ``config.input_backend`` cannot run this
  config, or this installation lacks it (DALI): called by `anp_jax.setup.validate_config`,
  before anything is read. What it needs of the machine and the dataset (a GPU for 'dali',
  images of a bounded size) is checked when the run is built, before the workdir is written
  (`pipeline.check_input_backend`)."""
  name = backend(config)
  if name not in DEVICE_BACKENDS:
    return
  if config.augment not in DEVICE_AUGMENTS:
    raise ConfigError(f"config.input_backend={name!r} implements the augmentation "
                     f"{DEVICE_AUGMENTS} (random-resized crop + flip; centre crop for "
                     f"evaluation), not config.augment={config.augment!r}; use "
                     "config.input_backend='tf'.")
  if name == 'dali' and config.executor != 'jit':
    raise ConfigError("config.input_backend='dali' puts DALI's GPU output straight into the "
                     "mesh's arrays: it needs config.executor='jit' (or use "
                     "input_backend='tf_device').")
  if name in ('dali', 'dali_cpu'):
    try:
      dali_input.import_dali(name)
    except ImportError as e:  # Says how to install it, or which backend needs none.
      raise ConfigError(str(e)) from None


def box_size(config, *, stored_image_size: Optional[int], stored_short_side: Optional[int],
             dataset: str) -> int:
  """The side of the uint8 square a window travels in (see the module docstring), from what
  `pipeline.DatasetMeta` says of the stored images."""
  size = int(config.image_size)
  if stored_image_size:
    return max(int(stored_image_size), size)
  if stored_short_side:
    return max(math.ceil(4 * int(stored_short_side) / 3), size)
  name = backend(config) if backend(config) in DEVICE_BACKENDS else 'tf_device'
  raise ConfigError(
      f'config.input_backend={name!r} needs images of a bounded size, and '
      f'{dataset} keeps its photos at their source size (prepared with --resize_short_side 0): '
      'prepare it with --resize_short_side N (e.g. 256), or use '
      "config.input_backend='tf'.")


def identity_geometry(size: int):
  """The geometry that copies a ``size x size`` window unchanged (`device_input`)."""
  return tf.constant([[size, size, 0, 0], [size, size, 0, 0]], tf.int32)


def _to_uint8(image):
  return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)


def train_plan(image_bytes, seed, *, size: int, box: int) -> Dict[str, tf.Tensor]:
  """A training example's window (`images.train_window`), whether it fits the box, its
  geometry (the window resized to ``size``) and its flip bit."""
  window = images.train_window(image_bytes, seed)
  h, w = window[2], window[3]
  return {'window': window, 'fits': (h <= box) & (w <= box),
          'geometry': tf.stack([tf.stack([h, size, 0, 0]), tf.stack([w, size, 0, 0])]),
          'flip': tf.cast(images.flip_bit(seed), tf.int32)}


def _eval_axis(length, resized, size: int):
  """Evaluation along one axis of ``length`` pixels resized to ``resized``: the centre crop's
  offset in the resized image, and the range of pixels its bicubic taps read (`device_input`'s
  formula, widened by `EVAL_SLACK`, clipped to the image)."""
  offset = (resized - size) // 2
  scale = tf.cast(length, tf.float32) / tf.cast(resized, tf.float32)

  def source(out):  # TensorFlow's half-pixel mapping of output pixel `out`.
    return tf.cast(tf.floor((tf.cast(out, tf.float32) + 0.5) * scale - 0.5), tf.int32)

  first = tf.maximum(source(offset) - 1 - EVAL_SLACK, 0)
  last = tf.minimum(source(offset + size - 1) + 2 + EVAL_SLACK, length - 1)
  return offset, first, last - first + 1


def eval_plan(image_bytes, *, size: int, box: int, crop_fraction: float
              ) -> Dict[str, tf.Tensor]:
  """An evaluation example's window (what the centre crop of `images.center_crop`
  reads), whether it fits the box, its geometry, and flip 0."""
  shape = images.encoded_shape(image_bytes)
  new_h, new_w = images.center_resized_size(shape, size, crop_fraction)
  off_y, y, h = _eval_axis(shape[0], new_h, size)
  off_x, x, w = _eval_axis(shape[1], new_w, size)
  return {'window': tf.stack([y, x, h, w]), 'fits': (h <= box) & (w <= box),
          'geometry': tf.stack([tf.stack([shape[0], new_h, off_y, y]),
                                tf.stack([shape[1], new_w, off_x, x])]),
          'flip': tf.constant(0, tf.int32)}


def host_fallback(image_bytes, plan, *, train: bool, size: int, crop_fraction: float):
  """The ``size x size`` uint8 image of an example whose window does not fit the box: the
  'tf' path's resize on the host, rounded (flip and normalisation stay on the device)."""
  if train:
    image = images.resize_square(images.decode_window(image_bytes, plan['window']), size)
  else:
    image = images.center_crop(image_bytes, size, crop_fraction)
  return _to_uint8(image)


def device_example(example, *, train: bool, config, box: int, seed=None,
                   decode: bool = True) -> Dict[str, tf.Tensor]:
  """One example in the device format: ``image`` (the decoded window, uint8, at most
  ``box x box``; `decode`) or ``encoded`` + ``window`` (the bytes DALI decodes the window of;
  not `decode`), with ``geometry``, ``flip``, ``mask`` and the labels.

  A window that does not fit the box is resized on the host (`host_fallback`); DALI then gets
  it losslessly as a PNG of the whole ``size x size`` image."""
  size = int(config.image_size)
  image_bytes = example['image']
  plan = (train_plan(image_bytes, seed, size=size, box=box) if train else
          eval_plan(image_bytes, size=size, box=box, crop_fraction=config.crop_fraction))

  def fallback():
    return host_fallback(image_bytes, plan, train=train, size=size,
                         crop_fraction=config.crop_fraction)

  fits = plan['fits']
  out = {'geometry': tf.where(fits, plan['geometry'], identity_geometry(size)),
         'flip': plan['flip'], 'mask': tf.constant(1.0, tf.float32)}
  if decode:
    out['image'] = tf.cond(fits, lambda: images.decode_window(image_bytes, plan['window']),
                           fallback)
  else:
    out['encoded'] = tf.cond(fits, lambda: image_bytes, lambda: tf.io.encode_png(fallback()))
    out['window'] = tf.where(fits, plan['window'], tf.constant([0, 0, size, size], tf.int32))
  for key in images.LABEL_KEYS:
    out[key] = tf.cast(example[key], tf.int32)
  return out


def padding_example(config, decode: bool = True) -> Dict[str, tf.Tensor]:
  """Evaluation's padding example (``mask == 0``) in the device format: a 1 x 1 black window
  (a PNG of it for DALI), copied unchanged, which `device_input.finish` zeroes."""
  size = int(config.image_size)
  black = tf.zeros([1, 1, 3], tf.uint8)
  out = {'geometry': identity_geometry(size), 'flip': tf.constant(0, tf.int32),
         'mask': tf.constant(0.0, tf.float32),
         **{k: tf.constant(0, tf.int32) for k in images.LABEL_KEYS}}
  if decode:
    out['image'] = black
  else:
    out['encoded'] = tf.io.encode_png(black)
    out['window'] = tf.constant([0, 0, 1, 1], tf.int32)
  return out


def batch(ds: tf.data.Dataset, size: int, box: Optional[int]) -> tf.data.Dataset:
  """Batches of `size` device-format examples; decoded windows are padded into the box
  (top-left, zeros) by the batching itself: one copy."""
  if box is None:
    return ds.batch(size, drop_remainder=True)
  shapes = {k: v.shape for k, v in ds.element_spec.items()}
  shapes['image'] = tf.TensorShape([box, box, 3])
  return ds.padded_batch(size, padded_shapes=shapes, drop_remainder=True)
