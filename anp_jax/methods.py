"""The training methods as config values: their names, their checks and the local-SGD node count.

``config.executor`` (how the step compiles: `EXECUTORS`) and ``config.method`` (what it does
across devices and steps: `METHODS`, with the ``async_sgd`` and ``local_sgd`` sections) are
checked here, from the config alone (no devices, no JAX). Both `anp_jax.setup` (which checks a
config before anything runs) and `anp_jax.executors` (which run the methods) import this module,
so setup does not depend on the executors.
"""

import math

import numpy as np

EXECUTORS = ('jit', 'pmap')
METHODS = ('sync', 'async', 'local_sgd')
# config.async_sgd.staleness and .momentum.
STALENESS = ('constant', 'uniform', 'geometric', 'simulated')
MOMENTUM_MODES = ('keep', 'compensate')
# Optimizers with an explicit momentum that 'compensate' can lower.
MOMENTUM_OPTIMIZERS = ('sgd', 'nesterov', 'lars')


def validate(config) -> None:
  """Checks config.method and its section; ValueError with what to change (no devices used).

  The enumerated values (executor, method, staleness, ...) are checked by
  `anp_jax.setup.CHOICES` before this runs."""
  if config.method != 'sync' and config.executor != 'jit':
    raise ValueError(f"config.method={config.method!r} runs on the 'jit' executor only (the pmap "
                     f"executor is kept for comparison with synchronous training); set "
                     f"config.executor='jit'.")
  if config.method == 'async':
    _validate_async(config)
  elif config.method == 'local_sgd':
    _validate_local_sgd(config)


def _validate_async(config) -> None:
  """Checks config.async_sgd (its enumerations are checked by `anp_jax.setup.CHOICES`)."""
  a = config.async_sgd
  if not is_int(a.max_tau) or a.max_tau < 0:
    raise ValueError(f'config.async_sgd.max_tau must be an integer >= 0 (the parameter history '
                     f'kept), got {a.max_tau!r}.')
  if a.staleness in ('constant', 'geometric'):
    if a.staleness == 'constant' and (not is_int(a.tau) or a.tau < 0):
      raise ValueError(f'config.async_sgd.tau must be an integer >= 0 (steps of staleness), '
                       f'got {a.tau!r}.')
    if a.staleness == 'geometric' and not (isinstance(a.tau, (int, float)) and a.tau >= 0):
      raise ValueError(f'config.async_sgd.tau (the mean of the geometric staleness) must be '
                       f'>= 0, got {a.tau!r}.')
    if a.tau > a.max_tau:
      raise ValueError(f'config.async_sgd.tau={a.tau} is larger than the kept parameter history '
                       f'(config.async_sgd.max_tau={a.max_tau}): raise max_tau to at least '
                       f'{math.ceil(a.tau) if a.staleness == "constant" else 3 * math.ceil(a.tau)}'
                       f' (memory: (max_tau + 1) x the parameters per device) or lower tau.')
  if a.staleness == 'simulated':
    if not is_int(a.workers) or a.workers < 1:
      raise ValueError(f'config.async_sgd.workers must be an integer >= 1, got {a.workers!r}.')
    if not (isinstance(a.compute_cv, (int, float)) and a.compute_cv >= 0):
      raise ValueError(f'config.async_sgd.compute_cv must be >= 0, got {a.compute_cv!r}.')
    if a.workers - 1 > a.max_tau:
      raise ValueError(f'config.async_sgd.workers={a.workers} gives a mean staleness of '
                       f'{a.workers - 1}, larger than the kept parameter history '
                       f'(config.async_sgd.max_tau={a.max_tau}); set max_tau to at least '
                       f'{2 * a.workers} (memory: (max_tau + 1) x the parameters per device).')
  if a.momentum == 'compensate' and config.optimizer not in MOMENTUM_OPTIMIZERS:
    raise ValueError(f"config.async_sgd.momentum='compensate' lowers the explicit momentum of "
                     f'{MOMENTUM_OPTIMIZERS}; config.optimizer={config.optimizer!r} has none. '
                     "Use momentum='keep'.")


def _validate_local_sgd(config) -> None:
  """Checks config.local_sgd (the node count against the job's devices: `resolve_nodes`)."""
  s = config.local_sgd
  if not is_int(s.sync_every) or s.sync_every < 1:
    raise ValueError(f'config.local_sgd.sync_every must be an integer >= 1 (steps between '
                     f'parameter averages; 1 = synchronous SGD), got {s.sync_every!r}.')
  if not is_int(s.nodes) or s.nodes < 0:
    raise ValueError(f'config.local_sgd.nodes must be an integer >= 0 (0 = one node per JAX '
                     f'process), got {s.nodes!r}.')


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
