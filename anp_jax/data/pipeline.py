"""tf.data input pipeline: one global example order, per-process reads, exact evaluation.

Design:
* Training data is a pure function of ``(seed, position)``: the job reads one stream, the
  training split's epochs back to back, epoch ``e`` a uniform permutation of the whole split
  drawn from ``(seed, e)`` alone, cut into global batches across epoch boundaries (no tail
  dropped: an epoch is train_size examples at every batch size). Global batch ``s`` is positions
  ``[s * B, (s + 1) * B)``, split by position over however many devices and processes there
  are, and every example's augmentation uses a stateless seed ``(seed, position)``. The global
  batch of a step is therefore the same on 1, 2 or 8 devices, in one process or several, and
  `train_dataset(start_step=s)` continues exactly where step ``s`` left off on any topology —
  resume needs no iterator state.
* Each process reads only its own examples: by byte offset in the TFRecord files, or from an
  in-memory copy of the split (``config.cache``). It yields per-process batches of
  ``global_batch / process_count`` examples; `global_batches` turns them into one global
  `jax.Array` sharded on the mesh's ``data`` axis.
* Evaluation is exact: each process reads its own part of the split (`tfds.even_splits`), every
  process yields the same number of batches, the last ones padded with ``mask == 0`` examples, so
  every example is counted exactly once and no collective waits.
* TensorFlow never sees a GPU (`hide_gpus_from_tf`), images are decoded in `map`.
"""

import collections
import dataclasses
import hashlib
import math
import os
from typing import Any, Dict, Iterator, Optional, Sequence

import jax
import numpy as np

# TensorFlow never sees a GPU (`anp_jax.runtime.configure`, called by every entry point).
from anp_jax.tf_import import tf
import tensorflow_datasets as tfds

from anp_jax.configs import default as default_config
from anp_jax.data import dali_input, filelock, windows
from anp_jax.data.device_input import MEAN_RGB, STDDEV_RGB
# The example's geometry, flip and labels, shared with the device backends (`images`); the
# names stay importable from here.
from anp_jax.data.images import (LABEL_KEYS, PNG_SIGNATURE, center_crop,  # noqa: F401
                                 center_resized_size, crop_window, decode_crop, decode_window,
                                 encoded_shape, flip, flip_bit, resize_square, train_window)

_center_crop = center_crop  # The name older callers and tests use.
DATASETS = ('synthetic_anp', 'anp')
# 'cifar': reflect-pad + random crop + flip; 'inception': random-resized crop + flip (centre crop
# for evaluation); 'flip': flip only; 'none'.
AUGMENTS = ('cifar', 'inception', 'flip', 'none')


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
  stored_image_size: Optional[int]  # Every image is this size (the generated dataset).
  # The shorter side of stored images is at most this (a prepared `anp` with resize; None: any).
  stored_short_side: Optional[int]
  split_sizes: Dict[str, int]  # Every split of the dataset (train, validation, test, ...).


def get_builder(config) -> tfds.core.DatasetBuilder:
  """Returns the (prepared) TFDS builder named by ``config.dataset``."""
  data_dir = os.path.expanduser(config.data_dir)
  if config.dataset == 'synthetic_anp':
    return _prepared(lambda: _synthetic_builder(config), data_dir)
  if config.dataset == 'anp':
    from anp_jax.data.anp import prepared
    check_data_dir(config)
    return prepared.builder_from_config(config, data_dir)
  raise ValueError(f'Unknown dataset {config.dataset!r}; choose synthetic_anp or anp.')


def _synthetic_builder(config):
  """The builder of the generated dataset `config` names (its files may not exist yet)."""
  from anp_jax.data import synthetic
  return synthetic.SyntheticAnp(config=synthetic.builder_config(**dict(config.synthetic)),
                                data_dir=os.path.expanduser(config.data_dir),
                                file_format='tfrecord')


def planned_meta(config) -> 'DatasetMeta':
  """`dataset_meta` of the run's dataset, without generating it: what a plan (a study's
  ``--dry_run``) needs. A generated dataset's sizes and names are a function of its options
  (the ghost_bn preset's dry run generated its 12,800 images first); a prepared ``anp``
  dataset's are read from it, as `dataset_meta` does."""
  if config.dataset != 'synthetic_anp':
    return dataset_meta(get_builder(config), config)
  builder = _synthetic_builder(config)
  return dataset_meta(builder, config, split_sizes=builder.split_sizes())


