"""Synchronous data parallelism on `jax.pmap` over the local devices, kept for comparison.

pmap is in maintenance mode; the ``jit`` executor (`anp_jax.executors.sync`) is the default and
the only one of the other methods. The state carries a leading local-device axis; checkpoints
hold one host copy of it (`to_checkpoint` / `from_checkpoint`), so they are interchangeable with
the jit executor's.
"""

import functools

import jax
import numpy as np

from anp_jax.executors.common import (AXIS, EvalStep, Executor, accumulate, host_init,
                                      memoized_map_eval, per_device_functions)


def make(config, model, tx, setup, mesh) -> Executor:
  del mesh  # pmap maps over this process's devices.
  train_fn, eval_fn, init_fn = per_device_functions(config, model, tx, setup)
  n_local = jax.local_device_count()

  def replicate(tree):
    stacked = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (n_local,) + x.shape), tree)
    return jax.pmap(lambda t: t)(stacked)

  def to_device(batch):
    return jax.tree.map(lambda x: x.reshape((n_local, -1) + x.shape[1:]), batch)

  # Device 0's copy, read without a program across the devices: ``a[0]`` on a pmap output (a
  # jax.Array sharded over every local device) compiles an SPMD gather per leaf, an all-reduce
  # over all devices each, and XLA:CPU's pool has just enough threads for one collective at a
  # time: under load such a per-leaf all-reduce once waited 300 s for its eighth participant and
  # aborted the process (tests/test_executors.py).
  def unreplicate(state):
    return jax.tree.map(lambda a: a.addressable_data(0).reshape(a.shape[1:]), state)

  def first_copy(a):
    return np.asarray(a.addressable_data(0))[0]

  def to_checkpoint(state):
    return jax.tree.map(first_copy, state)

  def map_eval(fn):  # Host totals and flags: pmap transfers them (the first batch's only).
    per_device = functools.partial(eval_fn, fn=fn)
    return EvalStep(jax.pmap(per_device, axis_name=AXIS),
                    jax.pmap(accumulate(per_device), axis_name=AXIS, donate_argnums=(2,)),
                    put=lambda value: value, flag=lambda value: np.full((n_local,), value))

  def restore_target(state):  # Host arrays: restored on the host, then replicated.
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                        to_checkpoint(state))

  return Executor(
      name='pmap', method='sync',
      init=lambda: replicate(host_init(init_fn)),
      train_step=jax.pmap(train_fn, axis_name=AXIS, donate_argnums=(0,)),
      map_eval=memoized_map_eval(map_eval),
      to_device=to_device,
      fetch=lambda x: jax.tree.map(first_copy, x),
      unreplicate=unreplicate, restore_target=restore_target,
      to_checkpoint=to_checkpoint, from_checkpoint=replicate)
