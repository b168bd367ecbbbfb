"""Input pipeline: global sharded batches, determinism, exact resume, per-process shards, exact
eval, a training stream that crosses epoch boundaries."""

import hashlib
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
from jax.sharding import PartitionSpec as P

from anp_jax import durations, executors, setup, trainer
from anp_jax.executors.common import MeshHelper
from anp_jax.data import pipeline
from conftest import (ROOT, TESTS, TINY_SYNTHETIC, assert_leaves_close, launch, leaves, main_cmd,
                      subprocess_env, tiny_config, wait)

TRAIN_SIZE = TINY_SYNTHETIC['num_pairs'] * TINY_SYNTHETIC['train_per_class']  # 256
EVAL_SIZE = TINY_SYNTHETIC['num_pairs'] * TINY_SYNTHETIC['eval_per_class']  # 104


def _batches(ds, n):
  it = iter(ds.as_numpy_iterator())
  return [next(it) for _ in range(n)]


def _digest(images):
  return [hashlib.sha1(np.ascontiguousarray(im).tobytes()).hexdigest() for im in images]


def test_generated_dataset_is_deterministic_and_sized(data_dir, tmp_path):
  builder = pipeline.get_builder(tiny_config(data_dir))
  meta = pipeline.dataset_meta(builder, tiny_config(data_dir))
  assert (meta.train_size, meta.eval_size, meta.num_anps) == (TRAIN_SIZE, EVAL_SIZE, 8)
  assert len(set(meta.anp_names)) == 8 and all('_' in n for n in meta.anp_names)
  again = pipeline.get_builder(tiny_config(tmp_path))  # Generated anew elsewhere.
  a = next(iter(builder.as_dataset(split='validation', shuffle_files=False).take(5)))
  b = next(iter(again.as_dataset(split='validation', shuffle_files=False).take(5)))
  np.testing.assert_array_equal(a['image'].numpy(), b['image'].numpy())


def test_generated_dataset_has_a_held_out_test_split(data_dir):
  """train / validation / test: test as large as validation by default, no image in two splits,
  every split named in `dataset_meta` and evaluated exactly by `eval_dataset`."""
  config = tiny_config(data_dir, augment='none')
  builder = pipeline.get_builder(config)
  meta = pipeline.dataset_meta(builder, config)
  assert meta.split_sizes == {'train': TRAIN_SIZE, 'validation': EVAL_SIZE, 'test': EVAL_SIZE}
  images = {}
  for split in meta.split_sizes:
    ds = builder.as_dataset(split=split, shuffle_files=False)
    images[split] = set(_digest(ex['image'] for ex in tfds.as_numpy(ds)))
    assert len(images[split]) == meta.split_sizes[split]
  assert not (images['test'] & images['validation']) and not (images['test'] & images['train'])
  batches = list(pipeline.eval_dataset(builder, config, per_process_batch=48, split='test',
                                       process_index=1, process_count=2).as_numpy_iterator())
  assert len(batches) == pipeline.num_eval_batches(EVAL_SIZE, 2, 48)
  assert sum(int(b['mask'].sum()) for b in batches) == EVAL_SIZE // 2
  with pytest.raises(ValueError, match=r"split='tset'.* it has \['train', 'validation', 'test'\]"):
    pipeline.eval_dataset(builder, config, per_process_batch=48, split='tset')


def test_the_test_split_size_is_an_option_of_its_own(data_dir):
  """test_per_class sets the test split alone; None or 0 (config.synthetic's default) mean
  eval_per_class, under the same config name."""
  from anp_jax.data import synthetic
  same = synthetic.make_config(**TINY_SYNTHETIC)
  assert synthetic.make_config(**TINY_SYNTHETIC, test_per_class=None) == same
  assert synthetic.make_config(**TINY_SYNTHETIC, test_per_class=0) == same
  assert synthetic.make_config(**TINY_SYNTHETIC, test_per_class=13).name == same.name
  other = synthetic.make_config(**dict(TINY_SYNTHETIC, test_per_class=5))
  assert other.name != same.name and other.test_per_class == 5
  with pytest.raises(ValueError, match='test_per_class must be >= 1'):
    synthetic.make_config(**dict(TINY_SYNTHETIC, test_per_class=-1))


