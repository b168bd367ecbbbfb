"""config.input_backend='dali_cpu' (and the glue of 'dali'): NVIDIA DALI decodes the windows
tf.data chose; the same examples, order, labels, padding and images as 'tf_device'
(anp_jax/data/dali_input.py).

DALI is installed by test.sh (requirements-dali.txt), as in CI; these tests fail without it,
unless ANP_NO_DALI=1 says this machine has none (then they skip)."""

import os
import sys

import jax
import numpy as np
import pytest
import tensorflow as tf

from anp_jax import executors, trainer
from anp_jax.data import anp, dali_input, device_input, input_stages, pipeline
from anp_jax.executors.common import MeshHelper
from conftest import tiny_config

if os.environ.get('ANP_NO_DALI') == '1':
  pytest.skip('ANP_NO_DALI=1: NVIDIA DALI is not installed here', allow_module_level=True)
import nvidia.dali  # noqa: E402,F401  A missing DALI fails here: test.sh installs it.


@pytest.fixture(scope='module')
def photos(tmp_path_factory):
  """Photo-like JPEGs (72 x 96, stored at shorter side 48) and 24 x 400 panoramas (the
  training crops do not fit the box: the host resizes them and hands DALI a PNG)."""
  root = tmp_path_factory.mktemp('dali')
  out = {'root': root}
  for name, n, h, w, side in (('photos', 24, 72, 96, 48), ('panoramas', 16, 24, 400, 24)):
    input_stages.write_photo_folder(str(root / name), n, 4, h, w, 90)
    out[name] = anp.prepare(str(root / name), str(root / 'tfds'), layout='folder', resize=side,
                            source_tag=name)
  return out


def _config(photos, name, backend, **overrides):
  return tiny_config(photos['root'] / 'tfds', dataset='anp', augment='inception',
                     input_backend=backend, image_size=40,
                     **{'anp.config_name': photos[name].builder_config.name, **overrides})


def _batches(builder, config, to_device, steps=3, eval_batch=16):
  """`steps` global training batches of 16 over the mesh, then the validation split."""
  train = pipeline.global_batches(pipeline.train_dataset(
      builder, config, per_device_batch=2, num_shards=8, shards=range(8)), to_device)
  out = [jax.device_get(next(train)) for _ in range(steps)]
  ev = pipeline.eval_dataset(builder, config, per_process_batch=eval_batch, split='validation',
                             process_index=0, process_count=1)
  return out + [jax.device_get(b) for b in pipeline.global_batches(ev, to_device)]


@pytest.mark.parametrize('name', ['photos', 'panoramas'])
def test_dali_cpu_gives_the_tf_device_batches(photos, name):
  """Through the trainer's transfer (8 devices): the same keys, shapes, dtypes, labels, masks,
  geometry and flips, in the same order, as 'tf_device'; the images are libjpeg's as
  TensorFlow decodes the whole image (DALI's region decode), which is 'tf_device''s
  `decode_and_crop_jpeg` but at the window's first and last column, where libjpeg upsamples
  chroma from inside the window only; the panoramas' host-resized windows are equal."""
  builder = photos[name]
  to_device = MeshHelper(executors.make_mesh()).to_device
  dali = _batches(builder, _config(photos, name, 'dali_cpu'), to_device)
  host = _batches(builder, _config(photos, name, 'tf_device'), to_device)
  assert len(dali) == len(host) == 4
  assert dali[-1]['mask'].sum() < len(dali[-1]['mask'])  # Padded evaluation.
  for d, h in zip(dali, host, strict=True):
    assert sorted(d) == sorted(h)
    for key in d:
      assert d[key].dtype == h[key].dtype and d[key].shape == h[key].shape, key
      if key != 'image':
        np.testing.assert_array_equal(d[key], h[key], err_msg=key)
    for i in range(len(d['mask'])):
      differ = np.nonzero((d['image'][i] != h['image'][i]).any(axis=(0, 2)))[0].tolist()
      assert len(differ) <= 2, (i, differ)  # At most the window's first and last column.
      in_size, resized, offset, start = d['geometry'][i, 1]
      if resized == 40 and offset == start == 0:  # A training window of in_size columns.
        assert set(differ) <= {0, in_size - 1}, (i, differ, in_size)


