"""Input pipeline: global sharded batches, determinism, exact resume, per-process shards, exact eval."""

import hashlib

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from anp_jax import executors, setup
from anp_jax.executors.common import MeshHelper
from anp_jax.data import pipeline
from conftest import TINY_SYNTHETIC, tiny_config

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
  monkeypatch.setattr(distributed, 'barrier', barriers.append)
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
  monkeypatch.setattr(distributed, 'coordination_client', lambda: store)
  monkeypatch.setattr(pipeline, '_prepare_once', disk_full)
  monkeypatch.setattr(distributed, '_barrier_uses', {})
  barriers = _as_process(monkeypatch, 0)
  with pytest.raises(OSError, match='No space left on device'):
    pipeline.get_builder(tiny_config(tmp_path))
  assert barriers == ['anp_jax_prepare_dataset'] and len(store.values) == 1
  monkeypatch.setattr(distributed, '_barrier_uses', {})  # Process 1's first call, same job.
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