def test_train_batches_shard_on_the_data_axis(data_dir):
  config = tiny_config(data_dir)
  builder = pipeline.get_builder(config)
  mesh = executors.make_mesh()
  ds = pipeline.train_dataset(builder, config, per_device_batch=4,
                              num_shards=8, shards=pipeline.local_shards(mesh))
  batch = next(pipeline.global_batches(ds, MeshHelper(mesh).to_device))
  assert batch['image'].shape == (32, 16, 16, 3)
  assert batch['image'].sharding.spec == P('data')
  assert len(batch['image'].addressable_shards) == 8
  assert {s.data.shape for s in batch['image'].addressable_shards} == {(4, 16, 16, 3)}
  assert float(batch['mask'].sum()) == 32


def test_training_order_is_deterministic_and_resumes_exactly(data_dir):
  config = tiny_config(data_dir)
  builder = pipeline.get_builder(config)
  kw = dict(per_device_batch=4, num_shards=8, shards=range(8))
  full = _batches(pipeline.train_dataset(builder, config, **kw), 12)
  again = _batches(pipeline.train_dataset(builder, config, **kw), 12)
  resumed = _batches(pipeline.train_dataset(builder, config, start_step=5, **kw), 7)
  assert len(full) == len(again) == 12 and len(resumed) == 7
  for a, b in zip(full, again, strict=True):
    np.testing.assert_array_equal(a['image'], b['image'])
  for a, b in zip(full[5:], resumed, strict=True):  # Crosses the epoch boundary at step 8.
    np.testing.assert_array_equal(a['image'], b['image'])
    np.testing.assert_array_equal(a['label_anp'], b['label_anp'])
  # Each epoch is a permutation: labels of epoch 0 and 1 have the same multiset, other order.
  e0 = np.concatenate([b['label_anp'] for b in full[:8]])
  e1 = np.concatenate([b['label_anp'] for b in full[8:12]])
  assert np.bincount(e0).tolist() == [32] * 8
  assert not np.array_equal(e0[:128], e1)


def test_global_batch_does_not_depend_on_the_process_grouping(data_dir):
  """8 devices in one process, or 2 processes x 4, or 4 x 2: the same global batches."""
  config = tiny_config(data_dir)
  builder = pipeline.get_builder(config)
  kw = dict(per_device_batch=4, num_shards=8, start_step=3)
  one = _batches(pipeline.train_dataset(builder, config, shards=range(8), **kw), 6)
  for group in (2, 4):
    parts = [_batches(pipeline.train_dataset(builder, config, shards=range(p, p + group), **kw),
                      6) for p in range(0, 8, group)]
    for step, full in enumerate(one):
      joined = np.concatenate([part[step]['image'] for part in parts])
      np.testing.assert_array_equal(full['image'], joined)


def test_processes_read_disjoint_shards(data_dir):
  config = tiny_config(data_dir, augment='none')
  builder = pipeline.get_builder(config)
  seen = []
  for pid in range(2):
    ds = pipeline.train_dataset(builder, config, per_device_batch=4,
                                num_shards=8, shards=range(4 * pid, 4 * pid + 4))
    seen.append(set(_digest(np.concatenate([b['image'] for b in _batches(ds, 8)]))))
  assert len(seen[0]) == len(seen[1]) == 128
  assert not seen[0] & seen[1]


def _stream(builder, config, devices: int, start_step: int, steps: int, batch: int = 32):
  """`steps` global batches of `batch` examples from `start_step` on, read as one process with
  `devices` devices would read them."""
  return _batches(pipeline.train_dataset(builder, config, per_device_batch=batch // devices,
                                         num_shards=devices, shards=range(devices),
                                         start_step=start_step), steps)


