"""Every executor compiles the state's initialisation at XLA optimisation level 0
(`executors.common.INIT_COMPILER_OPTIONS`: it runs once, and level 2 spent 6x longer compiling it
than level 0 for ResNet-8; ResNet-50 2x) and still produces the state every other part expects."""

import jax
import pytest

from anp_jax import trainer
from anp_jax.executors import common
from conftest import leaves, tiny_config


@pytest.mark.parametrize('overrides', [
    dict(), dict(executor='pmap'), dict(method='async', **{'async_sgd.tau': 1}),
    dict(method='local_sgd', **{'local_sgd.nodes': 2})])
def test_each_executor_compiles_its_init_at_level_0(data_dir, monkeypatch, overrides):
  calls = []
  real = jax.jit

  def recording_jit(fun, **kwargs):
    calls.append(kwargs.get('compiler_options'))
    return real(fun, **kwargs)
  monkeypatch.setattr(jax, 'jit', recording_jit)  # Executors jit at build time (pmap: at init).
  state = trainer.build(tiny_config(data_dir, **overrides)).init_state()
  assert calls.count(common.INIT_COMPILER_OPTIONS) == 1, calls
  assert common.INIT_COMPILER_OPTIONS == {'xla_backend_optimization_level': 0}
  assert leaves(state)  # And it built a state.
