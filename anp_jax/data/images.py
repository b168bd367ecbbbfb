"""What every input path shares about one example: its labels, its image's geometry, its flip.

The host's tf.data pipeline (`anp_jax.data.pipeline`), the device backends' host half
(`anp_jax.data.windows`) and DALI's feeder (`anp_jax.data.dali_input`) all draw an example's
crop window and flip bit from its seed with these functions, and read the same label fields: so
every backend sees the same windows and flips, by construction. This module imports only
TensorFlow, and nothing of `anp_jax.data`: the three import it, and the data flows one way
(pipeline -> windows -> dali_input, each of them -> images).
"""

from anp_jax.tf_import import tf

LABEL_KEYS = ('label_anp', 'label_adjective', 'label_noun')
# config.input_backend: who finishes the images (`anp_jax.data.windows` says what each does).
BACKENDS = ('tf', 'tf_device', 'dali', 'dali_cpu')
# The backends that hand the device uint8 windows.
DEVICE_BACKENDS = ('tf_device', 'dali', 'dali_cpu')


def backend(config) -> str:
  """``config.input_backend`` ('tf' for a config that predates the field)."""
  return config.get('input_backend', 'tf')


def crop_window(shape, seed):
  """The random-resized crop's window (area 8-100 %, aspect 3/4-4/3) of an image of `shape`:
  ``(begin, size)``, as `tf.slice` takes them."""
  bbox = tf.constant([0.0, 0.0, 1.0, 1.0], dtype=tf.float32, shape=[1, 1, 4])
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape, bounding_boxes=bbox, seed=seed, min_object_covered=0.1,
      aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  return begin, size


PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def encoded_shape(image_bytes):
  """``[height, width, channels]`` (int32) of an encoded image, from its header where the format
  allows: JPEG (`tf.io.extract_jpeg_shape`: the file's own channel count) and PNG (the IHDR
  chunk: 3 channels, as decoding to RGB gives); other formats are decoded to find out."""
  def png():
    width_height = tf.io.decode_raw(tf.strings.substr(image_bytes, 16, 8), tf.int32,
                                    little_endian=False)
    return tf.stack([width_height[1], width_height[0], 3])

  def decoded():
    return tf.shape(tf.io.decode_image(image_bytes, channels=3, expand_animations=False))

  is_png = tf.equal(tf.strings.substr(image_bytes, 0, 8), PNG_SIGNATURE)
  return tf.cond(tf.io.is_jpeg(image_bytes), lambda: tf.io.extract_jpeg_shape(image_bytes),
                 lambda: tf.cond(is_png, png, decoded))


def train_window(image_bytes, seed):
  """The random-resized crop's window of an encoded image, ``[y, x, height, width]`` (int32),
  sampled from its shape (`encoded_shape`, `crop_window`) without decoding it."""
  begin, size = crop_window(encoded_shape(image_bytes), seed)
  return tf.stack([begin[0], begin[1], size[0], size[1]])


def decode_window(image_bytes, window, dct_method: str = ''):
  """The pixels of ``window`` ``[y, x, height, width]`` of an encoded image (uint8 RGB).

  JPEG is decoded only inside the window (`decode_and_crop_jpeg`, the fast path for photos);
  other encodings (the generated dataset stores PNG) are decoded whole, then cut.
  ``dct_method`` is `tf.io.decode_jpeg`'s ('': libjpeg's fast integer IDCT, TensorFlow's
  default)."""
  def from_jpeg():
    return tf.io.decode_and_crop_jpeg(image_bytes, window, channels=3, dct_method=dct_method)

  def from_other():
    image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
    return tf.slice(image, [window[0], window[1], 0], [window[2], window[3], 3])

  return tf.cond(tf.io.is_jpeg(image_bytes), from_jpeg, from_other)


def decode_crop(image_bytes, seed):
  """The random-resized crop's window of an encoded image of any format, decoded (uint8):
  `train_window` then `decode_window`, so the crop does not depend on the encoding."""
  return decode_window(image_bytes, train_window(image_bytes, seed))


def resize_square(image, size: int):
  """Bicubic resize to `size` x `size` (float32)."""
  return tf.image.resize(image, [size, size], method='bicubic')


def flip_bit(seed):
  """Whether the example of `seed` is flipped: `tf.image.stateless_random_flip_left_right`'s
  draw (a uniform number below 1/2) from the example's flip seed."""
  flip_seed = tf.random.experimental.stateless_fold_in(seed, 1)
  return tf.random.stateless_uniform([], seed=flip_seed, minval=0, maxval=1.0) < 0.5


def flip(image, seed):
  """A left-right flip with probability 1/2, drawn from the example's seed (`flip_bit`)."""
  return tf.cond(flip_bit(seed), lambda: tf.reverse(image, [1]), lambda: image)


def center_resized_size(shape, size, crop_fraction):
  """The evaluation resize of an image of `shape`: its shorter side to size / crop_fraction,
  ``(new_height, new_width)`` (int32)."""
  h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
  scale = (size / crop_fraction) / tf.minimum(h, w)
  return tf.cast(tf.math.ceil(h * scale), tf.int32), tf.cast(tf.math.ceil(w * scale), tf.int32)


def center_crop(image_bytes, size, crop_fraction=0.875):
  """Resize the shorter side to size / crop_fraction, then take the central size x size crop."""
  image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
  new_h, new_w = center_resized_size(tf.shape(image), size, crop_fraction)
  image = tf.image.resize(image, [new_h, new_w], method='bicubic')
  return tf.image.resize_with_crop_or_pad(image, size, size)