@pytest.mark.parametrize('before,after', [(2, 1), (1, 2), (8, 2)])
def test_a_resume_on_another_device_count_continues_the_epoch(data_dir, before, after):
  """An epoch (256 examples, 8 global batches of 32) read on `before` devices up to step 3,
  then resumed on `after` devices: every example exactly once, and the same batches as the
  uninterrupted run. (Before: each device read its own shard of the split, so the shards, and
  what was left of them, changed with the device count; 2 -> 1 saw 191 distinct examples of
  256, 65 twice and 65 never.)"""
  config = tiny_config(data_dir, augment='none')  # An image's digest names its example.
  builder = pipeline.get_builder(config)
  seen = (_stream(builder, config, before, 0, 3) + _stream(builder, config, after, 3, 5))
  ids = _digest(np.concatenate([b['image'] for b in seen]))
  assert len(ids) == TRAIN_SIZE
  assert len(set(ids)) == TRAIN_SIZE, (f'{len(set(ids))} distinct examples of {len(ids)}: '
                                       f'{len(ids) - len(set(ids))} seen twice')
  whole = _stream(builder, config, before, 0, 8)
  assert ids == _digest(np.concatenate([b['image'] for b in whole]))


def test_the_global_batch_does_not_depend_on_the_device_count(data_dir):
  """1, 2 and 8 devices: the same examples in the same order at every step, with the same
  augmentation (random crops and flips), across the epoch boundary at step 8."""
  config = tiny_config(data_dir)  # augment='cifar': random crop + flip.
  builder = pipeline.get_builder(config)
  streams = {d: _stream(builder, config, d, 5, 5) for d in (1, 2, 8)}
  for d in (2, 8):
    for step, (a, b) in enumerate(zip(streams[1], streams[d], strict=True)):
      for key in ('image', 'mask', *pipeline.LABEL_KEYS):
        np.testing.assert_array_equal(a[key], b[key], err_msg=f'{d} devices, step {5 + step}')


@pytest.fixture(scope='module')
def four_file_builder(tmp_path_factory):
  """The tests' dataset written as 4 TFRecord files of 64 training examples each."""
  import tensorflow_datasets as tfds
  from anp_jax.data import synthetic
  path = str(tmp_path_factory.mktemp('tfds4'))
  builder = synthetic.SyntheticAnp(config=synthetic.make_config(**TINY_SYNTHETIC), data_dir=path,
                                   file_format='tfrecord')
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=4))
  assert len(builder.info.splits['train'].file_instructions) == 4
  return builder


def _file_of_image(builder, config):
  """Digest of each preprocessed training image -> index of the file that holds it."""
  import tensorflow as tf
  import tensorflow_datasets as tfds
  out = {}
  for k, fi in enumerate(builder.info.splits['train'].file_instructions):
    for record in tf.data.TFRecordDataset(fi.filename):
      ex = builder.info.features.deserialize_example(
          record, decoders={'image': tfds.decode.SkipDecoding()})
      image = pipeline.preprocess(ex, train=False, config=config, stored_size=16)['image']
      out[_digest([image.numpy()])[0]] = k
  assert len(out) == TRAIN_SIZE
  return out


@pytest.mark.parametrize('files', [1, 4])
def test_reading_by_byte_offset_equals_the_in_memory_copy(data_dir, four_file_builder, files):
  """config.cache=False reads each example from its TFRecord file at its byte offset; the
  batches are those of the in-memory copy (cache=True), across the epoch boundary at step 8."""
  builder = four_file_builder if files == 4 else pipeline.get_builder(tiny_config(data_dir))
  kw = dict(per_device_batch=16, num_shards=2, shards=[1], start_step=6)
  cached, read = (_batches(pipeline.train_dataset(builder, tiny_config(data_dir, cache=c), **kw),
                           4) for c in (True, False))
  for a, b in zip(cached, read, strict=True):
    for key in ('image', *pipeline.LABEL_KEYS):
      np.testing.assert_array_equal(a[key], b[key])


def test_every_epoch_is_a_new_permutation_across_all_files(four_file_builder, data_dir):
  """4 files of 64 examples, read by position: every epoch is the whole split, each in another
  order, and its first 32 examples already come from every file. (Before: an epoch read its
  files interleaved, example by example, in a shuffled file order, through a shuffle buffer; a
  device's shard larger than the buffer stayed close to that file order.)"""
  config = tiny_config(data_dir, augment='none', cache=False)
  file_of = _file_of_image(four_file_builder, config)
  batches = _batches(pipeline.train_dataset(four_file_builder, config, per_device_batch=32,
                                            num_shards=1, shards=[0]), 8 * 3)
  seen = _digest(np.concatenate([b['image'] for b in batches]))
  epochs = [seen[e * TRAIN_SIZE:(e + 1) * TRAIN_SIZE] for e in range(3)]
  for epoch in epochs:
    assert sorted(epoch) == sorted(file_of)
    assert {file_of[h] for h in epoch[:32]} == {0, 1, 2, 3}
  assert len({tuple(e) for e in epochs}) == 3


