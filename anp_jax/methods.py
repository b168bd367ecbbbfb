"""Training methods besides synchronous SGD: simulated asynchronous SGD and local SGD.

``config.method`` selects one; `anp_jax.train` runs all of them on the same mesh, input pipeline
and checkpoints. This module holds the host-side parts that need no devices:

* ``'async'`` — *simulated* asynchronous SGD. Every update applies a gradient computed on the
  parameters of ``tau`` steps ago (a ring buffer of the last ``max_tau + 1`` parameter snapshots
  lives in the `TrainState`). The global batch of one step plays one worker's mini-batch: to
  simulate N workers of batch b, set ``batch_size=b`` and take the staleness of N workers
  (``staleness='simulated', workers=N``: mean tau = N - 1). `staleness_sequence` draws tau per
  step as a pure function of the seed and the step, so a resumed run sees the same sequence.
  BatchNorm: the forward pass runs the *stale* parameters with the *current* running statistics,
  and the statistics it computes replace the current ones (a worker's statistics travel with its
  gradient). Memory: (max_tau + 1) x parameter bytes per device (`tree_bytes` of the params).
* ``'local_sgd'`` — mixed: synchronous inside each node (gradients averaged over the node's
  devices), parameters (and BN statistics, optionally the optimizer state) averaged across nodes
  every ``sync_every`` steps. `resolve_nodes` turns ``local_sgd.nodes`` into a node count.
"""

import math
from typing import Optional

import numpy as np

METHODS = ('sync', 'async', 'local_sgd')
STALENESS = ('constant', 'uniform', 'geometric', 'simulated')
MOMENTUM_MODES = ('keep', 'compensate')
# Optimizers with an explicit momentum that 'compensate' can lower.
MOMENTUM_OPTIMIZERS = ('sgd', 'nesterov', 'lars')


def _is_int(value) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def validate(config, devices: Optional[int] = None, processes: Optional[int] = None) -> None:
  """Checks config.method and its section; ValueError with what to change (no devices used).

  ``devices``/``processes`` (the job's counts) enable the checks of the local-SGD node count.
  """
  method = config.get('method', 'sync')
  if method not in METHODS:
    raise ValueError(f'config.method={method!r} is unknown; choose one of {METHODS}.')
  if method != 'sync' and config.executor != 'jit':
    raise ValueError(f"config.method={method!r} runs on the 'jit' executor only (the pmap "
                     f"executor is kept for comparison with synchronous training); set "
                     f"config.executor='jit'.")
  if method == 'async':
    _validate_async(config)
  elif method == 'local_sgd':
    _validate_local_sgd(config, devices, processes)


def _validate_async(config):
  a = config.async_sgd
  if a.staleness not in STALENESS:
    raise ValueError(f'config.async_sgd.staleness={a.staleness!r} is unknown; choose one of '
                     f'{STALENESS}.')
  if not _is_int(a.max_tau) or a.max_tau < 0:
    raise ValueError(f'config.async_sgd.max_tau must be an integer >= 0 (the parameter history '
                     f'kept), got {a.max_tau!r}.')
  if a.staleness in ('constant', 'geometric'):
    if a.staleness == 'constant' and (not _is_int(a.tau) or a.tau < 0):
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
    if not _is_int(a.workers) or a.workers < 1:
      raise ValueError(f'config.async_sgd.workers must be an integer >= 1, got {a.workers!r}.')
    if not (isinstance(a.compute_cv, (int, float)) and a.compute_cv >= 0):
      raise ValueError(f'config.async_sgd.compute_cv must be >= 0, got {a.compute_cv!r}.')
    if a.workers - 1 > a.max_tau:
      raise ValueError(f'config.async_sgd.workers={a.workers} gives a mean staleness of '
                       f'{a.workers - 1}, larger than the kept parameter history '
                       f'(config.async_sgd.max_tau={a.max_tau}); set max_tau to at least '
                       f'{2 * a.workers} (memory: (max_tau + 1) x the parameters per device).')
  if a.momentum not in MOMENTUM_MODES:
    raise ValueError(f'config.async_sgd.momentum={a.momentum!r}; choose one of '
                     f'{MOMENTUM_MODES}.')
  if a.momentum == 'compensate' and config.optimizer not in MOMENTUM_OPTIMIZERS:
    raise ValueError(f"config.async_sgd.momentum='compensate' lowers the explicit momentum of "
                     f'{MOMENTUM_OPTIMIZERS}; config.optimizer={config.optimizer!r} has none. '
                     "Use momentum='keep'.")


