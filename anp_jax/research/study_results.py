"""A study's results: one row per run, the learning rate chosen per point, statistics per point.

* `summarize_run`: a run directory (its record ``sweep_run.json``, ``metrics.jsonl`` and
  ``final_metrics.json``) as one row: status, outcome on the validation target, steps /
  examples / epochs to it, the same on the test split when the run evaluated one, final values.
  Only a finite state is a result: a diverged run (NaN/Inf loss) has outcome 'diverged', no
  steps to target and no final metric, and evaluations from its first non-finite loss on are
  not read (a constant NaN model scores chance accuracy, which can exceed a low target).
* `choose_rates`: per point, the learning-rate multiplier chosen on the **validation** split,
  Shallue et al.'s protocol ("Measuring the Effects of Data Parallelism on Neural Network
  Training", JMLR 2019: each configuration at its own best rate; a trial that diverges is
  infeasible). A rate is a candidate only if every one of its seeds finished without
  diverging. Among candidates, those whose every seed reached the target compete on the
  fewest mean steps to it; if none does, on the best mean final validation metric. Ties go to
  the higher final metric, then the smaller multiplier. A chosen rate at the edge of the rates
  tried (or none chosen, every rate having a diverged seed) asks for an extension beyond it.
* `aggregate`: per point, the statistics over seeds at its reported rate (the chosen one, or
  the only one tried): `stats.censored_summary` of steps and examples to the target (missed and
  diverged seeds counted, never dropped), `stats.value_summary` of the final metrics, on the test
  split when every seed evaluated it (``published_split``), else on validation (and the report
  says that the figures come from the split the choices were made on).
* `write_results`: ``results.json`` / ``results.csv`` (rows), ``points.json`` / ``points.csv``;
  `out_dir_kind`: which kind of study a directory holds (``experiment.json``).

No JAX: the reports and the planner import this.
"""

import csv
import io
import json
import math
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from anp_jax import metrics_io
from anp_jax.research import eval_seam, stats

RECORD_FILE = 'sweep_run.json'  # A run's record, written before it trains.
# A study's fresh-seed confirmation (`runner.confirmation_study`): this subdirectory of its --out.
CONFIRMATION_DIR = 'confirmation'
FINAL_FILE = 'final_metrics.json'
LATE_FRACTION = 0.6  # A crossing after this fraction of the budget leans on the schedule's end.


def is_finished(run_dir: str) -> bool:
  """A run with ``final_metrics.json`` (trained to the end, or diverged) is never retrained."""
  return os.path.exists(os.path.join(run_dir, FINAL_FILE))


def read_json(path: str):
  with open(path) as f:
    return json.load(f)


