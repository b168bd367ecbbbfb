"""Synchronous data parallelism on the ``jit`` executor (the default).

`jax.jit` of `jax.shard_map` over the one mesh: batch ``P('data')``, state ``P()`` (replicated),
state buffers donated. Gradients are averaged with `pmean` inside the per-device step
(`anp_jax.steps.per_device_train_step`). Works unchanged across processes.
"""

import functools

from anp_jax.executors.common import (Executor, MeshHelper, memoized_map_eval,
                                      per_device_functions)


def make(config, model, tx, setup, mesh) -> Executor:
  train_fn, eval_fn, init_fn = per_device_functions(config, model, tx, setup)
  helper = MeshHelper(mesh)
  return Executor(
      name='jit', method='sync',
      init=helper.jit_init(init_fn),
      train_step=helper.jit_train_step(functools.partial(train_fn, in_shard_map=True)),
      map_eval=memoized_map_eval(
          lambda fn: helper.jit_eval_step(functools.partial(eval_fn, fn=fn))),
      to_device=helper.to_device, fetch=helper.fetch, unreplicate=lambda state: state,
      restore_target=helper.restore_target)
