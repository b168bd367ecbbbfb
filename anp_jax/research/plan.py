"""Time-to-accuracy planner: which batch size, sync or async, how many nodes.

The command line is `anp_jax.plan` (``python -m anp_jax.plan --pilot DIR ...``); `build_plan`
is the same from Python, `write_plan` writes what ``--out`` gets.

Two halves, joined by time to target = steps to target x time per step:

* **Statistical side** (McCandlish et al. 2018): steps to a target follow
  S(B) = S_min (1 + B_noise / B) and examples E(B) = E_min (1 + B / B_noise). From one *pilot*
  run at batch B0 that reached the target after S0 steps and logged the noise scale
  (`anp_jax.research.noise_scale`: the two EMAs tr(Σ) and |G|²), B_noise is the ratio of their means over
  the second half of the steps it trained and S_min = S0 / (1 + B_noise / B0) (`pilot_model`).
  From a *sweep* with two or more batch sizes reaching the target, S_min and B_crit are fitted
  directly (`fit_steps_to_target`) and the measured B_simple is shown next to them
  (`sweep_model`). Uncertainty: the spread of B_noise over consecutive windows of the pilot's
  log (or over the sweep's batch sizes / leave-one-batch-out fits) gives a set of (S_min, B_noise)
  pairs, and every prediction is reported as the range they span.
* **Asynchrony** (`convergence_penalty`): stale gradients and infrequent averaging cost extra
  updates. The factor 1 + alpha·(mean staleness) (asynchronous SGD) and 1 + beta·(H − 1) (local
  SGD averaging every H steps) is fitted to the epochs each arm of the sync/async/mixed experiment
  needed to reach accuracy levels the synchronous arm reached, relative to the synchronous arm;
  the spread over levels (and the lower bounds from arms that never got there) is its range.
* **Hardware side** (`anp_jax.research.perfmodel`): step time (sync, local SGD) or update rate and mean
  staleness (async, mixed-async) for every (nodes, global batch, method) of a cluster preset or
  a small cluster file (`load_cluster`, JSON or YAML, unknown fields rejected).

`make_plan` joins them into rows (nodes, global batch, method) -> steps, step time, time to
target, device-hours, and picks the fastest, the cheapest within 10 % of the fastest, and what
SPRINT's criterion (the fastest configuration by epoch time meeting a target global batch, blind
to convergence) would choose. Pure numpy + `perfmodel` (no JAX unless the workload is measured
from the pilot's model with XLA's cost analysis).
"""

import dataclasses
import json
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from anp_jax.configs import default as default_config
from anp_jax.metrics_io import read_metrics, target_crossing
from anp_jax.research import noise_scale
from anp_jax.research import perfmodel as pm

PLAN_METHODS = ('sync', 'async', 'mixed', 'local_sgd')


class PlanError(ValueError):
  """Bad planner input: the message says what to change."""


# ----------------------------------------------------------------------------------------------
# The statistical side.


def fit_steps_to_target(batch: Sequence[float], steps: Sequence[float],
                        relative: bool = True) -> Tuple[float, float]:
  """Least-squares fit of S = S_min (1 + B_crit / B); returns (s_min, b_crit).

  The model is linear in 1/B: S = a + c / B with a = S_min and c = S_min·B_crit, so this is an
  ordinary linear least-squares problem (no scipy). Steps span orders of magnitude across a
  sweep, so by default every point is weighted by 1/S, i.e. *relative* residuals are minimised —
  otherwise the smallest batches (most steps) decide the fit alone. Needs ≥ 2 distinct batch
  sizes. A non-positive S_min or B_crit means the data do not follow the model in this range
  (e.g. all points in the perfect-scaling regime); they are returned as fitted, for the caller
  to report.
  """
  b = np.asarray(batch, np.float64)
  s = np.asarray(steps, np.float64)
  if b.shape != s.shape or b.ndim != 1:
    raise ValueError(f'batch and steps must be 1-D of equal length, got {b.shape}, {s.shape}.')
  if len(np.unique(b)) < 2:
    raise ValueError('Fitting S = S_min (1 + B_crit / B) needs at least two distinct batch sizes.')
  if np.any(b <= 0) or np.any(s <= 0):
    raise ValueError('Batch sizes and steps must be positive.')
  design = np.stack([np.ones_like(b), 1.0 / b], axis=1)
  w = 1.0 / s if relative else np.ones_like(s)
  (a, c), *_ = np.linalg.lstsq(design * w[:, None], s * w, rcond=None)
  b_crit = c / a if a != 0 else math.inf
  return float(a), float(b_crit)


@dataclasses.dataclass
class StepsModel:
  """S(B) = s_min (1 + b_noise / B), with alternative (s_min, b_noise) pairs for its range.

  ``source`` says where it comes from; ``notes`` are the estimates shown next to it (e.g. the
  fitted B_crit and the measured B_simple of a sweep) and what they rest on (a sweep's
  ``fit_batches``, and the batch sizes ``excluded`` from its fit with the reason).
  """
  s_min: float
  b_noise: float
  alternatives: List[Tuple[float, float]]
  source: str
  notes: Dict[str, object] = dataclasses.field(default_factory=dict)

  def steps(self, batch: float) -> Tuple[float, float, float]:
    """(central, low, high) steps to target at global batch ``batch`` (per update)."""
    values = [s * (1 + b / batch) for s, b in [(self.s_min, self.b_noise)] + self.alternatives]
    return values[0], min(values), max(values)

  @property
  def e_min(self) -> float:
    """E_min = S_min · B_noise: the fewest examples (at B -> 0) that reach the target."""
    return self.s_min * self.b_noise


