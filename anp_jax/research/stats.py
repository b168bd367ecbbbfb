"""Statistics over the seeds of one study point: means with 95 % intervals, and censoring.

Pure functions on lists of numbers (the standard library, and numpy only for the bootstrap), so
that the runner, the reports and the planner share one definition and tests check it by hand.

* `mean_interval`: the mean of n values and a confidence interval for it, by default Student's
  t interval ``mean ± t(1 - (1 - level) / 2, n - 1) · s / √n`` (s: the sample standard
  deviation), else a percentile bootstrap of the mean (``method='bootstrap'``; with 3 seeds it
  is narrower than the t interval and optimistic: the t interval is the default).
* `t_quantile`: Student's t quantile from the regularized incomplete beta function (no scipy).
* `censored_summary`: steps to a target over seeds of which some never reached it. A seed that
  missed the target within its budget took *more* than its budget (right-censored); one that
  diverged never reaches it. Neither is dropped: the mean over the survivors would flatter the
  point (only the lucky seeds count). Following Shallue et al. ("Measuring the Effects of Data
  Parallelism on Neural Network Training", JMLR 2019), where a trial that does not reach the
  goal within its budget, or diverges, is *infeasible*, a point reaches the target only if
  every one of its seeds reached it; then its mean and interval are reported. Otherwise the
  summary is censored: how many reached it ("2 / 3"), a lower bound of the mean (each miss
  counted at its budget: it needed at least that), and the median when more than half reached
  it (a miss sorts above every reached value, so the median is then a reached value).
* `difference_interval` / `ratio_interval`: two points compared (Welch's t; a ratio of means
  on the log scale by the delta method), each with its two-sided p-value; `spread`: the noise
  floor of one configuration (SD, empirical and predicted 95 % ranges of a single run);
  `detectable_difference`: the smallest true difference of two n-seed means that a 95 %
  interval excludes 0 for with 80 % power (at 50 % power: the interval's half-width).
* Several comparisons at once: `holm` (Holm's step-down adjustment of p-values: the family-wise
  error stays at the level whatever the comparisons' dependence) with `ratio_interval` at the
  Bonferroni level `simultaneous_level` (intervals that hold together), or one model with a
  pooled variance (`pooled_log_ratios`: every arm's log values share one SD, more degrees of
  freedom, an assumption to state).
* `clopper_pearson`: the exact interval of a binomial proportion (a band's coverage, k of n);
  `clustered_mean_interval`: a mean of paired differences with its t-interval over clusters
  (the points of one task are not independent: each task counts once).
* `value_summary`: a final metric (accuracy, loss) over seeds; a diverged seed has no finite
  final state, so the point has no mean: the summary counts the diverged seeds and gives the
  range of the others.
"""

import math
import statistics
from typing import Dict, Optional, Sequence

CI_METHODS = ('t', 'bootstrap')
LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 10_000


def _incomplete_beta(a: float, b: float, x: float) -> float:
  """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified
  Lentz), on the side of x where the fraction converges fast."""
  if x <= 0.0:
    return 0.0
  if x >= 1.0:
    return 1.0
  if x > (a + 1.0) / (a + b + 2.0):
    return 1.0 - _incomplete_beta(b, a, 1.0 - x)
  log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
               + b * math.log1p(-x))
  tiny = 1e-300
  c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
  d = 1.0 / (d if abs(d) > tiny else tiny)
  h = d
  for m in range(1, 500):
    for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                      -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
      d = 1.0 + numerator * d
      d = 1.0 / (d if abs(d) > tiny else tiny)
      c = 1.0 + numerator / c
      c = c if abs(c) > tiny else tiny
      h *= c * d
    if abs(c * d - 1.0) < 1e-15:
      break
  return math.exp(log_front) * h / a


