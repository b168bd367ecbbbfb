"""config.input_backend='tf_device': the host decodes only the crop window into a uint8 box, the
device resizes, flips and normalises inside the step (anp_jax/data/windows.py,
anp_jax/data/device_input.py); the same examples and images as the host path ('tf')."""

import subprocess

import jax
import numpy as np
import pytest
import tensorflow as tf

from anp_jax import setup, trainer
from anp_jax.data import anp, device_input, input_stages, pipeline, windows
from anp_jax.errors import ConfigError
from conftest import ROOT, main_cmd, subprocess_env, tiny_config

# float32 images agree to a few float32 ulps (XLA's division and fused multiply-adds round
# differently from TensorFlow's kernels); bfloat16 images are then equal but for a rare element
# one bfloat16 ulp apart (where the float32 value lies on a rounding boundary, or is near 0).
F32_ATOL = 2e-5
BF16_DIFFERENT_AT_MOST = 1e-3


def _prepare(root, name, n, height, width, resize):
  input_stages.write_photo_folder(str(root / name), n, 4, height, width, 90)
  return anp.prepare(str(root / name), str(root / 'tfds'), layout='folder', resize=resize,
                     source_tag=name)


@pytest.fixture(scope='module')
def photos(tmp_path_factory):
  """Photo-like JPEGs (72 x 96, stored at shorter side 48: box 64) and panoramas (24 x 400 at
  24: box 40, the image size; no crop of >= 10 % of their area with an aspect ratio in [3/4, 4/3]
  fits them, so the crop sampler falls back to the whole image, which does not fit the box)."""
  root = tmp_path_factory.mktemp('device_input')
  return {'photos': _prepare(root, 'photos', 24, 72, 96, 48),
          'panoramas': _prepare(root, 'panoramas', 16, 24, 400, 24),
          'unbounded': _prepare(root, 'unbounded', 8, 40, 50, 0), 'root': root}


def _config(photos, name, backend, **overrides):
  builder = photos[name]
  return tiny_config(photos['root'] / 'tfds', dataset='anp', augment='inception',
                     input_backend=backend, image_size=40,
                     **{'anp.config_name': builder.builder_config.name, **overrides})


def _both(photos, name, n_train=3, **overrides):
  """(tf batches, tf_device batches finished by the device): n_train training steps of 16 on
  2 devices, then the whole validation split in padded batches of 16."""
  out = []
  builder = photos[name]
  for backend in ('tf', 'tf_device'):
    config = _config(photos, name, backend, **overrides)
    train = pipeline.train_dataset(builder, config, per_device_batch=8, num_shards=2,
                                   shards=[0, 1]).as_numpy_iterator()
    batches = [next(train) for _ in range(n_train)]
    batches += list(pipeline.eval_dataset(builder, config, per_process_batch=16,
                                          split='validation', process_index=0,
                                          process_count=1).as_numpy_iterator())
    if backend == 'tf_device':
      raw = batches
      finish = device_input.finish_jit(config)
      batches = [jax.device_get(finish(b)) for b in batches]
    out.append(batches)
  return out[0], out[1], raw


def _assert_same_images(host, device, dtype):
  assert device.dtype == host.dtype == dtype and device.shape == host.shape
  diff = np.abs(device.astype(np.float32) - host.astype(np.float32))
  if dtype == np.float32:
    assert diff.max() <= F32_ATOL, diff.max()
  else:
    # One bfloat16 ulp of the larger value, or the float32 error where that is larger (near 0).
    larger = np.maximum(np.abs(host.astype(np.float32)), np.abs(device.astype(np.float32)))
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(larger, 1e-30))) - 7)
    assert np.all(diff <= np.maximum(ulp, F32_ATOL)), diff.max()
    assert (diff > 0).mean() <= BF16_DIFFERENT_AT_MOST


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_tf_device_gives_the_host_paths_batches(photos, dtype):
  """Same examples, labels, masks and padding; the images equal to float32 rounding, in the
  model's dtype (training: random-resized crop + flip; evaluation: centre crop, padded)."""
  host, device, raw = _both(photos, 'photos', **{'model.dtype': dtype})
  assert len(host) == len(device) == 3 + 1  # 3 training batches, 1 padded evaluation batch.
  assert raw[0]['image'].dtype == np.uint8 and raw[0]['image'].shape == (16, 64, 64, 3)
  assert raw[-1]['mask'].sum() < 16  # The evaluation batch is padded.
  assert 0 < raw[0]['flip'].sum() < 16  # Both flip states occur.
  for h, d in zip(host, device, strict=True):
    assert sorted(h) == sorted(d)
    for key in ('mask', *pipeline.LABEL_KEYS):
      np.testing.assert_array_equal(h[key], d[key])
    _assert_same_images(h['image'], d['image'], np.dtype(dtype))