def test_a_cache_larger_than_the_memory_share_is_refused(data_dir, monkeypatch):
  monkeypatch.setattr(pipeline, '_host_memory_bytes', lambda: 1000)
  config = tiny_config(data_dir)
  with pytest.raises(ValueError, match=r'config\.cache=True would hold .* set config\.cache=False'):
    pipeline.train_dataset(pipeline.get_builder(config), config, per_device_batch=4,
                           num_shards=8, shards=range(8))


def test_a_truncated_record_file_is_a_clear_error(four_file_builder, tmp_path, data_dir):
  """Reading by position indexes the record headers first: a cut file fails there, naming it."""
  import shutil
  import tensorflow_datasets as tfds
  copy = tmp_path / 'copy'
  shutil.copytree(four_file_builder.data_dir, copy)
  victim = sorted(copy.glob('*-train.tfrecord-*'))[2]
  victim.write_bytes(victim.read_bytes()[:-100])
  builder = tfds.builder_from_directory(str(copy))
  with pytest.raises(ValueError, match=f'{victim}.* is not a whole uncompressed TFRecord file'):
    pipeline.train_dataset(builder, tiny_config(data_dir, cache=False), per_device_batch=4,
                           num_shards=1, shards=[0])


def test_shards_must_be_consecutive_devices(data_dir):
  config = tiny_config(data_dir)
  with pytest.raises(ValueError, match='consecutive device indices'):
    pipeline.train_dataset(pipeline.get_builder(config), config, per_device_batch=4,
                           num_shards=8, shards=[0, 2])


