"""Asynchrony: the convergence penalty of stale gradients and infrequent averaging.

The planner's default (`mapped_penalty`, `MappedPenalty`): the mapped sync/async/mixed study
(`experiments/results/sync_async_mixed_cpu/`: every arm with the examples per update and the
staleness it has on the 16-K80 cluster, each at its own tuned rate, 3 seeds): an asynchronous
or mixed arm needs ``ratio`` times the examples synchronous SGD needs at the same global batch,
with the ratio's 95 % interval; local SGD likewise. No ordering by staleness is supported there,
so one ratio holds over the measured staleness.

The earlier form (`convergence_penalty`, only for a results.json given explicitly: the
withdrawn one-seed unmapped study feeds no default):
extra updates to the target, a factor 1 + alpha·(mean staleness) for asynchronous SGD and
1 + beta·(H − 1) for local SGD averaging every H steps, fitted to the epochs each arm of the
sync/async/mixed experiment needed to reach accuracy levels the synchronous arm reached. An arm
that never reached a level is censored: its factor is only bounded from below, and the fit
treats it so (`censored_slope`).
"""

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

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

  ``points`` are the measured (x, factor, level) triples, ``bounds`` the (x, minimum factor,
  level) of arms that never reached a level in their budget (censored: the factor is at least
  the budget over sync's epochs). ``low``/``high`` bound the slope: the fits per level and the
  leave-one-x-out fits. ``leave_one_out``: per measured factor or bound, the factor the fit
  without its x predicts (``error`` = predicted / measured − 1 for a factor; for a bound,
  ``consistent``: the prediction is at least the bound). ``inconsistent_bounds``: the bounds the
  fit on everything predicts below (the fit compromises between them and the measured factors).
  """
  slope: float
  low: float
  high: float
  points: List[Tuple[float, float, float]]
  bounds: List[Tuple[float, float, float]]
  leave_one_out: List[Dict] = dataclasses.field(default_factory=list)
  inconsistent_bounds: List[Tuple[float, float, float]] = dataclasses.field(default_factory=list)

  def factor(self, x: float) -> Tuple[float, float, float]:
    return 1 + self.slope * x, 1 + self.low * x, 1 + self.high * x

  @property
  def measured_x(self) -> Tuple[float, float]:
    """The range of x the experiment measured (factors or bounds): beyond it, extrapolation."""
    xs = [p[0] for p in self.points + self.bounds]
    return (min(xs), max(xs)) if xs else (0.0, 0.0)


def censored_slope(points: Sequence[Tuple[float, float, float]],
                   bounds: Sequence[Tuple[float, float, float]]) -> float:
  """Least-squares slope of factor − 1 = slope · x through the origin, a bound counting as a
  residual only where the fit predicts less than it (censored least squares).

  Minimises sum (f_i − 1 − s x_i)² over the measured factors plus sum max(0, L_j − 1 − s x_j)²
  over the lower bounds, s >= 0: convex and piecewise quadratic, so its derivative is monotone
  and bisection finds the minimum. A bound the fit already meets adds nothing; one it does not
  meet pulls the slope up as a measured factor at the bound would. With bounds only it is the
  least slope meeting them all (the optimistic end); with neither, 0. Points at x = 0 carry no
  information on a slope through the origin.
  """
  pts = [(x, f - 1) for x, f, *_ in points if x > 0]
  bnd = [(x, b - 1) for x, b, *_ in bounds if x > 0]
  if not pts and not bnd:
    return 0.0

  def gradient(s):
    return (-sum(x * (y - s * x) for x, y in pts)
            - sum(x * max(0.0, y - s * x) for x, y in bnd))

  lo, hi = 0.0, max([y / x for x, y in pts + bnd] + [0.0]) + 1.0
  if gradient(lo) >= 0:
    return 0.0
  for _ in range(200):  # The interval shrinks 2^200-fold: far below float resolution.
    mid = (lo + hi) / 2
    if gradient(mid) < 0:
      lo = mid
    else:
      hi = mid
  return hi


def fit_penalty(points: Sequence[Tuple[float, float, float]],
                bounds: Sequence[Tuple[float, float, float]],
                levels: Sequence[float]) -> Penalty:
  """`censored_slope` on everything, its range (per level, leaving each x out) and the
  leave-one-x-out predictions of every measured factor and bound."""
  points, bounds = list(points), list(bounds)
  slope = censored_slope(points, bounds)
  alternatives = [censored_slope([p for p in points if p[2] == lv],
                                 [b for b in bounds if b[2] == lv])
                  for lv in levels if any(p[2] == lv and p[0] > 0 for p in points + bounds)]
  loo = []
  for x in sorted({p[0] for p in points + bounds if p[0] > 0}):
    rest_p = [p for p in points if p[0] != x]
    rest_b = [b for b in bounds if b[0] != x]
    if not any(p[0] > 0 for p in rest_p + rest_b):
      continue  # Nothing else to predict it from.
    s = censored_slope(rest_p, rest_b)
    alternatives.append(s)
    for px, f, lv in points:
      if px == x:
        loo.append({'x': x, 'level': lv, 'measured': f, 'predicted': 1 + s * x,
                    'error': (1 + s * x) / f - 1, 'censored': False})
    for bx, b, lv in bounds:
      if bx == x:
        loo.append({'x': x, 'level': lv, 'measured': b, 'predicted': 1 + s * x, 'error': None,
                    'censored': True, 'consistent': 1 + s * x >= b})
  inconsistent = [b for b in bounds if 1 + slope * b[0] < b[1] - 1e-12]
  return Penalty(slope, min(alternatives + [slope]), max(alternatives + [slope]), points,
                 bounds, leave_one_out=loo, inconsistent_bounds=inconsistent)


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
  slope is a censored least-squares fit through (0, 1) (`censored_slope`: a missed level is a
  lower bound, not a measured factor); its range spans the per-level and leave-one-x-out fits
  (`fit_penalty`).
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
      out[kind] = fit_penalty(points, bounds, levels)
  return out


# ----------------------------------------------------------------------------------------------
# The mapped study's penalty: examples to the target relative to sync on the same cluster.

# The arms whose ratio the planner's asynchronous and local-SGD rows take: plain momentum and a
# plain rate, as the planner's methods train (compensated momentum and staleness-aware rates are
# variants the plan does not model).
MAPPED_KINDS = {'async': ('async', 'mixed'), 'local_sgd': ('local_sgd',)}


@dataclasses.dataclass
class MappedPenalty:
  """The cost of asynchrony (or of local SGD's infrequent averaging) as the mapped
  sync/async/mixed study measures it: an arm on the cluster needs ``ratio`` times the examples
  to the target that synchronous SGD needs **at the same global batch** (workers x their batch),
  each arm at its own tuned rate, 3 seeds. ``low`` / ``high``: its 95 % interval (Welch, delta
  method on the log scale, `stats.ratio_interval` of the pooled arms' seeds against sync's);
  ``log_sd`` the log-sd that interval implies, which joins the band. The study shows no ordering
  by staleness (or H), so one ratio holds over the measured range ``measured`` (mean staleness
  in updates, or H - 1); beyond it a row is extrapolated, and at 0 (one worker, or averaging
  every step: synchronous SGD) the factor is 1. ``arms``: each arm's own ratio and
  interval. ``reference`` 'global_batch': `time_to_target.plan_row` scales the steps model at
  the row's global batch, not at its update batch."""
  kind: str
  ratio: float
  low: float
  high: float
  log_sd: float
  measured: Tuple[float, float]
  arms: List[Dict]
  source: str
  seeds: int
  reference: str = 'global_batch'
  # Whether the figures are the fresh-seed confirmation's runs (not the ones that chose rates).
  confirmed: bool = False

  @property
  def bounds(self) -> int:
    """Seeds of the pooled arms that missed the target, counted at their budget: then the ratio
    (and its interval) is a lower bound on the penalty."""
    return sum(a.get('bounds', 0) for a in self.arms)

  @property
  def bounds_note(self) -> str:
    """Which arms' seeds are bounds, in words ('' when none)."""
    bounded = [f'{a["arm"]} ({a["bounds"]} of {a["seeds"]} seeds)' for a in self.arms
               if a.get('bounds')]
    return ('seeds that missed the target counted at their budget, so the ratio is a lower '
            f'bound: {", ".join(bounded)}' if bounded else '')

  def factor(self, x: float) -> Tuple[float, float, float]:
    """(ratio, low, high) at staleness (or H - 1) ``x``; 1 at x = 0: one worker, or
    averaging every step, is synchronous SGD."""
    if x <= 0:
      return 1.0, 1.0, 1.0
    return self.ratio, self.low, self.high

  def log_var(self, x: float) -> float:
    """The variance of the log ratio the band adds at ``x`` (none at x = 0)."""
    return self.log_sd ** 2 if x > 0 else 0.0

  @property
  def measured_x(self) -> Tuple[float, float]:
    return self.measured

  def covers(self, x: float) -> bool:
    lo, hi = self.measured
    return lo * (1 - 1e-9) <= x <= hi * (1 + 1e-9)


def _chosen_seeds(arm: Dict, grid: Sequence[Dict], key: str
                  ) -> Optional[Tuple[List[float], int]]:
  """An arm's ``key`` (examples to the target) over the seeds of its chosen rate, and how many of
  them are bounds: a seed that trained its whole budget without reaching the target counts at
  its budget (steps x the arm's examples per update; it needs at least that). None without a
  chosen rate or when a seed diverged or did not finish (nothing bounds it)."""
  if not arm.get('lr_chosen'):
    return None
  runs = [g for g in grid
          if g.get('arm') == arm['name'] and float(g['lr_mult']) == float(arm['lr_mult'])]
  values, bounds = [], 0
  for g in runs:
    if g.get(key) is not None:
      values.append(float(g[key]))
    elif g.get('status') == 'finished' and g.get('steps') and arm.get('batch'):
      values.append(float(g['steps']) * float(arm['batch']))
      bounds += 1
    else:
      return None
  return (values, bounds) if values else None


def mapped_penalty(study_dir: str) -> Dict[str, 'MappedPenalty']:
  """The asynchrony and local-SGD penalties of a mapped sync/async/mixed study directory
  (``results.json``: one record per arm at its chosen rate; ``grid.json``: every run). When the
  directory holds a fresh-seed confirmation of the chosen rates (``confirmation/``, the same
  files), its runs are used instead: figures from runs that did not choose the rates. Figures on
  the test split when every run evaluated it, else validation. A seed that missed the target
  counts at its budget, a lower bound (a censored point is counted, not dropped: leaving out the
  arms that missed would pick the easiest ones), and the penalty says so; an arm with a diverged
  or unfinished seed at its chosen rate is left out and named."""
  import json
  import os
  from anp_jax.research import stats
  confirmed = os.path.join(study_dir, 'confirmation')
  use = confirmed if os.path.exists(os.path.join(confirmed, 'grid.json')) else study_dir
  try:
    with open(os.path.join(use, 'results.json')) as f:
      arms = json.load(f)
    with open(os.path.join(use, 'grid.json')) as f:
      grid = json.load(f)
  except (OSError, ValueError) as e:
    raise PlanError(f'--penalty_results {study_dir}: not a mapped sync/async/mixed study '
                    f'directory ({e}).') from None
  if not isinstance(arms, list) or not all('staleness' in a and 'lr_chosen' in a for a in arms):
    raise PlanError(f'--penalty_results {study_dir}: its results.json holds no mapped '
                    'sync/async/mixed arms (experiments/sync_async_mixed.py with seeds).')
  test = all(g.get('has_test') for g in grid)
  key = ('test_' if test else '') + 'examples_to_target'
  sync = next((a for a in arms if a['method'] == 'sync'), None)
  ref = _chosen_seeds(sync, grid, key) if sync else None
  if ref is None or ref[1]:
    raise PlanError(f'--penalty_results {study_dir}: no synchronous arm whose seeds all reached '
                    'the target to compare with.')
  ref = ref[0]
  which = 'fresh-seed confirmation runs' if use == confirmed else 'the runs that chose the rates'
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))
  shown = os.path.abspath(study_dir)
  shown = os.path.relpath(shown, root) if shown.startswith(root + os.sep) else study_dir
  out = {}
  for kind, methods in MAPPED_KINDS.items():
    members, pooled, left_out = [], [], []
    for a in arms:
      if (a['method'] not in methods or a.get('aware') or a.get('compensate')
          or (kind == 'local_sgd' and a['sync_every'] <= 1)):
        continue
      chosen = _chosen_seeds(a, grid, key)
      if chosen is None:
        left_out.append(a['name'])
        continue
      values, bounds = chosen
      x = float(a['staleness']) if kind == 'async' else float(a['sync_every'] - 1)
      r = stats.ratio_interval(values, ref)
      members.append({'arm': a['name'], 'x': x, 'ratio': r['ratio'], 'low': r['low'],
                      'high': r['high'], 'seeds': len(values), 'bounds': bounds})
      pooled += values
    if not members:
      continue
    r = stats.ratio_interval(pooled, ref)
    t = stats.t_quantile(0.975, r['df']) if r['df'] else 1.96
    xs = [m['x'] for m in members]
    pen = MappedPenalty(
        kind=kind, ratio=r['ratio'], low=r['low'], high=r['high'],
        log_sd=math.log(r['high'] / r['low']) / (2 * t) if r['low'] else 0.0,
        measured=(min(xs), max(xs)), arms=members, source='', seeds=len(ref),
        confirmed=use == confirmed)
    pen.source = (f'{shown}: {", ".join(m["arm"] for m in members)} against sync at the same '
                  f'global batch, {"test" if test else "validation"} examples to the target, '
                  f'{which}' + (f'; {pen.bounds_note}' if pen.bounds else '')
                  + (f'; left out (a seed diverged or did not finish): {", ".join(left_out)}'
                     if left_out else ''))
    out[kind] = pen
  return out