def _validate_local_sgd(config, devices, processes):
  s = config.local_sgd
  if not _is_int(s.sync_every) or s.sync_every < 1:
    raise ValueError(f'config.local_sgd.sync_every must be an integer >= 1 (steps between '
                     f'parameter averages; 1 = synchronous SGD), got {s.sync_every!r}.')
  if not _is_int(s.nodes) or s.nodes < 0:
    raise ValueError(f'config.local_sgd.nodes must be an integer >= 0 (0 = one node per JAX '
                     f'process), got {s.nodes!r}.')
  if devices is not None:
    resolve_nodes(config, devices, processes or 1)


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


def expected_staleness(config) -> float:
  """Mean tau of config.async_sgd's distribution (before clipping): N - 1 for N workers."""
  a = config.async_sgd
  if a.staleness in ('constant', 'geometric'):
    return float(a.tau)
  if a.staleness == 'uniform':
    return a.max_tau / 2
  return float(a.workers - 1)


def compensated_momentum(momentum: float, workers: float) -> float:
  """Mitliagkas et al. 2016: N asynchronous workers add implicit momentum ~ 1 - 1/N."""
  return max(0.0, float(momentum) - (1.0 - 1.0 / workers))


def staleness_sequence(config, num_steps: int) -> np.ndarray:
  """tau for steps 0..num_steps-1 (int32): deterministic in ``async_sgd.seed``; not clipped.

  'constant': tau every step. 'uniform': integers 0..max_tau. 'geometric': P(k) = p (1-p)^k with
  mean tau (p = 1 / (1 + tau)). 'simulated': the staleness of `workers` workers against a
  parameter server, from the event simulation `anp_jax.research.perfmodel.staleness_sampler`, in the
  order the server applies the gradients (mean workers - 1). The sequence for n steps is a
  prefix of the one for more steps, so a longer run resumed from a shorter one agrees.
  """
  a = config.async_sgd
  n = int(num_steps)
  seed = int(a.seed)
  if a.staleness == 'constant':
    return np.full(n, int(a.tau), np.int32)
  if a.staleness == 'uniform':
    rng = np.random.default_rng([seed, 1])
    return rng.integers(0, int(a.max_tau) + 1, size=n).astype(np.int32)
  if a.staleness == 'geometric':
    if a.tau == 0:
      return np.zeros(n, np.int32)
    rng = np.random.default_rng([seed, 2])
    return (rng.geometric(1.0 / (1.0 + a.tau), size=n) - 1).astype(np.int32)
  if a.staleness == 'simulated':
    from anp_jax.research import perfmodel
    # The simulation's first gradients depend on nothing later, so a prefix stays a prefix.
    return perfmodel.staleness_sampler(int(a.workers), max(n, 1),
                                       compute_time_cv=float(a.compute_cv),
                                       seed=seed)[:n].astype(np.int32)
  raise ValueError(f'config.async_sgd.staleness={a.staleness!r} is unknown; choose one of '
                   f'{STALENESS}.')


def clip_staleness(taus: np.ndarray, max_tau: int, start_step: int = 0) -> np.ndarray:
  """tau clipped to the history kept (max_tau) and to the steps done (none before step 0)."""
  steps = np.arange(start_step, start_step + len(taus))
  return np.minimum(np.minimum(taus, max_tau), steps).astype(np.int32)


def describe_staleness(config, taus: np.ndarray) -> str:
  """One start-up line: the distribution, its realised mean, and what was clipped."""
  a = config.async_sgd
  over = int(np.sum(taus > a.max_tau))
  line = (f"simulated asynchronous SGD: staleness '{a.staleness}' (expected mean "
          f'{expected_staleness(config):.2f}, realised {taus.mean():.2f} over {len(taus)} '
          f'steps), max_tau {a.max_tau}')
  if over:
    line += (f'; {over} draw(s) ({100 * over / len(taus):.2f} %) exceeded max_tau and are '
             f'clipped to {a.max_tau}: raise config.async_sgd.max_tau to keep them '
             f'(largest draw {int(taus.max())})')
  return line


def tree_bytes(tree) -> int:
  """Bytes of a pytree of arrays (or ShapeDtypeStructs): one parameter snapshot of the history."""
  import jax
  return int(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
                 for x in jax.tree.leaves(tree)))
