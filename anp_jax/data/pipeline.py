"""tf.data input pipeline: per-process shards, deterministic epochs, exact evaluation.

Design:
* Each process reads only its own shard of every split (`tfds.even_splits` over processes) and
  yields per-process batches of ``global_batch / process_count`` examples; `global_batches` turns
  them into one global `jax.Array` sharded on the mesh's ``data`` axis.
* Training data is a pure function of ``(seed, shard, position)``: each device's stream is its
  shard's epochs back to back, epoch ``e`` shuffled with seed ``(seed, shard, e)``, batched across
  epoch boundaries (no tail dropped: an epoch is train_size examples at every batch size), and
  every example's augmentation uses a stateless seed ``(seed, e, index)``.
  `train_dataset(start_step=s)` therefore continues exactly where step ``s`` left off — resume
  needs no iterator state.
* Evaluation is exact: every process yields the same number of batches, the last ones padded
  with ``mask == 0`` examples, so every example is counted exactly once and no collective waits.
* TensorFlow never sees a GPU (`hide_gpus_from_tf`), images are decoded in `map`.
"""

import dataclasses
import hashlib
import math
import os
from typing import Any, Dict, Iterator, Optional, Sequence

import jax
import numpy as np

# TensorFlow never sees a GPU (`anp_jax.runtime.configure`, called by every entry point).
import tensorflow as tf
import tensorflow_datasets as tfds

from anp_jax.data import filelock

LABEL_KEYS = ('label_anp', 'label_adjective', 'label_noun')
DATASETS = ('synthetic_anp', 'anp')
# 'cifar': reflect-pad + random crop + flip; 'inception': random-resized crop + flip (centre crop
# for evaluation); 'flip': flip only; 'none'.
AUGMENTS = ('cifar', 'inception', 'flip', 'none')
MEAN_RGB = (0.485, 0.456, 0.406)
STDDEV_RGB = (0.229, 0.224, 0.225)


@dataclasses.dataclass
class DatasetMeta:
  """What the trainer needs to know about a prepared dataset."""
  name: str
  num_anps: int
  num_adjectives: int
  num_nouns: int
  anp_names: Sequence[str]
  train_size: int
  eval_size: int
  eval_split: str
  stored_image_size: Optional[int]


def get_builder(config) -> tfds.core.DatasetBuilder:
  """Returns the (prepared) TFDS builder named by ``config.dataset``."""
  data_dir = os.path.expanduser(config.data_dir)
  if config.dataset == 'synthetic_anp':
    from anp_jax.data import synthetic
    builder_config = synthetic.builder_config(**dict(config.synthetic))
    def make():
      return synthetic.SyntheticAnp(config=builder_config, data_dir=data_dir,
                                    file_format='tfrecord')
    return _prepared(make, data_dir)
  if config.dataset == 'anp':
    from anp_jax.data.anp import prepared
    check_data_dir(config)
    return prepared.builder_from_config(config, data_dir)
  raise ValueError(f'Unknown dataset {config.dataset!r}; choose synthetic_anp or anp.')


def check_data_dir(config) -> None:
  """A prepared (not generated) dataset needs an existing config.data_dir."""
  data_dir = os.path.expanduser(config.data_dir)
  if config.dataset == 'anp' and not os.path.isdir(data_dir):
    raise FileNotFoundError(f'config.data_dir={data_dir!r} does not exist; prepare the ANP '
                            'dataset there first with `python -m anp_jax.data.prepare`.')


