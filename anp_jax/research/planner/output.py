"""What the planner writes: the plan as markdown (`format_plan`), JSON (`plan_to_json`), two
plots (`plot_plan`), and all of them into a folder (`write_plan`)."""

import dataclasses
import json
import math
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from anp_jax.research.planner.budget import DEEP_DECAY_FRACTION
from anp_jax.research.planner.steps_model import BAND_LEVEL
from anp_jax.research.planner.time_to_target import Plan, Row


def _hours(seconds: float) -> str:
  h = seconds / 3600
  return f'{h:.3g} h' if h >= 0.1 else f'{seconds / 60:.3g} min'


def _pct(x: float) -> str:
  return f'{100 * x:+.0f} %'


def describe_model(plan: Plan) -> List[str]:
  """The plan's inputs in words: target, steps model, band, coverage, budget, penalties."""
  m = plan.model
  lines = [f'Target: {m.notes["metric"]} >= {m.notes["target"]:g} ({m.notes["target_source"]}).'
           ] if 'metric' in m.notes else []
  spread = ''
  if m.alternatives:
    b = [b for _, b in m.alternatives]
    spread = (f'; sub-windows {min(b):.4g}-{max(b):.4g}' if m.spread == 'windows' else
              f'; leave-one-batch-out fits {min(b):.4g}-{max(b):.4g}')
  window = m.notes.get('b_simple_window')
  late = m.notes.get('b_simple_late')
  factor = ''
  if m.b_crit_factor != 1.0:
    factor = (f'; B_crit = {m.b_crit_factor:.4g} x B_noise' + (
        f' (log-sd {m.factor_log_sd:.3g} over {m.factor_tasks} calibration tasks: '
        f'{m.notes["b_crit_factor_source"]})' if m.notes.get('b_crit_factor_source') else
        ' (given)'))
  elif m.notes.get('b_crit_factor_source'):
    factor = f'; B_crit = B_noise ({m.notes["b_crit_factor_source"]})'
  kind = m.notes.get('predictor')
  if m.fit_points:
    noise = f'B_crit fitted to the pilots\' mean steps at {len(m.fit_points)} batch sizes'
  elif kind == 'constant':
    noise = (f'B_crit a constant {m.b_crit:.4g} fitted on calibration tasks (the pilot\'s noise '
             'scale is not used' + (f'; measured up to the crossing: B_noise '
                                    f'{m.notes["pilot_b_noise_unused"]:.4g}'
                                    if m.notes.get('pilot_b_noise_unused') else '') + ')')
    window = factor = spread = late = ''
  elif kind in ('power_law', 'perfect'):
    noise = ('perfect scaling through the pilot\'s steps (no noise scale, no parameter)'
             if kind == 'perfect' else
             'a power law fitted on calibration tasks through the pilot\'s steps (no noise '
             'scale)')
    window = factor = spread = late = ''
  elif kind == 'near_crossing':
    noise = f'B_simple {m.b_noise:.4g} over the last quarter of the window up to the crossing'
    window = ''
  else:
    noise = f'B_noise {m.b_noise:.4g}'
  lines.append(f'Steps model ({m.source}): {m.form()}; {noise}'
               + (f' over the {window}' if window else '') + spread
               + (f'; the late window (second half of the run) gives {late:.4g}' if late else '')
               + factor + '.')
  if m.notes.get('default_heldout'):
    from anp_jax.research.planner.predictors import NAMES
    lines.append(f'Default predictor: {NAMES.get(kind, kind)}. {m.notes["default_heldout"]}')
  shown = {k: v for k, v in m.notes.items()
           if k not in ('metric', 'target', 'target_source', 'b_simple_window',
                        'b_crit_factor_source', 'predictor', 'predictor_parameters',
                        'default_heldout')}
  if shown:
    lines.append('Estimates: ' + ', '.join(f'{k} = {v:.4g}' if isinstance(v, float) else
                                            f'{k} = {v}' for k, v in shown.items()) + '.')
  lines.append(
      f'Band: an approximate {100 * BAND_LEVEL:.0f} % prediction interval of one run\'s steps '
      f'(log-normal): B_noise\'s uncertainty ('
      + ('none: no noise scale enters' if kind in ('constant', 'power_law', 'perfect') else
         {'windows': 'the sub-windows\' spread', 'jackknife': 'the jackknife of the fit',
          'fit': 'none apart: B_crit is fitted to the pilots\' batch sizes'}.get(m.spread,
                                                                                 m.spread))
      + ((f'), the calibrated parameter\'s over its {m.factor_tasks} tasks (as a new task\'s'
          if kind in ('constant', 'power_law') else
          '), the B_crit / B_noise factor\'s (as a new task\'s') if m.factor_log_sd else '')
      + f'), the run-to-run spread ({m.seed_source})'
      + (f' of the run and of the {m.anchor_runs:g} pilot run(s) it is anchored on'
         if math.isfinite(m.anchor_runs) else
         ' of the run and of the pilots\' seeds, carried through the fit' if m.fit_points else
         ' of the run') + ' and, on asynchronous and '
      'local-SGD rows, the penalty\'s range, added in quadrature.')
  if m.covered is not None:
    lo, hi = m.covered
    cover = f'batch {lo:g}' if lo == hi else f'batches {lo:g}-{hi:g}'
    pens = '; '.join(f'{"mean staleness" if k == "async" else "local SGD H − 1"} '
                     f'{p.measured_x[0]:g}-{p.measured_x[1]:g}'
                     for k, p in plan.penalties.items())
    lines.append(f'Inputs cover: {cover} ({m.source})'
                 + (f'; predictions validated for {m.validated[0]:g}-{m.validated[1]:g}'
                    if m.validated and m.validated != m.covered else '')
                 + (f'; the penalties were measured at {pens}' if pens else '')
                 + '. Rows beyond are flagged "extrapolated".')
  lines.append(m.budget.describe() if m.budget is not None else
               'Budget: unknown (the size of the input\'s training split is not recorded): '
               'whether each configuration reaches the target within its run is not checked.')
  for kind, p in plan.penalties.items():
    x = 'mean staleness' if kind == 'async' else '(H - 1)'
    if getattr(p, 'reference', None) == 'global_batch':
      at_least = '>= ' if getattr(p, 'bounds', 0) else ''
      lines.append(f'Convergence penalty {kind}: {at_least}{p.ratio:.3g} [{p.low:.3g}, '
                   f'{p.high:.3g}] (95 % '
                   f'interval) x the examples synchronous SGD needs at the same global batch, '
                   f'over {x} {p.measured[0]:g}-{p.measured[1]:g} (no ordering by it measured; '
                   f'per arm: ' + ', '.join(f'{a["arm"]} {">= " if a.get("bounds") else ""}'
                                            f'{a["ratio"]:.2f} [{a["low"]:.2f}, '
                                            f'{a["high"]:.2f}]' for a in p.arms)
                   + f'; {p.seeds} seeds of sync; {p.source}).')
      continue
    loo = {}
    for r in p.leave_one_out:
      if not r['censored']:
        loo.setdefault(r['x'], []).append(_pct(r['error']))
    lines.append(f'Convergence penalty {kind}: updates x (1 + {p.slope:.3g} {x}), censored fit, '
                 f'slope range {p.low:.3g}-{p.high:.3g} ({len(p.points)} measured factors, '
                 f'{len(p.bounds)} lower bounds from arms that missed a level'
                 + (f', {len(p.inconsistent_bounds)} of them above the fit'
                    if p.inconsistent_bounds else '') + ')'
                 + ('; leave-one-x-out errors (per level) ' + ', '.join(
                     f'x={x:g}: {" / ".join(e)}' for x, e in sorted(loo.items()))
                    if loo else '') + '.')
  return lines