def t_cdf(t: float, df: float) -> float:
  """P(T <= t) for Student's t with `df` degrees of freedom."""
  tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
  return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
  """The `p` quantile of Student's t with `df` > 0 degrees of freedom (t_cdf inverted by
  bisection to float precision; e.g. t_quantile(0.975, 2) = 4.303)."""
  if not 0.0 < p < 1.0 or not df > 0:
    raise ValueError(f't_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}.')
  if p < 0.5:
    return -t_quantile(1.0 - p, df)
  low, high = 0.0, 1.0
  while t_cdf(high, df) < p:
    high *= 2.0
  for _ in range(200):
    mid = 0.5 * (low + high)
    if t_cdf(mid, df) < p:
      low = mid
    else:
      high = mid
    if high - low <= 1e-13 * max(1.0, high):
      break
  return 0.5 * (low + high)


def describe_method(method: str, level: float = LEVEL) -> str:
  """One sentence for reports: which interval the figures carry."""
  pct = f'{100 * level:g} %'
  if method == 't':
    return (f'{pct} confidence intervals over seeds: Student-t, mean ± t(n-1) · s / √n '
            '(s: the standard deviation over seeds).')
  if method == 'bootstrap':
    return (f'{pct} confidence intervals over seeds: percentile bootstrap of the mean '
            f'({BOOTSTRAP_RESAMPLES:,} resamples; optimistic for few seeds).')
  raise ValueError(f'Unknown interval method {method!r}; choose one of {CI_METHODS}.')


def mean_interval(values: Sequence[float], level: float = LEVEL, method: str = 't',
                  seed: int = 0) -> Dict:
  """{'n', 'mean', 'sd', 'low', 'high', 'method', 'level'} of `values` (finite numbers).

  One value has no spread to measure: sd, low and high are None. A bootstrap draws
  `BOOTSTRAP_RESAMPLES` resamples with a fixed `seed` (the same values give the same interval).
  """
  if method not in CI_METHODS:
    raise ValueError(f'Unknown interval method {method!r}; choose one of {CI_METHODS}.')
  values = [float(v) for v in values]
  if not values or not all(math.isfinite(v) for v in values):
    raise ValueError(f'mean_interval needs finite values, got {values}.')
  n = len(values)
  mean = math.fsum(values) / n
  out = {'n': n, 'mean': mean, 'sd': None, 'low': None, 'high': None, 'method': method,
         'level': level}
  if n < 2:
    return out
  sd = statistics.stdev(values)
  out['sd'] = sd
  if method == 't':
    half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * sd / math.sqrt(n)
    out['low'], out['high'] = mean - half, mean + half
  else:
    import numpy as np
    rng = np.random.default_rng(seed)
    draws = rng.choice(np.asarray(values), size=(BOOTSTRAP_RESAMPLES, n)).mean(axis=1)
    low, high = np.quantile(draws, [(1.0 - level) / 2.0, 1.0 - (1.0 - level) / 2.0])
    out['low'], out['high'] = float(low), float(high)
  return out


def _welch(a: Sequence[float], b: Sequence[float], scale_a: float = 1.0, scale_b: float = 1.0):
  """(standard error, Welch-Satterthwaite degrees of freedom) of mean(a)/scale_a - mean(b)/
  scale_b; (None, None) when a group has fewer than 2 values or both have no spread."""
  if len(a) < 2 or len(b) < 2:
    return None, None
  va = statistics.variance(a) / len(a) / scale_a ** 2
  vb = statistics.variance(b) / len(b) / scale_b ** 2
  if va + vb <= 0:
    return 0.0, float(len(a) + len(b) - 2)
  df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
  return math.sqrt(va + vb), df


def difference_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Dict:
  """mean(a) - mean(b) with Welch's t interval (unequal variances): {'diff', 'low', 'high',
  'df', 'n_a', 'n_b', 'p' (two-sided, of no difference)}; low / high / p None when a group has
  fewer than 2 values."""
  a, b = [float(v) for v in a], [float(v) for v in b]
  if not a or not b:
    raise ValueError('difference_interval needs values in both groups.')
  diff = math.fsum(a) / len(a) - math.fsum(b) / len(b)
  se, df = _welch(a, b)
  out = {'diff': diff, 'low': None, 'high': None, 'df': df, 'n_a': len(a), 'n_b': len(b),
         'level': level, 'p': None}
  if se is not None:
    half = t_quantile(1.0 - (1.0 - level) / 2.0, df) * se if se > 0 else 0.0
    out['low'], out['high'] = diff - half, diff + half
    out['p'] = t_p_value(diff / se, df) if se > 0 else (0.0 if diff else 1.0)
  return out