def _prepared(make, data_dir: str) -> tfds.core.DatasetBuilder:
  """A builder from `make()` whose dataset is generated, once, before anyone reads it.

  In a multi-process job process 0 generates while the others wait at a barrier (every process
  calls this, so the barrier is never under a process branch). A builder made before its files
  existed has no splits, so it is made afresh after generation. A process that still finds no
  dataset (a node-local data_dir, or a single process) generates it under the file lock, which
  also serialises independent jobs sharing a data_dir.

  A dataset that is already there is only read, by every process: no lock is taken and nothing
  is written, so a prepared data_dir may be a read-only shared folder, as for a single process.

  When process 0 fails to prepare, it still reaches the barrier and leaves its error in the
  coordination service's key-value store; every other process then raises it too, and the job
  exits at once with the cause in every log (a process 0 that raised before the barrier left
  the others waiting there, and every process was then aborted with JAX's "another task died"
  after ``ANP_SHUTDOWN_TIMEOUT`` seconds, exit code 134).
  """
  if jax.process_count() > 1:
    from anp_jax import distributed

    def prepare_if_missing():
      builder = make()
      if not _is_prepared(builder):  # Before the lock: that would write into data_dir.
        _prepare_once(builder, data_dir)
    distributed.on_process_0('anp_jax_prepare_dataset', prepare_if_missing,
                             f'prepare the dataset in {data_dir}')
  builder = make()
  if not _is_prepared(builder):
    _prepare_once(builder, data_dir)
    builder = make()
  return builder


def _is_prepared(builder) -> bool:
  return tf.io.gfile.exists(os.path.join(builder.data_dir, 'dataset_info.json'))


def _prepare_once(builder, data_dir: str):
  """Generates the dataset under a file lock: one process writes, the others wait and reuse.

  The wait says who holds the lock once it gets long, and gives up after
  ``ANP_BARRIER_TIMEOUT`` s (default 3600) with an error naming the holder (a stuck or stopped
  process would otherwise hang every later job on this data_dir)."""
  from anp_jax import distributed
  os.makedirs(data_dir, exist_ok=True)
  with filelock.exclusive(os.path.join(data_dir, '.prepare.lock'),
                          f'preparing {builder.name} in {data_dir}',
                          timeout_s=distributed.barrier_timeout_s()):
    if not _is_prepared(builder):
      # The builder prints its own progress lines; TFDS's bars leave cursor-control fragments
      # in logs that are not terminals.
      tfds.display_progress_bar(False)
      builder.download_and_prepare(
          download_config=tfds.download.DownloadConfig(verify_ssl=False))


def dataset_meta(builder, config) -> DatasetMeta:
  info = builder.info
  feats = info.features
  eval_split = config.eval_split
  if eval_split not in info.splits:
    raise ValueError(f'Dataset {builder.name} has no split {eval_split!r}; it has '
                     f'{list(info.splits)}.')
  return DatasetMeta(
      name=builder.name,
      num_anps=feats['label_anp'].num_classes,
      num_adjectives=feats['label_adjective'].num_classes,
      num_nouns=feats['label_noun'].num_classes,
      anp_names=feats['label_anp'].names,
      train_size=info.splits['train'].num_examples,
      eval_size=info.splits[eval_split].num_examples,
      eval_split=eval_split,
      stored_image_size=_stored_size(builder))


def dataset_identity(builder, meta: DatasetMeta) -> Dict[str, Any]:
  """What every process's copy of the dataset must agree on (a node-local ``data_dir`` may hold
  another preparation): the TFDS name, config and version, the split sizes, the label sets."""
  fields = dataclasses.asdict(meta)
  names = fields.pop('anp_names')
  return {**fields, 'full_name': builder.info.full_name, 'num_anp_names': len(names),
          'anp_names_sha1': hashlib.sha1('\n'.join(names).encode()).hexdigest()[:16]}


# ----------------------------------------------------------------------------------------------
# Preprocessing (in the tf.data graph).


def image_dtype(config) -> tf.DType:
  """The dtype images leave the pipeline in: bfloat16 when the model computes in bfloat16,
  float32 otherwise.

  The model's first operation casts its input to its compute dtype, and TensorFlow's float32 ->
  bfloat16 cast rounds to nearest even as JAX's does: training and evaluation are bit-identical
  either way (tested). Casting in the pipeline halves what the host batches and copies to the
  devices per step (154 -> 77 MB for 256 images at 224 px) and made the 224 px JPEG training
  pipeline 15 % faster per core (1,030 -> 1,190 images/s on 2 cores).
  """
  return tf.bfloat16 if config.model.dtype == 'bfloat16' else tf.float32


def _normalize(image, dtype=tf.float32):
  image = tf.cast(image, tf.float32) / 255.0
  return tf.cast((image - MEAN_RGB) / STDDEV_RGB, dtype)