def pilot_model(batch: int, steps: float, b_noise: float,
                b_noise_samples: Sequence[float] = (), source: str = 'pilot') -> StepsModel:
  """One run at batch B0 reaching the target after S0 steps: S_min = S0 / (1 + B_noise / B0).

  Each of ``b_noise_samples`` (B_noise of sub-windows) gives an alternative (S_min, B_noise)
  through the same anchor, so the range is 0 at B0 and widens away from it.
  """
  if not (b_noise > 0 and math.isfinite(b_noise)):
    raise PlanError(f'The measured noise scale is {b_noise!r}: it must be positive. The pilot '
                    'ended before the gradient signal was measurable; train it longer or use a '
                    'later window.')
  anchor = lambda b: (steps / (1 + b / batch), b)
  alts = [anchor(b) for b in b_noise_samples if b is not None and b > 0]
  return StepsModel(*anchor(b_noise), alternatives=alts, source=source,
                    notes={'pilot_batch': batch, 'pilot_steps': steps, 'b_simple': b_noise})


def load_pilot(workdir: str, metric: str = 'eval/anp_top1', target: Optional[float] = None,
               windows: int = 4) -> StepsModel:
  """The steps model of a pilot run's workdir (``metrics.jsonl`` + ``config.json``).

  S0 is the pilot's steps to target as the sweep counts them (`metrics_io.target_crossing`:
  interpolated between the evaluations around the crossing), so one run gives the same S0 as a
  pilot and as a sweep row. B_noise is `noise_scale.window_b_simple` over the second half of
  the steps the pilot trained (as the sweep reports it), its range the `b_simple_windows` of
  ``windows`` sub-windows. The pilot must be synchronous (``config.method`` 'sync'; runs
  recorded before the field existed were): the model's steps are synchronous updates, to which
  the plan adds the asynchrony penalty itself.
  """
  records = read_metrics(workdir)
  cfg_path = os.path.join(workdir, 'config.json')
  if not records or not os.path.exists(cfg_path):
    raise PlanError(f'{workdir!r} is not a trainer workdir (no metrics.jsonl / config.json).')
  config = default_config.read_run_config(workdir)
  if config.method != 'sync':
    # Its steps to target already include the cost of stale (async, mixed) or averaged
    # (local_sgd) updates: taken as synchronous, S_min would be too high and the plan would
    # charge that cost a second time on the asynchronous rows.
    raise PlanError(f"The pilot in {workdir!r} trained with method {config.method!r}: a pilot "
                    "must be a synchronous run (config.method='sync'), whose steps measure the "
                    'batch size alone. Use a synchronous run of the same model as the pilot.')
  if target is None:
    if not config.stop_at_metric:
      raise PlanError('Give --target (the pilot has no config.stop_at_metric to take it from).')
    metric, target = config.stop_at_metric, float(config.stop_at_value)
  crossing = target_crossing(records, target, metric)
  if crossing is None:
    best = max((r[metric] for r in records if metric in r), default=None)
    raise PlanError(f'The pilot never reached {metric} >= {target} (best: {best}). Lower '
                    '--target, or train the pilot longer.')
  last = max(r['step'] for r in records)
  b_noise = noise_scale.window_b_simple(records, last / 2, last)
  if b_noise is None:
    has_fields = any(noise_scale.G2_FIELD in r for r in records)
    raise PlanError(
        f'The pilot in {workdir!r} has no usable noise-scale logs '
        f'({noise_scale.G2_FIELD} / {noise_scale.TRACE_FIELD}'
        + (': the mean |G|² of its second half is not positive' if has_fields else
           ' missing') + '). Train it with config.noise_scale=True, more than one device (or '
        "grad_accum_steps > 1) and bn_mode='ghost' or 'per_device'.")
  samples = noise_scale.b_simple_windows(records, windows, last / 2, last)
  model = pilot_model(int(config['batch_size']), crossing['step'], b_noise, samples,
                      source=f'pilot {os.path.basename(os.path.normpath(workdir))}')
  model.notes.update(target=target)
  return model


def sweep_points(rows: Sequence[Dict], rule: Optional[str] = None,
                 warmup: Optional[str] = None) -> Dict[int, Dict]:
  """Per batch: mean steps to target over its finished seeds, and their median B_simple.

  ``rows`` are a sweep's ``results.json`` records; only the selected learning rate of each
  batch (``best_lr``) and one (rule, warmup) arm count. Each point: ``steps`` (None unless every
  finished seed reached the target), ``b_simple``, ``seeds`` (finished) and ``missed`` (how many
  of them never reached it). A batch size that some seeds miss gets no steps, as in the sweep
  report (`sweep_report.aggregate`): the mean over the seeds that got there would flatter it
  (only the lucky ones count) and pull the fit towards perfect scaling.
  """
  arms = sorted({(r['rule'], r['warmup']) for r in rows})
  chosen = [a for a in arms if (rule is None or a[0] == rule) and (warmup is None or a[1] == warmup)]
  if len(chosen) != 1:
    raise PlanError(f'The sweep has the arms {arms} (rule, warmup); choose one with --rule and '
                    '--warmup.')
  points = {}
  for r in rows:
    if (r['rule'], r['warmup']) != chosen[0] or not r.get('best_lr', True):
      continue
    if r['status'] != 'finished':
      continue
    p = points.setdefault(int(r['batch']), {'steps': [], 'b_simple': [], 'missed': 0})
    if r['steps_to_target'] is None:
      p['missed'] += 1
    else:
      p['steps'].append(float(r['steps_to_target']))
    if r.get('b_simple') is not None:
      p['b_simple'].append(float(r['b_simple']))
  return {b: {'steps': float(np.mean(p['steps'])) if p['steps'] and not p['missed'] else None,
              'b_simple': float(np.median(p['b_simple'])) if p['b_simple'] else None,
              'seeds': len(p['steps']) + p['missed'], 'missed': p['missed']}
          for b, p in sorted(points.items())}