def ratio_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Dict:
  """mean(a) / mean(b) of positive values with an interval from the delta method on the log
  scale and Welch's degrees of freedom: log(ratio) ± t · sqrt(s_a²/(n_a m_a²) + s_b²/(n_b m_b²))
  (the relative standard errors of the two means): {'ratio', 'low', 'high', 'df', 'n_a',
  'n_b', 'p' (two-sided, of ratio 1)}; low / high / p None when a group has fewer than 2
  values."""
  a, b = [float(v) for v in a], [float(v) for v in b]
  if not a or not b or min(a + b) <= 0:
    raise ValueError('ratio_interval needs positive values in both groups.')
  ma, mb = math.fsum(a) / len(a), math.fsum(b) / len(b)
  out = {'ratio': ma / mb, 'low': None, 'high': None, 'df': None, 'n_a': len(a),
         'n_b': len(b), 'level': level, 'p': None}
  se, df = _welch(a, b, ma, mb)
  if se is not None:
    half = t_quantile(1.0 - (1.0 - level) / 2.0, df) * se if se > 0 else 0.0
    out.update(low=ma / mb * math.exp(-half), high=ma / mb * math.exp(half), df=df,
               p=t_p_value(math.log(ma / mb) / se, df) if se > 0 else (0.0 if ma != mb else 1.0))
  return out


def spread(values: Sequence[float], level: float = LEVEL) -> Dict:
  """How much one configuration varies from seed to seed (the noise floor): {'n', 'mean', 'sd',
  'cv' (sd / mean), 'min', 'max', 'q_low', 'q_high' (the empirical (1 - level)/2 and
  1 - (1 - level)/2 quantiles, linear interpolation), 'run_low', 'run_high' (the range a single
  new run falls in with probability `level` under a normal model: mean ± t · sd · sqrt(1 +
  1/n)), 'mean_low', 'mean_high' (the t interval of the mean)}. Needs >= 2 finite values."""
  values = sorted(float(v) for v in values)
  if len(values) < 2 or not all(math.isfinite(v) for v in values):
    raise ValueError(f'spread needs at least 2 finite values, got {values}.')
  n = len(values)
  mean = math.fsum(values) / n
  sd = statistics.stdev(values)
  t = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1)

  def quantile(q):
    pos = q * (n - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    return values[lo] + (pos - lo) * (values[hi] - values[lo])
  return {'n': n, 'mean': mean, 'sd': sd, 'cv': sd / mean if mean else None,
          'min': values[0], 'max': values[-1], 'q_low': quantile((1.0 - level) / 2.0),
          'q_high': quantile(1.0 - (1.0 - level) / 2.0),
          'run_low': mean - t * sd * math.sqrt(1.0 + 1.0 / n),
          'run_high': mean + t * sd * math.sqrt(1.0 + 1.0 / n),
          'mean_low': mean - t * sd / math.sqrt(n), 'mean_high': mean + t * sd / math.sqrt(n),
          'level': level}


def detectable_difference(sd: float, n_a: int, n_b: int, level: float = LEVEL,
                          power: float = 0.8) -> float:
  """The smallest true difference of two means of n_a and n_b runs (seed-to-seed standard
  deviation `sd`, pooled t, n_a + n_b - 2 degrees of freedom) whose `level` interval excludes 0
  with probability `power`: (t(1 - α/2) + t(power)) · sd · sqrt(1/n_a + 1/n_b). At `power` 0.5
  it is the interval's half-width: a difference that large is detected only half the time.
  (The noncentral t's exact answer differs by under 2 % for 3 + 3 runs.)"""
  if n_a < 1 or n_b < 1 or n_a + n_b < 3:
    raise ValueError(f'detectable_difference needs n_a + n_b >= 3, got {n_a} and {n_b}.')
  if not 0.0 < power < 1.0:
    raise ValueError(f'power must be in (0, 1), got {power}.')
  df = n_a + n_b - 2
  quantile = t_quantile(1.0 - (1.0 - level) / 2.0, df)
  if power != 0.5:
    quantile += t_quantile(power, df)
  return quantile * sd * math.sqrt(1.0 / n_a + 1.0 / n_b)


def t_p_value(t: float, df: float) -> float:
  """The two-sided p-value of a t statistic with `df` degrees of freedom."""
  return 2.0 * t_cdf(-abs(t), df)


def holm(p_values: Sequence[float]) -> list:
  """Holm's step-down adjustment: the k-th smallest of m p-values times (m - k + 1), made
  non-decreasing in that order and capped at 1; in the input's order. A comparison whose
  adjusted p-value is below α is a claim with family-wise error at most α."""
  m = len(p_values)
  order = sorted(range(m), key=lambda i: p_values[i])
  adjusted, running = [0.0] * m, 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * p_values[i]))
    adjusted[i] = running
  return adjusted