@pytest.mark.slow(45)
def test_training_resumed_on_two_devices_equals_the_uninterrupted_run_on_eight(data_dir,
                                                                             tmp_path):
  """8 devices train 3 steps (a checkpoint mid-epoch), 2 devices resume to step 6: the final
  parameters and BatchNorm statistics are those of 6 steps on 8 devices, up to the rounding of
  a sum over 2 devices instead of 8 (ghost BatchNorm groups do not depend on the device count).
  (Before: the 2-device run read other examples from step 3 on, and the states differed.)"""
  overrides = dict(schedule='constant', checkpoint_every_steps=3, noise_scale=False)
  whole = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=6, **overrides),
                                     str(tmp_path / 'whole'))
  workdir = tmp_path / 'split'
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=3, **overrides), str(workdir))
  out = subprocess.run(main_cmd(data_dir, workdir, num_train_steps=6, **overrides),
                       env=subprocess_env(2), capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'Resumed from checkpoint at step 3' in out.stdout and '2 devices' in out.stdout
  _, variables, _ = trainer.load_checkpoint(str(workdir))
  assert_leaves_close(leaves(variables), leaves({'batch_stats': whole.state.batch_stats,
                                                 'params': whole.state.params}),
                      rtol=2e-4, atol=2e-6)


@pytest.mark.slow(40)
def test_a_resume_from_one_process_onto_two_and_back_continues_the_epoch(data_dir, tmp_path):
  """Real processes: a job of 2 processes x 2 devices reads the epoch from step 0 and, as a
  resumed run, from step 3 (`Run.train_batches`, as the trainer does). Its global batches are
  those of one process with 1 device; 1 -> 2 (one process up to step 3, then the job) and
  2 -> 1 (the job up to step 3, then one process) see every example of the epoch exactly once."""
  config = tiny_config(data_dir, augment='none')
  builder = pipeline.get_builder(config)
  procs = launch([sys.executable, os.path.join(TESTS, 'data_worker.py')], 2, 2, tmp_path,
                 MP_CONFIG=config.to_json(), MP_READS=json.dumps([[0, 8], [3, 5]]))
  outs = wait(procs, tmp_path)
  assert [o['devices'] for o in outs] == [4, 4]
  job = []  # Per read, per step: the digests of the whole global batch, in order.
  for read in zip(*(o['reads'] for o in outs), strict=True):
    steps = []
    for parts in zip(*read, strict=True):
      rows = dict(row for part in parts for row in part)
      assert sorted(rows) == list(range(32))  # Both processes' rows make the global batch.
      steps.append([rows[i] for i in range(32)])
    job.append(steps)
  one = [_digest(b['image']) for b in _stream(builder, config, 1, 0, 8)]
  assert job[0] == one and job[1] == one[3:]
  for ids in (sum(one[:3] + job[1], []), sum(job[0][:3] + one[3:], [])):  # 1 -> 2, 2 -> 1.
    assert len(ids) == len(set(ids)) == TRAIN_SIZE


@pytest.mark.parametrize('processes', [1, 2, 3])
def test_exact_eval_counts_every_example_once(data_dir, processes):
  config = tiny_config(data_dir, augment='none')
  builder = pipeline.get_builder(config)
  per_process = 96 // processes // 8 * 8 or 8
  expected_batches = pipeline.num_eval_batches(EVAL_SIZE, processes, per_process)
  digests, counts = [], []
  for pid in range(processes):
    batches = list(pipeline.eval_dataset(builder, config, per_process_batch=per_process,
                                         split='validation', process_index=pid,
                                         process_count=processes).as_numpy_iterator())
    assert len(batches) == expected_batches  # Same count everywhere: no collective waits.
    for b in batches:
      keep = b['mask'] > 0
      digests += _digest(b['image'][keep])
      counts.append(keep.sum())
  assert sum(counts) == EVAL_SIZE  # 104 is not a multiple of the batch: padding was masked.
  assert len(set(digests)) == EVAL_SIZE


def test_missing_data_dir_for_anp_dataset(tmp_path):
  config = tiny_config(tmp_path / 'nope', dataset='anp')
  with pytest.raises(FileNotFoundError, match='does not exist'):
    setup.validate_config(config)


def test_default_synthetic_options_use_the_registered_builder_config(tmp_path, monkeypatch):
  """config.synthetic equal to SyntheticAnpConfig's defaults names the config registered in
  BUILDER_CONFIGS, and TFDS refuses a new config object of that name (before: "Cannot name a
  custom BuilderConfig the same as an available BuilderConfig"). Only the builder is made here:
  generating the default 11,200 images is not the point."""
  from anp_jax.data import synthetic
  monkeypatch.setattr(pipeline, '_prepared', lambda make, data_dir: make())
  config = tiny_config(tmp_path)
  defaults = synthetic.SyntheticAnpConfig(name='defaults')
  config.synthetic.update({k: getattr(defaults, k) for k in synthetic._OPTION_NAMES})
  builder = pipeline.get_builder(config)
  assert builder.builder_config is synthetic.SyntheticAnp.BUILDER_CONFIGS[0]
  other = pipeline.get_builder(tiny_config(tmp_path))  # Any other options: their own config.
  assert other.builder_config.name != builder.builder_config.name
  assert other.builder_config.num_pairs == TINY_SYNTHETIC['num_pairs']


def _as_process(monkeypatch, index, count=2):
  """Makes this process look like process `index` of `count`; returns the barriers it passes."""
  from anp_jax import distributed
  barriers = []
  monkeypatch.setattr(jax, 'process_count', lambda: count)
  monkeypatch.setattr(jax, 'process_index', lambda: index)
  monkeypatch.setattr(distributed.coordination, 'barrier', barriers.append)
  return barriers


@pytest.mark.parametrize('index', [0, 1])
def test_a_prepared_data_dir_is_read_without_the_preparation_lock(data_dir, monkeypatch, index):
  """A prepared data_dir may be a read-only shared folder: every process of a multi-process job
  reads it without the lock (before: process 0 created data_dir/.prepare.lock first, and failed
  with PermissionError where a single-process job read the same folder), and still passes the
  barrier, which the other processes wait at."""
  def no_lock(*args, **kwargs):
    raise AssertionError('the dataset is prepared: no lock, no preparation')
  monkeypatch.setattr(pipeline, '_prepare_once', no_lock)
  barriers = _as_process(monkeypatch, index)
  builder = pipeline.get_builder(tiny_config(data_dir))
  assert builder.info.splits['train'].num_examples == TRAIN_SIZE
  assert barriers == ['anp_jax_prepare_dataset']


def test_process_0_prepares_a_missing_dataset_before_the_barrier(tmp_path, monkeypatch):
  """An empty data_dir: process 0 prepares it (under the lock) before the others pass the
  barrier, and they then read it."""
  calls = []
  monkeypatch.setattr(pipeline, '_prepare_once',
                      lambda builder, data_dir: calls.append(('prepare', data_dir)))
  barriers = _as_process(monkeypatch, 0)
  monkeypatch.setattr(pipeline, '_is_prepared', lambda builder: bool(barriers))
  pipeline.get_builder(tiny_config(tmp_path))
  assert calls == [('prepare', str(tmp_path))] and barriers == ['anp_jax_prepare_dataset']


def test_label_noise_needs_a_second_anp():
  """Label noise replaces a label by another ANP: with one ANP there is none. Refused when the
  config is made (before: it passed, then generation failed in numpy, rng.integers(1, 1))."""
  from anp_jax.data import synthetic
  one = dict(num_adjectives=1, num_nouns=1, num_pairs=1, image_size=16, train_per_class=2,
             eval_per_class=1)
  with pytest.raises(ValueError, match=r'label_noise=0\.5 needs num_pairs >= 2'):
    synthetic.make_config(label_noise=0.5, **one)
  assert synthetic.make_config(**one).label_noise == 0.0  # One ANP without noise is fine.


def test_a_failed_preparation_on_process_0_fails_every_process_at_once(tmp_path, monkeypatch):
  """Process 0 fails to prepare: it still passes the barrier (before: it raised first, and the
  others waited there until the job was aborted), leaves its error in the coordination service,
  and every other process raises it, as the same kind of error (exit code 2 for an OSError)."""
  from anp_jax import distributed

  class Store:  # The key-value part of jax.distributed's coordination client.
    def __init__(self):
      self.values = {}

    def key_value_set(self, key, value):
      self.values[key] = value

    def key_value_dir_get(self, prefix):
      return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]

  def disk_full(builder, data_dir):
    raise OSError(28, 'No space left on device')

  store = Store()
  monkeypatch.setattr(distributed.coordination, 'coordination_client', lambda: store)
  monkeypatch.setattr(pipeline, '_prepare_once', disk_full)
  monkeypatch.setattr(distributed.coordination, '_barrier_uses', {})
  barriers = _as_process(monkeypatch, 0)
  with pytest.raises(OSError, match='No space left on device'):
    pipeline.get_builder(tiny_config(tmp_path))
  assert barriers == ['anp_jax_prepare_dataset'] and len(store.values) == 1
  # Process 1's first call, same job.
  monkeypatch.setattr(distributed.coordination, '_barrier_uses', {})
  barriers = _as_process(monkeypatch, 1)
  with pytest.raises(OSError, match=f'Process 0 failed to prepare the dataset in {tmp_path}: '
                                    r'OSError: \[Errno 28\] No space left on device'):
    pipeline.get_builder(tiny_config(tmp_path))
  assert barriers == ['anp_jax_prepare_dataset']