def sweep_model(points: Dict[int, Dict], use: str = 'fit') -> StepsModel:
  """S_min and B_crit fitted to a sweep (``use='fit'``), or S_min for the measured B_simple.

  The range comes from the leave-one-batch-out fits (jackknife). Both B_crit (fit) and
  B_simple (median over batch sizes of each run's window-mean estimate) are in ``notes``, with
  the batch sizes of the fit (``fit_batches``: where every finished seed reached the target;
  the planner's default batch sizes for a sweep) and those left out (``excluded``, with how
  many of their seeds missed the target).
  """
  reached = {b: p['steps'] for b, p in points.items() if p['steps'] is not None}
  if len(reached) < 2:
    raise PlanError(f'Only {len(reached)} batch size(s) of the sweep reached the target with '
                    'every seed: the fit needs two; lower the target or use one run as a pilot '
                    '(--pilot).')
  batch = np.array(sorted(reached), np.float64)
  steps = np.array([reached[b] for b in sorted(reached)])
  s_min, b_crit = fit_steps_to_target(batch, steps)
  simple = [p['b_simple'] for p in points.values() if p['b_simple'] is not None]
  b_simple = float(np.median(simple)) if simple else None
  notes = {'s_min_fit': s_min, 'b_crit_fit': b_crit, 'batches': len(reached),
           'fit_batches': sorted(reached)}
  missed = {b: p for b, p in points.items() if p['steps'] is None and p.get('missed')}
  if missed:
    notes['excluded'] = '; '.join(
        f'{b} ({p["missed"]} of {p.get("seeds", p["missed"])} seeds missed the target)'
        for b, p in sorted(missed.items())) + ': not fitted'
  if b_simple is not None:
    notes['b_simple'] = b_simple
  if use == 'b_simple':
    if b_simple is None:
      raise PlanError('The sweep has no B_simple measurements (noise-scale logs).')

    def anchored(b_noise, bs, ss):
      g = 1 + b_noise / bs
      w = 1 / ss ** 2
      return float(np.sum(w * ss * g) / np.sum(w * g * g)), b_noise

    central = anchored(b_simple, batch, steps)
    alts = [anchored(b, batch, steps) for b in simple]
    source = 'sweep, S_min for the measured B_simple'
  else:
    if not (s_min > 0 and 0 < b_crit < math.inf):
      raise PlanError(f'The sweep does not follow S = S_min (1 + B_crit / B) (fit: S_min={s_min:.3g}, '
                      f'B_crit={b_crit:.3g}); use --use b_simple or more batch sizes.')
    central = (s_min, b_crit)
    alts = []
    if len(batch) >= 3:
      for i in range(len(batch)):
        keep = np.arange(len(batch)) != i
        if len(np.unique(batch[keep])) >= 2:
          s, b = fit_steps_to_target(batch[keep], steps[keep])
          if s > 0 and 0 < b < math.inf:
            alts.append((s, b))
    source = 'sweep fit'
  return StepsModel(central[0], central[1], alts, source=source, notes=notes)


# The fields each experiment's results.json rows have (both write DIR/results.json).
SWEEP_FIELDS = ('batch', 'rule', 'warmup', 'status', 'steps_to_target')
PENALTY_FIELDS = ('name', 'method', 'curve')


def check_rows(rows, path: str, kind: str) -> List[Dict]:
  """`rows` (a results.json) if they are records of experiment `kind` ('sweep': batch_size_sweep.py,
  'penalty': sync_async_mixed.py); else `PlanError` naming the experiment expected."""
  fields, expected, other = {
      'sweep': (SWEEP_FIELDS, 'experiments/batch_size_sweep.py',
                'experiments/sync_async_mixed.py'),
      'penalty': (PENALTY_FIELDS, 'experiments/sync_async_mixed.py',
                  'experiments/batch_size_sweep.py')}[kind]
  if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
    raise PlanError(f'{path} is not a list of run records; give the results of {expected}.')
  lacking = sorted({f for r in rows for f in fields if f not in r})
  if lacking:
    other_fields = PENALTY_FIELDS if kind == 'sweep' else SWEEP_FIELDS
    looks = (f' (they look like the results of {other})'
             if rows and all(f in rows[0] for f in other_fields) else '')
    raise PlanError(f'{path} holds no {expected} results: its rows lack {lacking}{looks}. '
                    f'Give the --out directory (results.json) of {expected}.')
  return rows


def _read_rows(path: str, kind: str, label: str) -> List[Dict]:
  """The checked rows (`check_rows`) of the results.json at `path`; `PlanError` naming `label`
  when it cannot be read or parsed."""
  try:
    with open(path) as f:
      rows = json.load(f)
  except (OSError, ValueError) as e:
    raise PlanError(f'{label}: unreadable ({e}).') from None
  return check_rows(rows, path, kind)


def load_sweep(out_dir: str, rule: Optional[str] = None, warmup: Optional[str] = None,
               target: Optional[float] = None, use: str = 'fit') -> StepsModel:
  """The steps model of a finished sweep directory (its ``results.json``)."""
  path = os.path.join(out_dir, 'results.json')
  if not os.path.exists(path):
    raise PlanError(f'{out_dir!r} has no results.json: not a finished sweep directory.')
  rows = _read_rows(path, 'sweep', path)
  recorded = {r.get('target_top1') for r in rows}
  if target is not None and recorded != {target}:
    raise PlanError(f'The sweep results are for target {sorted(recorded)}, not {target}: '
                    'recompute them with `python experiments/batch_size_sweep.py ... '
                    f'--target_top1 {target}` (no retraining), then plan again.')
  model = sweep_model(sweep_points(rows, rule, warmup), use=use)
  model.notes.update(target=rows[0]['target_top1'] if rows else target)
  return model


