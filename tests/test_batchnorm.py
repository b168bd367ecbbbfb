"""BatchNorm statistics modes: global, per-device and ghost groups, on 8 simulated devices."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from anp_jax.models.norm import BatchNorm


def _apply(bn, x):
  variables = bn.init(jax.random.key(0), x)
  y, mutated = bn.apply(variables, x, mutable=['batch_stats'])
  return y, mutated['batch_stats']


def _reference(x, group):
  g = x.reshape((-1, group) + x.shape[1:])
  mean = g.mean(axis=(1, 2, 3), keepdims=True)
  var = g.var(axis=(1, 2, 3), keepdims=True)
  return ((g - mean) / np.sqrt(var + 1e-5)).reshape(x.shape), mean, var


def test_ghost_groups_normalise_each_group_on_its_own():
  x = np.random.default_rng(0).normal(size=(16, 3, 3, 4)).astype(np.float32) * 3 + 1
  x[8:] += 10  # Make groups differ.
  y, stats = _apply(BatchNorm(group_size=4), jnp.asarray(x))
  ref, mean, var = _reference(x, 4)
  np.testing.assert_allclose(y, ref, atol=1e-4)
  np.testing.assert_allclose(stats['mean'], 0.1 * mean.mean(axis=0).ravel(), rtol=1e-5)
  np.testing.assert_allclose(stats['var'], 0.9 + 0.1 * var.mean(axis=0).ravel(), rtol=1e-5)


def test_global_mode_is_whole_batch_statistics():
  x = np.random.default_rng(1).normal(size=(16, 2, 2, 3)).astype(np.float32)
  y, _ = _apply(BatchNorm(), jnp.asarray(x))
  np.testing.assert_allclose(y, _reference(x, 16)[0], atol=1e-4)


def test_group_size_must_divide_batch():
  with pytest.raises(ValueError, match='group_size'):
    _apply(BatchNorm(group_size=3), jnp.ones((8, 2, 2, 3)))


@pytest.mark.parametrize('mode', ['global', 'per_device'])
def test_modes_under_shard_map_on_8_devices(mode):
  assert jax.device_count() == 8
  from anp_jax.executors import make_mesh
  mesh = make_mesh()
  x = np.random.default_rng(2).normal(size=(32, 2, 2, 3)).astype(np.float32)
  x += np.arange(32, dtype=np.float32)[:, None, None, None]  # Every device's shard differs.
  bn = BatchNorm(axis_name='data' if mode == 'global' else None)
  variables = bn.init(jax.random.key(0), x)

  @jax.jit
  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P('data')),
                     out_specs=(P('data'), P()))
  def run(v, xs):
    y, mut = bn.apply(v, xs, mutable=['batch_stats'])
    return y, jax.lax.pmean(mut['batch_stats'], 'data')

  y, stats = run(variables, x)
  group = 32 if mode == 'global' else 4  # 4 examples per device.
  ref, mean, _ = _reference(x, group)
  np.testing.assert_allclose(np.asarray(y), ref, atol=1e-4)
  np.testing.assert_allclose(np.asarray(stats['mean']), 0.1 * mean.mean(axis=0).ravel(),
                             rtol=1e-4)


# ----------------------------------------------------------------------------------------------
# Frozen BatchNorm (config.freeze matches the layer's scale): torchvision's FrozenBatchNorm2d,
# running statistics in training too, and they never change.

# Every BatchNorm of a ResNet (stem, blocks, projections); the convolutions and heads train.
ALL_BN = r'bn_init/.*|.*/BatchNorm_\d+/.*|.*/norm_proj/.*'


def _resnet8(**overrides):
  from anp_jax import models
  from anp_jax.configs import tiny
  config = tiny.get_config()
  config.update_from_flattened_dict(overrides)
  return config, models.create_model(config, models.Heads(8, 4, 4))


def test_a_frozen_layer_normalises_with_its_running_statistics_in_training_too():
  config, model = _resnet8(freeze='conv_init/.*|bn_init/.*')
  x = jnp.asarray(np.random.default_rng(3).normal(size=(8, 16, 16, 3)).astype(np.float32))
  variables = model.init(jax.random.key(0), x, train=False)
  stats = jax.tree.map(np.asarray, variables['batch_stats'])
  stats['bn_init'] = {'mean': np.full_like(stats['bn_init']['mean'], 0.3),
                      'var': np.full_like(stats['bn_init']['var'], 4.0)}
  variables = {'params': variables['params'], 'batch_stats': stats}

  def outputs(train):
    kwargs = dict(mutable=['batch_stats', 'intermediates']) if train else dict(
        mutable=['intermediates'])
    _, mutated = model.apply(variables, x, train=train, capture_intermediates=True, **kwargs)
    inter = mutated['intermediates']
    return ({name: np.asarray(inter[name]['__call__'][0]) if name == 'bn_init' else
             np.asarray(inter['BasicBlock_0']['BatchNorm_0']['__call__'][0])
             for name in ('bn_init', 'block')}, mutated.get('batch_stats'))

  (train, new_stats), (evaluated, _) = outputs(True), outputs(False)
  # Before: train-mode mean 0.000 / std 1.000, eval-mode mean -0.114 / std 1.390, max diff 2.51.
  np.testing.assert_array_equal(train['bn_init'], evaluated['bn_init'])
  np.testing.assert_array_equal(new_stats['bn_init']['mean'], stats['bn_init']['mean'])
  np.testing.assert_array_equal(new_stats['bn_init']['var'], stats['bn_init']['var'])
  # A layer that is not frozen still normalises with the batch's statistics and updates them.
  assert np.abs(train['block'] - evaluated['block']).max() > 0.1
  assert not np.array_equal(new_stats['BasicBlock_0']['BatchNorm_0']['mean'],
                            stats['BasicBlock_0']['BatchNorm_0']['mean'])


FROZEN_VARIANTS = {
    'jit_ghost': dict(bn_mode='ghost'),
    'jit_global': dict(bn_mode='global'),
    'jit_per_device_accum2': dict(bn_mode='per_device', grad_accum_steps=2),
    'pmap_global': dict(executor='pmap', bn_mode='global'),
    'pmap_per_device': dict(executor='pmap', bn_mode='per_device'),
    'async': dict(method='async', **{'async_sgd.tau': 1, 'async_sgd.max_tau': 2}),
    'local_sgd': dict(method='local_sgd', **{'local_sgd.nodes': 2, 'local_sgd.sync_every': 1}),
}


@pytest.mark.parametrize('variant', sorted(FROZEN_VARIANTS))
def test_a_step_with_every_batchnorm_frozen_trains_on_the_eval_mode_forward(data_dir, variant):
  # With every BatchNorm frozen the train-mode forward is the eval-mode one, in every executor
  # and BN mode: the first step's loss is the eval-mode loss of the initial model on its batch,
  # and the statistics stay as they were while the convolutions train.
  from anp_jax import models, steps, trainer
  from conftest import tiny_config
  config = tiny_config(data_dir, freeze=ALL_BN, num_train_steps=2, **FROZEN_VARIANTS[variant])
  run = trainer.build(config)
  batch = next(run.train_batches())
  state, sums = run.train_step(run.init_state(), batch)
  sums = run.fetch(sums)
  model = models.create_model(config, run.meta)
  x = jnp.zeros((1, 16, 16, 3))
  variables = model.init(jax.random.key(config.seed), x, train=False)
  host = jax.tree.map(np.asarray, jax.device_get(batch))
  if host['image'].ndim == 5:  # pmap's layout: (devices, per-device batch, ...).
    host = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]), host)
  logits = model.apply(variables, host['image'], train=False)
  _, expected = steps.head_metrics(logits, host, config)
  for key in ('loss', 'anp_loss', 'noun_loss'):
    np.testing.assert_allclose(sums[key], expected[key], rtol=2e-5, err_msg=key)
  final = run.fetch(state)
  for name, stats in variables['batch_stats'].items():  # Unchanged, bit for bit.
    for got, want in zip(jax.tree.leaves(final.batch_stats[name]), jax.tree.leaves(stats),
                         strict=True):
      np.testing.assert_array_equal(np.asarray(got).reshape(want.shape), want, err_msg=name)
  assert not np.array_equal(np.asarray(final.params['conv_init']['kernel']).reshape(
      variables['params']['conv_init']['kernel'].shape), variables['params']['conv_init']['kernel'])
