"""The statistical side: steps to a target against the batch size (McCandlish et al. 2018).

S(B) = S_min (1 + B_noise / B): from one pilot run (`pilot_model`: S_min through its steps to
target, B_noise its measured noise scale) or fitted to a sweep (`fit_steps_to_target`,
`sweep_model`), with alternative (S_min, B_noise) pairs that give every prediction its range.
"""

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from anp_jax.research.planner.errors import PlanError


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
