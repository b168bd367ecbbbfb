"""The statistical side: steps to a target against the batch size (McCandlish et al. 2018).

S(B) = S_min (1 + B_crit / B): from one pilot run (`pilot_model`: S_min through its steps to
target, B_crit its measured noise scale B_noise times `B_CRIT_FACTOR`, calibrated on held-out
tasks), fitted to pilots at two or more batch sizes (`multi_batch_pilot_model`) or to a sweep
(`fit_steps_to_target`, `sweep_model`), with alternative (S_min, B_noise) pairs that give every
prediction its range.
"""

import dataclasses
import math
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from anp_jax.research import stats, study_results
from anp_jax.research.planner.budget import Budget
from anp_jax.research.planner.default_predictor import DEFAULT as _DEFAULT
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


# The band: an approximate 90 % prediction interval of the steps to target, log-normal with the
# spreads below added in quadrature (see `StepsModel.band_width`).
BAND_LEVEL = 0.90
BAND_Z = statistics.NormalDist().inv_cdf(0.5 + BAND_LEVEL / 2)  # 1.645

# Run-to-run spread of steps to target when the input measures none (one pilot seed): re-running
# a configuration of the committed cpu batch-size sweep (`experiments/results/bs_sweep_cpu/`)
# with another data order moved its steps to target by -31 % to +40 % (B=32 without lr scaling:
# 500 -> 348 steps; B=64 without warmup: 248 -> 346). That range is taken as the 90 % range of
# the ratio of two runs of one configuration: in logs, (ln 1.40 - ln 0.69) / 2 = 0.354 =
# BAND_Z x sqrt(2) x sigma, so one run's log-sd sigma = 0.152. Inputs with several seeds of one
# configuration (pilot seeds, a sweep's seeds) use their measured spread instead.
DEFAULT_SEED_SPREAD = (-0.31, 0.40)
DEFAULT_SEED_LOG_SD = ((math.log1p(DEFAULT_SEED_SPREAD[1]) - math.log1p(DEFAULT_SEED_SPREAD[0]))
                       / (2 * BAND_Z * math.sqrt(2)))

# B_crit = B_CRIT_FACTOR x the pilot's B_noise (up to its target crossing): the `factor`
# predictor (`predictors`), with its parameters in `default_predictor.DEFAULT`. McCandlish et al.
# (2018) take B_crit ~ B_noise; on the generated tasks a-f of the `plan_validation` study preset
# (`anp_jax/configs/study_plan_validation.py`: the linear rule's rates, untuned, the planner's
# premise), S = S_min (1 + B_crit / B) fitted to the mean steps of 5-6 batch sizes x 3 seeds gave
# B_crit / B_noise = 2.05 (a), 1.95 (b), 1.69 (c), 1.30 (d), 2.01 (e), 1.60 (f)
# (`experiments/results/plan_validation/heldout/`, diagnosis). The factor is their geometric mean;
# its uncertainty for a new task their log-sd (5 degrees of freedom) as a prediction interval,
# sd·sqrt(1 + 1/6). (Over a, b, c alone: 1.891, log-sd 0.0985, which scored d, e, f out of sample
# and understated the spread: d's 1.30 lay outside its 90 % interval, 1.36-2.63.)
# `tests/test_planner_factor.py` recomputes them from the committed results.
B_CRIT_FACTOR = _DEFAULT['parameters']['factor']['factor']
B_CRIT_FACTOR_LOG_SD = _DEFAULT['parameters']['factor']['log_sd']
B_CRIT_FACTOR_TASKS = _DEFAULT['parameters']['factor']['tasks']
B_CRIT_FACTOR_SOURCE = f'B_crit / B_noise fitted on {_DEFAULT["calibration"]}'

# How far from the pilot's batch size B0 the pilot's predictions have been validated:
# B0 / 4 ... 8 B0 (`experiments/plan_validation.py`, report in
# experiments/results/plan_validation/). The planner's default batch sizes stay inside; rows
# beyond are marked extrapolated.
VALIDATED_RATIOS = (0.25, 8.0)

# The same for a pilot at two batch sizes B1 < B2 (S_min and B_crit fitted, no factor): B1 / 4
# ... 2 B2, of its smallest and its largest batch (a pilot at B0 and 4 B0 scored on the held-out
# tasks' other batch sizes, docs/studies.md section 5).
MULTI_VALIDATED_RATIOS = (0.25, 2.0)