# ----------------------------------------------------------------------------------------------
# Asynchrony: the convergence penalty.


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


def _penalty_kind(method: str) -> Optional[str]:
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
    arms = [r for r in results if _penalty_kind(r['method']) == kind]
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


# ----------------------------------------------------------------------------------------------
# Validation against measurements (experiments/plan_validation.py).


def validate_pilot(points: Dict[int, Dict], pilot_batch: int) -> List[Dict]:
  """Steps to target at every batch predicted from the pilot batch's run alone, vs measured.

  ``points`` as from `sweep_points` (the pilot's B_simple is its row's ``b_simple``).
  """
  pilot = points[pilot_batch]
  return validate_model(pilot_model(pilot_batch, pilot['steps'], pilot['b_simple']), points)


def validate_model(model: StepsModel, points: Dict[int, Dict]) -> List[Dict]:
  """A steps model's predictions (central, low, high) against measured steps per batch."""
  out = []
  for b, p in sorted(points.items()):
    central, lo, hi = model.steps(b)
    out.append({'batch': b, 'measured': p['steps'], 'predicted': central, 'low': lo, 'high': hi,
                'error': central / p['steps'] - 1 if p['steps'] else None})
  return out


def validate_leave_one_out(points: Dict[int, Dict]) -> List[Dict]:
  """Each batch's steps to target from the S_min, B_crit fit to all the other batches."""
  reached = {b: p['steps'] for b, p in points.items() if p['steps'] is not None}
  out = []
  for b in sorted(reached):
    others = {k: v for k, v in reached.items() if k != b}
    if len(others) < 2:
      continue
    s_min, b_crit = fit_steps_to_target(list(others), list(others.values()))
    pred = s_min * (1 + b_crit / b)
    out.append({'batch': b, 'measured': reached[b], 'predicted': pred,
                'error': pred / reached[b] - 1, 's_min': s_min, 'b_crit': b_crit})
  return out


def validate_methods(results: Sequence[Dict], level_frac: float = 0.5) -> List[Dict]:
  """Predicted vs measured time to a level for every arm of the sync/async/mixed experiment.

  Measured: the arm's epochs to ``level_frac`` x the sync arm's best top-1 (interpolated) times
  its predicted epoch time on the seed paper's cluster (the experiment's own mapping).
  Predicted: the sync arm's epochs times the penalty fitted *without this arm's worker count or
  sync period* (leave one out), times the same epoch time. None where an arm never got there.
  """
  sync = next(r for r in results if r['method'] == 'sync')
  level = level_frac * max(c['top1'] for c in sync['curve'])
  e_sync = epochs_to_level(sync['curve'], level)
  rows = []
  for r in results:
    measured = epochs_to_level(r['curve'], level)
    if r['method'] == 'sync':
      factor = 1.0
    else:
      kind = _penalty_kind(r['method'])
      kind_x = 'workers' if kind == 'async' else 'sync_every'
      rest = [o for o in results if o['method'] == 'sync' or
              (_penalty_kind(o['method']) == kind and o[kind_x] != r[kind_x])]
      pen = convergence_penalty(rest, levels=(level_frac,)).get(kind)
      x = r[kind_x] - 1
      factor = pen.factor(x)[0] if pen else None
    epoch_h = r['predicted_epoch_s'] / 3600
    rows.append({'name': r['name'], 'method': r['method'], 'level': level,
                 'measured_epochs': measured, 'predicted_epochs':
                 e_sync * factor if factor is not None else None,
                 'measured_h': measured * epoch_h if measured is not None else None,
                 'predicted_h': e_sync * factor * epoch_h if factor is not None else None})
  return rows


# ----------------------------------------------------------------------------------------------
# The hardware side.

_DEVICE_FIELDS = {f.name for f in dataclasses.fields(pm.Device)}
_INTERCONNECT_FIELDS = {f.name for f in dataclasses.fields(pm.Interconnect)}
_CLUSTER_FIELDS = {'name', 'nodes', 'devices_per_node', 'max_devices_per_node', 'device',
                   'interconnect', 'devices_per_compute_pool', 'node_counts'}


def _check_fields(where: str, given: Dict, allowed):
  unknown = sorted(set(given) - set(allowed))
  if unknown:
    raise PlanError(f'Unknown field(s) {unknown} in {where}; allowed: {sorted(allowed)}.')