def test_windows_that_do_not_fit_the_box_are_resized_on_the_host(photos):
  """Panoramas 17x longer than high: every training crop is the whole image, longer than the
  box; the host resizes it as the 'tf' path does and rounds it to uint8, the device copies it:
  the 'tf' image with its pixels rounded and clipped to [0, 255]. Evaluation's windows fit."""
  host, device, raw = _both(photos, 'panoramas', n_train=2)
  mean = np.asarray(device_input.MEAN_RGB, np.float32)
  std = np.asarray(device_input.STDDEV_RGB, np.float32)
  fallbacks = 0
  for h, d, r in zip(host, device, raw, strict=True):
    copied = (r['geometry'][:, :, 0] == 40).all(axis=1) & (r['geometry'][:, :, 1] == 40).all(
        axis=1) & (r['mask'] > 0)
    fits = ~copied & (r['mask'] > 0)
    fallbacks += copied.sum()
    if fits.any():
      _assert_same_images(h['image'][fits], d['image'][fits], np.dtype(np.float32))
    if copied.any():
      host_pixels = (h['image'][copied] * std + mean) * 255.0
      device_pixels = (d['image'][copied] * std + mean) * 255.0
      np.testing.assert_allclose(device_pixels, np.round(device_pixels), atol=1e-3)  # uint8.
      assert np.abs(device_pixels - np.clip(host_pixels, 0, 255)).max() <= 0.5 + 1e-3
  assert fallbacks == 2 * 16  # Every training example; no evaluation example.


def test_tf_device_batches_resume_and_split_over_processes_as_tf(photos):
  """The host's batches are a function of (seed, step) and split by position: start_step=2
  continues where step 2 of a run from 0 is, and 2 processes x 1 device make 1 x 2's batch."""
  config = _config(photos, 'photos', 'tf_device')
  builder = photos['photos']
  kw = dict(per_device_batch=4, num_shards=2)

  def take(n, **more):
    it = pipeline.train_dataset(builder, config, **{**kw, **more}).as_numpy_iterator()
    return [next(it) for _ in range(n)]
  full = take(4, shards=[0, 1])
  resumed = take(2, shards=[0, 1], start_step=2)
  halves = [take(4, shards=[p]) for p in (0, 1)]
  for key in ('image', 'geometry', 'flip', 'label_anp'):
    for a, b in zip(full[2:], resumed, strict=True):
      np.testing.assert_array_equal(a[key], b[key])
    for step, batch in enumerate(full):
      np.testing.assert_array_equal(batch[key], np.concatenate([h[step][key] for h in halves]))


def test_device_resize_is_tensorflows_bicubic():
  """Random window sizes, up- and downsampling, with and without flip, and the evaluation's
  resize-then-centre-crop of a window: `device_input.resize` is `tf.image.resize` (bicubic)."""
  rng = np.random.default_rng(0)
  box, size = 60, 24
  for h, w, flip in ((7, 9, 0), (60, 13, 1), (24, 24, 0), (33, 58, 1)):
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    want = tf.image.resize(image, [size, size], method='bicubic').numpy()
    want = want[:, ::-1] if flip else want
    windows_ = np.zeros((1, box, box, 3), np.uint8)
    windows_[0, :h, :w] = image
    got = device_input.resize(windows_, np.array([[[h, size, 0, 0], [w, size, 0, 0]]]),
                              np.array([flip]), size)
    np.testing.assert_allclose(np.asarray(got)[0], want, atol=1e-4, rtol=0)
  # Evaluation: an 80 x 70 image resized to 31 x 28, its centre 24 x 24 read from the window
  # at row 5, column 4 (rows 7-69 and columns 4-65 hold its taps).
  image = rng.integers(0, 256, (80, 70, 3), dtype=np.uint8)
  want = tf.image.resize_with_crop_or_pad(
      tf.image.resize(image, [31, 28], method='bicubic'), size, size).numpy()
  windows_ = np.zeros((1, 70, 70, 3), np.uint8)
  windows_[0, :70, :66] = image[5:75, 4:70]
  got = device_input.resize(windows_, np.array([[[80, 31, 3, 5], [70, 28, 2, 4]]]),
                            np.array([0]), size)
  np.testing.assert_allclose(np.asarray(got)[0], want, atol=1e-4, rtol=0)