@dataclasses.dataclass
class StepsModel:
  """S(B) = s_min (1 + b_crit_factor · b_noise / B), with the uncertainty of each prediction.

  ``b_noise``: a pilot's measured noise scale, or a sweep's fitted B_crit (its factor 1).
  ``b_crit_factor``: B_crit / B_noise (a pilot: `B_CRIT_FACTOR` unless given), with
  ``factor_log_sd`` its uncertainty for a new task (log-sd over the ``factor_tasks`` tasks that
  calibrated it; 0: taken as exact) and ``anchor_batch`` the batch where the factor's part of
  the band is 0 (the pilot's: S goes through its steps there whatever the factor).

  ``alternatives``: other (s_min, b_noise) pairs the input allows: B_noise of sub-windows of a
  pilot's log through the same anchor (``spread='windows'``: their standard deviation is the
  uncertainty), or the leave-one-batch-out fits of a sweep (``spread='jackknife'``: the
  jackknife standard deviation). ``seed_log_sd``: the run-to-run spread (log-sd) of one run's
  steps to target (``seed_source`` says whence: measured over seeds, or `DEFAULT_SEED_LOG_SD`);
  ``anchor_runs``: how many runs the model's anchor averages (a pilot's seeds; inf for a fit,
  whose jackknife already holds its points' noise). ``covered``: the batch sizes the input
  measured; ``validated``: how far predictions have been checked (a pilot: `VALIDATED_RATIOS`
  of its batch). ``budget``: the input's training budget and schedule, carried to other batch
  sizes (None: not known). ``source`` says where the model comes from; ``notes`` are the
  estimates shown next to it (e.g. a sweep's fitted B_crit and measured B_simple, its
  ``fit_batches`` and the batch sizes ``excluded`` from its fit with the reason).
  ``fit_points``: (batch, mean steps, runs) of pilots at several batch sizes whose means S(B)
  was fitted to (`multi_batch_pilot_model`): their seed noise reaches each prediction through
  the fit (`anchor_weight`) instead of one anchor's ``anchor_runs``.
  """
  s_min: float
  b_noise: float
  alternatives: List[Tuple[float, float]]
  source: str
  notes: Dict[str, object] = dataclasses.field(default_factory=dict)
  spread: str = 'windows'
  seed_log_sd: float = DEFAULT_SEED_LOG_SD
  seed_dof: Optional[float] = None  # Degrees of freedom of a measured seed_log_sd.
  seed_source: str = (f'default: one run\'s log-sd {DEFAULT_SEED_LOG_SD:.3f}, from re-runs that '
                      f'moved steps to target by {100 * DEFAULT_SEED_SPREAD[0]:+.0f} % to '
                      f'{100 * DEFAULT_SEED_SPREAD[1]:+.0f} %')
  anchor_runs: float = 1.0
  covered: Optional[Tuple[float, float]] = None
  validated: Optional[Tuple[float, float]] = None
  budget: Optional[Budget] = None
  b_crit_factor: float = 1.0
  factor_log_sd: float = 0.0
  factor_tasks: int = 0
  anchor_batch: Optional[float] = None
  fit_points: Tuple[Tuple[float, float, float], ...] = ()

  @property
  def b_crit(self) -> float:
    """The critical batch of S(B): b_crit_factor x b_noise."""
    return self.b_crit_factor * self.b_noise

  def form(self) -> str:
    """The model in one phrase, for the plan."""
    return (f'S(B) = {self.s_min:.4g} (1 + {self.b_crit:.4g} / B), E_min = {self.e_min:.4g} '
            'examples')

  def central(self, batch: float) -> float:
    """Steps to target at global batch ``batch`` (per update)."""
    return self.s_min * (1 + self.b_crit / batch)

  def noise_log_sd(self, batch: float) -> float:
    """The uncertainty of log S(batch) from B_noise (and S_min): the alternatives' spread."""
    k = self.b_crit_factor
    logs = [math.log(s * (1 + k * b / batch)) for s, b in self.alternatives]
    if len(logs) < 2:
      return 0.0
    if self.spread == 'jackknife':
      mean = sum(logs) / len(logs)
      return math.sqrt((len(logs) - 1) / len(logs) * sum((v - mean) ** 2 for v in logs))
    return statistics.stdev(logs)

  def factor_log_var(self, batch: float) -> float:
    """The variance of log S(batch) from the factor's uncertainty for a new task: d log S /
    d log k = x / (1 + x) - x0 / (1 + x0), x = B_crit / batch, x0 = B_crit / anchor_batch (0
    at the anchor), times the factor's log-sd as a prediction for one more task."""
    if not self.factor_log_sd or self.anchor_batch is None:
      return 0.0
    x, x0 = self.b_crit / batch, self.b_crit / self.anchor_batch
    slope = x / (1 + x) - x0 / (1 + x0)
    tasks = max(self.factor_tasks, 1)
    return (slope * self.factor_log_sd) ** 2 * (1 + 1 / tasks)

  def anchor_weight(self, batch: float) -> float:
    """How much of one run's seed variance (log steps) the model's prediction at ``batch``
    inherits from the runs it rests on: 1 / anchor_runs for one anchor (0 for a sweep's fit,
    whose jackknife holds its points' noise). With ``fit_points`` (means S_i of n_i runs), the
    fit's prediction is linear in them, S(B) = Σ h_i(B) S_i (the relative-weighted least squares
    of `fit_steps_to_target`), so by the delta method Var log S(B) = σ² Σ h_i² S_i² / n_i /
    S(B)² for a seed log-sd σ: small between the batches, growing beyond them as the fit
    extrapolates."""
    if not self.fit_points:
      return 1 / self.anchor_runs
    b, s, n = (np.array([p[i] for p in self.fit_points], np.float64) for i in range(3))
    design = np.stack([np.ones_like(b), 1 / b], axis=1)
    omega = 1 / s ** 2
    x = np.array([1.0, 1.0 / batch])
    h = omega * (design @ np.linalg.solve(design.T @ (design * omega[:, None]), x))
    central = float(h @ s)
    return float(np.sum(h ** 2 * s ** 2 / n)) / central ** 2

  def band_width(self, batch: float, runs: float = 1, extra_log_var: float = 0.0) -> float:
    """Half the width of the `BAND_LEVEL` band of log steps, with ``extra_log_var`` (another
    independent uncertainty, e.g. a penalty's) added.

    The variance: B_noise's uncertainty, the anchor's seed noise (its runs averaged, or carried
    through a fit: `anchor_weight`) and the new runs' seed noise, noise_log_sd² + seed_log_sd²
    (anchor_weight + 1/runs), the factor's (`factor_log_var`), plus the extra. The normal
    quantile, or Student's t where a part was measured from few values (the seed spread from few
    seeds, the factor from few tasks: each with its degrees of freedom), carried to the sum by
    Welch-Satterthwaite (the other parts counted as known), ν = σ_total⁴ / Σ (σ_part⁴ / ν_part).
    """
    seed_var = self.seed_log_sd ** 2 * (self.anchor_weight(batch) + 1 / runs)
    factor_var = self.factor_log_var(batch)
    total_var = self.noise_log_sd(batch) ** 2 + seed_var + factor_var + extra_log_var
    parts = [(seed_var, self.seed_dof), (factor_var, self.factor_tasks - 1)]
    measured = sum(v ** 2 / dof for v, dof in parts if dof and dof > 0 and v > 0)
    quantile = BAND_Z
    if measured > 0:
      quantile = stats.t_quantile(0.5 + BAND_LEVEL / 2, total_var ** 2 / measured)
    return quantile * math.sqrt(total_var)

  def steps(self, batch: float, runs: float = 1) -> Tuple[float, float, float]:
    """(central, low, high) steps to target at global batch ``batch`` (per update): the band is
    an approximate `BAND_LEVEL` prediction interval of the mean of ``runs`` runs."""
    central, width = self.central(batch), self.band_width(batch, runs)
    return central, central * math.exp(-width), central * math.exp(width)

  def extrapolation(self, batch: float) -> str:
    """'' inside the validated batch sizes, else why the prediction at ``batch`` is outside."""
    if self.validated is None:
      return ''
    lo, hi = self.validated
    if lo * (1 - 1e-9) <= batch <= hi * (1 + 1e-9):
      return ''
    pilot = self.notes.get('pilot_batch')
    ratio = f' ({batch / pilot:g}x the pilot\'s {pilot})' if pilot else ''
    return f'batch {batch:g}{ratio} outside the validated {lo:g}-{hi:g}'

  @property
  def e_min(self) -> float:
    """E_min = S_min · B_crit: the fewest examples (at B -> 0) that reach the target."""
    return self.s_min * self.b_crit