@pytest.mark.slow(15)
def test_bfloat16_models_get_bfloat16_images_and_train_bit_for_bit_the_same(data_dir):
  """A bfloat16 model casts its input to bfloat16 first; the pipeline now makes that cast itself,
  halving the bytes per batch that the host assembles and copies to the devices. The images are
  the float32 pipeline's rounded to nearest even, as JAX rounds them, so a train step and an
  evaluation give the same bits."""
  import jax.numpy as jnp
  from anp_jax import benchmarking, models, optim
  from anp_jax.steps import init_state, per_device_train_step
  f32, b16 = tiny_config(data_dir), tiny_config(data_dir, **{'model.dtype': 'bfloat16'})
  builder = pipeline.get_builder(f32)
  kw = dict(per_device_batch=4, num_shards=8, shards=range(8))
  as_b16 = lambda x: np.asarray(jnp.asarray(x).astype(jnp.bfloat16))
  train = [_batches(pipeline.train_dataset(builder, c, **kw), 2) for c in (f32, b16)]
  evals = [list(pipeline.eval_dataset(builder, c, per_process_batch=48, split='validation',
                                      process_index=0, process_count=1).as_numpy_iterator())
           for c in (f32, b16)]  # 104 examples in 3 batches of 48: the last one padded.
  for a, b in zip(train[0] + evals[0], train[1] + evals[1]):
    assert a['image'].dtype == np.float32 and b['image'].dtype == jnp.bfloat16
    np.testing.assert_array_equal(as_b16(a['image']).view(np.uint16), b['image'].view(np.uint16))
    for key in ('mask', *pipeline.LABEL_KEYS):
      np.testing.assert_array_equal(a[key], b[key])
  host = benchmarking.synthetic_batch(b16, 4, {'anp': 8, 'adjective': 4, 'noun': 4})
  assert host['image'].dtype == jnp.bfloat16  # The benchmark's bare step: the same dtypes.

  model = models.create_model(b16, models.Heads(8, 4, 4), axis_name=None)
  tx = optim.create_optimizer(b16, optim.create_lr_schedule(b16, 10, 100))
  state = init_state(model, tx, b16.image_size, 0)
  step = jax.jit(lambda s, b: per_device_train_step(
      s, b, model=model, tx=tx, config=b16, accum_steps=1, num_devices=1, axis_name=None))
  batch = {k: v[:16] for k, v in train[0][0].items()}
  after = [step(state, dict(batch, image=image)) for image in (batch['image'],
                                                               train[1][0]['image'][:16])]
  for x, y in zip(jax.tree.leaves(after[0]), jax.tree.leaves(after[1])):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ----------------------------------------------------------------------------------------------