def _inception_crop(image_bytes, size, seed):
  """Random-resized crop (area 8-100 %, aspect 3/4-4/3) of an encoded image of any format.

  JPEG is decoded only inside the window (`decode_and_crop_jpeg`, the fast path for photos);
  other encodings (the generated dataset stores PNG) are decoded whole, then cropped. Both
  sample the window from the image shape with the same seed, so the crop does not depend on the
  encoding.
  """
  bbox = tf.constant([0.0, 0.0, 1.0, 1.0], dtype=tf.float32, shape=[1, 1, 4])

  def window(shape):
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=bbox, seed=seed, min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    return begin, crop_size

  def from_jpeg():
    begin, crop_size = window(tf.io.extract_jpeg_shape(image_bytes))
    offset_y, offset_x, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(crop_size)
    return tf.io.decode_and_crop_jpeg(image_bytes, tf.stack([offset_y, offset_x, h, w]),
                                      channels=3)

  def from_other():
    image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
    begin, crop_size = window(tf.shape(image))
    return tf.slice(image, begin, crop_size)

  image = tf.cond(tf.io.is_jpeg(image_bytes), from_jpeg, from_other)
  return tf.image.resize(image, [size, size], method='bicubic')


def _center_crop(image_bytes, size, crop_fraction=0.875):
  """Resize the shorter side to size / crop_fraction, then take the central size x size crop."""
  image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
  shape = tf.shape(image)
  h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
  scale = (size / crop_fraction) / tf.minimum(h, w)
  new_h = tf.cast(tf.math.ceil(h * scale), tf.int32)
  new_w = tf.cast(tf.math.ceil(w * scale), tf.int32)
  image = tf.image.resize(image, [new_h, new_w], method='bicubic')
  return tf.image.resize_with_crop_or_pad(image, size, size)


def preprocess(example, *, train: bool, config, seed=None, stored_size=None):
  """Decodes and augments one example; returns {'image', labels..., 'mask'}.

  ``stored_size`` is the dataset's fixed image size (None when images vary in size): small
  fixed-size images are only resized when it differs from ``config.image_size``.
  """
  size = config.image_size
  augment = config.augment
  if augment not in AUGMENTS:
    raise ValueError(f'config.augment={augment!r} is unknown; choose one of {AUGMENTS}.')
  image_bytes = example['image']
  if augment == 'inception':
    image = (_inception_crop(image_bytes, size, seed) if train
             else _center_crop(image_bytes, size, config.crop_fraction))
  else:
    image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
    if stored_size != size:
      image = tf.image.resize(image, [size, size])
    image.set_shape([size, size, 3])
    if train and augment == 'cifar':
      pad = config.crop_padding
      padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]], mode='REFLECT')
      image = tf.image.stateless_random_crop(padded, [size, size, 3], seed=seed)
  if train and augment != 'none':
    flip_seed = tf.random.experimental.stateless_fold_in(seed, 1)
    image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
  out = {'image': _normalize(image, image_dtype(config)), 'mask': tf.constant(1.0, tf.float32)}
  for key in LABEL_KEYS:
    out[key] = tf.cast(example[key], tf.int32)
  return out


def _stored_size(builder) -> Optional[int]:
  shape = builder.info.features['image'].shape
  return shape[0] if shape and shape[0] else None


# ----------------------------------------------------------------------------------------------
# Datasets.


def _plain(fn):
  """`fn` for ``Dataset.map`` and friends without AutoGraph's source conversion: the functions
  here use ``tf.cond`` explicitly and Python control flow only on Python values, so conversion
  changes nothing but costs ~0.1 s per traced function (a training pipeline traces one per
  device of the process)."""
  return tf.autograph.experimental.do_not_convert(fn)


def _read_options():
  options = tf.data.Options()
  options.deterministic = True
  options.threading.private_threadpool_size = 0  # Share TF's pool.
  options.autotune.enabled = True
  return options


def _process_split(split: str, process_count: int, process_index: int, drop_remainder: bool):
  return tfds.even_splits(split, n=process_count, drop_remainder=drop_remainder)[process_index]