def pilot_model(batch: int, steps: float, b_noise: float,
                b_noise_samples: Sequence[float] = (), source: str = 'pilot',
                b_crit_factor: float = 1.0, factor_log_sd: float = 0.0, factor_tasks: int = 0,
                **fields) -> StepsModel:
  """One run at batch B0 reaching the target after S0 steps: S_min = S0 / (1 + B_crit / B0),
  B_crit = ``b_crit_factor`` x B_noise (1 here: McCandlish et al.'s B_crit ~ B_noise; the
  planner's pilots pass `B_CRIT_FACTOR`, see `inputs.load_pilot`).

  Each of ``b_noise_samples`` (B_noise of sub-windows) gives an alternative (S_min, B_noise)
  through the same anchor, so B_noise's part of the band is 0 at B0 and widens away from it,
  as does the factor's (``factor_log_sd`` over ``factor_tasks``). It covers B0 and is validated
  over `VALIDATED_RATIOS` of it; ``fields`` set the other `StepsModel` fields (seed spread,
  anchor runs, budget).
  """
  if not (b_noise > 0 and math.isfinite(b_noise)):
    raise PlanError(f'The measured noise scale is {b_noise!r}: it must be positive. The pilot '
                    'ended before the gradient signal was measurable; train it longer or use a '
                    'later window.')
  if not (b_crit_factor > 0 and math.isfinite(b_crit_factor)):
    raise PlanError(f'The B_crit / B_noise factor is {b_crit_factor!r}: it must be positive.')
  anchor = lambda b: (steps / (1 + b_crit_factor * b / batch), b)
  alts = [anchor(b) for b in b_noise_samples if b is not None and b > 0]
  fields.setdefault('covered', (batch, batch))
  fields.setdefault('validated', (batch * VALIDATED_RATIOS[0], batch * VALIDATED_RATIOS[1]))
  return StepsModel(*anchor(b_noise), alternatives=alts, source=source,
                    notes={'pilot_batch': batch, 'pilot_steps': steps, 'b_simple': b_noise},
                    b_crit_factor=b_crit_factor, factor_log_sd=factor_log_sd,
                    factor_tasks=factor_tasks, anchor_batch=batch, **fields)