def test_eval_windows_hold_every_tap_of_the_centre_crop():
  """The window `windows.eval_plan` picks, resampled on the device, gives the centre crop of
  the whole decoded image, for shapes whose windows start at, and away from, the image's edge."""
  rng = np.random.default_rng(1)
  size, crop_fraction = 24, 0.875
  for h, w in ((30, 30), (48, 32), (27, 100), (100, 27)):
    image = input_stages.photo_like(rng, h, w)
    encoded = tf.io.encode_png(image)
    plan = windows.eval_plan(encoded, size=size, box=200, crop_fraction=crop_fraction)
    y, x, wh, ww = plan['window'].numpy()
    box = np.zeros((1, 200, 200, 3), np.uint8)
    box[0, :wh, :ww] = image[y:y + wh, x:x + ww]
    got = device_input.resize(box, plan['geometry'].numpy()[None], np.array([0]), size)
    want = pipeline._center_crop(encoded, size, crop_fraction).numpy()  # noqa: SLF001
    np.testing.assert_allclose(np.asarray(got)[0], want, atol=1e-4, rtol=0)
    if max(h, w) == 100:  # The long side is read only where the centre crop's taps are.
      assert max(wh, ww) < 100 and (y > 0 or x > 0)


def test_png_shape_is_read_from_its_header():
  for h, w in ((5, 9), (300, 17)):
    png = tf.io.encode_png(tf.zeros([h, w, 3], tf.uint8))
    assert pipeline.encoded_shape(png).numpy().tolist() == [h, w, 3]
  jpeg = tf.io.encode_jpeg(tf.zeros([12, 7, 3], tf.uint8))
  assert pipeline.encoded_shape(jpeg).numpy().tolist() == [12, 7, 3]


def test_flip_bit_is_the_flip_of_the_host_path():
  image = tf.reshape(tf.range(2 * 3 * 3), [2, 3, 3])
  for position in range(20):
    seed = pipeline.example_seed(position, 0)
    flipped = not np.array_equal(pipeline.flip(image, seed).numpy(), image.numpy())
    want = tf.image.stateless_random_flip_left_right(
        image, seed=tf.random.experimental.stateless_fold_in(seed, 1)).numpy()
    assert flipped == bool(pipeline.flip_bit(seed).numpy())
    np.testing.assert_array_equal(pipeline.flip(image, seed).numpy(), want)


def test_unsupported_settings_are_clear_errors(photos, data_dir):
  with pytest.raises(ConfigError, match="implements the augmentation"):
    setup.validate_config(tiny_config(data_dir, input_backend='tf_device'))  # augment='cifar'
  with pytest.raises(ConfigError, match='input_backend.*unknown'):
    setup.validate_config(tiny_config(data_dir, input_backend='gpu'))
  with pytest.raises(ConfigError, match="needs config.executor='jit'"):
    setup.validate_config(tiny_config(data_dir, input_backend='dali', augment='inception',
                                      executor='pmap'))
  config = _config(photos, 'unbounded', 'tf_device')
  with pytest.raises(ConfigError, match='--resize_short_side'):
    pipeline.train_dataset(photos['unbounded'], config, per_device_batch=4, num_shards=1,
                           shards=[0])


# ----------------------------------------------------------------------------------------------
# Issue 42, item 3: a backend's preconditions are checked before the workdir is written.

# A package that shadows NVIDIA DALI (first on PYTHONPATH): `import nvidia.dali` fails as where
# DALI is not installed; the other `nvidia.*` packages are still found (`extend_path`).
_NO_DALI = {'nvidia/__init__.py': 'import pkgutil\n__path__ = pkgutil.extend_path(__path__, '
                                  '__name__)\n',
            'nvidia/dali/__init__.py': "raise ImportError('No module named nvidia.dali')\n"}