def finite_evals(records: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
  """The evaluation records before the first one whose loss is not finite (a diverged state's
  evaluations are not results)."""
  out = []
  for r in records:
    if not any(k.startswith((eval_seam.VALIDATION_PREFIX, eval_seam.TEST_PREFIX)) for k in r):
      continue
    losses = [v for k, v in r.items() if k.endswith('/loss') and isinstance(v, (int, float))]
    if any(not math.isfinite(v) for v in losses):
      break
    out.append(r)
  return out


def _crossing(evals, metric: str, target: float, outcome: str) -> Dict[str, Any]:
  """Steps to `target` on `metric` (interpolated first crossing, `metrics_io.target_crossing`)
  and the outcome: 'reached' or 'missed' for a finished run; a diverged or unfinished run keeps
  its outcome and has no steps (no result before the run has ended on a finite state)."""
  hit = None
  if outcome == 'finished':
    hit = metrics_io.target_crossing(evals, target, metric)
    outcome = 'reached' if hit else 'missed'
  return {'outcome': outcome, 'step': hit['step'] if hit else None,
          'eval_step': hit['eval_step'] if hit else None}


def summarize_run(run_dir: str, target_metric: str, target_value: float,
                  record: Optional[Dict] = None, metrics: Sequence[str] = ('anp_top1',)
                  ) -> Optional[Dict]:
  """One results row of a run directory (None if the runner never started it).

  `record` is the run's record as planned now (else its ``sweep_run.json``). Columns: the
  record's (name, point, fields, seed, lr_mult, base_lr, lr, batch, total_steps, ...), then
  status ('finished', 'diverged', 'incomplete'), final_step, outcome (on the validation
  target), steps_to_target, examples_to_target, epochs_to_target,
  eval_step_reaching_target, budget_fraction_at_target, late_crossing (after `LATE_FRACTION`
  of the budget), has_test, test_outcome / test_steps_to_target / test_examples_to_target,
  the final and best value of the target metric and of every `metrics` name on both splits
  (``eval/anp_top1``, ``test/anp_top1``, ``best/eval/anp_top1``), wall_time_s and error.
  """
  path = os.path.join(run_dir, RECORD_FILE)
  if record is None:
    if not os.path.exists(path):
      return None
    record = read_json(path)
  final = read_json(os.path.join(run_dir, FINAL_FILE)) if is_finished(run_dir) else None
  records = metrics_io.read_metrics(run_dir)
  evals = finite_evals(records)
  if final is None:
    status = 'incomplete'
  elif final.get('diverged'):
    status = 'diverged'
  else:
    status = 'finished'
  base_outcome = {'incomplete': 'unfinished'}.get(status, status)  # Before the crossing.
  test_metric = eval_seam.test_metric(target_metric)
  has_test = any(test_metric in r for r in evals)
  batch = record['batch']
  train_size = record.get('train_size') or record['steps_per_epoch'] * batch
  total = record['total_steps']
  row = dict(record)
  row['fields'] = dict(record.get('fields', {}))
  row['tune'] = dict(record.get('tune', {}))
  row.update(status=status, target_metric=target_metric, target_value=target_value,
             final_step=final.get('step') if final else (records[-1]['step'] if records else 0))
  for prefix, metric in (('', target_metric), ('test_', test_metric)):
    if prefix and not has_test and status == 'finished':  # This run evaluated no test split.
      hit = {'outcome': None, 'step': None, 'eval_step': None}
    else:
      hit = _crossing(evals, metric, target_value, base_outcome)
    steps = hit['step']
    row.update({f'{prefix}outcome': hit['outcome'], f'{prefix}steps_to_target': steps,
                f'{prefix}examples_to_target': None if steps is None else steps * batch,
                f'{prefix}epochs_to_target': None if steps is None else steps * batch / train_size})
    if not prefix:
      row.update(eval_step_reaching_target=hit['eval_step'],
                 budget_fraction_at_target=None if steps is None else steps / total,
                 late_crossing=steps is not None and steps > LATE_FRACTION * total)
  row['has_test'] = has_test
  ok = status == 'finished'
  names = dict.fromkeys([target_metric[len(eval_seam.VALIDATION_PREFIX):], *metrics])
  for name in names:
    for prefix in (eval_seam.VALIDATION_PREFIX, eval_seam.TEST_PREFIX):
      key = prefix + name
      value = final.get(key) if ok else None
      row[key] = float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
      seen = [r[key] for r in evals if isinstance(r.get(key), (int, float))]
      row[f'best/{key}'] = max(seen) if seen and key.endswith(('top1', 'top5')) else None
  row.update(wall_time_s=final.get('wall_time_s') if final else None,
             error=final.get('error') if final else None)
  return row


# Which study an --out directory belongs to: each writes its results over the same paths, so one
# directory holds one kind. The marker is written before the first run.
EXPERIMENT_FILE = 'experiment.json'
# Directories written before the marker existed are recognised by the file their study wrote
# (the first versions of two studies); every study since writes the marker.
_PRE_MARKER_FILES = {'sweep.json': 'batch_size_sweep', 'grid.json': 'sync_async_mixed'}


def out_dir_kind(out: str) -> Optional[str]:
  """The kind of study whose results `out` holds, or None."""
  path = os.path.join(out, EXPERIMENT_FILE)
  if os.path.exists(path):
    try:
      return read_json(path).get('kind')
    except (OSError, ValueError):
      return None
  return next((kind for name, kind in _PRE_MARKER_FILES.items()
               if os.path.exists(os.path.join(out, name))), None)


# ----------------------------------------------------------------------------------------------
# The learning-rate choice.


def outcome_of(row: Mapping[str, Any]) -> str:
  """A row's outcome on the validation target; rows written before the column existed derive it
  from status and steps_to_target. A diverged run never reached the target."""
  if row.get('outcome'):
    return row['outcome']
  status = row['status']
  if status == 'diverged':
    return 'diverged'
  if status != 'finished':
    return 'unfinished'
  return 'reached' if row.get('steps_to_target') is not None else 'missed'


def tune_of(row: Mapping[str, Any]) -> Dict[str, Any]:
  """The tuned values of a row's run ({} when the study tunes nothing but the rate)."""
  return dict(row.get('tune') or {})


def _candidate(row: Mapping[str, Any]):
  """(tuned values as JSON, multiplier): what the choice picks among, per point."""
  return json.dumps(tune_of(row), sort_keys=True), float(row['lr_mult'])


def choose_rates(rows: Sequence[Mapping[str, Any]], group: Callable[[Mapping], Any],
                 final: Callable[[Mapping], Optional[float]]) -> Dict[Any, Dict[str, Any]]:
  """Per group of `group` (a point), the chosen multiplier and tuned values (see the module
  docstring; a candidate is one multiplier with one combination of the tuned values).

  `final(row)` is the row's final validation metric (None when it has none). Each choice:
  ``lr_mult`` (None: no candidate), ``tune`` (the chosen tuned values, {} when the study tunes
  none; None without a choice), ``tried`` (sorted multipliers), ``tuned`` (more than one
  tried), ``edge`` ('low' / 'high' when the chosen rate is the lowest / highest of several
  tried, 'low' when every candidate had a diverged seed: smaller rates are the way on; None),
  ``pending`` (some run has not finished: the choice may still change) and ``reason``.
  """
  groups: Dict[Any, Dict[Any, List[Mapping]]] = {}
  for r in rows:
    groups.setdefault(group(r), {}).setdefault(_candidate(r), []).append(r)
  choices = {}
  for key, by_candidate in groups.items():
    tried = sorted({mult for _, mult in by_candidate})
    outcomes = {c: [outcome_of(r) for r in runs] for c, runs in by_candidate.items()}
    pending = any('unfinished' in o for o in outcomes.values())
    candidates = [c for c, o in outcomes.items() if 'unfinished' not in o and 'diverged' not in o]

    def score(candidate):
      runs = by_candidate[candidate]
      values = [final(r) for r in runs]
      mean = (math.fsum(values) / len(values)) if None not in values else -math.inf
      if all(o == 'reached' for o in outcomes[candidate]):
        steps = math.fsum(r['steps_to_target'] for r in runs) / len(runs)
        return (0, steps, -mean, candidate[1], candidate[0])
      return (1, 0.0, -mean, candidate[1], candidate[0])

    chosen = min(candidates, key=score) if candidates else None
    if chosen is None:
      reason = 'unfinished' if pending else 'every rate tried has a diverged seed'
    elif score(chosen)[0] == 0:
      reason = 'fewest mean steps to the target over seeds that all reached it'
    else:
      reason = 'no rate reached the target with every seed: best mean final metric'
    mult = None if chosen is None else chosen[1]
    edge = None
    if chosen is None and not pending:
      edge = 'low'
    elif chosen is not None:
      mults = sorted(m for c, m in by_candidate if c == chosen[0])
      if len(mults) > 1 and mult in (mults[0], mults[-1]):
        edge = 'low' if mult == mults[0] else 'high'
    choices[key] = {'lr_mult': mult, 'tune': None if chosen is None else json.loads(chosen[0]),
                    'tried': tried, 'tuned': len(tried) > 1, 'edge': edge, 'pending': pending,
                    'reason': reason}
  return choices


def is_chosen(row: Mapping[str, Any], choice: Mapping[str, Any]) -> bool:
  """Whether a row is a run of its point's chosen multiplier and tuned values."""
  return (choice['lr_mult'] is not None and float(row['lr_mult']) == choice['lr_mult']
          and tune_of(row) == choice['tune'])


def extensions(choices: Mapping[Any, Mapping[str, Any]], base: Sequence[float], limit: int,
               factor: float = 2.0,
               base_of: Optional[Callable[[Any], Sequence[float]]] = None) -> Dict[Any, float]:
  """Per point whose choice is at an edge, the next multiplier: `factor` beyond that edge.

  A point already extended `limit` times beyond its base grid (`base_of(point)`, default
  `base`; multipliers outside its [min, max]) gets none, nor does one whose choice is pending:
  the report then says the rate is still at the edge.
  """
  out = {}
  for key, c in choices.items():
    grid = base if base_of is None else base_of(key)
    lo, hi = min(grid), max(grid)
    done = sum(1 for m in c['tried'] if m < lo or m > hi)
    if c['edge'] is None or c['pending'] or done >= limit:
      continue
    out[key] = min(c['tried']) / factor if c['edge'] == 'low' else max(c['tried']) * factor
  return out


# ----------------------------------------------------------------------------------------------
# Statistics per point.


def reported_rows(runs: Sequence[Mapping[str, Any]], choice: Mapping[str, Any]) -> List[Mapping]:
  """The rows a point is reported with: those of its chosen candidate; with no choice, those of
  its only candidate when it tried one (its diverged seeds then show in the statistics); else
  none."""
  if choice['lr_mult'] is not None:
    return [r for r in runs if is_chosen(r, choice)]
  if len({_candidate(r) for r in runs}) == 1:
    return list(runs)
  return []


def _budget(row, unit: str) -> float:
  return row['total_steps'] * (row['batch'] if unit == 'examples' else 1)


def point_statistics(rows: Sequence[Mapping[str, Any]], target_metric: str,
                     metrics: Sequence[str], level: float = stats.LEVEL,
                     method: str = 't') -> Dict[str, Any]:
  """The statistics of one point over its seeds (`rows`, one per seed at one rate).

  Steps and examples to the target on validation (``steps_to_target``) and, when every seed
  evaluated the test split, on test (``test_steps_to_target``); final values of every metric
  on the published split (``final``: {'test/anp_top1': summary}); ``published_split``; the
  outcome counts; ``late_crossings`` (seeds crossing after `LATE_FRACTION` of the budget).
  """
  outcomes = [outcome_of(r) for r in rows]
  # A diverged or unfinished seed has no test figure either way: it counts as such on test too.
  has_test = any(r.get('has_test') for r in rows) and all(
      r.get('has_test') or o in ('diverged', 'unfinished') for r, o in zip(rows, outcomes))
  out = {'seeds': len(rows), 'published_split': 'test' if has_test else 'validation',
         **{k: outcomes.count(k) for k in ('reached', 'missed', 'diverged', 'unfinished')},
         'late_crossings': sum(bool(r.get('late_crossing')) for r in rows)}
  for prefix in ('', 'test_'):
    if prefix and not has_test:
      out.update({f'test_{u}_to_target': None for u in ('steps', 'examples')})
      continue
    these = outcomes if not prefix else [r['test_outcome'] for r in rows]
    for unit in ('steps', 'examples'):
      out[f'{prefix}{unit}_to_target'] = stats.censored_summary(
          [r[f'{prefix}{unit}_to_target'] for r in rows], these,
          [_budget(r, unit) for r in rows], level, method)
  prefix = eval_seam.TEST_PREFIX if has_test else eval_seam.VALIDATION_PREFIX
  names = dict.fromkeys([target_metric[len(eval_seam.VALIDATION_PREFIX):], *metrics])
  out['final'] = {prefix + name: stats.value_summary([r.get(prefix + name) for r in rows],
                                                    outcomes, level, method)
                  for name in names}
  return out


def aggregate(rows: Sequence[Mapping[str, Any]], target_metric: str, metrics: Sequence[str],
              level: float = stats.LEVEL, method: str = 't',
              order: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
  """One record per point (in `order`, else first appearance): its fields, the rate choice
  (`choose_rates` on the validation target metric), the counts over all its runs, and
  `point_statistics` at its reported rate (`reported_rows`)."""
  by_point: Dict[str, List[Mapping]] = {}
  for r in rows:
    by_point.setdefault(r['point'], []).append(r)
  choices = choose_rates(rows, lambda r: r['point'], lambda r: r.get(target_metric))
  names = [p for p in (order or []) if p in by_point] + [p for p in by_point
                                                          if p not in (order or [])]
  points = []
  for name in names:
    runs, choice = by_point[name], choices[name]
    shown = sorted(reported_rows(runs, choice), key=lambda r: r['seed'])
    points.append({
        'point': name, 'fields': dict(runs[0].get('fields') or {}),
        'lr_mult': float(shown[0]['lr_mult']) if shown else None,
        'lr': shown[0].get('lr') if shown else None, 'lr_chosen': choice['lr_mult'] is not None,
        'tune': tune_of(shown[0]) if shown else None,
        'tune_tried': sorted({json.dumps(tune_of(r), sort_keys=True) for r in runs}),
        'lr_tuned': choice['tuned'], 'lr_edge': choice['edge'], 'lr_tried': choice['tried'],
        'lr_pending': choice['pending'], 'lr_reason': choice['reason'],
        'runs': len(runs), 'runs_diverged': sum(outcome_of(r) == 'diverged' for r in runs),
        'seed_list': [r['seed'] for r in shown], 'target_metric': target_metric,
        'target_value': runs[0].get('target_value'), 'ci': stats.describe_method(method, level),
        **point_statistics(shown, target_metric, metrics, level, method)})
  return points


# ----------------------------------------------------------------------------------------------
# Files.


def _cell(value) -> Any:
  if value is None:
    return ''
  if isinstance(value, (dict, list, tuple)):
    return json.dumps(value, sort_keys=True)
  return value


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Optional[Sequence[str]] = None) -> str:
  """`rows` as CSV: `columns` (default: every key, in order of first appearance), None as ''
  and a nested value as JSON."""
  if columns is None:
    columns = list(dict.fromkeys(k for r in rows for k in r))
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction='ignore')
  writer.writeheader()
  for r in rows:
    writer.writerow({k: _cell(r.get(k)) for k in columns})
  return buf.getvalue()


