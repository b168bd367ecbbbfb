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