def _refused(cmd, workdir, env):
  """Runs the command line `cmd`; asserts exit 2 with one line on stderr and no `workdir`;
  returns that line."""
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
  assert len(lines) == 1 and lines[0].startswith('ERROR: '), out.stderr[-3000:]
  assert not workdir.exists(), sorted(p.name for p in workdir.iterdir())
  return lines[0]


@pytest.mark.slow(15)
def test_dali_missing_exits_2_before_the_workdir_is_written(data_dir, tmp_path):
  """Before: exit 1, a traceback ending in ImportError, and the workdir holding .lock,
  checkpoints/, config.json, an events file and an empty metrics.jsonl."""
  for name, text in _NO_DALI.items():
    (tmp_path / 'shadow' / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / 'shadow' / name).write_text(text)
  env = subprocess_env(1)
  env['PYTHONPATH'] = f"{tmp_path / 'shadow'}:{env['PYTHONPATH']}"
  workdir = tmp_path / 'w'
  line = _refused(main_cmd(data_dir, workdir, input_backend='dali_cpu', augment='inception'),
                  workdir, env)
  assert "config.input_backend='dali_cpu' needs NVIDIA DALI, which is not installed" in line
  assert 'requirements-dali.txt' in line


@pytest.mark.slow(15)
def test_an_unbounded_dataset_exits_2_before_the_workdir_is_written(photos, tmp_path):
  """Before: the right exit 2, but after the workdir was written (.lock, checkpoints/,
  config.json, an events file, an empty metrics.jsonl)."""
  workdir = tmp_path / 'w'
  config = _config(photos, 'unbounded', 'tf_device', batch_size=8, eval_batch_size=8)
  overrides = {k: v for k, v in config.to_dict().items()
               if k in ('dataset', 'augment', 'input_backend', 'image_size', 'batch_size',
                        'eval_batch_size')}
  # The 8 photos are all in 'train': evaluate that split (nothing runs that far anyway).
  cmd = main_cmd(photos['root'] / 'tfds', workdir, **overrides,
                 **{'anp.config_name': config.anp.config_name, 'evals.eval.split': 'train'})
  line = _refused(cmd, workdir, subprocess_env(1))
  assert "config.input_backend='tf_device' needs images of a bounded size" in line


def test_dali_gpu_decode_without_a_gpu_is_refused_before_the_workdir_is_written(data_dir,
                                                                                tmp_path):
  """Before: refused when the first batch was read, after the workdir was written."""
  config = tiny_config(data_dir, augment='inception', input_backend='dali')
  with pytest.raises(ConfigError, match=r"input_backend='dali' decodes JPEGs on the GPU.*"
                                        r"'dali_cpu'"):
    trainer.train_and_evaluate(config, str(tmp_path / 'w'))
  assert not (tmp_path / 'w').exists()


def _trained(config, steps=2):
  run = trainer.build(config)
  state = run.init_state()
  batches = run.train_batches(0)
  for step in range(steps):
    state, _ = run.train_step(state, next(batches), step)
  return run, state


@pytest.mark.slow(25)
@pytest.mark.parametrize('executor', ['jit', 'pmap'])
def test_training_and_evaluation_on_the_device_path_match_the_host_path(data_dir, executor):
  """The real executors (8 devices) on the generated PNGs: two steps and an evaluation with
  'tf_device' give the 'tf' run's parameters and metrics (to float32 rounding)."""
  (run_a, a), (run_b, b) = [_trained(tiny_config(data_dir, augment='inception',
                                                 executor=executor, input_backend=backend))
                             for backend in ('tf', 'tf_device')]
  leaves_a = jax.tree.leaves(run_a.executor.unreplicate(a).params)
  leaves_b = jax.tree.leaves(run_b.executor.unreplicate(b).params)
  for x, y in zip(leaves_a, leaves_b, strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5, rtol=1e-4)
  ev_a, ev_b = run_a.evaluate(a), run_b.evaluate(b)
  assert ev_a.keys() == ev_b.keys()
  for key in ev_a:
    assert ev_b[key] == pytest.approx(ev_a[key], rel=1e-4, abs=1e-5), key
