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
  on the log scale by the delta method); `spread`: the noise floor of one configuration (SD,
  empirical and predicted 95 % ranges of a single run); `detectable_difference`: the smallest
  difference of two n-seed means outside that noise.
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
  'df', 'n_a', 'n_b'}; low / high None when a group has fewer than 2 values."""
  a, b = [float(v) for v in a], [float(v) for v in b]
  if not a or not b:
    raise ValueError('difference_interval needs values in both groups.')
  diff = math.fsum(a) / len(a) - math.fsum(b) / len(b)
  se, df = _welch(a, b)
  out = {'diff': diff, 'low': None, 'high': None, 'df': df, 'n_a': len(a), 'n_b': len(b),
         'level': level}
  if se is not None:
    half = t_quantile(1.0 - (1.0 - level) / 2.0, df) * se if se > 0 else 0.0
    out['low'], out['high'] = diff - half, diff + half
  return out


def ratio_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Dict:
  """mean(a) / mean(b) of positive values with an interval from the delta method on the log
  scale and Welch's degrees of freedom: log(ratio) ± t · sqrt(s_a²/(n_a m_a²) + s_b²/(n_b m_b²))
  (the relative standard errors of the two means): {'ratio', 'low', 'high', 'df', 'n_a',
  'n_b'}; low / high None when a group has fewer than 2 values."""
  a, b = [float(v) for v in a], [float(v) for v in b]
  if not a or not b or min(a + b) <= 0:
    raise ValueError('ratio_interval needs positive values in both groups.')
  ma, mb = math.fsum(a) / len(a), math.fsum(b) / len(b)
  out = {'ratio': ma / mb, 'low': None, 'high': None, 'df': None, 'n_a': len(a),
         'n_b': len(b), 'level': level}
  se, df = _welch(a, b, ma, mb)
  if se is not None:
    half = t_quantile(1.0 - (1.0 - level) / 2.0, df) * se if se > 0 else 0.0
    out.update(low=ma / mb * math.exp(-half), high=ma / mb * math.exp(half), df=df)
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


def detectable_difference(sd: float, n_a: int, n_b: int, level: float = LEVEL) -> float:
  """Half-width of the `level` interval of the difference of two means of n_a and n_b runs
  whose seed-to-seed standard deviation is `sd` (pooled t, n_a + n_b - 2 degrees of freedom):
  a measured difference smaller than this is within the noise floor."""
  if n_a < 1 or n_b < 1 or n_a + n_b < 3:
    raise ValueError(f'detectable_difference needs n_a + n_b >= 3, got {n_a} and {n_b}.')
  return t_quantile(1.0 - (1.0 - level) / 2.0, n_a + n_b - 2) * sd * math.sqrt(
      1.0 / n_a + 1.0 / n_b)


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
