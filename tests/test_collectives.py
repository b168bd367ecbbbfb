"""`anp_jax.collectives`: a pytree reduced in one buffer per dtype equals `jax.lax.psum`/`pmean`,
and the compiled step really has one all-reduce operand per dtype (what makes it fast on gloo)."""

import re

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from anp_jax import collectives
from anp_jax.executors import common


def _tree(seed):
  """Leaves of several shapes and dtypes, different on every device."""
  rng = np.random.default_rng(seed)
  n = jax.device_count()
  return {'w': rng.normal(size=(n, 3, 3, 4, 5)).astype(np.float32),
          'b': rng.normal(size=(n, 5)).astype(np.float32),
          'scalar': rng.normal(size=(n,)).astype(np.float32),
          'count': rng.integers(0, 100, size=(n, 7)).astype(np.int32),
          'stats': [rng.normal(size=(n, 2, 6)).astype(np.float32)]}


def _reduce(fn, tree):
  mesh = common.make_mesh()
  per_device = lambda t: jax.tree.map(lambda x: x[None], fn(jax.tree.map(lambda x: x[0], t)))
  return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P('data'),
                               out_specs=P('data')))(tree)


@pytest.mark.parametrize('op', ['psum', 'pmean'])
def test_fused_reduction_equals_the_per_leaf_one_bit_for_bit(op):
  assert jax.device_count() == 8
  tree = _tree(0)
  if op == 'pmean':  # jax.lax.pmean of an integer leaf would be a float: floats only.
    tree.pop('count')
  ref = _reduce(lambda t: getattr(jax.lax, op)(t, 'data'), tree)
  fused = _reduce(lambda t: getattr(collectives, op)(t, 'data', fuse=True), tree)
  unfused = _reduce(lambda t: getattr(collectives, op)(t, 'data', fuse=False), tree)
  ref_leaves, fused_leaves = jax.tree.leaves(ref), jax.tree.leaves(fused)
  assert jax.tree.structure(ref) == jax.tree.structure(fused)
  for r, f, u in zip(ref_leaves, fused_leaves, jax.tree.leaves(unfused), strict=True):
    assert r.dtype == f.dtype and r.shape == f.shape
    np.testing.assert_array_equal(np.asarray(f), np.asarray(r))
    np.testing.assert_array_equal(np.asarray(u), np.asarray(r))
  # Not trivially equal: the devices held different values and every device now has the sum.
  w = np.asarray(fused['w'])
  np.testing.assert_allclose(w[0], tree['w'].sum(0) / (8 if op == 'pmean' else 1), rtol=1e-5)
  np.testing.assert_array_equal(w[0], w[7])


def _all_reduce_operands(fn, tree) -> list:
  mesh = common.make_mesh()
  per_device = lambda t: jax.tree.map(lambda x: x[None], fn(jax.tree.map(lambda x: x[0], t)))
  hlo = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P('data'), out_specs=P('data'))
                ).lower(tree).compile().as_text()
  reduces = [line for line in hlo.splitlines() if re.search(r'\ball-reduce(-start)?\(', line)]
  return [len(re.findall(r'[a-z]+\d*\[[\d,]*\]', line.split('=', 1)[1].split('all-reduce')[0]))
          for line in reduces]


def test_the_compiled_reduction_has_one_operand_per_dtype():
  tree = _tree(1)  # 5 leaves: 4 float32, 1 int32.
  assert sum(_all_reduce_operands(lambda t: collectives.psum(t, 'data', fuse=True), tree)) == 2
  assert sum(_all_reduce_operands(lambda t: jax.lax.psum(t, 'data'), tree)) == 5


def test_the_train_step_does_one_fused_all_reduce_on_cpu(data_dir):
  """The trainer's step on 8 devices: one all-reduce, as many operands as dtypes (float32)."""
  from anp_jax import trainer
  from conftest import tiny_config
  assert collectives.fuse_by_default()  # The tests run on the CPU backend.
  run = trainer.build(tiny_config(data_dir))
  state = run.executor.init()
  batch = next(run.train_batches(0))
  hlo = run.executor.train_step.lower(state, batch).compile().as_text()
  reduces = [line for line in hlo.splitlines() if re.search(r'\ball-reduce(-start)?\(', line)]
  assert len(reduces) == 1, reduces
  operands = re.findall(r'[a-z]+\d*\[[\d,]*\]', reduces[0].split('=', 1)[1].split('all-reduce')[0])
  assert operands and all(o.startswith('f32[') for o in operands), operands
  assert len(operands) == 1, operands  # ~60 parameters, BN statistics and metric sums: one buffer.
