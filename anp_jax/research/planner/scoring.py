"""How good the planner's predictions were: errors, tallies and band coverage, out of sample.

`score_predictions` takes predictions (central value and band) beside measured means and says
how far off each was, how many were within a tolerance and how many measured means fell inside
their band. A point the model was built from (the pilot's own batch size: predicted exactly by
construction) is marked in-sample and never counted.
"""

import statistics
from typing import Dict, Iterable, Optional, Sequence

# "Within 25 %": the tolerance the validation tallies use.
WITHIN = 0.25


def score_predictions(rows: Sequence[Dict], in_sample: Iterable[float] = (),
                      tolerance: float = WITHIN, max_batch: Optional[float] = None) -> Dict:
  """Errors and coverage of predictions against measured means.

  ``rows``: dicts with ``batch``, ``predicted`` and ``measured`` (a mean over seeds; None where
  it is not defined, e.g. a seed missed the target), optionally ``low`` / ``high`` (the band).
  ``in_sample``: batch sizes the model was fitted on (not counted); ``max_batch``: count only
  batch sizes up to it (e.g. 8x the pilot's: how far the validation reaches).

  Returns ``rows`` (copies with ``error`` = predicted / measured − 1, ``inside`` the band,
  ``counted``), ``n`` (counted rows), ``within`` (|error| <= tolerance), ``inside`` and
  ``coverage`` (measured means inside their band, of the counted rows with a band),
  ``median_abs_error``, ``max_abs_error``, ``not_measured`` (counted batch sizes without a
  measured mean) and ``tolerance``.
  """
  in_sample = set(in_sample)
  scored = []
  for r in rows:
    r = dict(r)
    measured = r.get('measured')
    r['error'] = r['predicted'] / measured - 1 if measured else None
    banded = r.get('low') is not None and r.get('high') is not None
    r['inside'] = (r['low'] <= measured <= r['high']) if banded and measured else None
    r['in_sample'] = r['batch'] in in_sample
    r['counted'] = (not r['in_sample'] and measured is not None
                    and (max_batch is None or r['batch'] <= max_batch))
    scored.append(r)
  counted = [r for r in scored if r['counted']]
  errors = [abs(r['error']) for r in counted]
  banded = [r for r in counted if r['inside'] is not None]
  return {
      'rows': scored, 'n': len(counted), 'tolerance': tolerance,
      'within': sum(e <= tolerance for e in errors),
      'inside': sum(r['inside'] for r in banded), 'banded': len(banded),
      'coverage': sum(r['inside'] for r in banded) / len(banded) if banded else None,
      'median_abs_error': statistics.median(errors) if errors else None,
      'max_abs_error': max(errors) if errors else None,
      'not_measured': [r['batch'] for r in scored if not r['in_sample'] and r.get('measured') is None
                       and (max_batch is None or r['batch'] <= max_batch)]}


def describe_score(score: Dict, what: str = 'predictions',
                   sample: str = 'the pilot batch not counted') -> str:
  """One line: 'k/n within 25 % out of sample (SAMPLE): median |error|, worst, band coverage'."""
  if not score['n']:
    return f'No {what} out of sample to score.'
  text = (f'{what[0].upper() + what[1:]} within {100 * score["tolerance"]:.0f} % out of sample '
          f'({sample}): {score["within"]}/{score["n"]}; median |error| '
          f'{100 * score["median_abs_error"]:.1f} %, worst {100 * score["max_abs_error"]:.1f} %')
  if score['banded']:
    text += f'; measured inside the band: {score["inside"]}/{score["banded"]}'
  return text + '.'
