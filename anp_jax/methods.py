"""The training methods as config values: their names, their checks and the local-SGD node count.

``config.executor`` (how the step compiles: `EXECUTORS`) and ``config.method`` (what it does
across devices and steps: `METHODS`, with the ``async_sgd`` and ``local_sgd`` sections) are
checked here, from the config alone (no devices, no JAX). Both `anp_jax.setup` (which checks a
config before anything runs) and `anp_jax.executors` (which run the methods) import this module,
so setup does not depend on the executors.
"""

import math

import numpy as np

from anp_jax import registry

EXECUTORS = ('jit', 'pmap')
METHODS = ('sync', 'async', 'local_sgd')
# config.async_sgd.staleness and .momentum.
STALENESS = ('constant', 'uniform', 'geometric', 'simulated')
MOMENTUM_MODES = ('keep', 'compensate')


def momentum_optimizers():
  """The optimizers with an explicit momentum (``config.momentum``) that 'compensate' can lower:
  their registrations say (``explicit_momentum``, `anp_jax.optim.register_optimizer`)."""
  return tuple(n for n in registry.OPTIMIZERS.names()
               if registry.OPTIMIZERS.get(n).explicit_momentum)


def validate(config) -> None:
  """Checks config.method and its section; ValueError with what to change (no devices used).

  The enumerated values (executor, method, staleness, ...) and each number's own range (tau,
  max_tau, workers, nodes, sync_every, ...) are checked by `anp_jax.setup.CHOICES` and
  `anp_jax.setup.RANGES` before this runs; here, what depends on several fields. The node count
  against the job's devices: `resolve_nodes`."""
  if config.method != 'sync' and config.executor != 'jit':
    raise ValueError(f"config.method={config.method!r} runs on the 'jit' executor only (the pmap "
                     f"executor is kept for comparison with synchronous training); set "
                     f"config.executor='jit'.")
  if config.method == 'async':
    _validate_async(config)


def _validate_async(config) -> None:
  """Checks config.async_sgd's fields against each other."""
  a = config.async_sgd
  if a.staleness in ('constant', 'geometric'):
    if a.staleness == 'constant' and not is_int(a.tau):
      raise ValueError(f'config.async_sgd.tau must be an integer >= 0 (steps of staleness) with '
                       f"staleness='constant', got {a.tau!r}.")
    if a.tau > a.max_tau:
      raise ValueError(f'config.async_sgd.tau={a.tau} is larger than the kept parameter history '
                       f'(config.async_sgd.max_tau={a.max_tau}): raise max_tau to at least '
                       f'{math.ceil(a.tau) if a.staleness == "constant" else 3 * math.ceil(a.tau)}'
                       f' (memory: (max_tau + 1) x the parameters per device) or lower tau.')
  if a.staleness == 'simulated' and a.workers - 1 > a.max_tau:
    raise ValueError(f'config.async_sgd.workers={a.workers} gives a mean staleness of '
                     f'{a.workers - 1}, larger than the kept parameter history '
                     f'(config.async_sgd.max_tau={a.max_tau}); set max_tau to at least '
                     f'{2 * a.workers} (memory: (max_tau + 1) x the parameters per device).')
  if a.momentum == 'compensate' and config.optimizer not in momentum_optimizers():
    raise ValueError(f"config.async_sgd.momentum='compensate' lowers the explicit momentum of "
                     f'{momentum_optimizers()}; config.optimizer={config.optimizer!r} has none. '
                     "Use momentum='keep'.")


def resolve_nodes(config, devices: int, processes: int) -> int:
  """The local-SGD node count: ``local_sgd.nodes``, or one node per process when it is 0."""
  nodes = int(config.local_sgd.nodes) or processes
  if devices % nodes:
    raise ValueError(f'config.local_sgd.nodes={nodes} does not divide the {devices} devices of '
                     f'this job; use a divisor of {devices} '
                     f'({[n for n in range(1, devices + 1) if devices % n == 0]}).')
  per_node = devices // nodes
  local = devices // processes
  if processes > 1 and (per_node % local and local % per_node):
    raise ValueError(f'With {processes} processes of {local} devices, a node of {per_node} '
                     'devices would straddle processes unevenly; choose config.local_sgd.nodes '
                     'so that each node is a whole number of processes or each process a whole '
                     'number of nodes.')
  return nodes


def is_int(value) -> bool:
  """An integer config value (numpy integers too; True/False are not)."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
