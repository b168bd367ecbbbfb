"""The report of any study: ``DIR/report.md`` and ``DIR/points.png`` from its results.

Reads ``points.json`` (statistics per point, `study_results.aggregate`), ``results.json`` (a
row per run) and ``study.json`` (the study's settings) in ``DIR`` and writes, without JAX:

* the registration (`registration.describe`: its hash and recorded time beside the first
  run's, or that there is none);
* the protocol: target, seeds, learning-rate grid and how a rate is chosen (on validation),
  which interval the figures carry (`stats.describe_method`), on which split they are published;
* a table per point: its fields, chosen rate (marked at the edge of its grid, or none), the
  seeds' outcomes, steps to the target on validation and on test, and the final metrics, each
  as mean [95 % interval] over seeds or, when a seed missed or diverged, as a censored figure
  (`stats.format_summary`: "≥ 93 (1/3 reached, 2 diverged)");
* the learning-rate grid of each point (every rate's and tuned setting's outcomes), the
  warnings (rates still at an edge, points without a stable rate, crossings late in the
  budget, figures on validation);
* ``points.png``: the final metric and the steps to the target per point (against the one
  numeric field the points vary, when there is one), with the intervals as error bars.
"""

import json
import math
import os
from typing import List, Mapping, Optional, Sequence

from anp_jax import plotting
from anp_jax.research import registration, stats, study_results


def load(out_dir: str):
  """(points, rows, settings) of a study directory; FileNotFoundError if it has no results."""
  paths = {name: os.path.join(out_dir, name)
           for name in ('points.json', 'results.json', 'study.json')}
  for name in ('points.json', 'results.json'):
    if not os.path.exists(paths[name]):
      raise FileNotFoundError(f'{paths[name]} does not exist: run the study with --out '
                              f'{out_dir} first.')
  settings = (study_results.read_json(paths['study.json'])
              if os.path.exists(paths['study.json']) else {})
  return (study_results.read_json(paths['points.json']),
          study_results.read_json(paths['results.json']), settings)


def varied_field(points: Sequence[Mapping]) -> Optional[str]:
  """The one config field whose numeric value differs across the points (None if not one)."""
  fields = {k for p in points for k in p['fields']}
  varied = [k for k in sorted(fields)
            if len({json.dumps(p['fields'].get(k)) for p in points}) > 1]
  if len(varied) != 1:
    return None
  values = [p['fields'].get(varied[0]) for p in points]
  numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
  return varied[0] if numeric else None


def error_bars(summaries, scale: float = 1.0):
  """(means, [below, above]) of complete summaries, for `errorbar` (no interval: no bar)."""
  means = [scale * s['mean'] for s in summaries]
  low = [scale * (s['mean'] - s['low']) if s['low'] is not None else 0.0 for s in summaries]
  high = [scale * (s['high'] - s['mean']) if s['high'] is not None else 0.0 for s in summaries]
  return means, [low, high]


