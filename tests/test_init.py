"""Every executor starts from the same initial state, bit for bit: one init program
(`executors.common.host_init`, compiled at XLA optimisation level 0 on CPU) for sync, pmap, async
and local SGD, whose own layouts (device axis, parameter history, node axis) are added without
arithmetic. This is what the README's "async with tau = 0 equals sync bit for bit" and "local SGD
with H = 1 equals sync" rest on."""

import jax
import numpy as np
import pytest

from anp_jax import trainer
from anp_jax.executors import common
from conftest import assert_leaves_close, leaves, tiny_config


def _init(config, monkeypatch):
  """(run, initial state as host numpy, the compiler options of every jax.jit made meanwhile)."""
  calls = []
  real = jax.jit

  def recording_jit(fun, **kwargs):
    calls.append(kwargs.get('compiler_options'))
    return real(fun, **kwargs)
  with monkeypatch.context() as m:
    m.setattr(jax, 'jit', recording_jit)  # Executors jit at build time and at init.
    run = trainer.build(config)
    state = jax.device_get(run.init_state())
  return run, state, calls


@pytest.fixture(scope='module')
def sync_init(data_dir):
  with pytest.MonkeyPatch.context() as m:
    return _init(tiny_config(data_dir), m)


def test_sync_init_is_one_level_0_program(sync_init):
  _, state, calls = sync_init
  assert common.INIT_COMPILER_OPTIONS == {'xla_backend_optimization_level': 0}
  assert calls.count(common.INIT_COMPILER_OPTIONS) == 1, calls
  assert state.history is None and int(state.step) == 0
  assert leaves(state.params) and all(np.isfinite(x).all() for x in leaves(state.params))


@pytest.mark.parametrize('overrides', [
    dict(executor='pmap'), dict(method='async', **{'async_sgd.tau': 1, 'async_sgd.max_tau': 2}),
    dict(method='local_sgd', **{'local_sgd.nodes': 2})], ids=['pmap', 'async', 'local_sgd'])
def test_every_executor_starts_from_syncs_state_bit_for_bit(data_dir, monkeypatch, sync_init,
                                                             overrides):
  _, want, _ = sync_init
  want_leaves = leaves((want.params, want.batch_stats, want.opt_state, want.noise_ema))
  run, got, calls = _init(tiny_config(data_dir, **overrides), monkeypatch)
  assert calls.count(common.INIT_COMPILER_OPTIONS) == 1, calls
  executor = run.executor
  if executor.name == 'pmap':  # One copy per local device.
    copies = [jax.tree.map(lambda x, i=i: x[i], got) for i in range(jax.local_device_count())]
  elif executor.method == 'local_sgd':  # One replica per node.
    copies = [jax.tree.map(lambda x, i=i: x[i], got) for i in range(2)]
  else:  # async: replicated, plus max_tau + 1 snapshots of the parameters.
    copies = [got]
    history = leaves(got.history)
    assert len(history) == len(leaves(want.params))
    for snapshots, p in zip(history, leaves(want.params), strict=True):
      assert snapshots.shape == (3,) + p.shape
      for k in range(3):
        np.testing.assert_array_equal(snapshots[k], p)
  assert len(copies) > 1 or executor.method == 'async'
  for copy in copies:
    assert_leaves_close(leaves((copy.params, copy.batch_stats, copy.opt_state, copy.noise_ema)),
                        want_leaves)  # No tolerance: bit for bit.