def cluster_from_dict(spec: Dict) -> Tuple[pm.Cluster, List[int]]:
  """A `perfmodel.Cluster` (at its maximum node count) and the node counts to plan for.

  Fields: ``nodes`` (the most nodes available), ``devices_per_node``, ``device`` (a preset name:
  k80, v100, h200, cpu, or a dict of `perfmodel.Device` fields, optionally with ``preset`` to
  start from), ``interconnect`` (a dict of `perfmodel.Interconnect` fields, or a cluster preset
  name whose links to use), optional ``name``, ``max_devices_per_node``,
  ``devices_per_compute_pool`` and ``node_counts`` (default: 1, 2, 4, ... up to ``nodes``).
  """
  if not isinstance(spec, dict):
    raise PlanError(f'A cluster file holds one mapping of fields, got {type(spec).__name__}.')
  _check_fields('the cluster file', spec, _CLUSTER_FIELDS)
  for req in ('nodes', 'devices_per_node', 'device', 'interconnect'):
    if req not in spec:
      raise PlanError(f'The cluster file needs the field {req!r}.')
  device = spec['device']
  try:
    if isinstance(device, str):
      if device not in pm.DEVICES:
        raise PlanError(f'device {device!r} is not a preset; choose one of {sorted(pm.DEVICES)} '
                        'or give its fields.')
      device = pm.DEVICES[device]()
    else:
      _check_fields('cluster.device', device, _DEVICE_FIELDS | {'preset'})
      device = dict(device)
      base = device.pop('preset', None)
      if base is not None:
        if base not in pm.DEVICES:
          raise PlanError(f'device.preset {base!r} is unknown; choose one of {sorted(pm.DEVICES)}.')
        device = dataclasses.replace(pm.DEVICES[base](), **device)
      else:
        device.setdefault('name', 'device')
        device = pm.Device(**device)
    links = spec['interconnect']
    if isinstance(links, str):
      if links not in pm.CLUSTERS:
        raise PlanError(f'interconnect {links!r} is not a cluster preset; choose one of '
                        f'{sorted(pm.CLUSTERS)} or give its fields.')
      links = pm.CLUSTERS[links]().interconnect
    else:
      _check_fields('cluster.interconnect', links, _INTERCONNECT_FIELDS)
      links = pm.Interconnect(**links)
    cluster = pm.Cluster(nodes=spec['nodes'], devices_per_node=spec['devices_per_node'],
                         device=device, interconnect=links,
                         max_devices_per_node=spec.get('max_devices_per_node'),
                         name=spec.get('name', 'cluster'),
                         devices_per_compute_pool=spec.get('devices_per_compute_pool', 1))
  except (TypeError, ValueError) as e:
    if isinstance(e, PlanError):
      raise
    raise PlanError(f'Bad cluster description: {e}') from e
  counts = spec.get('node_counts')
  if counts is None:
    counts = _powers_of_two(cluster.nodes)
  elif not isinstance(counts, (list, tuple)) or not counts:
    # A scalar (``node_counts: 4``) is a plausible slip for a one-element list; iterating it
    # would be a TypeError and a traceback instead of this message.
    raise PlanError(f'node_counts must be a list of node counts, e.g. [1, 2, 4], got {counts!r}; '
                    'leave it out for 1, 2, 4, ... up to nodes.')
  # bool is an int subclass, but `true` in YAML is no node count.
  if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 or n > cluster.nodes
         for n in counts):
    raise PlanError(f'node_counts {counts} must be integers in 1..nodes={cluster.nodes}.')
  return cluster, sorted(set(counts))


def _powers_of_two(top: int) -> List[int]:
  counts, n = [], 1
  while n < top:
    counts.append(n)
    n *= 2
  return counts + [top]


def load_cluster(name_or_path: str, nodes: Optional[int] = None) -> Tuple[pm.Cluster, List[int]]:
  """A cluster preset (``minotauro``, ``dgx_h200``) or a JSON/YAML cluster file."""
  if name_or_path in pm.CLUSTERS:
    cluster = pm.CLUSTERS[name_or_path]() if nodes is None else pm.CLUSTERS[name_or_path](nodes)
    return cluster, _powers_of_two(cluster.nodes)
  if not os.path.exists(name_or_path):
    raise PlanError(f'--cluster {name_or_path!r} is neither a preset ({sorted(pm.CLUSTERS)}) '
                    'nor an existing file.')
  with open(name_or_path) as f:
    text = f.read()
  if name_or_path.endswith(('.yaml', '.yml')):
    import yaml
    try:
      spec = yaml.safe_load(text)
    except yaml.YAMLError as e:
      raise PlanError(f'{name_or_path}: not valid YAML ({e}).') from e
  else:
    try:
      spec = json.loads(text)
    except ValueError as e:
      raise PlanError(f'{name_or_path}: not valid JSON ({e}); YAML files end in .yaml.') from e
  return cluster_from_dict(spec)


# ----------------------------------------------------------------------------------------------
# Joining them.


@dataclasses.dataclass
class Row:
  """One planned configuration; times in seconds, ranges (low, high) from the model ranges."""
  nodes: int
  devices: int
  global_batch: int
  per_device_batch: int
  method: str
  sync_period: int
  update_batch: int
  mean_staleness: float
  steps: float
  steps_range: Tuple[float, float]
  step_time: float
  epoch_time: float
  time: float
  time_range: Tuple[float, float]
  device_hours: float

  def label(self) -> str:
    extra = f' H={self.sync_period}' if self.method == 'local_sgd' else ''
    return f'{self.nodes}x{self.devices // self.nodes} B={self.global_batch} {self.method}{extra}'


@dataclasses.dataclass
class Plan:
  rows: List[Row]
  fastest: Row
  cheapest: Row
  sprint: Optional[Row]
  sprint_batch: int
  model: StepsModel
  penalties: Dict[str, Penalty]
  skipped: List[str]