def simultaneous_level(level: float, comparisons: int) -> float:
  """The per-comparison level at which `comparisons` intervals hold together at `level`
  (Bonferroni): 1 - (1 - level) / comparisons."""
  if comparisons < 1:
    raise ValueError(f'comparisons must be >= 1, got {comparisons}.')
  return 1.0 - (1.0 - level) / comparisons


def pooled_log_ratios(groups: Dict[str, Sequence[float]], reference: str,
                      level: float = LEVEL) -> Dict:
  """Every group against `reference` in one model with a pooled variance: log values with a
  mean per group and one SD shared by all (pooled over the groups, Σ (n_i - 1) degrees of
  freedom). Per group: the ratio of geometric means, its `level` t-interval, the p-value of
  ratio 1 and the Holm-adjusted p-value over the comparisons. The assumption (every group's log
  values spread alike) buys degrees of freedom; where one group's SD is far from the others',
  say so beside it. Returns {'sd', 'df', 'level', 'ratios': {name: {...}}}."""
  logs = {k: [math.log(float(v)) for v in values] for k, values in groups.items()}
  if reference not in logs or any(len(v) < 1 for v in logs.values()):
    raise ValueError(f'pooled_log_ratios needs values for every group and {reference!r}.')
  df = sum(len(v) - 1 for v in logs.values())
  if df < 1:
    raise ValueError('pooled_log_ratios needs a group with two or more values.')
  sd = math.sqrt(sum(sum((x - statistics.fmean(v)) ** 2 for x in v) for v in logs.values()) / df)
  t = t_quantile(1.0 - (1.0 - level) / 2.0, df)
  ref = logs[reference]
  out = {}
  for name, v in logs.items():
    if name == reference:
      continue
    diff = statistics.fmean(v) - statistics.fmean(ref)
    se = sd * math.sqrt(1.0 / len(v) + 1.0 / len(ref))
    out[name] = {'ratio': math.exp(diff), 'low': math.exp(diff - t * se),
                 'high': math.exp(diff + t * se),
                 'p': t_p_value(diff / se, df) if se > 0 else (0.0 if diff else 1.0)}
  for name, adjusted in zip(out, holm([r['p'] for r in out.values()])):
    out[name]['p_holm'] = adjusted
  return {'sd': sd, 'df': df, 'level': level, 'ratios': out}


def beta_quantile(p: float, a: float, b: float) -> float:
  """The `p` quantile of the Beta(a, b) distribution (its CDF, the regularized incomplete beta
  function, inverted by bisection)."""
  if not 0.0 < p < 1.0 or not (a > 0 and b > 0):
    raise ValueError(f'beta_quantile needs 0 < p < 1 and a, b > 0, got {p}, {a}, {b}.')
  low, high = 0.0, 1.0
  for _ in range(200):
    mid = 0.5 * (low + high)
    if _incomplete_beta(a, b, mid) < p:
      low = mid
    else:
      high = mid
    if high - low < 1e-15:
      break
  return 0.5 * (low + high)