def plot_points(points: Sequence[Mapping], field: Optional[str], metric: str, path: str) -> str:
  """Final `metric` and steps to the target per point, mean with its interval, against `field`
  (the one numeric field the points vary) or, without one, point by point; a point whose seeds
  did not all reach the target is drawn at its lower bound (▲), one with a diverged seed is named
  under the axes."""
  plt = plotting.pyplot()
  fig, (ax_m, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2))
  if field is not None:
    ordered = sorted(points, key=lambda p: p['fields'][field])
    xs = [p['fields'][field] for p in ordered]
  else:
    ordered, xs = list(points), list(range(len(points)))
  done = [(x, p['final'][metric]) for x, p in zip(xs, ordered)
          if p['final'].get(metric) and p['final'][metric]['kind'] == 'complete']
  if done:
    means, bars = error_bars([s for _, s in done], 100)
    ax_m.errorbar([x for x, _ in done], means, yerr=bars, marker='o', capsize=3, ls='none')
  complete = [(x, p['steps_to_target']) for x, p in zip(xs, ordered)
              if p['steps_to_target'] and p['steps_to_target']['kind'] == 'complete']
  if complete:
    means, bars = error_bars([s for _, s in complete])
    ax_s.errorbar([x for x, _ in complete], means, yerr=bars, marker='o', capsize=3, ls='none',
                  label='every seed reached it')
  censored = [(x, p['steps_to_target']) for x, p in zip(xs, ordered)
              if p['steps_to_target'] and p['steps_to_target']['kind'] == 'censored']
  if censored:
    ax_s.plot([x for x, _ in censored], [s['lower_bound'] for _, s in censored], '^',
              color='tab:red', label='lower bound: a seed missed or diverged')
  bad = [f'{p["point"]} ({p["diverged"]}/{p["seeds"]} diverged)' for p in ordered
         if p['diverged']]
  if bad:
    fig.text(0.01, 0.01, 'diverged seeds: ' + ', '.join(bad), fontsize=7)
  for ax in (ax_m, ax_s):
    if field is None:
      ax.set_xticks(xs, [p['point'] for p in ordered], rotation=30, fontsize=8)
    else:
      if all(x > 0 for x in xs) and max(xs) / min(xs) >= 4:
        ax.set_xscale('log', base=2)
      ax.set_xlabel(field)
    ax.grid(alpha=0.3, which='both')
  if ax_s.lines:
    ax_s.legend(fontsize=7)
  p0 = ordered[0]
  ax_m.set(ylabel=f'final {metric} (%)',
           title=f'Final {metric} ({p0["published_split"]} split), 95 % CI')
  ax_s.set(ylabel='steps to target (validation)',
           title=f'Steps to {p0["target_metric"]} >= {p0["target_value"]:g}, 95 % CI')
  return plotting.save_figure(fig, path)


def _lr_cell(p: Mapping) -> str:
  if p['lr_mult'] is None:
    return 'none: ' + p['lr_reason']
  text = f'{p["lr"]:.4g} (x{p["lr_mult"]:g})' if p.get('lr') is not None else f'x{p["lr_mult"]:g}'
  if not p['lr_tuned']:
    text += ', not tuned'
  if not p['lr_chosen']:
    text += ', not a stable rate'
  elif p['lr_edge']:
    text += f', {"lowest" if p["lr_edge"] == "low" else "highest"} tried'
  if p.get('tune'):
    text += '; ' + ', '.join(f'{k}={v}' for k, v in p['tune'].items())
  if p['lr_pending']:
    text += ', provisional'
  return text


def _outcomes(p: Mapping) -> str:
  parts = [f'{p[k]} {k}' for k in ('reached', 'missed', 'diverged', 'unfinished') if p[k]]
  return f'{p["seeds"]}: ' + ', '.join(parts) if parts else '0'


def grid_lines(points: Sequence[Mapping], rows: Sequence[Mapping]) -> List[str]:
  """Per point, every candidate tried (rate, and tuned values if any) and what its seeds did
  (the choice's evidence; ← marks the chosen one)."""
  lines = []
  for p in points:
    runs = [r for r in rows if r['point'] == p['point']]
    by_candidate = {}
    for r in runs:
      tune = study_results.tune_of(r)
      label = ', '.join(f'{k}={v}' for k, v in tune.items())
      by_candidate.setdefault((float(r['lr_mult']), label), []).append(r)
    cells = []
    for (mult, label), these in sorted(by_candidate.items()):
      outcomes = [study_results.outcome_of(r) for r in these]
      counts = ', '.join(f'{outcomes.count(k)} {k}' for k in ('reached', 'missed', 'diverged',
                                                              'unfinished') if k in outcomes)
      steps = [r['steps_to_target'] for r in these if r.get('steps_to_target') is not None]
      mean = f'; steps {math.fsum(steps) / len(steps):.0f}' if len(steps) == len(these) else ''
      mark = ' ←' if p['lr_chosen'] and study_results.is_chosen(
          these[0], {'lr_mult': p['lr_mult'], 'tune': p['tune']}) else ''
      cells.append(f'x{mult:g}{" (" + label + ")" if label else ""}: {counts}{mean}{mark}')
    lines.append(f'- {p["point"]}: ' + '; '.join(cells))
  return lines


