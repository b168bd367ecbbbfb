"""Test set-up: 8 simulated CPU devices, a tiny generated dataset shared by the session."""

import os

if 'xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS', ''):
  # Subprocesses of the multi-process tests set their own count.
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('CUDA_VISIBLE_DEVICES', '')
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  # Most tests compile the same tiny programs (and subprocesses inherit the environment): XLA's
  # persistent cache, fresh for each session, turns their repeats into loads, which cuts the
  # suite's time by about 3x. Set ANP_TEST_XLA_CACHE to keep one between sessions.
  import atexit
  import shutil
  import tempfile
  _keep = os.environ.get('ANP_TEST_XLA_CACHE')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _keep or tempfile.mkdtemp(prefix='anp_xla_cache_')
  if not _keep:
    atexit.register(shutil.rmtree, os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)
  os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'] = '0'

import pytest  # noqa: E402

from anp_jax.configs import default  # noqa: E402

# 8 ANPs of 4 adjectives x 4 nouns, 16 px; 104 eval examples: not a multiple of any batch used.
TINY_SYNTHETIC = dict(num_adjectives=4, num_nouns=4, num_pairs=8, image_size=16,
                      train_per_class=32, eval_per_class=13, label_noise=0.0, seed=0)


def tiny_config(data_dir, **overrides):
  """A config that trains in seconds: ResNet-8 at width 0.25 on 16 px images."""
  c = default.get_config()
  c.data_dir = str(data_dir)
  c.synthetic.update(TINY_SYNTHETIC)
  c.image_size = 16
  c.model.name = 'resnet8'
  c.model.width = 0.5
  c.batch_size = 32
  c.eval_batch_size = 32
  c.bn_mode = 'ghost'
  c.bn_group_size = 4
  c.num_train_steps = 6
  c.log_every_steps = 2
  c.eval_every_epochs = 0
  c.warmup_epochs = 0
  c.progress_bar = False
  c.checkpoint_every_steps = 0
  c.checkpoint_every_minutes = 0
  c.async_checkpointing = False
  for key, value in overrides.items():
    node = c
    parts = key.split('.')
    for p in parts[:-1]:
      node = node[p]
    node[parts[-1]] = value
  return c


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """A prepared tiny synthetic_anp dataset (generated once per test session)."""
  path = tmp_path_factory.mktemp('tfds')
  from anp_jax.data import pipeline
  pipeline.get_builder(tiny_config(path))
  return path


def leaves(tree):
  """The leaves of a pytree as host numpy arrays."""
  import jax
  import numpy as np
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_resume_is_exact(make_config, steps: int, split: int, tmp_path, capsys):
  """Trains `steps` steps in one go, then `split` steps + a resumed run to `steps` in another
  workdir; asserts the resume message and bit-identical final states. `make_config(n)` is the
  config with ``num_train_steps=n`` (it must checkpoint at `split`). Returns (whole, resumed)."""
  import numpy as np
  from anp_jax import train
  whole = train.train_and_evaluate(make_config(steps), str(tmp_path / 'whole'))
  train.train_and_evaluate(make_config(split), str(tmp_path / 'split'))
  resumed = train.train_and_evaluate(make_config(steps), str(tmp_path / 'split'))
  assert f'Resumed from checkpoint at step {split}' in capsys.readouterr().out
  for x, y in zip(leaves(whole.state), leaves(resumed.state), strict=True):
    np.testing.assert_array_equal(x, y)
  return whole, resumed