def plan_row(model: StepsModel, penalties: Dict[str, Penalty], cluster: pm.Cluster,
             workload: pm.Workload, nodes: int, global_batch: int, method: str,
             sync_period: int = 1, **predict_kwargs) -> Row:
  """Predicted steps and time to target of one configuration (ValueError if it cannot run)."""
  c = cluster.resized(nodes=nodes)
  devices = c.num_devices
  if global_batch % devices:
    raise ValueError(f'global batch {global_batch} does not split over {devices} devices')
  b = global_batch // devices
  if method == 'sync':
    p = pm.predict(c, workload, b, 'sync', **predict_kwargs)
  elif method == 'async':
    p = pm.predict(c, workload, b, 'async', **predict_kwargs)
  elif method == 'mixed':
    p = pm.predict(c, workload, b, 'mixed', **predict_kwargs)
  elif method == 'local_sgd':
    p = pm.predict(c, workload, b, 'mixed', mixed_mode='local_sgd', local_steps=sync_period,
                   **predict_kwargs)
  else:
    raise ValueError(f'method {method!r}; choose one of {PLAN_METHODS}')
  if method in ('async', 'mixed'):
    update_batch, staleness = p.worker_batch, p.mean_staleness
    pen = penalties.get('async')
    factor = pen.factor(staleness) if pen else (1.0, 1.0, 1.0)
    seconds_per_update = 1.0 / p.updates_per_s
  else:
    update_batch, staleness = global_batch, 0.0
    pen = penalties.get('local_sgd') if method == 'local_sgd' else None
    factor = pen.factor(sync_period - 1) if pen else (1.0, 1.0, 1.0)
    seconds_per_update = p.step_time
  s, s_lo, s_hi = model.steps(update_batch)
  steps = (s * factor[0], s_lo * factor[1], s_hi * factor[2])
  time = steps[0] * seconds_per_update
  return Row(nodes=nodes, devices=devices, global_batch=global_batch, per_device_batch=b,
             method=method, sync_period=sync_period, update_batch=update_batch,
             mean_staleness=staleness, steps=steps[0], steps_range=(steps[1], steps[2]),
             step_time=seconds_per_update, epoch_time=p.epoch_time, time=time,
             time_range=(steps[1] * seconds_per_update, steps[2] * seconds_per_update),
             device_hours=time * devices / 3600)


def make_plan(model: StepsModel, cluster: pm.Cluster, workload: pm.Workload,
              node_counts: Sequence[int], batches: Sequence[int], methods: Sequence[str],
              penalties: Optional[Dict[str, Penalty]] = None, sync_periods: Sequence[int] = (4,),
              sprint_batch: Optional[int] = None, tolerance: float = 0.10,
              drop_unfit: bool = False, **predict_kwargs) -> Plan:
  """Every (nodes, batch, method) that runs -> a `Row`; fastest, cheapest-near-fastest, SPRINT.

  A batch size that fits none of the configurations (splits over none of the node counts'
  devices) is an error naming it, since the caller asked for it; with ``drop_unfit`` (a default
  list the user never chose) it is left out and noted in ``skipped`` instead.
  """
  penalties = penalties or {}
  bad = sorted(set(methods) - set(PLAN_METHODS))
  if bad:
    raise PlanError(f'Unknown method(s) {bad}; choose from {PLAN_METHODS}.')
  if any(m in ('async', 'mixed') for m in methods) and 'async' not in penalties:
    raise PlanError('Asynchronous methods need a convergence penalty: pass --penalty_results '
                    '(the sync/async/mixed experiment results.json).')
  rows, skipped = [], []
  devices = [n * cluster.devices_per_node for n in node_counts]
  for batch in batches:
    fits_somewhere = False
    for n in node_counts:
      for method in methods:
        for h in (sync_periods if method == 'local_sgd' else (1,)):
          try:
            rows.append(plan_row(model, penalties, cluster, workload, n, batch, method, h,
                                 **predict_kwargs))
            fits_somewhere = True
          except ValueError as e:
            skipped.append(f'{n} node(s), B={batch}, {method}: {e}')
    if not fits_somewhere and drop_unfit:
      skipped.append(f'B={batch}: fits none of the configurations (devices {devices}); left out '
                     'of the default batch sizes')
    elif not fits_somewhere:
      raise PlanError(f'Global batch {batch} fits none of the configurations (devices {devices}): '
                      f'{skipped[-1] if skipped else ""}. Use a multiple of the device counts.')
  if not rows:  # Only with drop_unfit: every default batch size was left out.
    raise PlanError(f'None of the default batch sizes {list(batches)} fits a configuration '
                    f'(devices {devices}): give --batches, multiples of the device counts.')
  fastest = min(rows, key=lambda r: r.time)
  near = [r for r in rows if r.time <= (1 + tolerance) * fastest.time]
  cheapest = min(near, key=lambda r: (r.device_hours, r.time))
  sprint_batch = (sprint_batch or int(model.notes.get('pilot_batch', 0))
                  or min(r.global_batch for r in rows))
  meets = [r for r in rows if r.method == 'sync' and r.global_batch >= sprint_batch]
  sprint = min(meets, key=lambda r: (r.epoch_time, r.devices)) if meets else None
  return Plan(rows, fastest, cheapest, sprint, sprint_batch, model, penalties, skipped)


# ----------------------------------------------------------------------------------------------
# Output.


def _hours(seconds: float) -> str:
  h = seconds / 3600
  return f'{h:.3g} h' if h >= 0.1 else f'{seconds / 60:.3g} min'


