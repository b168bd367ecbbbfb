"""How good the planner's predictions were: errors, tallies and band coverage, out of sample.

`score_predictions` takes predictions (central value and band) beside measured means and says
how far off each was, how many were within a tolerance and how many measured means fell inside
their band. A point the model was built from (the pilot's own batch size: predicted exactly by
construction) is marked in-sample and never counted.

A point where some seeds missed the target has no mean, only a lower bound of it (each miss
counted at its budget: it needed at least that). It is **counted as a bound**, never dropped:
the mean is at least the bound, so the error predicted / mean - 1 is at most predicted / bound
- 1, and |error| is at least 1 - predicted / bound when the prediction lies below the bound
(else nothing is known: |error| >= 0). So every statistic that includes such a point is a bound
(`summarize`): the median and the worst |error| are at least the values shown; a bound past
the tolerance is a point known to miss it, one below it leaves "every point within" not shown;
the band holds the point only if its upper edge is above the bound (undetermined then),
and misses it for sure when the bound lies above the band.
"""

import statistics
from typing import Dict, Iterable, Optional, Sequence

from anp_jax.research import stats

# "Within 25 %": the tolerance the validation tallies use.
WITHIN = 0.25


def score_row(r: Dict) -> Dict:
  """One prediction scored: a copy of ``r`` with ``error`` (predicted / measured - 1, None for a
  bound), ``censored`` (only a ``lower_bound`` of the mean is known), ``error_at_most``
  (predicted / bound - 1: the error is at most this), ``abs_error`` (|error|, or its lower bound
  for a censored point: max(0, 1 - predicted / bound)) and ``inside`` (the band holds the
  measured mean; for a bound, False when the bound lies above the band, else None: unknown)."""
  r = dict(r)
  measured, bound = r.get('measured'), r.get('lower_bound')
  banded = r.get('low') is not None and r.get('high') is not None
  r['censored'] = measured is None and bound is not None and bound > 0
  r['error'] = r['predicted'] / measured - 1 if measured else None
  r['error_at_most'] = r['predicted'] / bound - 1 if r['censored'] else None
  if r['error'] is not None:
    r['abs_error'] = abs(r['error'])
  elif r['censored']:
    r['abs_error'] = max(0.0, -r['error_at_most'])
  else:
    r['abs_error'] = None
  if banded and measured:
    r['inside'] = r['low'] <= measured <= r['high']
  elif banded and r['censored']:
    r['inside'] = False if bound > r['high'] else None
  else:
    r['inside'] = None
  return r


def summarize(rows: Sequence[Dict], tolerance: float = WITHIN) -> Dict:
  """The statistics of counted scored rows (`score_row`), censored ones as bounds.

  ``n`` (points), ``censored``, ``median_abs_error`` / ``max_abs_error`` (lower bounds when
  ``bounded``: some point is censored), ``median_abs_error_high`` (the median with every
  censored |error| at its largest possible value, 100 %: what a claim "median <= X" needs),
  ``within`` (measured |error| <= tolerance), ``beyond`` (known past it, bounds included),
  ``undetermined`` (censored points whose bound is within it), ``every_within`` (True / False /
  None: not shown), the band: ``inside``, ``banded`` (points whose inclusion is known; a bound
  above the band counts as outside), ``undetermined_band``, ``coverage`` and its
  Clopper-Pearson 95 % interval ``coverage_ci``."""
  errors = [r['abs_error'] for r in rows if r['abs_error'] is not None]
  censored = [r for r in rows if r.get('censored')]
  high = [1.0 if r.get('censored') else r['abs_error'] for r in rows if r['abs_error'] is not None]
  within = sum(r['abs_error'] <= tolerance for r in rows if r.get('error') is not None)
  beyond = sum(r['abs_error'] > tolerance for r in rows if r['abs_error'] is not None)
  undetermined = sum(r['abs_error'] <= tolerance for r in censored)
  banded = [r for r in rows if r.get('inside') is not None]
  inside = sum(bool(r['inside']) for r in banded)
  return {
      'n': len(errors), 'censored': len(censored), 'bounded': bool(censored),
      'tolerance': tolerance, 'within': within, 'beyond': beyond, 'undetermined': undetermined,
      'every_within': False if beyond else (None if undetermined else bool(errors)),
      'median_abs_error': statistics.median(errors) if errors else None,
      'median_abs_error_high': statistics.median(high) if high else None,
      'max_abs_error': max(errors) if errors else None,
      'inside': inside, 'banded': len(banded),
      'undetermined_band': sum(1 for r in rows if r['abs_error'] is not None
                               and r.get('inside') is None and r.get('low') is not None),
      'coverage': inside / len(banded) if banded else None,
      'coverage_ci': stats.clopper_pearson(inside, len(banded)) if banded else None}