def _flags(r: Row) -> str:
  flags = [] if r.feasibility in ('ok', 'unknown') else [r.feasibility]
  return ', '.join(flags + (['extrapolated'] if r.extrapolated else []))


def _pick(title: str, r: Optional[Row]) -> str:
  text = f'* {title}: {r.label()}: {_hours(r.time)}, {r.device_hours:.3g} device-hours'
  if r.extrapolated:
    text += f' — extrapolated: {"; ".join(r.extrapolated)}'
  return text + '.'


def format_plan(plan: Plan) -> str:
  """The plan as markdown: its inputs (`describe_model`), the table, the picks."""
  lines = describe_model(plan)
  lines += ['', '| nodes | devices | global batch | method | update batch | staleness | steps '
            f'({100 * BAND_LEVEL:.0f} % band) | budget (share) | step time | time to target '
            f'({100 * BAND_LEVEL:.0f} % band) | device-hours | flags |',
            '|---|---|---|---|---|---|---|---|---|---|---|---|']
  for r in sorted(plan.rows, key=lambda r: (r.global_batch, r.method, r.nodes)):
    method = r.method + (f' H={r.sync_period}' if r.method == 'local_sgd' else '')
    budget = ('—' if r.budget_steps is None else
              f'{r.budget_steps} ({100 * r.budget_fraction:.0f} %)')
    lines.append(f'| {r.nodes} | {r.devices} | {r.global_batch} | {method} | {r.update_batch} | '
                 f'{r.mean_staleness:.2g} | {r.steps:.0f} ({r.steps_range[0]:.0f}-'
                 f'{r.steps_range[1]:.0f}) | {budget} | {1e3 * r.step_time:.4g} ms | '
                 f'{_hours(r.time)} ({_hours(r.time_range[0])}-{_hours(r.time_range[1])}) | '
                 f'{r.device_hours:.3g} | {_flags(r)} |')
  lines.append('')
  if plan.fastest is None:
    lines.append(f'* Fastest: none. Every configuration is predicted to cross the target after '
                 f'{100 * DEEP_DECAY_FRACTION:.0f} % of its budget or never: lower the target, '
                 'or give the runs a longer budget.')
  else:
    lines += [_pick('Fastest', plan.fastest),
              _pick('Cheapest within 10 % of the fastest', plan.cheapest)]
  if plan.passed_over:
    shown = plan.passed_over[:5]
    more = len(plan.passed_over) - len(shown)
    lines.append('* Faster, not recommended: ' + '; '.join(
        f'{r.label()} ({_hours(r.time)}): {why}' for r, why in shown)
        + (f'; and {more} more' if more > 0 else '') + '.')
  if plan.sprint is not None:
    s = plan.sprint
    lines.append(f'* SPRINT\'s criterion (fastest epoch, sync, global batch >= {plan.sprint_batch}):'
                 f' {s.label()}: {_hours(s.time)} to target, {s.device_hours:.3g} device-hours'
                 + (f' — {s.why_not()}' if not s.eligible else '')
                 + (f' — extrapolated: {"; ".join(s.extrapolated)}' if s.extrapolated else '')
                 + '.')
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
  label = lambda r: r.label() if r is not None else None
  return {'model': dataclasses.asdict(plan.model), 'band_level': BAND_LEVEL,
          'penalties': {k: dataclasses.asdict(v) for k, v in plan.penalties.items()},
          'rows': [dataclasses.asdict(r) for r in plan.rows],
          'fastest': label(plan.fastest), 'cheapest_within_10pct': label(plan.cheapest),
          'passed_over': [{'row': r.label(), 'why': why} for r, why in plan.passed_over],
          'sprint': label(plan.sprint), 'sprint_batch': plan.sprint_batch,
          'skipped': plan.skipped}


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