def clopper_pearson(k: int, n: int, level: float = LEVEL) -> Dict:
  """The exact (Clopper-Pearson) `level` interval of a proportion k / n: {'k', 'n', 'rate',
  'low', 'high', 'level'} (conservative: it covers at least `level` for every true rate)."""
  if not 0 <= k <= n or n < 1:
    raise ValueError(f'clopper_pearson needs 0 <= k <= n and n >= 1, got {k}, {n}.')
  alpha = 1.0 - level
  low = 0.0 if k == 0 else beta_quantile(alpha / 2.0, k, n - k + 1)
  high = 1.0 if k == n else beta_quantile(1.0 - alpha / 2.0, k + 1, n - k)
  return {'k': k, 'n': n, 'rate': k / n, 'low': low, 'high': high, 'level': level}


def clustered_mean_interval(values: Sequence[float], clusters: Sequence, level: float = LEVEL
                            ) -> Dict:
  """The mean of `values` (e.g. paired differences of two predictors' errors, one per point)
  with a t-interval that counts each cluster (e.g. a task, whose points share a pilot) once:
  the mean of the cluster means and their `mean_interval` (clusters - 1 degrees of freedom).
  Beside it, ``point_low`` / ``point_high``: the interval treating every value as independent
  (narrower, and optimistic when a cluster's values move together). {'mean', 'low', 'high',
  'clusters', 'n', 'point_low', 'point_high', 'level'}; low / high None with one cluster."""
  if len(values) != len(clusters) or not values:
    raise ValueError('clustered_mean_interval needs one cluster per value, and values.')
  by = {}
  for v, c in zip(values, clusters):
    by.setdefault(c, []).append(float(v))
  means = [statistics.fmean(v) for v in by.values()]
  clustered = mean_interval(means, level)
  points = mean_interval([float(v) for v in values], level)
  return {'mean': clustered['mean'], 'low': clustered['low'], 'high': clustered['high'],
          'clusters': len(by), 'n': len(values), 'point_mean': points['mean'],
          'point_low': points['low'], 'point_high': points['high'], 'level': level}