def format_plan(plan: Plan) -> str:
  """The plan as markdown: model, penalties, the table, the three picks."""
  m = plan.model
  lines = [f'Steps model ({m.source}): S(B) = {m.s_min:.4g} (1 + {m.b_noise:.4g} / B), '
           f'E_min = {m.e_min:.4g} examples'
           + (f'; B_noise range {min(b for _, b in m.alternatives):.4g}-'
              f'{max(b for _, b in m.alternatives):.4g}' if m.alternatives else '') + '.']
  if m.notes:
    lines.append('Estimates: ' + ', '.join(f'{k} = {v:.4g}' if isinstance(v, float) else
                                            f'{k} = {v}' for k, v in m.notes.items()) + '.')
  for kind, p in plan.penalties.items():
    x = 'mean staleness' if kind == 'async' else '(H - 1)'
    lines.append(f'Convergence penalty {kind}: updates x (1 + {p.slope:.3g} {x}), slope range '
                 f'{p.low:.3g}-{p.high:.3g} ({len(p.points)} measured factors, '
                 f'{len(p.bounds)} lower bounds).')
  lines += ['', '| nodes | devices | global batch | method | update batch | staleness | steps '
            '(range) | step time | time to target (range) | device-hours |',
            '|---|---|---|---|---|---|---|---|---|---|']
  for r in sorted(plan.rows, key=lambda r: (r.global_batch, r.method, r.nodes)):
    method = r.method + (f' H={r.sync_period}' if r.method == 'local_sgd' else '')
    lines.append(f'| {r.nodes} | {r.devices} | {r.global_batch} | {method} | {r.update_batch} | '
                 f'{r.mean_staleness:.2g} | {r.steps:.0f} ({r.steps_range[0]:.0f}-'
                 f'{r.steps_range[1]:.0f}) | {1e3 * r.step_time:.4g} ms | {_hours(r.time)} '
                 f'({_hours(r.time_range[0])}-{_hours(r.time_range[1])}) | '
                 f'{r.device_hours:.3g} |')
  lines += ['', f'* Fastest: {plan.fastest.label()}: {_hours(plan.fastest.time)}, '
            f'{plan.fastest.device_hours:.3g} device-hours.',
            f'* Cheapest within 10 % of the fastest: {plan.cheapest.label()}: '
            f'{_hours(plan.cheapest.time)}, {plan.cheapest.device_hours:.3g} device-hours.']
  if plan.sprint is not None:
    lines.append(f'* SPRINT\'s criterion (fastest epoch, sync, global batch >= {plan.sprint_batch}):'
                 f' {plan.sprint.label()}: {_hours(plan.sprint.time)} to target, '
                 f'{plan.sprint.device_hours:.3g} device-hours.')
  return '\n'.join(lines)


def plot_plan(plan: Plan, out_dir: str) -> List[str]:
  """time_vs_nodes.png (time to target vs nodes, a line per batch and method) and pareto.png."""
  from anp_jax import plotting
  plt = plotting.pyplot()
  fig, ax = plt.subplots(figsize=(8, 4.5))
  keys = sorted({(r.global_batch, r.method, r.sync_period) for r in plan.rows})
  colour = {b: f'C{i % 10}' for i, b in enumerate(sorted({k[0] for k in keys}))}
  for batch, method, h in keys:
    rs = sorted([r for r in plan.rows if (r.global_batch, r.method, r.sync_period) ==
                 (batch, method, h)], key=lambda r: r.nodes)
    label = f'B={batch} {method}' + (f' H={h}' if method == 'local_sgd' else '')
    line, = ax.plot([r.nodes for r in rs], [r.time / 3600 for r in rs], marker='o', ms=3,
                    label=label, color=colour[batch],
                    linestyle={'sync': '-', 'async': ':', 'mixed': '--'}.get(method, '-.'))
    ax.fill_between([r.nodes for r in rs], [r.time_range[0] / 3600 for r in rs],
                    [r.time_range[1] / 3600 for r in rs], color=line.get_color(), alpha=0.1)
  ax.set(xscale='log', yscale='log', xlabel='nodes', ylabel='predicted time to target (h)',
         title='Time to target vs nodes (colour: batch, line: method; bands: range)')
  ax.legend(fontsize=6, ncol=1 + len(keys) // 16, loc='center left', bbox_to_anchor=(1.01, 0.5))
  paths = [plotting.save_figure(fig, os.path.join(out_dir, 'time_vs_nodes.png'))]
  fig, ax = plt.subplots(figsize=(6, 4.5))
  xs = np.array([r.device_hours for r in plan.rows])
  ys = np.array([r.time / 3600 for r in plan.rows])
  ax.scatter(xs, ys, s=12, color='0.6', label='configurations')
  front = pareto_front(plan.rows)
  ax.plot([r.device_hours for r in front], [r.time / 3600 for r in front], 'o-', color='C3',
          label='Pareto front')
  tags = {}  # One label per configuration, naming every pick it is.
  for r, tag in ((plan.fastest, 'fastest'), (plan.cheapest, 'cheapest ≤10 %'),
                 (plan.sprint, 'SPRINT')):
    if r is not None:
      tags.setdefault(id(r), (r, []))[1].append(tag)
  for i, (r, names) in enumerate(tags.values()):
    ax.annotate(f'{" = ".join(names)}: {r.label()}', (r.device_hours, r.time / 3600),
                fontsize=6, xytext=(5, 5 + 9 * i), textcoords='offset points')
  ax.set(xscale='log', yscale='log', xlabel='device-hours', ylabel='time to target (h)',
         title='Time vs cost')
  ax.legend(fontsize=7)
  paths.append(plotting.save_figure(fig, os.path.join(out_dir, 'pareto.png')))
  return paths


def pareto_front(rows: Sequence[Row]) -> List[Row]:
  """Rows no other row beats in both time and device-hours, by increasing device-hours."""
  front, best = [], math.inf
  for r in sorted(rows, key=lambda r: (r.device_hours, r.time)):
    if r.time < best:
      front.append(r)
      best = r.time
  return front


def plan_to_json(plan: Plan) -> Dict:
  return {'model': dataclasses.asdict(plan.model),
          'penalties': {k: dataclasses.asdict(v) for k, v in plan.penalties.items()},
          'rows': [dataclasses.asdict(r) for r in plan.rows],
          'fastest': plan.fastest.label(), 'cheapest_within_10pct': plan.cheapest.label(),
          'sprint': plan.sprint.label() if plan.sprint else None,
          'sprint_batch': plan.sprint_batch, 'skipped': plan.skipped}


# ----------------------------------------------------------------------------------------------
# From run directories to a written plan (what ``python -m anp_jax.plan`` does).


def pilot_classes(pilot: str, config) -> int:
  """The number of ANP classes the pilot run trained on. The head's size barely changes the FLOPs
  but is part of what every all-reduce moves (ResNet-50: 2048 x 553 of 25.6 M parameters).

  The generated dataset's count is in the config; a prepared folder's (dataset 'anp') is not,
  but the identity every checkpoint records holds it (`checkpointing.identity`): read from the
  newest readable one. (Before: the synthetic count was used for both, so a pilot on the real
  ANP folder was modelled with the default 32-class head.)
  """
  if config.dataset == 'synthetic_anp':
    return int(config.synthetic.num_pairs)
  directory = os.path.join(pilot, 'checkpoints')
  steps = sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True) \
      if os.path.isdir(directory) else []
  for step in steps:
    try:
      with open(os.path.join(directory, str(step), 'meta', 'metadata')) as f:
        classes = json.load(f).get('identity', {}).get('num_anps')
    except (OSError, ValueError):
      continue
    if classes:
      return int(classes)
  raise PlanError(f'--workload pilot: the pilot {pilot} trained on dataset {config.dataset!r}, '
                  'whose class count only its checkpoints record, and it has no readable '
                  f'checkpoint in {directory}. Use a --workload preset or a pilot with its '
                  'final checkpoint.')