def test_dali_windows_are_the_whole_image_decode(photos):
  """DALI's region decode of each window equals TensorFlow's decode of the whole JPEG, cut."""
  builder = photos['photos']
  config = _config(photos, 'photos', 'dali_cpu')
  reader = pipeline.train_dataset(builder, config, per_device_batch=16, num_shards=1,
                                  shards=[0])
  host = next(iter(reader.ds.as_numpy_iterator()))
  decoded = next(pipeline.global_batches(reader, lambda x: x))
  assert decoded['image'].shape == (16, 64, 64, 3) and decoded['image'].dtype == np.uint8
  for i in range(16):
    y, x, h, w = host['window'][i]
    whole = tf.io.decode_image(host['encoded'][i], channels=3).numpy()
    np.testing.assert_array_equal(np.asarray(decoded['image'][i, :h, :w]),
                                  whole[y:y + h, x:x + w])
    assert not np.asarray(decoded['image'][i, h:]).any()  # Zero padding.


@pytest.mark.parametrize('processes', [1, 2, 3])
def test_dali_evaluation_counts_every_example_once(photos, processes):
  """Each process's padded part of the split, decoded by DALI: every example exactly once."""
  builder = photos['photos']
  config = _config(photos, 'photos', 'dali_cpu')
  total = builder.info.splits['validation'].num_examples
  per_process = 8
  expected = pipeline.num_eval_batches(total, processes, per_process)
  seen = []
  for pid in range(processes):
    ds = pipeline.eval_dataset(builder, config, per_process_batch=per_process,
                               split='validation', process_index=pid, process_count=processes)
    batches = list(pipeline.global_batches(ds, lambda x: x))
    assert len(batches) == expected
    finish = device_input.finish_jit(config)
    for b in batches:
      images = np.asarray(finish(b)['image'])
      keep = b['mask'] > 0
      assert not images[~keep].any()  # Padding is zeros, as on the host path.
      seen += [im.tobytes() for im in images[keep]]
  assert len(seen) == len(set(seen)) == total


@pytest.mark.slow(20)
@pytest.mark.parametrize('executor', ['jit', 'pmap'])
def test_training_with_dali_cpu_matches_tf_device(data_dir, executor):
  """The trainer on the generated PNGs (DALI decodes PNG as TensorFlow does: no JPEG window
  edges), 8 devices, the mesh's arrays (jit) or host batches (pmap): two steps and an evaluation
  give the 'tf_device' run's numbers."""
  runs = []
  for backend in ('tf_device', 'dali_cpu'):
    run = trainer.build(tiny_config(data_dir, augment='inception', input_backend=backend,
                                    executor=executor))
    state = run.init_state()
    batches = run.train_batches(0)
    for step in range(2):
      state, _ = run.train_step(state, next(batches), step)
    params = jax.device_get(run.executor.unreplicate(state).params)
    runs.append((jax.tree.leaves(params), run.evaluate(state)))
  (params_a, eval_a), (params_b, eval_b) = runs
  for x, y in zip(params_a, params_b, strict=True):
    np.testing.assert_array_equal(x, y)
  assert eval_a == eval_b


def test_dali_missing_is_a_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, 'nvidia.dali', None)
  with pytest.raises(ImportError, match='requirements-dali.txt'):
    dali_input.import_dali('dali_cpu')


def test_dali_missing_is_refused_by_config_validation(monkeypatch, data_dir):
  """Issue 42, item 3: with the config's other checks, before anything is read or written
  (before: an ImportError when the first batch was read, after the workdir was written)."""
  from anp_jax import setup
  from anp_jax.errors import ConfigError
  monkeypatch.setitem(sys.modules, 'nvidia.dali', None)
  for backend in ('dali', 'dali_cpu'):
    with pytest.raises(ConfigError, match=rf"config.input_backend='{backend}' needs NVIDIA DALI, "
                                          r'which is not installed here .*requirements-dali.txt'):
      setup.validate_config(tiny_config(data_dir, augment='inception', input_backend=backend))
  setup.validate_config(tiny_config(data_dir, augment='inception', input_backend='tf_device'))


def test_dali_gpu_decode_without_a_gpu_is_refused(photos):
  """'dali' (nvJPEG) on a machine whose JAX has no GPU: an error naming the CPU mode, not a
  silent fallback."""
  config = _config(photos, 'photos', 'dali')
  with pytest.raises(ValueError, match="'dali_cpu'"):
    pipeline.train_dataset(photos['photos'], config, per_device_batch=4, num_shards=1,
                           shards=[0])
