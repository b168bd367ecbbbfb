"""Gradient staleness of asynchronous SGD, from a discrete-event simulation (pure numpy).

`simulate_async` runs N workers that compute, push their gradient and read the parameters back
against parameter servers, and records each gradient's staleness (updates applied between the
worker's read and the update that applies its gradient) and each update's effective batch. Two
users, at two levels:

* the simulated asynchronous SGD of the trainer (`anp_jax.executors.asynchronous`) draws its
  per-step staleness from `staleness_sampler` (``config.async_sgd.staleness='simulated'``);
* the performance model (`anp_jax.research.perfmodel`) predicts throughput and staleness
  distributions from `simulate_async`.

The sampler is a thin view of the simulation, so both live here, in the core, below both users:
the core never imports `anp_jax.research`.
"""

import dataclasses
import heapq
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np


# ----------------------------------------------------------------------------------------------
# Validation helpers: every error names the offending field.

def require_positive(owner: str, field: str, value, integer: bool = False):
  if integer:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
      raise ValueError(f'{owner}.{field} must be a positive integer, got {value!r}.')
  elif isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
    raise ValueError(f'{owner}.{field} must be a positive number, got {value!r}.')
  if not value > 0 or not math.isfinite(value):
    raise ValueError(f'{owner}.{field} must be positive (and finite), got {value!r}.')


def require_non_negative(owner: str, field: str, value):
  if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
    raise ValueError(f'{owner}.{field} must be a non-negative number, got {value!r}.')
  if not value >= 0 or not math.isfinite(value):
    raise ValueError(f'{owner}.{field} must be non-negative (and finite), got {value!r}.')


# ----------------------------------------------------------------------------------------------
# Discrete-event simulation of asynchronous SGD with parameter servers.

@dataclasses.dataclass
class AsyncSimResult:
  """Samples recorded by `simulate_async` after its warm-up.

  ``staleness[i]``: updates the server applied between the moment the worker of the i-th recorded
  gradient read its parameters and the update that applies that gradient. ``effective_batch[j]``:
  images in the j-th recorded update (worker batch x gradients merged into it).
  """
  staleness: np.ndarray
  worker: np.ndarray
  apply_time: np.ndarray
  effective_batch: np.ndarray
  elapsed: float
  num_workers: int
  worker_batch: int

  @property
  def mean_staleness(self) -> float:
    return float(self.staleness.mean())

  @property
  def gradients_per_s(self) -> float:
    return len(self.staleness) / self.elapsed if self.elapsed > 0 else math.inf

  @property
  def updates_per_s(self) -> float:
    return len(self.effective_batch) / self.elapsed if self.elapsed > 0 else math.inf

  @property
  def images_per_s(self) -> float:
    return self.gradients_per_s * self.worker_batch

  def staleness_pmf(self) -> Dict[int, float]:
    return _pmf(self.staleness)

  def effective_batch_pmf(self) -> Dict[int, float]:
    return _pmf(self.effective_batch)


def _pmf(samples: np.ndarray) -> Dict[int, float]:
  values, counts = np.unique(samples, return_counts=True)
  return {int(v): float(c) / len(samples) for v, c in zip(values, counts)}


class _UnitSampler:
  """Buffered unit-mean step-time multipliers with a given coefficient of variation."""

  def __init__(self, cv: float, distribution: str, rng: np.random.Generator, block: int = 8192):
    if distribution not in ('gamma', 'lognormal'):
      raise ValueError(f"distribution={distribution!r}; choose 'gamma' or 'lognormal'.")
    self.cv, self.distribution, self.rng, self.block = cv, distribution, rng, block
    self._buf, self._i = np.empty(0), 0

  def __call__(self) -> float:
    if self.cv == 0:
      return 1.0
    if self._i == len(self._buf):
      if self.distribution == 'gamma':
        shape = 1.0 / self.cv**2
        self._buf = self.rng.gamma(shape, 1.0 / shape, self.block)
      else:
        sigma2 = math.log1p(self.cv**2)
        self._buf = self.rng.lognormal(-sigma2 / 2, math.sqrt(sigma2), self.block)
      self._i = 0
    self._i += 1
    return float(self._buf[self._i - 1])