def check_data_dir(config) -> None:
  """A prepared (not generated) dataset needs an existing config.data_dir."""
  data_dir = os.path.expanduser(config.data_dir)
  if config.dataset == 'anp' and not os.path.isdir(data_dir):
    raise FileNotFoundError(f'config.data_dir={data_dir!r} does not exist; prepare the ANP '
                            'dataset there first with `.venv/bin/python -m anp_jax.data.prepare`.')


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


def dataset_meta(builder, config, split_sizes: Optional[Dict[str, int]] = None) -> DatasetMeta:
  """The sizes and names of `builder`'s (prepared) dataset for `config`'s run; `split_sizes`:
  the splits' sizes when its files are not there yet (`planned_meta`)."""
  info = builder.info
  feats = info.features
  if split_sizes is None:
    split_sizes = {name: split.num_examples for name, split in info.splits.items()}
  # The split of the run's default evaluation (config.evals' 'eval' entry).
  eval_split = default_config.default_eval_split(config)
  check_split(builder, eval_split, "config.evals['eval'].split", names=list(split_sizes))
  check_heads(builder, config)
  return DatasetMeta(
      name=builder.name,
      num_anps=feats['label_anp'].num_classes,
      num_adjectives=feats['label_adjective'].num_classes,
      num_nouns=feats['label_noun'].num_classes,
      anp_names=feats['label_anp'].names,
      train_size=split_sizes['train'],
      eval_size=split_sizes[eval_split],
      eval_split=eval_split,
      stored_image_size=_stored_size(builder),
      stored_short_side=_stored_short_side(builder),
      split_sizes=dict(split_sizes))


def check_heads(builder, config) -> None:
  """A dataset prepared with ordinary class names (``prepare --labels class``) has no adjective
  or noun labels (one placeholder each): training those heads would report a meaningless 100 %.
  Raises with the flags that turn them off."""
  if builder.name != 'anp':
    return
  from anp_jax.data.anp import prepared
  if prepared.read_summary(builder.data_dir).get('labels') != 'class':
    return
  on = [f'config.model.{h}_head' for h in ('adjective', 'noun')
        if config.model.get(f'{h}_head', True)]
  if on:
    raise ValueError(f'{" and ".join(on)} need adjective / noun labels, and the dataset '
                     f'{builder.info.full_name} was prepared with ordinary class names (--labels '
                     'class: one label per class): add --config.model.adjective_head=False '
                     '--config.model.noun_head=False.')


def check_split(builder, split: str, what: str = 'split',
                names: Optional[Sequence[str]] = None) -> None:
  """Raises naming the dataset's splits (`names`, default: the prepared builder's) when `split`
  is not one of them."""
  names = list(builder.info.splits) if names is None else list(names)
  if split not in names:
    raise ValueError(f'{what}={split!r}: dataset {builder.name} has no such split; it has '
                     f'{names}.')


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


def normalize(image, dtype=tf.float32):
  """uint8 or float RGB in [0, 255] -> (x / 255 - mean) / std, in `dtype`."""
  image = tf.cast(image, tf.float32) / 255.0
  return tf.cast((image - MEAN_RGB) / STDDEV_RGB, dtype)


def _inception_crop(image_bytes, size, seed):
  """Random-resized crop of an encoded image of any format (`decode_crop`), resized to `size`."""
  return resize_square(decode_crop(image_bytes, seed), size)


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
             else center_crop(image_bytes, size, config.crop_fraction))
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
    image = flip(image, seed)
  out = {'image': normalize(image, image_dtype(config)), 'mask': tf.constant(1.0, tf.float32)}
  for key in LABEL_KEYS:
    out[key] = tf.cast(example[key], tf.int32)
  return out


def _stored_size(builder) -> Optional[int]:
  shape = builder.info.features['image'].shape
  return shape[0] if shape and shape[0] else None