STAT_KEYS = ('mean', 'low', 'high', 'sd', 'lower_bound', 'median', 'kind')


def flat_point(p: Mapping[str, Any]) -> Dict[str, Any]:
  """A point record as one CSV row: each statistic as ``<name>`` (its table text, see
  `stats.format_summary`) and ``<name>_<mean|low|high|...>``."""
  out = {k: v for k, v in p.items() if not isinstance(v, dict) or k == 'fields'}
  summaries = {k: v for k, v in p.items() if k.endswith('_to_target')}
  summaries.update(p.get('final', {}))
  for name, s in summaries.items():
    out[name] = stats.format_summary(s, '.4g') if s else ''
    for key in STAT_KEYS:
      out[f'{name}_{key}'] = s.get(key) if s else None
  return out


def write_text_atomic(path: str, text: str):
  """`text` to `path` through a temporary file and os.replace (readers never see half)."""
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)


def write_measurement(out: str, name: str, result: Mapping[str, Any], text: str) -> List[str]:
  """A benchmark's committed result: ``out/name`` (JSON) and ``out/README.md`` (its tables),
  each written atomically; returns both paths."""
  os.makedirs(out, exist_ok=True)
  paths = [os.path.join(out, name), os.path.join(out, 'README.md')]
  write_text_atomic(paths[0], json.dumps(result, indent=1))
  write_text_atomic(paths[1], text)
  return paths


