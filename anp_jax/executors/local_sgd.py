"""Local SGD (``config.method='local_sgd'``): synchronous inside a node, averaged across nodes.

A 2-D mesh (``node``, ``device``) over the same devices in the same order as the 1-D mesh
(`anp_jax.executors.common.make_node_mesh`). Each node keeps its own replica (every state leaf
has a leading node axis, sharded ``P('node')``); gradients are averaged over ``device`` only
(global BatchNorm too: over a node's batch); every ``sync_every`` steps a second compiled step
also averages parameters and BN statistics (optionally the optimizer state) over ``node``. The
host picks the step function by step number (`Executor.step_args`), so no collective sits inside
a conditional. `anp_jax.methods.resolve_nodes` turns ``local_sgd.nodes`` into a node count.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from anp_jax import collectives, optim, steps
from anp_jax.executors.common import (DEVICE, NODE, Executor, MeshHelper, memoized_map_eval,
                                      per_device_functions)


def _is_float(x) -> bool:
  return jnp.issubdtype(x.dtype, jnp.floating)


def average_replicas(tree):
  """One model from the nodes' replicas (leading node axis): float leaves averaged, others
  (step counters) taken from node 0."""
  return jax.tree.map(lambda x: collectives.replica_mean(x) if _is_float(x) else x[0], tree)


def make(config, model, tx, setup, mesh) -> Executor:
  """Local SGD over the (node, device) `mesh`; state leaves carry a leading node axis."""
  nodes, per_node = mesh.shape[NODE], mesh.shape[DEVICE]
  every = int(config.local_sgd.sync_every)
  average_opt = bool(config.local_sgd.average_opt_state)
  both = (NODE, DEVICE)
  helper = MeshHelper(mesh, batch_spec=P(both), state_spec=P(NODE))
  train_fn, _, init_fn = per_device_functions(config, model, tx, setup, num_devices=per_node,
                                              axis_name=DEVICE, in_shard_map=True)

  def node_mean(tree):
    # Across nodes (processes): one all-reduce buffer per dtype (`anp_jax.collectives`).
    leaves, treedef = jax.tree.flatten(tree)
    floats = [i for i, x in enumerate(leaves) if _is_float(x)]
    for i, mean in zip(floats, collectives.pmean([leaves[i] for i in floats], NODE), strict=True):
      leaves[i] = mean
    return jax.tree.unflatten(treedef, leaves)

  def average_model(local):
    # Frozen parameters and their BN statistics are equal on every node and stay bit-exact.
    return local.replace(
        params=optim.keep_frozen_params(config, local.params, node_mean(local.params)),
        batch_stats=optim.keep_frozen_stats(config, local.batch_stats,
                                            node_mean(local.batch_stats)))

  def step(state, batch, average: bool):
    local = jax.tree.map(lambda x: x[0], state)  # This node's replica.
    new, sums = train_fn(local, batch)
    if average:
      new = average_model(new)
      if average_opt:
        new = new.replace(opt_state=node_mean(new.opt_state))
    grad_norm = sums.pop('_grad_norm')
    # Metric sums over the whole global batch, and the mean gradient norm: one all-reduce.
    sums, grad_norm = collectives.psum((sums, grad_norm), NODE)
    sums['_grad_norm'] = grad_norm / jax.lax.axis_size(NODE)
    return jax.tree.map(lambda x: x[None], new), sums

  def eval_step(state, batch, fn):
    # The node-averaged model (what a final average would give).
    local = average_model(jax.tree.map(lambda x: x[0], state))
    return steps.per_device_eval_step(local, batch, model=model, config=config, fn=fn,
                                      axis_name=both)

  compiled = {average: helper.jit_train_step(functools.partial(step, average=average))
              for average in (False, True)}

  def train_step(state, batch, average: bool = False):
    return compiled[bool(average)](state, batch)

  def add_node_axis(state):
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (nodes,) + x.shape), state)

  return Executor(
      name='jit', method='local_sgd',
      init=helper.jit_init(init_fn, expand=add_node_axis),
      train_step=train_step,
      map_eval=memoized_map_eval(
          lambda fn: helper.jit_eval_step(functools.partial(eval_step, fn=fn))),
      to_device=helper.to_device, fetch=helper.fetch,
      unreplicate=jax.jit(average_replicas, out_shardings=helper.replicated),
      restore_target=helper.restore_target,
      step_args=lambda step: ((step + 1) % every == 0,),
      describe=(f'local SGD: {nodes} node(s) x {per_node} device(s), parameters'
                f'{" and optimizer state" if average_opt else ""} and BN statistics averaged '
                f'across nodes every {every} step(s)'
                + ("; bn_mode='global' averages over a node's batch" if
                   config.bn_mode == 'global' else '')),
      identity={'method': 'local_sgd', 'local_sgd.nodes': nodes})