def confirmation_section(out_dir: str, figures: Sequence, name: str = 'point') -> List[str]:
  """The report's section putting a study's fresh-seed confirmation (``DIR/confirmation/``,
  `runner.confirmation_study`) beside its selection: per point, each of ``figures`` ((title,
  summary of a points.json entry, format, scale)) over the selection's seeds and over the
  confirmation's. [] without a confirmation."""
  path = os.path.join(out_dir, study_results.CONFIRMATION_DIR, 'points.json')
  if not os.path.exists(path) or not os.path.exists(os.path.join(out_dir, 'points.json')):
    return []
  selection = {p['point']: p for p in study_results.read_json(os.path.join(out_dir,
                                                                             'points.json'))}
  confirmed = study_results.read_json(path)
  seeds = sorted({s for p in confirmed for s in p.get('seed_list') or ()})
  lines = ['## Fresh-seed confirmation', '',
           f'Every {name} again at the configuration chosen on validation, with seeds {seeds} that '
           f'chose nothing (`--confirm_seeds`, in `{study_results.CONFIRMATION_DIR}/`). The '
           'selection\'s figures come from the runs that won the choice and lean towards it (the '
           'winner\'s curse); the confirmation\'s do not: quote those.', '',
           f'| {name} | chosen lr | ' + ' | '.join(f'{title}: selection | {title}: confirmation'
                                                   for title, *_ in figures) + ' |',
           '|---|---|' + '---|---|' * len(figures)]
  for p in confirmed:
    sel = selection.get(p['point'], {})
    cells = []
    for _, get, spec, scale in figures:
      cells += [stats.format_summary(get(sel) if sel else None, spec, scale),
                stats.format_summary(get(p), spec, scale)]
    lines.append(f'| {p["point"]} | {p["lr"]:.3g} (x{p["lr_mult"]:g}) | ' + ' | '.join(cells)
                 + ' |')
  return lines + ['']


def published(p: Mapping, key: str):
  """A points.json entry's steps (``key`` 'steps_to_target') or examples on its published split
  (test when evaluated)."""
  if not p:
    return None
  return p.get('test_' + key) if p.get('published_split') == 'test' else p.get(key)


def published_final(p: Mapping, metric: str = 'anp_top1'):
  if not p:
    return None
  prefix = 'test/' if p.get('published_split') == 'test' else 'eval/'
  return (p.get('final') or {}).get(prefix + metric)