def write_rows(out: str, rows: Sequence[Mapping[str, Any]],
               columns: Optional[Sequence[str]] = None) -> List[str]:
  """``results.json`` / ``results.csv`` (one row per run; `columns` of the CSV), atomically."""
  from anp_jax import reporting  # Imports JAX: only the runner writes, readers stay without it.
  paths = [os.path.join(out, 'results.json'), os.path.join(out, 'results.csv')]
  reporting.write_json_atomic(paths[0], list(rows))
  write_text_atomic(paths[1], csv_text(rows, columns))
  return paths


def write_points(out: str, points: Sequence[Mapping[str, Any]]) -> List[str]:
  """``points.json`` / ``points.csv`` (one record per point: `flat_point`), atomically."""
  from anp_jax import reporting  # Imports JAX: only the runner writes, readers stay without it.
  paths = [os.path.join(out, 'points.json'), os.path.join(out, 'points.csv')]
  reporting.write_json_atomic(paths[0], list(points))
  write_text_atomic(paths[1], csv_text([flat_point(p) for p in points]))
  return paths


def write_results(out: str, rows: Sequence[Mapping[str, Any]],
                  points: Sequence[Mapping[str, Any]],
                  columns: Optional[Sequence[str]] = None) -> List[str]:
  """`write_rows` and `write_points`; returns the paths."""
  return write_rows(out, rows, columns) + write_points(out, points)