def censored_summary(values: Sequence[Optional[float]], outcomes: Sequence[str],
                     budgets: Sequence[float], level: float = LEVEL, method: str = 't',
                     floor: Optional[float] = None) -> Dict:
  """Steps (or examples) to a target over seeds, misses counted (see the module docstring).

  ``values[i]``: seed i's steps to the target, None if it did not reach it; ``outcomes[i]``:
  'reached', 'missed' (finished its budget below the target), 'diverged' or 'unfinished';
  ``budgets[i]``: its budget in the same unit. Returns ``kind``:

  * 'complete': every seed reached the target; `mean_interval`'s keys.
  * 'censored': some did not; ``mean`` None, ``lower_bound`` (mean with each miss at its
    budget), ``median`` (None when half or more missed: it lies beyond the budget).
  * 'unfinished': a seed is still training; no statistic yet.

  ``floor``: the least value a seed can record (e.g. the first evaluated step). A 'complete'
  interval that reaches below it is cut there and marked ``clipped`` (a t-interval of 3 seeds
  can run below 0 steps; no seed can).

  and always the counts ``n``, ``reached``, ``missed``, ``diverged``, ``unfinished``.
  """
  if not len(values) == len(outcomes) == len(budgets):
    raise ValueError('censored_summary needs one value, outcome and budget per seed.')
  counts = {k: sum(o == k for o in outcomes) for k in ('reached', 'missed', 'diverged',
                                                          'unfinished')}
  if sum(counts.values()) != len(outcomes):
    raise ValueError(f'Unknown outcome in {list(outcomes)}.')
  for v, o in zip(values, outcomes):
    if (v is not None) != (o == 'reached'):
      raise ValueError(f'A seed has value {v} with outcome {o!r}: only a reached target has one.')
  out = {'n': len(values), **counts, 'mean': None, 'sd': None, 'low': None, 'high': None,
         'lower_bound': None, 'median': None, 'method': method, 'level': level}
  if not values:
    return dict(out, kind='empty')
  if counts['unfinished']:
    return dict(out, kind='unfinished')
  if counts['reached'] == len(values):
    complete = dict(out, **mean_interval(values, level, method), kind='complete')
    if floor is not None and complete['low'] is not None and complete['low'] < floor:
      complete.update(low=float(floor), clipped=True)
    return complete
  at_least = [v if v is not None else float(b) for v, b in zip(values, budgets)]
  ordered = sorted(values, key=lambda v: math.inf if v is None else v)
  n = len(ordered)
  middle = ordered[(n - 1) // 2: n // 2 + 1]  # One value (n odd) or two (n even).
  median = None if None in middle else math.fsum(middle) / len(middle)
  return dict(out, kind='censored', lower_bound=math.fsum(at_least) / n, median=median)


def value_summary(values: Sequence[Optional[float]], outcomes: Sequence[str],
                  level: float = LEVEL, method: str = 't') -> Dict:
  """A final metric over seeds: ``kind`` 'complete' (every seed has a finite value:
  `mean_interval`'s keys), 'diverged' (some seed diverged: no mean; ``finished_min`` /
  ``finished_max`` over the others), 'missing' (a finished seed lacks the metric), 'unfinished'
  or 'empty'; with the counts ``n``,
  ``diverged``, ``unfinished``. `outcomes` as in `censored_summary` ('reached' and 'missed' both
  count as finished)."""
  if len(values) != len(outcomes):
    raise ValueError('value_summary needs one value and outcome per seed.')
  diverged = sum(o == 'diverged' for o in outcomes)
  unfinished = sum(o == 'unfinished' for o in outcomes)
  out = {'n': len(values), 'diverged': diverged, 'unfinished': unfinished, 'mean': None,
         'sd': None, 'low': None, 'high': None, 'method': method, 'level': level}
  if not values:
    return dict(out, kind='empty')
  if unfinished:
    return dict(out, kind='unfinished')
  finished = [v for v, o in zip(values, outcomes) if o != 'diverged']
  finite = [float(v) for v in finished if v is not None and math.isfinite(float(v))]
  if diverged:
    return dict(out, kind='diverged', finished_min=min(finite, default=None),
                finished_max=max(finite, default=None))
  if len(finite) < len(finished):  # A finished run without the metric (never evaluated).
    return dict(out, kind='missing', missing=len(finished) - len(finite))
  return dict(out, **mean_interval(finite, level, method), kind='complete')


def format_summary(s: Optional[Dict], spec: str = '.0f', scale: float = 1.0,
                   prefix_bound: str = '≥ ') -> str:
  """A summary as a table cell: '85 [70, 100]' (mean [interval]), '85 (1 seed)',
  '≥ 93 (1/3 reached, 2 diverged)', '— (1/3 diverged; others 41–43)', 'unfinished'."""
  if s is None or s['kind'] == 'empty':
    return '—'
  fmt = lambda x: format(scale * x, spec)
  if s['kind'] == 'unfinished':
    return f'unfinished ({s["unfinished"]}/{s["n"]} seeds)'
  if s['kind'] == 'missing':
    return f'— (not measured in {s["missing"]}/{s["n"]} seeds)'
  if s['kind'] == 'complete':
    if s['low'] is None:
      return f'{fmt(s["mean"])} (1 seed)'
    return f'{fmt(s["mean"])} [{fmt(s["low"])}, {fmt(s["high"])}]'
  if s['kind'] == 'censored':
    why = ', '.join(f'{s[k]} {k}' for k in ('missed', 'diverged') if s[k])
    text = f'{prefix_bound}{fmt(s["lower_bound"])} ({s["reached"]}/{s["n"]} reached, {why}'
    if s['median'] is not None:
      text += f'; median {fmt(s["median"])}'
    return text + ')'
  others = ('' if s['finished_min'] is None else
            f'; others {fmt(s["finished_min"])}–{fmt(s["finished_max"])}')
  return f'— ({s["diverged"]}/{s["n"]} diverged{others})'