# The training stream crosses epoch boundaries: no tail dropped, resumable mid-batch across one.


def test_stream_crosses_epochs_and_drops_no_tail(data_dir):
  """3 devices x 5 examples: 2 epochs = ceil(512 / 15) = 35 steps. The stream's first 256
  positions are one whole epoch, the next 256 the next one, reshuffled, and the last 13 start a
  third: every example is read two or three times, nothing is dropped. (Before the stream
  crossed epochs, each epoch was cut to whole steps and lost its tail.)"""
  config = tiny_config(data_dir, augment='none')
  builder = pipeline.get_builder(config)
  pdb, shards = 5, 3
  steps = durations.to_steps(steps_per_epoch=TRAIN_SIZE / (pdb * shards), epochs=2,
                             rounding='ceil')
  assert steps == 35
  ds = pipeline.train_dataset(builder, config, per_device_batch=pdb, num_shards=shards,
                              shards=range(shards))
  seen = _digest(np.concatenate([b['image'] for b in _batches(ds, steps)]))
  assert len(seen) == steps * pdb * shards == 525
  first, second = seen[:TRAIN_SIZE], seen[TRAIN_SIZE:2 * TRAIN_SIZE]
  assert len(set(first)) == TRAIN_SIZE and sorted(second) == sorted(first)
  assert second != first  # The next epoch is reshuffled.
  counts = {h: seen.count(h) for h in set(seen)}
  assert min(counts.values()) == 2 and max(counts.values()) == 3


def test_resume_mid_batch_across_an_epoch_boundary_is_exact(data_dir):
  """8 devices x 3 = 24 examples a step: step 10 reads positions 240-263, the last 16 of epoch 0
  and the first 8 of epoch 1."""
  config = tiny_config(data_dir)
  builder = pipeline.get_builder(config)
  kw = dict(per_device_batch=3, num_shards=8, shards=range(8))
  full = _batches(pipeline.train_dataset(builder, config, **kw), 14)
  for start in (9, 10, 11):
    resumed = _batches(pipeline.train_dataset(builder, config, start_step=start, **kw),
                       14 - start)
    for a, b in zip(full[start:], resumed, strict=True):
      np.testing.assert_array_equal(a['image'], b['image'])
      np.testing.assert_array_equal(a['label_anp'], b['label_anp'])