def make_report(out_dir: str) -> str:
  """Writes DIR/report.md and DIR/points.png; returns the report's path."""
  points, rows, settings = load(out_dir)
  if not points:
    raise ValueError(f'{out_dir}/points.json has no points.')
  metric_names = list(points[0]['final'])
  split = {p['published_split'] for p in points}
  title = settings.get('title') or f'Study `{settings.get("kind", os.path.basename(out_dir))}`'
  lines = [f'# {title}', '']
  if settings:
    lines += [f'Preset `{settings.get("preset")}`, {settings.get("devices")} device(s), '
              f'{settings.get("epochs")} epochs per run, model `{settings.get("model")}` at '
              f'{settings.get("image_size")} px on `{settings.get("dataset")}`; seeds '
              f'{settings.get("seeds")}; learning-rate multipliers {settings.get("lr_grid")} of '
              'the preset\'s base_lr' + (f', extended x2 beyond an edge choice at most '
                                         f'{settings["lr_extensions"]} time(s) per point.'
                                         if settings.get('lr_extensions') else '.'), '']
  lines += [registration.describe(out_dir), '']
  p0 = points[0]
  lines += [
      f'Target: {p0["target_metric"]} >= {p0["target_value"]:g} on the validation split. The '
      'learning rate of each point is chosen on validation: a rate with a diverged seed is '
      'never chosen; among the others, the fewest mean steps to the target over seeds that all '
      'reached it, else the best mean final validation metric.',
      '',
      p0['ci'] + ' A point reaches the target only if every seed reached it; otherwise its '
      'steps are censored: "≥ X (k/n reached ...)" is a lower bound of the mean (a miss counted '
      'at its budget) and the median is shown when more than half reached it. A diverged seed '
      'leaves its point without a mean final metric (the range of the others is shown).', '']
  if split != {'test'}:
    lines += ['**No test split was evaluated by every point**: the published figures of '
              + ', '.join(p['point'] for p in points if p['published_split'] != 'test')
              + ' come from the validation split the choices were made on (biased upwards).', '']
  header = ['point', 'fields', 'chosen lr', 'seeds', 'steps to target (validation)',
            'steps to target (test)'] + [f'final {m}' for m in metric_names]
  lines += ['## Points', '', '| ' + ' | '.join(header) + ' |',
            '|' + '---|' * len(header)]
  for p in points:
    fields = ', '.join(f'{k}={v}' for k, v in p['fields'].items())
    cells = [p['point'], fields, _lr_cell(p), _outcomes(p),
             stats.format_summary(p['steps_to_target']),
             stats.format_summary(p['test_steps_to_target'])]
    cells += [stats.format_summary(p['final'][m], '.4g' if m.endswith('loss') else '.2f',
                                   1 if m.endswith('loss') else 100) for m in metric_names]
    lines.append('| ' + ' | '.join(cells) + ' |')
  lines += ['', 'Accuracies in %; mean [95 % interval] over seeds.', '']
  lines += confirmation_section(out_dir, (
      ('steps to the target', lambda p: published(p, 'steps_to_target'), '.0f', 1.0),
      ('final top-1 (%)', lambda p: published_final(p), '.1f', 100.0)))
  lines += ['## Learning-rate grid per point', ''] + grid_lines(points, rows) + ['']
  warnings = []
  edge = [f'{p["point"]} (x{p["lr_mult"]:g}, {"lowest" if p["lr_edge"] == "low" else "highest"})'
          for p in points if p['lr_chosen'] and p['lr_edge']]
  if edge:
    warnings.append('Chosen rate still at the edge of the rates tried (the optimum may lie '
                    'beyond): ' + ', '.join(edge) + '.')
  unstable = [p['point'] for p in points if not p['lr_chosen'] and not p['lr_pending']]
  if unstable:
    warnings.append('No rate without a diverged seed: ' + ', '.join(unstable) + '.')
  late = [f'{p["point"]} ({p["late_crossings"]}/{p["seeds"]})' for p in points
          if p['late_crossings']]
  if late:
    warnings.append(f'Seeds crossing the target after {100 * study_results.LATE_FRACTION:g} % '
                    'of their budget (the schedule\'s end may decide their steps): '
                    + ', '.join(late) + '.')
  if warnings:
    lines += ['## Warnings', ''] + [f'- {w}' for w in warnings] + ['']
  if metric_names:
    plot_points(points, varied_field(points), metric_names[0],
                os.path.join(out_dir, 'points.png'))
    lines += ['## Figure', '', '![points](points.png)', '']
  bad = [r for r in rows if r['status'] != 'finished']
  if bad:
    lines += ['## Runs that did not finish', '']
    lines += [f'- `{r["name"]}`: {r["status"]}' + (f' — {r["error"]}' if r.get('error') else '')
              for r in bad] + ['']
  path = os.path.join(out_dir, 'report.md')
  study_results.write_text_atomic(path, '\n'.join(lines))
  return path