def workload_for(name: str, dataset_size: int, pilot: Optional[str] = None) -> pm.Workload:
  """A `perfmodel.WORKLOADS` preset by name, or 'pilot': the pilot run's model from XLA."""
  if name in pm.WORKLOADS:
    return pm.WORKLOADS[name](dataset_size=dataset_size)
  if name == 'pilot' and pilot:
    config = default_config.read_run_config(pilot)
    from anp_jax import models
    model = models.create_model(config, models.Heads(pilot_classes(pilot, config)))
    return pm.workload_from_flax(model, config.image_size, name=config.model.name,
                                 dataset_size=dataset_size)
  raise PlanError(f'--workload {name!r}: choose one of {sorted(pm.WORKLOADS)} or '
                  '"pilot" (with --pilot).')


def build_plan(*, pilot: Optional[str] = None, sweep: Optional[str] = None,
               metric: str = 'eval/anp_top1', target: Optional[float] = None,
               rule: Optional[str] = None, warmup: Optional[str] = None, use: str = 'fit',
               cluster: str = 'minotauro', nodes: Optional[Sequence[int]] = None,
               batches: Optional[Sequence[int]] = None, methods: str = 'sync,mixed',
               sync_periods: Sequence[int] = (4,), penalty_results: Optional[str] = None,
               workload: str = 'resnet50', dataset_size: int = 307_406,
               sprint_batch: Optional[int] = None) -> Plan:
  """The plan from a pilot run or a sweep directory (one of them); arguments as the CLI's flags.

  ``penalty_results``: the sync/async/mixed results.json the asynchrony penalty is fitted to
  (needed when ``methods`` names anything but sync). Raises `PlanError` on bad input.
  """
  if (pilot is None) == (sweep is None):
    raise PlanError('Give one of --pilot (a pilot run) or --sweep (a sweep directory).')
  if sweep is not None and metric != 'eval/anp_top1':
    raise PlanError(f'--metric {metric}: a sweep records steps to its ANP top-1 target only '
                    '(eval/anp_top1); drop --metric, or plan from a --pilot run for another '
                    'metric.')
  if target is not None and not 0 < target <= 1:
    raise PlanError(f'--target {target}: give the target accuracy as a fraction, 0 < target <= 1 '
                    '(e.g. 0.25).')
  if not (isinstance(dataset_size, int) and dataset_size > 0):
    raise PlanError(f'--dataset_size {dataset_size}: give the number of training images (> 0).')
  if sprint_batch is not None and sprint_batch <= 0:
    raise PlanError(f'--sprint_batch {sprint_batch}: give a global batch size > 0.')
  if pilot:
    model = load_pilot(pilot, metric, target)
  else:
    model = load_sweep(sweep, rule, warmup, target, use)
  method_list = [m for m in methods.split(',') if m]
  penalties = {}
  if any(m != 'sync' for m in method_list):
    if not penalty_results or not os.path.exists(penalty_results):
      raise PlanError(f'--penalty_results {penalty_results!r} does not exist.')
    rows = _read_rows(penalty_results, 'penalty', f'--penalty_results {penalty_results}')
    penalties = convergence_penalty(rows)
  the_cluster, counts = load_cluster(cluster)
  counts = nodes or counts
  if any(n > the_cluster.nodes or n < 1 for n in counts):
    raise PlanError(f'--nodes {counts}: the cluster has 1..{the_cluster.nodes} nodes.')
  # Default batch sizes: around what was measured, where the model is best. A pilot's batch
  # B0 x 1/4 ... 32; a sweep's own batch sizes (those of its fit). Sizes the user did not choose
  # that split over none of the node counts' devices are dropped, not refused (`make_plan`).
  default = not batches
  if default and 'fit_batches' in model.notes:
    batches = list(model.notes['fit_batches'])
  elif default:
    b0 = int(model.notes.get('pilot_batch', 128))
    batches = [b0 * k // 4 for k in (1, 2, 4, 8, 16, 32, 64, 128) if b0 * k % 4 == 0]
  return make_plan(model, the_cluster, workload_for(workload, dataset_size, pilot), counts,
                   batches, method_list, penalties, sync_periods, sprint_batch,
                   drop_unfit=default)


def write_plan(plan: Plan, out_dir: str) -> List[str]:
  """plan.md (the `format_plan` text), plan.json and the two PNGs in ``out_dir``; their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = [os.path.join(out_dir, 'plan.md'), os.path.join(out_dir, 'plan.json')]
  with open(paths[0], 'w') as f:
    f.write('# Time-to-accuracy plan\n\n' + format_plan(plan) +
            '\n\n![time vs nodes](time_vs_nodes.png)\n![pareto](pareto.png)\n')
  with open(paths[1], 'w') as f:
    json.dump(plan_to_json(plan), f, indent=2)
  return paths + plot_plan(plan, out_dir)
