"""Executors: how the per-device step (`anp_jax.steps`) runs on the job's devices.

Two choices, kept apart:

* ``config.executor`` — how the step is compiled: ``'jit'`` (`jax.jit` of `jax.shard_map` over
  one mesh; the default) or ``'pmap'`` (over the local devices, for comparison).
* ``config.method`` — what the step does across devices and steps: ``'sync'`` (gradients
  averaged every step; `sync`, `pmap`), ``'async'`` (simulated asynchronous SGD, `asynchronous`)
  or ``'local_sgd'`` (synchronous inside a node, averaged across nodes, `local_sgd`). The other
  methods run on the jit executor only.

`make_executor` returns an `Executor` (see `common`); `make_run_mesh` gives the mesh a method runs
on; `optimizer_config` the config the optimizer is built from. The names and checks of
``config.executor``, ``config.method`` and their sections are in `anp_jax.methods` (used by
`anp_jax.setup` before anything runs).
"""

from typing import Optional

from anp_jax import methods
from anp_jax.executors import asynchronous, local_sgd, pmap, sync
from anp_jax.executors.common import (AXIS, DEVICE, NODE, Executor, make_mesh,  # noqa: F401
                                      make_node_mesh)


def make_run_mesh(config, devices: int, processes: int, device_list: Optional[list] = None):
  """The mesh `config.method` runs on: (node, device) for local SGD, else the 1-D data mesh."""
  if config.method == 'local_sgd':
    return make_node_mesh(methods.resolve_nodes(config, devices, processes), device_list)
  return make_mesh(device_list)


def model_axis_name(config) -> str:
  """The mesh axis global BatchNorm averages over: the gradients' axis (a node's devices in
  local SGD, whose nodes only meet at the averaging steps)."""
  return DEVICE if config.method == 'local_sgd' else AXIS


def optimizer_config(config):
  """The config the optimizer is built from (async may compensate the momentum)."""
  return asynchronous.optimizer_config(config) if config.method == 'async' else config


def make_executor(config, model, tx, setup, mesh) -> Executor:
  """The executor of `config.method` on `config.executor` (see the module docstring)."""
  if config.method == 'async':
    return asynchronous.make(config, model, tx, setup, mesh)
  if config.method == 'local_sgd':
    return local_sgd.make(config, model, tx, setup, mesh)
  return (sync.make if config.executor == 'jit' else pmap.make)(config, model, tx, setup, mesh)