def simulate_async(num_workers: int, compute_time_mean: Union[float, Sequence[float]],
                   compute_time_cv: float = 0.0, comm_time: float = 0.0,
                   num_updates: int = 10_000, seed: int = 0, *, server_time: float = 0.0,
                   apply_time: float = 0.0, push_fraction: float = 0.5,
                   distribution: str = 'gamma', merge: bool = False, worker_batch: int = 1,
                   warmup: Optional[int] = None) -> AsyncSimResult:
  """Simulate N workers training asynchronously against a parameter server; record staleness.

  Each worker loops: compute a gradient (``compute_time_mean`` seconds on average, one value or
  one per worker; gamma- or lognormal-distributed with coefficient of variation
  ``compute_time_cv``), push it, and read the new parameters back. The time line of one push:

  * the server's links are a FIFO resource occupied ``server_time`` seconds per gradient (the
    serialised part: gradient bytes over the servers' aggregate bandwidth);
  * the worker's own link needs ``push_fraction * comm_time`` seconds; the gradient reaches the
    server when both are done;
  * the server applies updates one at a time, ``apply_time`` seconds each. With ``merge`` it sums
    every gradient that arrived while it was busy into the next update (SPRINT's server, whose
    effective mini-batch then varies); without, each gradient is its own update (TensorFlow's
    asynchronous parameter servers, as in the seed paper).

  The worker reads the parameters as they are right after its update and spends the remaining
  ``(1 - push_fraction) * comm_time`` receiving them. Staleness = updates applied between that
  read and the update that applies the worker's next gradient. For N identical workers, each
  other worker's updates fall into every such interval once on average: mean staleness N-1
  whatever the step-time distribution (without merging).

  The first ``warmup`` gradients (default 10 per worker; all workers start in lock-step) are
  dropped; ``num_updates`` gradients are recorded after it.
  """
  require_positive('simulate_async', 'num_workers', num_workers, integer=True)
  require_positive('simulate_async', 'num_updates', num_updates, integer=True)
  require_positive('simulate_async', 'worker_batch', worker_batch, integer=True)
  require_non_negative('simulate_async', 'compute_time_cv', compute_time_cv)
  for field, value in (('comm_time', comm_time), ('server_time', server_time),
                       ('apply_time', apply_time)):
    require_non_negative('simulate_async', field, value)
  if not 0 <= push_fraction <= 1:
    raise ValueError(f'simulate_async.push_fraction must be in [0, 1], got {push_fraction!r}.')
  means = np.broadcast_to(np.asarray(compute_time_mean, dtype=float), (num_workers,)).copy()
  if np.any(~np.isfinite(means)) or np.any(means <= 0):
    raise ValueError('simulate_async.compute_time_mean must be positive, got '
                     f'{compute_time_mean!r}.')
  if warmup is None:
    warmup = 10 * num_workers
  require_non_negative('simulate_async', 'warmup', warmup)

  rng = np.random.default_rng(seed)
  draw = _UnitSampler(compute_time_cv, distribution, rng)
  push_time = push_fraction * comm_time
  pull_time = comm_time - push_time

  # Events: (time, sequence, kind, payload); the sequence number keeps ties in FIFO order.
  REQUEST, ARRIVE, APPLIED = 0, 1, 2
  events: List[Tuple[float, int, int, object]] = []
  seq = 0

  def schedule(t, kind, payload):
    nonlocal seq
    heapq.heappush(events, (t, seq, kind, payload))
    seq += 1

  read_version = np.zeros(num_workers, dtype=np.int64)
  for w in range(num_workers):
    schedule(means[w] * draw(), REQUEST, w)

  link_free = 0.0
  version = 0
  busy = False
  queue: List[int] = []
  staleness, workers, times, eff_batch = [], [], [], []
  seen = 0
  last_applied = 0.0  # time of the latest update; the recording window opens at one
  t_start = None
  target = warmup + num_updates

  def start_update(t):
    nonlocal busy, queue
    if merge:
      batch, queue = queue, []
    else:
      batch = [queue.pop(0)]
    busy = True
    schedule(t + apply_time, APPLIED, batch)

  while seen < target:
    t, _, kind, payload = heapq.heappop(events)
    if kind == REQUEST:
      start = max(t, link_free)
      link_free = start + server_time
      schedule(max(link_free, t + push_time), ARRIVE, payload)
    elif kind == ARRIVE:
      queue.append(payload)
      if not busy:
        start_update(t)
    else:
      busy = False
      if seen + len(payload) > warmup:
        if t_start is None:
          t_start = last_applied
        eff_batch.append(len(payload) * worker_batch)
      for w in payload:
        if seen >= warmup:
          staleness.append(version - read_version[w])
          workers.append(w)
          times.append(t)
        seen += 1
        read_version[w] = version + 1
        schedule(t + pull_time + means[w] * draw(), REQUEST, w)
      version += 1
      last_applied = t
      if queue:
        start_update(t)
  # A merged last update may overshoot the target: keep exactly num_updates gradients.
  staleness, workers, times = staleness[:num_updates], workers[:num_updates], times[:num_updates]
  return AsyncSimResult(staleness=np.asarray(staleness, dtype=np.int64),
                        worker=np.asarray(workers, dtype=np.int64),
                        apply_time=np.asarray(times, dtype=float),
                        effective_batch=np.asarray(eff_batch, dtype=np.int64),
                        elapsed=float(times[-1] - t_start), num_workers=num_workers,
                        worker_batch=worker_batch)


def staleness_sampler(num_workers: int, num_samples: int, *, compute_time_cv: float = 0.1,
                      comm_to_compute: float = 0.0, server_to_compute: float = 0.0,
                      distribution: str = 'gamma', merge: bool = False,
                      seed: int = 0) -> np.ndarray:
  """``num_samples`` staleness values (int64) of asynchronous SGD with ``num_workers`` workers.

  For a simulated asynchronous SGD that needs realistic delays: the values come from
  `simulate_async` in the order the server applies the gradients (so their temporal correlation
  is kept), with times in units of the mean compute time: ``comm_to_compute`` is the worker-side
  push+pull time and ``server_to_compute`` the serialised server time per gradient, both relative
  to one compute step. The mean is num_workers - 1 unless the server saturates with ``merge``.
  """
  result = simulate_async(num_workers, 1.0, compute_time_cv, comm_to_compute, num_samples, seed,
                          server_time=server_to_compute, distribution=distribution, merge=merge)
  return result.staleness