def local_shards(mesh: Optional[jax.sharding.Mesh] = None) -> Sequence[int]:
  """Global indices of this process's devices in the mesh order: the data shards it reads."""
  if mesh is None:
    return list(range(jax.local_device_count()))
  flat = list(mesh.devices.flat)
  local = [i for i, d in enumerate(flat) if d.process_index == jax.process_index()]
  if local != list(range(local[0], local[0] + len(local))):
    raise ValueError('The mesh interleaves devices of different processes; per-process batches '
                     'need each process\'s devices to be contiguous in the mesh.')
  return local


def train_dataset(builder, config, *, per_device_batch: int, num_shards: int,
                  shards: Sequence[int], start_step: int = 0) -> tf.data.Dataset:
  """Infinite training batches for the devices `shards`, starting exactly at ``start_step``.

  The training split is cut into ``num_shards`` (= devices of the job) disjoint shards (sizes
  differ by at most one; no example is left out); device ``d`` always reads shard ``d``. Its
  stream is the endless concatenation of the shard's epochs, epoch ``e`` shuffled with seed
  ``(seed, d, e)``, and it is cut into batches of ``per_device_batch`` *across* epoch
  boundaries: a batch may end one epoch and start the next, so no epoch's tail is dropped and
  ``step * batch_size`` examples are exactly what the run has seen. Step ``s`` of device ``d``
  reads positions ``[s * per_device_batch, (s + 1) * per_device_batch)`` of that stream, a pure
  function of (seed, shard, position): resume needs no iterator state.

  A process yields the concatenation of its devices' batches. So the global batch of a step does
  not depend on how devices are grouped into processes: one process with 8 devices and two with 4
  see exactly the same data, and each process reads only its own shards.
  """
  seed = int(config.seed)
  stored = _stored_size(builder)
  splits = tfds.even_splits('train', n=num_shards, drop_remainder=False)
  position = start_step * per_device_batch  # In every device's stream.

  @tf.function(autograph=False)
  def augment(e, i, d, ex):
    # One traced graph for every shard (`d` is a tensor, not a constant of each shard's graph):
    # tracing the augmentation once per device of the process cost ~0.1 s each.
    example_seed = tf.stack([tf.cast(seed * 7919 + e, tf.int64),
                             tf.cast(i, tf.int64) * num_shards + d])
    return preprocess(ex, train=True, config=config, seed=example_seed, stored_size=stored)

  def shard_stream(d: int) -> tf.data.Dataset:
    size = _split_size(builder, splits[d])
    start_epoch, offset = divmod(position, size)
    epochs = tf.data.Dataset.range(start_epoch, 2**62)
    ds = epochs.flat_map(_plain(_epoch_reader(builder, config, splits[d], size, seed, d)))
    ds = ds.skip(offset)
    ds = ds.map(_plain(lambda e, i, ex: augment(e, i, tf.constant(d, tf.int64), ex)),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(per_device_batch, drop_remainder=True)

  streams = [shard_stream(d) for d in shards]
  if len(streams) == 1:
    ds = streams[0]
  else:
    def concat(*batches):
      return {key: tf.concat([b[key] for b in batches], axis=0) for key in batches[0]}
    ds = tf.data.Dataset.zip(tuple(streams)).map(_plain(concat))
  return ds.prefetch(tf.data.AUTOTUNE).with_options(_read_options())


# Files read concurrently when a shard is read in shuffled file order (see `_epoch_reader`).
FILE_CYCLE_LENGTH = 16


def _epoch_reader(builder, config, split: str, size: int, seed: int, d: int):
  """``epoch -> Dataset of (epoch, index in epoch, encoded example)``: one shuffled epoch.

  When the shard fits into ``config.shuffle_buffer`` the buffer shuffles it completely (a uniform
  permutation per epoch) and the encoded examples may be cached in memory (``config.cache``).
  When it does not, a buffer alone would keep every epoch close to the order of the files, so the
  shard's files (its TFDS file instructions) are first put in a random order per epoch, seed
  ``(seed, d, e)``, and read ``FILE_CYCLE_LENGTH`` at a time, interleaved example by example,
  before the buffer; such a shard is not cached (it is larger than the buffer, and a cache would
  fix the file order).
  """
  buffer = min(size, int(config.shuffle_buffer))
  epoch_seed = lambda e: seed * 1_000_003 + 7_919 * d + e  # noqa: E731
  instructions = builder.info.splits[split].file_instructions
  if buffer >= size or len(instructions) < 2:
    base = builder.as_dataset(split=split, shuffle_files=False,
                              decoders={'image': tfds.decode.SkipDecoding()})
    if config.cache:
      base = base.cache()
    read = lambda e: base  # noqa: E731
  else:
    if builder.info.file_format not in (None, tfds.core.FileFormat.TFRECORD):
      raise ValueError(f'Shuffled file order needs TFRecord files; {builder.name} is stored as '
                       f'{builder.info.file_format}.')
    features = builder.info.features
    files = tf.data.Dataset.from_tensor_slices(
        (tf.constant([fi.filename for fi in instructions]),
         tf.constant([fi.skip for fi in instructions], tf.int64),
         tf.constant([fi.take for fi in instructions], tf.int64)))
    decoders = {'image': tfds.decode.SkipDecoding()}

    def read(e):
      order = files.shuffle(len(instructions), seed=epoch_seed(e) * 31 + 17,
                            reshuffle_each_iteration=False)
      ds = order.interleave(
          _plain(lambda f, skip, take: tf.data.TFRecordDataset(f).skip(skip).take(take)),
          cycle_length=min(len(instructions), FILE_CYCLE_LENGTH), block_length=1,
          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
      return ds.map(_plain(lambda x: features.deserialize_example(x, decoders=decoders)))

  def epoch(e):
    ds = read(e).shuffle(buffer, seed=epoch_seed(e), reshuffle_each_iteration=False)
    return ds.enumerate().map(_plain(lambda i, ex: (e, i, ex)))

  return epoch


def num_eval_batches(eval_size: int, process_count: int, per_process_batch: int) -> int:
  """Batches every process yields so that the largest shard fits (shards differ by <= 1)."""
  return max(1, math.ceil(math.ceil(eval_size / process_count) / per_process_batch))


def eval_dataset(builder, config, *, per_process_batch: int, split: str,
                 process_index: Optional[int] = None,
                 process_count: Optional[int] = None) -> tf.data.Dataset:
  """Per-process evaluation batches: every example exactly once, padding masked out."""
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  total = builder.info.splits[split].num_examples
  shard = _process_split(split, process_count, process_index, drop_remainder=False)
  ds = builder.as_dataset(split=shard, shuffle_files=False,
                          decoders={'image': tfds.decode.SkipDecoding()})
  stored = _stored_size(builder)
  ds = ds.map(_plain(lambda ex: preprocess(ex, train=False, config=config, stored_size=stored)),
              num_parallel_calls=tf.data.AUTOTUNE)
  n_batches = num_eval_batches(total, process_count, per_process_batch)
  pad = n_batches * per_process_batch - _split_size(builder, shard)
  size = config.image_size
  padding = tf.data.Dataset.from_tensors(
      {'image': tf.zeros([size, size, 3], image_dtype(config)), 'mask': tf.constant(0.0),
       **{k: tf.constant(0, tf.int32) for k in LABEL_KEYS}}).repeat(pad)
  ds = ds.concatenate(padding).batch(per_process_batch, drop_remainder=True)
  return ds.prefetch(tf.data.AUTOTUNE).with_options(_read_options())


def _split_size(builder, split) -> int:
  return builder.info.splits[split].num_examples


# ----------------------------------------------------------------------------------------------
# Host → device.


def global_batches(ds: Any, to_device, prefetch: int = 2) -> Iterator[Dict[str, jax.Array]]:
  """Turns per-process numpy batches into device arrays with `to_device` (the executor's
  host → device transfer), keeping `prefetch` transfers in flight."""
  it = iter(tfds.as_numpy(ds))
  queue = []
  for batch in it:
    queue.append(to_device(batch))
    if len(queue) > prefetch:
      yield queue.pop(0)
  yield from queue
