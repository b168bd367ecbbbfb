"""Closed-form throughput and staleness distribution of asynchronous SGD, without the simulation.

`analytic_async` approximates what the event simulation `anp_jax.staleness.simulate_async`
measures for identical workers against a non-merging parameter server; `perfmodel.prediction`
reports it next to the simulated values as a cross-check, and `total_variation` measures how
far apart the two staleness distributions are.
"""

import dataclasses
import math
from typing import Dict

import numpy as np

from anp_jax.staleness import require_non_negative, require_positive


@dataclasses.dataclass(frozen=True)
class AsyncAnalytic:
  """Closed-form approximation of what `simulate_async` measures (no merging server).

  ``server_bound``: the servers' serialised link time, not the workers, sets the throughput; the
  mean-value formulas ignore queueing near that point, where the simulation is the reference.
  """
  gradients_per_s: float
  images_per_s: float
  mean_staleness: float
  staleness_variance: float
  staleness_pmf: Dict[int, float]
  effective_batch_pmf: Dict[int, float]
  server_bound: bool


def analytic_async(num_workers: int, compute_time_mean: float, compute_time_cv: float = 0.0,
                   comm_time: float = 0.0, *, server_time: float = 0.0,
                   push_fraction: float = 0.5, worker_batch: int = 1) -> AsyncAnalytic:
  """Throughput and staleness distribution of asynchronous SGD, without the simulation.

  Same inputs as `simulate_async` (identical workers, non-merging server). Derivation:

  * A worker's cycle is compute + pull + max(push, server time): N / cycle gradients per second,
    capped at 1 / ``server_time`` when the servers' links saturate (``server_bound``).
  * Mean staleness N - 1 (exact: between a worker's read and its next update, every other worker
    updates once on average).
  * Variance: N (N - 1) c^2 + (N - 1) c (1 - c) sqrt(2/pi) with c the cycle's coefficient
    of variation (compute jitter over the whole cycle; transfers are deterministic). The first
    term is exact for exponential cycles (c = 1: every update comes from a uniformly random
    worker, so staleness is geometric with mean N - 1), and 0 for lock-step workers (c = 0:
    staleness exactly N - 1); the second, the rounding of other workers' phase drift, is an
    empirical fit to `simulate_async` for c in [0.1, 1] and N in [4, 16] (gamma step times).
  * Shape: a negative binomial with that mean and variance when the variance exceeds the mean
    (geometric at c = 1), otherwise a normal density rounded to the integers >= 0.

  The tests hold the pmf to the simulation's within a total-variation distance of 0.15 for
  servers below saturation. A saturated server queues the gradients and serves them nearly
  round-robin, which narrows the distribution: there the simulation is the reference.
  """
  require_positive('analytic_async', 'num_workers', num_workers, integer=True)
  require_positive('analytic_async', 'compute_time_mean', compute_time_mean)
  require_positive('analytic_async', 'worker_batch', worker_batch, integer=True)
  for field, value in (('compute_time_cv', compute_time_cv), ('comm_time', comm_time),
                       ('server_time', server_time)):
    require_non_negative('analytic_async', field, value)
  if not 0 <= push_fraction <= 1:
    raise ValueError(f'analytic_async.push_fraction must be in [0, 1], got {push_fraction!r}.')
  n = num_workers
  push = push_fraction * comm_time
  cycle = compute_time_mean + (comm_time - push) + max(push, server_time)
  rate = n / cycle
  server_bound = server_time > 0 and 1.0 / server_time < rate
  if server_bound:
    rate = 1.0 / server_time
  c = min(compute_time_cv * compute_time_mean / cycle, 1.0)
  mean = float(n - 1)
  var = n * (n - 1) * c**2 + (n - 1) * c * (1 - c) * math.sqrt(2 / math.pi)
  pmf = _count_pmf(mean, var)
  return AsyncAnalytic(gradients_per_s=rate, images_per_s=rate * worker_batch,
                       mean_staleness=mean, staleness_variance=var, staleness_pmf=pmf,
                       effective_batch_pmf={worker_batch: 1.0}, server_bound=server_bound)


def _count_pmf(mean: float, var: float, tail: float = 1e-4) -> Dict[int, float]:
  """A distribution over integers >= 0 with the given mean and variance (see `analytic_async`)."""
  if mean == 0 or var <= 1e-12:
    return {int(round(mean)): 1.0}
  hi = int(math.ceil(mean + 12 * math.sqrt(var) + 10))
  k = np.arange(hi + 1)
  if var > mean:
    r = mean**2 / (var - mean)
    p = r / (r + mean)
    logpmf = (np.array([math.lgamma(x + r) - math.lgamma(r) - math.lgamma(x + 1) for x in k]) +
              r * math.log(p) + k * math.log1p(-p))
    w = np.exp(logpmf)
  else:
    w = np.exp(-0.5 * (k - mean)**2 / var)
  w = np.where(w / w.sum() >= tail, w, 0.0)  # Drop the far tail, then renormalise.
  w = w / w.sum()
  return {int(x): float(v) for x, v in zip(k, w) if v > 0}


def total_variation(p: Dict[int, float], q: Dict[int, float]) -> float:
  """Total-variation distance between two pmfs given as value -> probability dicts."""
  keys = set(p) | set(q)
  return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)
