"""What the planner writes: the plan as markdown (`format_plan`), JSON (`plan_to_json`), two
plots (`plot_plan`), and all of them into a folder (`write_plan`)."""

import dataclasses
import json
import math
import os
from typing import Dict, List, Sequence

import numpy as np

from anp_jax.research.planner.time_to_target import Plan, Row


def _hours(seconds: float) -> str:
  h = seconds / 3600
  return f'{h:.3g} h' if h >= 0.1 else f'{seconds / 60:.3g} min'


def format_plan(plan: Plan) -> str:
  """The plan as markdown: model, penalties, the table, the three picks."""
  m = plan.model
  lines = [f'Target: {m.notes["metric"]} >= {m.notes["target"]:g} ({m.notes["target_source"]}).'
           ] if 'metric' in m.notes else []
  lines += [f'Steps model ({m.source}): S(B) = {m.s_min:.4g} (1 + {m.b_noise:.4g} / B), '
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