def multi_batch_pilot_model(crossings: Dict[int, Sequence[float]], source: str = 'pilots',
                            **fields) -> StepsModel:
  """Pilots at two or more batch sizes (``crossings``: each batch's steps to target, one per
  seed): S_min and B_crit fitted to their mean steps (`fit_steps_to_target`: exact through two
  batches), with no B_crit / B_noise factor. The band carries the seeds' noise through the fit
  (`StepsModel.anchor_weight`), the seed spread measured over the seeds (pooled over the batch
  sizes) where some batch has two, else the default. Covers the pilots' batches; validated over
  `MULTI_VALIDATED_RATIOS` of the smallest and the largest. ``fields`` set other `StepsModel`
  fields (budget)."""
  if len(crossings) < 2:
    raise PlanError(f'A pilot at several batch sizes needs two or more, got {sorted(crossings)}.')
  batches = sorted(crossings)
  means = [float(np.mean(crossings[b])) for b in batches]
  s_min, b_crit = fit_steps_to_target(batches, means)
  listed = ', '.join(f'{m:.4g} steps at {b}' for b, m in zip(batches, means))
  if not (s_min > 0 and 0 < b_crit < math.inf):
    raise PlanError(f'The pilots ({listed}) do not follow S = S_min (1 + B_crit / B) (fit: '
                    f'S_min={s_min:.3g}, B_crit={b_crit:.3g}): the larger batch must need fewer '
                    'steps, but no fewer than the smaller batch\'s steps scaled down by the '
                    'ratio of the batches. Check the pilots, or pilot one batch size.')
  sd, dof = log_sd_over_seeds([crossings[b] for b in batches])
  if sd is not None:
    fields.update(seed_log_sd=sd, seed_dof=dof,
                  seed_source=f'measured: pooled over the pilots\' seeds at each batch size '
                              f'({dof} degree(s) of freedom: Student\'s t quantile), log-sd '
                              f'{sd:.3f}')
  lo, hi = batches[0], batches[-1]
  fields.setdefault('covered', (lo, hi))
  fields.setdefault('validated', (lo * MULTI_VALIDATED_RATIOS[0], hi * MULTI_VALIDATED_RATIOS[1]))
  points = tuple((float(b), m, float(len(crossings[b]))) for b, m in zip(batches, means))
  return StepsModel(s_min, b_crit, [], source=source,
                    notes={'pilot_batches': batches, 'pilot_steps': listed},
                    spread='fit', anchor_runs=math.inf, fit_points=points, **fields)