def _stored_short_side(builder) -> Optional[int]:
  if _stored_size(builder):
    return _stored_size(builder)
  if builder.name == 'anp':
    from anp_jax.data.anp import prepared
    return prepared.stored_short_side(builder.data_dir)
  return None


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
  """Endless training batches for this process's devices `shards`, from ``start_step`` on.

  The job reads one stream: the training split's epochs back to back, epoch ``e`` a uniform
  permutation of the whole split that depends on ``(config.seed, e)`` only (`epoch_order`),
  cut into global batches of ``per_device_batch * num_shards`` examples *across* epoch
  boundaries (no epoch's tail is dropped: ``step * batch_size`` examples are exactly what the
  run has seen). Global batch ``s`` is positions ``[s * B, (s + 1) * B)`` of the stream, and
  device ``d`` of the ``num_shards`` devices takes its ``d``-th slice of ``per_device_batch``.
  Each example's augmentation is seeded by ``(config.seed, position)`` (`example_seed`).

  So the global batch of a step, augmentation included, is the same on any number of devices
  and processes, and a run resumed on another topology continues the same epoch with no repeat
  and no gap; ``start_step`` is all a resume needs (no iterator state). This process yields the
  consecutive positions of its devices (they must be contiguous in the mesh): each process
  reads its own examples only (`TrainRecords`).
  """
  shards = list(shards)
  if not shards or shards != list(range(shards[0], shards[0] + len(shards))):
    raise ValueError(f'shards={shards} must be consecutive device indices (a process\'s devices '
                     'are contiguous in the mesh).')
  if shards[-1] >= num_shards:
    raise ValueError(f'shards={shards} reaches beyond num_shards={num_shards}.')
  records = TrainRecords(builder, cache=bool(config.cache))
  size, seed = records.size, int(config.seed)
  global_batch = per_device_batch * num_shards
  local_batch = per_device_batch * len(shards)
  first = start_step * global_batch + shards[0] * per_device_batch
  stored = _stored_size(builder)

  def position(j):  # j-th example this process reads -> its position in the job's stream.
    return first + (j // local_batch) * global_batch + j % local_batch

  def locate(j):
    p = position(j)
    return p, epoch_order(p // size, p % size, size=size, seed=seed)

  form = _device_form(builder, config)

  @tf.function(autograph=False)
  def augment(p, example):
    if form is not None:
      return form.example(example, train=True, seed=example_seed(p, seed))
    return preprocess(example, train=True, config=config, seed=example_seed(p, seed),
                      stored_size=stored)

  ds = tf.data.Dataset.counter().map(_plain(locate), num_parallel_calls=tf.data.AUTOTUNE)
  ds = records.read(ds)
  ds = ds.map(_plain(augment), num_parallel_calls=tf.data.AUTOTUNE)
  ds = form.batch(ds, local_batch) if form else ds.batch(local_batch, drop_remainder=True)
  ds = ds.prefetch(tf.data.AUTOTUNE).with_options(_read_options())
  return form.decoder(ds) if form else ds


@dataclasses.dataclass(frozen=True)
class _DeviceForm:
  """How a device backend (`anp_jax.data.windows`) makes and batches its examples."""
  config: Any
  box: int

  @property
  def decoded(self) -> bool:  # tf.data decodes the windows ('tf_device'), or DALI does.
    return windows.backend(self.config) == 'tf_device'

  def example(self, example, *, train: bool, seed=None):
    return windows.device_example(example, train=train, config=self.config, box=self.box,
                                  seed=seed, decode=self.decoded)

  def padding(self):
    return windows.padding_example(self.config, decode=self.decoded)

  def batch(self, ds, size: int):
    return windows.batch(ds, size, self.box if self.decoded else None)

  def decoder(self, ds):
    """`ds` itself when tf.data decodes, else DALI's decoder of it (`dali_input`)."""
    if self.decoded:
      return ds
    return dali_input.DaliBatches(ds, self.config, box=self.box)


def _device_form(builder, config) -> Optional[_DeviceForm]:
  """The device format of ``config.input_backend`` (None for 'tf': images leave the host
  finished)."""
  if windows.backend(config) not in windows.DEVICE_BACKENDS:
    return None
  windows.check_backend(config)
  return _DeviceForm(config, device_box(builder, config))


def check_input_backend(builder, config) -> None:
  """Raises `ConfigError` when ``config.input_backend`` cannot run on this machine or dataset:
  'dali' without a GPU (`dali_input.check_gpu`), a device backend on images of no bounded size
  (`device_box`). The trainer calls it when it builds the run, before the workdir is written;
  what the config alone decides (the augmentation, the executor, DALI installed) is
  `windows.check_backend`'s, in `anp_jax.setup.validate_config`."""
  name = windows.backend(config)
  if name not in windows.DEVICE_BACKENDS:
    return
  device_box(builder, config)
  if name == 'dali':
    dali_input.check_gpu(name)


def device_box(builder, config) -> int:
  """The side of the uint8 box the device backends hand windows over in, for this dataset
  (`windows.box_size`: a ConfigError when its images have no bounded size)."""
  return windows.box_size(config, stored_image_size=_stored_size(builder),
                          stored_short_side=_stored_short_side(builder), dataset=builder.name)


def _seed_key(seed: int, purpose: str) -> int:
  """A 63-bit key for one use of ``config.seed`` (the epoch order, the augmentation), so that
  the uses draw from unrelated streams of TensorFlow's stateless generators."""
  digest = hashlib.sha256(f'anp_jax/{purpose}/{seed}'.encode()).digest()
  return int.from_bytes(digest[:8], 'little') >> 1


def epoch_order(epoch, index, *, size: int, seed: int):
  """The example at position `index` of epoch `epoch`: a permutation of ``range(size)`` drawn
  from ``(seed, epoch)`` alone (`tf.random.experimental.index_shuffle`, a stateless bijection:
  nothing of size `size` is materialised, so it costs the same for 300k images as for 300)."""
  key = tf.stack([tf.constant(_seed_key(seed, 'epoch_order'), tf.int64),
                  tf.cast(epoch, tf.int64)])
  return tf.random.experimental.index_shuffle(tf.cast(index, tf.int64), key,
                                              tf.constant(size - 1, tf.int64))


def example_seed(position, seed: int):
  """The stateless seed of the augmentation of the example at `position` of the stream."""
  return tf.stack([tf.constant(_seed_key(seed, 'augment'), tf.int64),
                   tf.cast(position, tf.int64)])


# Records read at once when examples are read from the files by position (`TrainRecords`).
READ_PARALLELISM = 16
# `config.cache` refuses a training split larger than this share of the host's memory.
CACHE_MEMORY_SHARE = 0.5


class TrainRecords:
  """Random access to the encoded examples of a builder's training split, by example index.

  The index follows TFDS's order of the split (its file instructions, in order). With
  ``cache`` the whole split is read once, file by file, and held in memory (each process holds
  all of it: fast for the small generated datasets, refused when larger than
  ``CACHE_MEMORY_SHARE`` of the host's memory). Without it, each example is read from its
  TFRecord file at its byte offset, found by one pass over the record headers: a process reads
  only the examples it trains on. TFDS's shuffled reading (`shuffle_files` + a buffer) cannot
  give a global order; grain reads ArrayRecord files by index in the same way.
  """

  def __init__(self, builder, cache: bool):
    split = builder.info.splits['train']
    if builder.info.file_format not in (None, tfds.core.FileFormat.TFRECORD):
      raise ValueError(f'Reading training examples by position needs TFRecord files; '
                       f'{builder.name} is stored as {builder.info.file_format}.')
    self.size = split.num_examples
    if self.size < 1:
      raise ValueError(f'{builder.name} has no training examples.')
    self._features = builder.info.features
    instructions = split.file_instructions
    if cache:
      limit = CACHE_MEMORY_SHARE * _host_memory_bytes()
      if split.num_bytes > limit:
        raise ValueError(
            f'config.cache=True would hold the {split.num_bytes / 2**30:.1f} GiB training split '
            f'of {builder.name} in memory in every process, more than '
            f'{CACHE_MEMORY_SHARE:.0%} of this host\'s {limit / CACHE_MEMORY_SHARE / 2**30:.1f} '
            'GiB; set config.cache=False (each process then reads its own examples from the '
            'files).')
      reads = [tf.data.TFRecordDataset(fi.filename).skip(fi.skip).take(fi.take)
               for fi in instructions]
      ds = reads[0]
      for more in reads[1:]:
        ds = ds.concatenate(more)
      self._records = ds.batch(self.size).get_single_element()
      if self._records.shape[0] != self.size:
        raise ValueError(f'{builder.name}: read {self._records.shape[0]} training records, its '
                         f'info says {self.size}; prepare the dataset again.')
    else:
      self._records = None
      self._files, self._file_sizes, self._offsets, self._lengths = _record_index(
          builder.name, instructions, self.size)

  def read(self, located: tf.data.Dataset) -> tf.data.Dataset:
    """``(position, example index)`` -> ``(position, decoded example, image still encoded)``."""
    decoders = {'image': tfds.decode.SkipDecoding()}
    deserialize = lambda p, record: (  # noqa: E731
        p, self._features.deserialize_example(record, decoders=decoders))
    if self._records is not None:
      records = self._records
      ds = located.map(_plain(lambda p, k: (p, tf.gather(records, k))),
                       num_parallel_calls=tf.data.AUTOTUNE)
    else:
      files = tf.constant(self._files)
      file_sizes = tf.constant(self._file_sizes, tf.int64)
      offsets = tf.constant(self._offsets, tf.int64)
      lengths = tf.constant(self._lengths, tf.int64)

      def one_record(p, k):
        f, offset, length = tf.gather(files, k), tf.gather(offsets, k), tf.gather(lengths, k)
        size = tf.gather(file_sizes, k)
        record = tf.data.FixedLengthRecordDataset(
            f, record_bytes=length, header_bytes=offset, footer_bytes=size - offset - length,
            buffer_size=length)
        return tf.data.Dataset.zip((tf.data.Dataset.from_tensors(p), record))

      ds = located.interleave(_plain(one_record), cycle_length=READ_PARALLELISM, block_length=1,
                              num_parallel_calls=READ_PARALLELISM, deterministic=True)
    return ds.map(_plain(deserialize), num_parallel_calls=tf.data.AUTOTUNE)


def _record_index(name: str, instructions, size: int):
  """Per example of the split, in order: its file, that file's size, and the byte offset and
  length of its serialised record (TFRecord framing: a little-endian uint64 length, its CRC32C,
  the record, its CRC32C; only the headers are read)."""
  files, file_sizes, offsets, lengths = [], [], [], []
  for fi in instructions:
    file_size = tf.io.gfile.stat(fi.filename).length
    with tf.io.gfile.GFile(fi.filename, 'rb') as f:
      position, k = 0, 0
      while position < file_size and k < fi.skip + fi.take:
        f.seek(position)
        header = f.read(12)
        length = int.from_bytes(header[:8], 'little') if len(header) == 12 else -1
        end = position + 12 + length + 4
        if length < 0 or end > file_size:
          raise ValueError(f'{fi.filename} is not a whole uncompressed TFRecord file (record '
                           f'{k} at byte {position} overruns it); prepare {name} again.')
        if k >= fi.skip:
          files.append(fi.filename)
          file_sizes.append(file_size)
          offsets.append(position + 12)
          lengths.append(length)
        position, k = end, k + 1
    if k < fi.skip + fi.take:
      raise ValueError(f'{fi.filename} holds {k} records, {name}\'s info expects at least '
                       f'{fi.skip + fi.take}; prepare it again.')
  if len(offsets) != size:
    raise ValueError(f'{name}: found {len(offsets)} training records, its info says {size}.')
  return (np.asarray(files), np.asarray(file_sizes, np.int64), np.asarray(offsets, np.int64),
          np.asarray(lengths, np.int64))


def _host_memory_bytes() -> int:
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def num_eval_batches(eval_size: int, process_count: int, per_process_batch: int) -> int:
  """Batches every process yields so that the largest shard fits (shards differ by <= 1)."""
  return max(1, math.ceil(math.ceil(eval_size / process_count) / per_process_batch))


def eval_dataset(builder, config, *, per_process_batch: int, split: str,
                 process_index: Optional[int] = None,
                 process_count: Optional[int] = None) -> tf.data.Dataset:
  """Per-process evaluation batches: every example exactly once, padding masked out."""
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  check_split(builder, split)
  total = builder.info.splits[split].num_examples
  shard = _process_split(split, process_count, process_index, drop_remainder=False)
  ds = builder.as_dataset(split=shard, shuffle_files=False,
                          decoders={'image': tfds.decode.SkipDecoding()})
  stored = _stored_size(builder)
  form = _device_form(builder, config)
  if form is not None:
    one = lambda ex: form.example(ex, train=False)  # noqa: E731
  else:
    one = lambda ex: preprocess(ex, train=False, config=config, stored_size=stored)  # noqa: E731
  ds = ds.map(_plain(one), num_parallel_calls=tf.data.AUTOTUNE)
  n_batches = num_eval_batches(total, process_count, per_process_batch)
  pad = n_batches * per_process_batch - _split_size(builder, shard)
  size = config.image_size
  padding = tf.data.Dataset.from_tensors(
      form.padding() if form else
      {'image': tf.zeros([size, size, 3], image_dtype(config)), 'mask': tf.constant(0.0),
       **{k: tf.constant(0, tf.int32) for k in LABEL_KEYS}}).repeat(pad)
  ds = ds.concatenate(padding)
  ds = (form.batch(ds, per_process_batch) if form else
        ds.batch(per_process_batch, drop_remainder=True))
  ds = ds.prefetch(tf.data.AUTOTUNE).with_options(_read_options())
  return form.decoder(ds) if form else ds


def _split_size(builder, split) -> int:
  return builder.info.splits[split].num_examples


# Decoded evaluation batches kept in memory per process, across evaluations and runs (a study's
# runs evaluate the same splits every half epoch): at most this many bytes in all.
# ANP_EVAL_BATCH_CACHE=0 keeps none (every evaluation decodes its split, as before issue 44).
EVAL_CACHE_BYTES = 256 * 2**20
EVAL_CACHE_SWITCH = 'ANP_EVAL_BATCH_CACHE'
_eval_cache: 'collections.OrderedDict[Any, list]' = collections.OrderedDict()


def _eval_cache_key(builder, config, split: str, per_process_batch: int,
                    process_index: int, process_count: int):
  """What an evaluation's host batches depend on (``input_backend='tf'``: `preprocess` with
  ``train=False`` reads the image size, the augmentation's kind, the crop fraction and the
  image dtype), or None where they are not kept (another input backend; config.cache off;
  ``ANP_EVAL_BATCH_CACHE=0``)."""
  if windows.backend(config) != 'tf' or not config.cache:
    return None
  if os.environ.get(EVAL_CACHE_SWITCH, '1').strip().lower() in ('0', 'false', 'no', 'off'):
    return None
  return (os.path.abspath(builder.data_dir), builder.info.full_name, split, per_process_batch,
          process_index, process_count, int(config.image_size), str(config.augment),
          float(config.crop_fraction), str(config.model.dtype))


def _eval_bytes(builder, config, split: str, per_process_batch: int, process_count: int) -> int:
  """The bytes of a split's decoded host batches (images, labels, mask)."""
  batches = num_eval_batches(_split_size(builder, split), process_count, per_process_batch)
  image = int(config.image_size) ** 2 * 3 * image_dtype(config).size
  return batches * per_process_batch * (image + 4 * (len(LABEL_KEYS) + 1))


def eval_batches(builder, config, *, per_process_batch: int, split: str, to_device,
                 prefetch: int = 2) -> Iterator[Any]:
  """`eval_dataset`'s batches through `to_device` (`global_batches`), the same values, decoded
  once per process: a split whose host batches fit `EVAL_CACHE_BYTES` (with the others kept) is
  read into memory on its first evaluation and served from there afterwards (with
  ``config.cache``, and the 'tf' input backend, whose batches leave the host finished).
  Decoding the images was most of a small model's evaluation on CPU; the batches are the ones
  the pipeline yields, so every evaluation's sums are bit for bit what they were."""
  pidx, pcount = jax.process_index(), jax.process_count()
  key = _eval_cache_key(builder, config, split, per_process_batch, pidx, pcount)
  size = _eval_bytes(builder, config, split, per_process_batch, pcount) if key else 0
  if key is None or size > EVAL_CACHE_BYTES:
    yield from global_batches(eval_dataset(builder, config, per_process_batch=per_process_batch,
                                           split=split), to_device, prefetch)
    return
  cached = _eval_cache.get(key)
  if cached is None:
    ds = eval_dataset(builder, config, per_process_batch=per_process_batch, split=split)
    cached = list(tfds.as_numpy(ds))
    while _eval_cache and sum(_nbytes(v) for v in _eval_cache.values()) + size > EVAL_CACHE_BYTES:
      _eval_cache.popitem(last=False)
    _eval_cache[key] = cached
  _eval_cache.move_to_end(key)
  yield from transferred(cached, to_device, prefetch)


def _nbytes(batches) -> int:
  return sum(leaf.nbytes for batch in batches for leaf in batch.values())


def transferred(batches, to_device, prefetch: int):
  """`to_device` of each host batch, `prefetch` transfers ahead."""
  queue = []
  for batch in batches:
    queue.append(to_device(batch))
    if len(queue) > prefetch:
      yield queue.pop(0)
  yield from queue


# ----------------------------------------------------------------------------------------------
# Host → device.


def global_batches(ds: Any, to_device, prefetch: int = 2) -> Iterator[Dict[str, jax.Array]]:
  """Turns per-process numpy batches into device arrays with `to_device` (the executor's
  host → device transfer), keeping `prefetch` transfers in flight."""
  if hasattr(ds, 'device_batches'):  # DALI decodes and places the images itself.
    yield from ds.device_batches(to_device)
    return
  yield from transferred(tfds.as_numpy(ds), to_device, prefetch)
