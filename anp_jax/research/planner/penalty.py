"""Asynchrony: the convergence penalty of stale gradients and infrequent averaging.

Extra updates to the target, a factor 1 + alpha·(mean staleness) for asynchronous SGD and
1 + beta·(H − 1) for local SGD averaging every H steps, fitted to the epochs each arm of the
sync/async/mixed experiment needed to reach accuracy levels the synchronous arm reached.
"""

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from anp_jax.research.planner.errors import PlanError


def epochs_to_level(curve: Sequence[Dict], level: float) -> Optional[float]:
  """Epochs at which an eval curve first reaches ``level`` top-1, linearly interpolated."""
  prev = (0.0, 0.0)
  for c in curve:
    if c['top1'] >= level:
      (e0, a0), (e1, a1) = prev, (c['epoch'], c['top1'])
      return e0 + (e1 - e0) * (level - a0) / (a1 - a0) if a1 > a0 else e1
    prev = (c['epoch'], c['top1'])
  return None


@dataclasses.dataclass
class Penalty:
  """Extra updates to target: factor 1 + slope · x, x = mean staleness (async) or H − 1 (local).

  ``low``/``high`` bound the slope; ``points`` are the measured (x, factor, level) triples and
  ``bounds`` (x, minimum factor) for arms that never reached a level in their budget.
  """
  slope: float
  low: float
  high: float
  points: List[Tuple[float, float, float]]
  bounds: List[Tuple[float, float, float]]

  def factor(self, x: float) -> Tuple[float, float, float]:
    return 1 + self.slope * x, 1 + self.low * x, 1 + self.high * x


def _fit_slope(points, bounds, levels):
  """Slope of factor − 1 = slope·x through the origin, per level; the range over levels."""
  def slope(pts):
    xs = np.array([p[0] for p in pts])
    ys = np.array([p[1] - 1 for p in pts])
    return float(np.sum(xs * ys) / np.sum(xs * xs)) if np.sum(xs * xs) > 0 else 0.0
  valid = [p for p in points if p[0] > 0]
  # An arm that never reached a level needed at least budget/sync epochs: a lower bound.
  floor = max([(b[1] - 1) / b[0] for b in bounds if b[0] > 0], default=0.0)
  if not valid:  # Only lower bounds: the least slope they allow (an optimistic estimate).
    return Penalty(floor, floor, floor, points, bounds)
  per_level = [slope([p for p in valid if p[2] == lv]) for lv in levels
               if any(p[2] == lv for p in valid)]
  central = max(slope(valid), 0.0)
  return Penalty(max(central, floor), max(min(per_level), 0.0), max(max(per_level), floor),
                 points, bounds)


def penalty_kind(method: str) -> Optional[str]:
  """The penalty an experiment arm's method measures: 'async' (also mixed), 'local_sgd', None."""
  return {'async': 'async', 'mixed': 'async', 'local_sgd': 'local_sgd'}.get(method)


def convergence_penalty(results: Sequence[Dict], levels: Sequence[float] = (0.3, 0.45, 0.6)
                        ) -> Dict[str, Penalty]:
  """Penalties of async SGD (vs mean staleness) and local SGD (vs H − 1) from the experiment.

  ``results`` are ``experiments/sync_async_mixed.py``'s records (eval curves per arm). For each
  level (a fraction of the synchronous arm's best top-1) every arm's epochs to reach it divided
  by the synchronous arm's is one measured factor; an async or mixed-asynchronous arm of N
  workers (``method`` 'async' or 'mixed': the same simulated staleness, workers of one device or
  of a synchronous group) has mean staleness N − 1 (the event simulation's mean), a local-SGD arm
  x = H − 1. Of the arms per x (plain and staleness-aware lr, async and mixed) the best counts,
  as a planner would configure it. The
  slope is a least-squares fit through (0, 1); its range is the spread of per-level fits, raised
  to what the arms that never reached a level imply.
  """
  sync = next((r for r in results if r['method'] == 'sync'), None)
  if sync is None:
    raise PlanError('The sync/async/mixed results have no synchronous arm to compare with.')
  best = max(c['top1'] for c in sync['curve'])
  budget = max(c['epoch'] for c in sync['curve'])
  out = {}
  for kind, key in (('async', lambda r: r['workers'] - 1),
                    ('local_sgd', lambda r: r['sync_every'] - 1)):
    arms = [r for r in results if penalty_kind(r['method']) == kind]
    points, bounds = [], []
    for frac in levels:
      level = frac * best
      e_sync = epochs_to_level(sync['curve'], level)
      groups = {}
      for r in arms:
        e = epochs_to_level(r['curve'], level)
        groups.setdefault(key(r), []).append(e)
      for x, es in groups.items():
        reached = [e for e in es if e is not None]
        if reached:
          points.append((float(x), min(reached) / e_sync, frac))
        else:
          bounds.append((float(x), budget / e_sync, frac))
    if arms:
      out[kind] = _fit_slope(points, bounds, levels)
  return out