def sweep_arm(rows: Sequence[Dict], rule: Optional[str] = None,
              warmup: Optional[str] = None) -> Tuple[str, str]:
  """The one (rule, warmup) arm of a sweep's rows that ``rule`` and ``warmup`` select."""
  arms = sorted({(r['rule'], r['warmup']) for r in rows})
  chosen = [a for a in arms if (rule is None or a[0] == rule) and (warmup is None or a[1] == warmup)]
  if len(chosen) != 1:
    raise PlanError(f'The sweep has the arms {arms} (rule, warmup); choose one with --rule and '
                    '--warmup.')
  return chosen[0]


def sweep_points(rows: Sequence[Dict], rule: Optional[str] = None,
                 warmup: Optional[str] = None) -> Dict[int, Dict]:
  """Per batch: mean steps to target over its finished seeds, and their median B_simple.

  ``rows`` are a sweep's ``results.json`` records; only the selected learning rate of each
  batch (``best_lr``) and one (rule, warmup) arm count. Each point: ``steps`` (None unless every
  finished seed reached the target), ``steps_each`` (of the seeds that reached it),
  ``b_simple``, ``seeds`` (finished, diverged included) and ``missed`` (how many of them never
  reached it: missed or diverged, `study_results.outcome_of`). A batch size that some seeds miss gets no steps, as in the sweep
  report (`sweep_report.aggregate`): the mean over the seeds that got there would flatter it
  (only the lucky ones count) and pull the fit towards perfect scaling.
  """
  arm = sweep_arm(rows, rule, warmup)
  points = {}
  for r in rows:
    if (r['rule'], r['warmup']) != arm or not r.get('best_lr', True):
      continue
    outcome = study_results.outcome_of(r)
    if outcome == 'unfinished':
      continue
    p = points.setdefault(int(r['batch']), {'steps': [], 'b_simple': [], 'missed': 0})
    if outcome == 'reached':
      p['steps'].append(float(r['steps_to_target']))
    else:  # Missed, or diverged: it never reached the target either.
      p['missed'] += 1
    if r.get('b_simple') is not None:
      p['b_simple'].append(float(r['b_simple']))
  return {b: {'steps': float(np.mean(p['steps'])) if p['steps'] and not p['missed'] else None,
              'steps_each': p['steps'],
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
  batches = sorted(reached)
  return StepsModel(central[0], central[1], alts, source=source, notes=notes,
                    spread='windows' if use == 'b_simple' else 'jackknife',
                    anchor_runs=math.inf, covered=(batches[0], batches[-1]),
                    validated=(batches[0], batches[-1]), **seed_spread(points))


def log_sd_over_seeds(groups: Sequence[Sequence[float]]) -> Tuple[Optional[float], int]:
  """The pooled within-group standard deviation of log steps to target, and its degrees of
  freedom: the run-to-run spread of one configuration (groups: the seeds of one configuration
  each). (None, 0) when no group has two values."""
  squares, dof = 0.0, 0
  for values in groups:
    logs = [math.log(v) for v in values]
    if len(logs) >= 2:
      mean = sum(logs) / len(logs)
      squares += sum((v - mean) ** 2 for v in logs)
      dof += len(logs) - 1
  return (math.sqrt(squares / dof), dof) if dof else (None, 0)


def seed_spread(points: Dict[int, Dict]) -> Dict[str, object]:
  """`StepsModel`'s seed fields from a sweep's seeds: measured where a batch size has two or
  more seeds that reached the target (pooled over batch sizes), else the default."""
  sd, dof = log_sd_over_seeds([p.get('steps_each', []) for p in points.values()])
  if sd is None:
    return {}
  return {'seed_log_sd': sd, 'seed_dof': dof,
          'seed_source': f'measured: pooled over the seeds of the sweep\'s batch sizes ({dof} '
                         f'degree(s) of freedom: Student\'s t quantile), log-sd {sd:.3f}'}