def score_predictions(rows: Sequence[Dict], in_sample: Iterable[float] = (),
                      tolerance: float = WITHIN, max_batch: Optional[float] = None) -> Dict:
  """Errors and coverage of predictions against measured means (bounds where seeds missed).

  ``rows``: dicts with ``batch``, ``predicted`` and ``measured`` (a mean over seeds; None where
  it is not defined, e.g. a seed missed the target), optionally ``lower_bound`` (of that mean,
  when seeds missed) and ``low`` / ``high`` (the band). ``in_sample``: batch sizes the model was
  fitted on (not counted); ``max_batch``: count only batch sizes up to it (e.g. 8x the pilot's:
  how far the validation reaches).

  Returns ``rows`` (`score_row` copies with ``in_sample`` and ``counted``: out of sample, with
  a mean or a bound, within ``max_batch``), `summarize`'s statistics of the counted rows and
  ``not_measured`` (counted batch sizes with neither a mean nor a bound).
  """
  in_sample = set(in_sample)
  scored = []
  for r in rows:
    r = score_row(r)
    r['in_sample'] = r['batch'] in in_sample
    reach = max_batch is None or r['batch'] <= max_batch
    r['counted'] = not r['in_sample'] and r['abs_error'] is not None and reach
    scored.append(r)
  out = summarize([r for r in scored if r['counted']], tolerance)
  out.update(rows=scored, not_measured=[
      r['batch'] for r in scored if not r['in_sample'] and r['abs_error'] is None
      and (max_batch is None or r['batch'] <= max_batch)])
  return out


def _pct(x: float) -> str:
  return f'{100 * x:.1f} %'


def describe_score(score: Dict, what: str = 'predictions',
                   sample: str = 'the pilot batch not counted') -> str:
  """One line: 'k/n within 25 % out of sample (SAMPLE): median |error|, worst, band coverage',
  with the points where seeds missed counted as bounds ('≥')."""
  if not score['n']:
    return f'No {what} out of sample to score.'
  at_least = '≥ ' if score.get('bounded') else ''
  censored = score.get('censored', 0)
  text = (f'{what[0].upper() + what[1:]} within {100 * score["tolerance"]:.0f} % out of sample '
          f'({sample}): {score["within"]}/{score["n"]}'
          + (f', {score["beyond"]} known beyond it ({censored} point(s) where seeds missed, '
             f'counted as bounds; {score["undetermined"]} of them undetermined)'
             if censored else '')
          + f'; median |error| {at_least}{_pct(score["median_abs_error"])}, worst '
          f'{at_least}{_pct(score["max_abs_error"])}')
  if score['banded']:
    ci = score.get('coverage_ci')
    text += (f'; measured inside the band: {score["inside"]}/{score["banded"]}'
             + (f' (95 % CI {_pct(ci["low"])}-{_pct(ci["high"])})' if ci else '')
             + (f', {score["undetermined_band"]} undetermined'
                if score.get('undetermined_band') else ''))
  return text + '.'
