#!/usr/bin/env python3
"""The planner on held-out tasks: steps to target predicted from a pilot vs measured, scored
beside baselines declared before the runs.

  .venv/bin/python experiments/plan_validation_heldout.py --studies DIR_A,...,DIR_F \
      --calibration DIR_A,DIR_B,DIR_C --out experiments/results/plan_validation/heldout
  .venv/bin/python experiments/plan_validation_heldout.py --studies DIR_G,...,DIR_M \
      --registration experiments/registrations/plan_heldout_2.json --out DIR --apply_decision

Each DIR is a finished study of the ``plan_validation`` preset (``anp_jax/configs/
study_plan_validation.py``: one generated task, the global batch at 1/4 ... 8x the pilot's,
several seeds, stopping at the target). Reads its ``points.json`` and ``results.json`` and the
pilot point's run directories (no training), and writes ``report.md``, ``results.json`` and
``steps_heldout.png`` into ``--out``. Per task, every point predicted from the pilot's seeds by
each predictor (`anp_jax.research.planner.predictors`): the planner's B_crit = k x B_noise, the
same from the first seed alone, B_crit = B_noise (Pollux / AdaptDL's model), k' x B_simple near
the crossing, pilots at two batch sizes (the pilot and the point at 4x its batch, B_crit
fitted), and the baselines that ignore the noise scale (a constant B_crit, a power law, perfect
scaling); the measured mean and its 95 % interval, or, where seeds missed the target, the
lower bound of the mean, against which the point is scored as a bound ("the error is at most
..."). Pooled over the tasks: median and worst |error| (bounds counted), within 25 %, every
point within 30 %, the band's coverage with its Clopper-Pearson interval, the budget flags
against the points whose seeds missed, the issue 35 targets, and the planner paired against
each baseline point by point with an interval over tasks.

``--calibration``: the studies whose fits calibrate the predictors' parameters (k, k', the
constant B_crit, the power law's exponent: `plan_validation.calibrate_parameters`). Each of them
is scored with the parameters of the *other* calibration tasks (leave one task out); every other
study with those of all of them: the held-out score.

``--registration``: a registration file (`anp_jax.research.registration`) that the held-out
studies recorded before their first runs. The held-out studies are scored with its registered
parameters, each study's record is verified (same file, recorded before its first run), the
report prints its time beside each first run's, and its decision rule is applied
(`plan_validation.apply_rule`); ``--apply_decision`` then writes the winner as the planner's
default (``--decision_out``, default `anp_jax/research/planner/default_predictor.py`).
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

import datetime
import json
import pprint

from absl import app, flags

from anp_jax import cli, plotting, runtime
from anp_jax.research import plan_validation as validation
from anp_jax.research import planner, registration
from anp_jax.research.planner import predictors

FLAGS = flags.FLAGS
flags.DEFINE_list('studies', None, 'The task studies (study directories), comma-separated.')
flags.DEFINE_list('calibration', [], 'Those of --studies that calibrate the predictors\' '
                  'parameters (scored leaving each out); the others are held out.')
flags.DEFINE_string('registration', None, 'A registration file the held-out studies recorded '
                    'before their first runs: its parameters score them, its rule decides.')
flags.DEFINE_bool('apply_decision', False, 'With --registration: write the winner of its '
                  'decision rule as the planner\'s default predictor (--decision_out).')
flags.DEFINE_string('decision_out', None, 'Where --apply_decision writes the default predictor '
                    '(default: anp_jax/research/planner/default_predictor.py).')
flags.DEFINE_string('out', None, 'Directory for report.md, results.json and the PNG.')
flags.DEFINE_string('metric', None, "The target's metric (default: the pilot's recorded).")
flags.DEFINE_float('target', None, "The target's value (default: the pilot's recorded).")
flags.mark_flags_as_required(['studies', 'out'])

# The columns of the tables: (label in the scored task, name).
SHOWN = (('seeds', 'k x B_noise (planner)'), ('one_seed', 'k x B_noise, seed 0 alone'),
         ('uncorrected', 'B_crit = B_noise (Pollux)'), ('near_crossing', "k' x B_simple near"),
         ('two_batch', f'pilots at B0, {validation.TWO_BATCH_RATIO} B0'),
         ('constant', 'constant B_crit (baseline)'), ('power_law', 'power law (baseline)'),
         ('perfect', 'perfect scaling (baseline)'))
BASELINES = ('constant', 'power_law', 'perfect', 'uncorrected')


def _pct(x, sign=True):
  return '—' if x is None else (f'{100 * x:+.1f} %' if sign else f'{100 * x:.1f} %')


def _measured(r):
  if r['measured'] is not None:
    interval = (f' ({r["measured_low"]:.0f}–{r["measured_high"]:.0f})'
                if r.get('measured_low') is not None else '')
    return f'{r["measured"]:.0f}{interval}'
  bound = f' ≥ {r["lower_bound"]:.0f}' if r.get('lower_bound') is not None else ''
  return f'{r["reached"]}/{r["seeds"]} reached{bound}'


def _error(r):
  """A row's error cell: the error, or for a bound 'at most X'."""
  if r is None:
    return '—'
  if r['in_sample']:
    return 'in sample'
  if r.get('censored'):
    return f'≤ {_pct(r["error_at_most"])}'
  return _pct(r['error'])


def _name(task):
  return os.path.basename(os.path.normpath(task['study']))


def task_lines(task):
  """One task's section: its registration, pilot, every predictor's prediction and error."""
  m = task['seeds']['model']
  p = task['parameters']
  lines = [f'### {_name(task)} (`{task["study"]}`)', '', task.get('registration_line', ''), '',
           f'Pilot: {len(task["pilot_runs"])} seeds at B0 = {task["pilot_batch"]}; target '
           f'{m["metric"]} >= {m["target"]:g}; B_noise {m["b_noise"]:.4g} up to the target '
           f'crossing (the late window gives {m["b_simple_late"] or float("nan"):.4g}, the last '
           f'quarter before the crossing {m.get("b_simple_near") or float("nan"):.4g}); k = '
           f'{p["factor"]["factor"]:.4g}, constant B_crit = {p["constant"]["b_crit"]:.4g}, '
           f'power law alpha = {p["power_law"]["alpha"]:.4g}; seed spread: '
           f'{m["seed_source"]}.', '']
  labels = [(label, name) for label, name in SHOWN if task.get(label)]
  lines += ['| batch | ×pilot | measured mean (95 % CI) | ' + ' | '.join(
      f'{name} (90 % band) | error' for _, name in labels) + ' | share of budget (planner) | '
            'flag | late crossings |',
            '|' + '---|' * (3 + 2 * len(labels) + 3)]
  base = task['seeds']['score']['rows']
  by = {label: {r['batch']: r for r in task[label]['score']['rows']} for label, _ in labels}
  for r in base:
    cells = []
    for label, _ in labels:
      x = by[label].get(r['batch'])
      cells.append('— | —' if x is None else
                   f'{x["predicted"]:.0f} ({x["low"]:.0f}–{x["high"]:.0f}) | {_error(x)}')
    share = '—' if r['budget_share'] is None else f'{100 * r["budget_share"]:.0f} %'
    lines.append(f'| {r["batch"]} | {r["ratio"]:g} | {_measured(r)} | ' + ' | '.join(cells)
                 + f' | {share} | {r["feasibility"]} | {r["late_crossings"]} |')
  lines.append('')
  for label, name in labels:
    t = task[label]
    if t.get('unavailable'):
      lines.append(f'{name}: not available ({t["unavailable"]}).')
    else:
      lines.append(planner.describe_score(t['score'], f'predictions ({name})'))
  return lines + ['']


def _has_test(study_dir) -> bool:
  with open(os.path.join(study_dir, 'points.json')) as f:
    return all(p.get('test_steps_to_target') is not None for p in json.load(f))


def _coverage(p):
  if not p['banded']:
    return '—'
  ci = p['coverage_ci']
  more = f', {p["undetermined_band"]} undet.' if p['undetermined_band'] else ''
  return (f'{p["inside"]}/{p["banded"]}{more} [{100 * ci["low"]:.0f}, {100 * ci["high"]:.0f}] '
          '%')


def _every(p):
  return {True: 'yes', False: 'no', None: 'not shown'}[p['every_within_30']]


def pooled_rows(pooled):
  """The pooled table's rows: one per predictor."""
  rows = []
  for label, name in SHOWN:
    p = pooled.get(label)
    if p is None or not p['n']:
      continue
    f = p['feasibility']
    ge = '≥ ' if p['bounded'] else ''
    if p.get('unavailable'):
      name += f' (not {", ".join(p["unavailable"])})'
    rows.append(f'{name} | {p["n"]} ({p["censored"]}) | {ge}{_pct(p["median_abs_error"], False)}'
                f' | {ge}{_pct(p["max_abs_error"], False)} | {p["within"]}/{p["n"]} | '
                f'{_every(p)} | {_coverage(p)} | {f["missed_flagged"]}/{f["missed"]} | '
                f'{f["flagged_but_reached"]} |')
  return rows


POOLED_HEADER = ('| split | tasks | predictor | points (of them bounds) | median abs. error | '
                 'worst | within 25 % | every point within 30 % | inside the 90 % band [95 % '
                 'CI] | missed points flagged | flagged but reached |')


def _targets_line(p, what):
  targets, met = validation.HELDOUT_TARGETS, p['targets_met']
  word = lambda ok: 'met' if ok else 'not met'
  return (f'Targets ({what}, the planner from the pilot\'s seeds, bounds counted): median '
          f'|error| <= {100 * targets["median_abs_error"]:.0f} % — '
          f'{word(met["median_abs_error"])}; every point <= '
          f'{100 * targets["max_abs_error"]:.0f} % — {word(met["max_abs_error"])}; coverage >= '
          f'{100 * targets["coverage"]:.0f} % — {word(met["coverage"])}.')


def paired_lines(paired):
  lines = ['| split | tasks | planner against | points | mean difference of |error| (points of '
           '%) [95 % CI over tasks] | [95 % CI over points] | planner closer / farther |',
           '|---|---|---|---|---|---|---|']
  for (split, title, baseline), c in paired:
    if c is None:
      continue
    ci = ('—' if c['low'] is None else f'[{100 * c["low"]:+.1f}, {100 * c["high"]:+.1f}]')
    lines.append(f'| {split} | {title} | {dict(SHOWN)[baseline]} | {c["n"]} | '
                 f'{100 * c["mean"]:+.1f} {ci} | [{100 * c["point_low"]:+.1f}, '
                 f'{100 * c["point_high"]:+.1f}] | {c["better"]} / {c["worse"]} |')
  return lines


def groups(tasks, calibration):
  """(title, tasks) of the held-out tasks and of the calibration tasks (each scored with the
  parameters of the others)."""
  out = []
  held = [t for t in tasks if t['study'] not in calibration]
  cal = [t for t in tasks if t['study'] in calibration]
  if held:
    out.append((', '.join(_name(t) for t in held) + ' (held out)', held))
  if cal:
    out.append((', '.join(_name(t) for t in cal) + ' (calibration, each with the others\')',
                cal))
  return out


def diagnosis_lines(tasks, diagnostics):
  """Why the predictions miss, from each task's measurements alone (after the scoring)."""
  lines = ['## Diagnosis (validation split, after the scoring)', '',
           'From each task\'s own measured means: the fit of S = S_min (1 + B_crit / B) to all '
           'its batches, each batch predicted from the fit to the others (leave one out: does '
           'the form hold?), and B_simple up to each seed\'s crossing at every batch (the '
           'pilot\'s window; mean over the seeds that reached the target, 95 % t-interval). '
           'B_crit / B_noise: 95 % percentile bootstrap over seeds (optimistic with 3). None of '
           'this feeds the planner.', '',
           '| task | fitted B_crit | pilot B_noise | B_crit / B_noise | leave-one-out errors | '
           'B_simple up to the crossing [95 % CI], B = 32 ... 1024 |', '|---|---|---|---|---|---|']
  for task, d in zip(tasks, diagnostics):
    b_noise = task['seeds']['model']['b_noise']
    fit = d['fit']
    loo = ', '.join(f'{r["batch"]}: {_pct(r["error"])}' for r in d['leave_one_out'])
    simple = ', '.join('—' if v['mean'] is None else f'{v["mean"]:.0f}' + (
        f' [{v["low"]:.0f}, {v["high"]:.0f}]' if v.get('low') is not None else '')
                       for _, v in sorted(d['b_simple'].items()))
    crit = '—' if fit is None else f'{fit["b_crit"]:.0f}'
    ci = d.get('ratio_ci')
    ratio = '—' if fit is None else f'{fit["b_crit"] / b_noise:.2f}' + (
        f' [{ci["low"]:.2f}, {ci["high"]:.2f}]' if ci else '')
    lines.append(f'| {_name(task)} | {crit} | {b_noise:.0f} | {ratio} | {loo} | {simple} |')
  return lines + ['']


def parameter_lines(check, registered=None):
  """The parameters the held-out tasks are scored with, where they come from."""
  if registered is not None:
    lines = [f'Parameters: registered in `{registered["source"]}` (sha256 '
             f'{registered["sha256"][:12]}), fitted on its calibration tasks before the runs:']
    params = registered['parameters']
  elif check:
    lines = ['Parameters: fitted on the calibration tasks (geometric means and log-sds over '
             'the tasks; the power law\'s exponent by least squares over every task\'s points, '
             'its sd over the tasks\' own exponents):']
    params = check['parameters']
  else:
    return ['Parameters: the planner\'s calibrated ones (`default_predictor`): no calibration '
            'task given.', '']
  for kind in ('factor', 'near_crossing', 'constant', 'power_law'):
    p = params.get(kind)
    if not p:
      continue
    value = p.get('factor') or p.get('b_crit') or p.get('alpha')
    spread = p.get('log_sd') if p.get('log_sd') is not None else p.get('sd')
    values = ', '.join(f'{k} {v:.3g}' for k, v in (p.get('values') or {}).items())
    lines.append(f'* {predictors.NAMES[kind]}: {value:.4g} (' + (
        f'{"log-sd" if kind != "power_law" else "sd"} {spread:.3g} over {p["tasks"]} tasks'
        if spread is not None else f'{p["tasks"]} task(s)') + (f'; {values}' if values else '')
                 + ')')
  if check and registered is None:
    lines += ['', f'The planner\'s current default factor: {check["default"]:.4g} (log-sd '
              f'{check["default_log_sd"]:.3g} over {check["default_tasks"]} tasks); from the '
              f'calibration tasks here: {check["factor"]:.4g} (log-sd {check["log_sd"]:.3g} over '
              f'{check["tasks"]}): ' + ('the same.' if check['matches'] else
                                        'not the same (the default is calibrated on other '
                                        'tasks).')]
  return lines + ['']


def decision_lines(decision, rule_text):
  if decision is None:
    return []
  lines = ['## The registered decision rule, applied', '', f'Rule: {rule_text}', '',
           '| rank | predictor | median abs. error | worst |', '|---|---|---|---|']
  for i, (kind, p) in enumerate(decision['ranking'], 1):
    ge = '≥ ' if p['bounded'] else ''
    lines.append(f'| {i} | {predictors.NAMES[kind]} | {ge}{_pct(p["median_abs_error"], False)} '
                 f'| {ge}{_pct(p["max_abs_error"], False)} |')
  lines += ['', f'**Default: {predictors.NAMES[decision["winner"]]}**: {decision["reason"]}.', '']
  return lines


def write(out, tasks, test_tasks=None, diagnostics=None, calibration=(), check=None,
          registered=None, decision=None):
  calibration = set(calibration)
  labels = [label for label, _ in SHOWN]
  pooled, paired = {}, []
  for split, these in (('validation', tasks), ('test', test_tasks)):
    if not these:
      continue
    pooled[split] = []
    for title, group in groups(these, calibration):
      scores = {label: validation.pooled_score(group, label) for label in labels}
      pooled[split].append((title, scores))
      for baseline in BASELINES:
        paired.append(((split, title, baseline),
                       validation.paired_comparison(group, 'seeds', baseline)))
  lines = ['# The planner on held-out tasks, against baselines', '',
           'Generated by `experiments/plan_validation_heldout.py` from the studies of the '
           '`plan_validation` preset listed below (`anp_jax/configs/study_plan_validation.py`). '
           'Errors are out of sample: the pilot\'s batch is never counted, points up to 8× the '
           'pilot\'s batch are. Every predictor goes through the pilot\'s mean steps; they '
           'differ in how steps change with the batch (`anp_jax/research/planner/'
           'predictors.py`): the planner\'s B_crit = k x B_noise; the same from seed 0 alone; '
           'B_crit = B_noise, the premise of McCandlish et al. that Pollux / AdaptDL\'s '
           'statistical-efficiency model takes (Qiao et al., OSDI 2021); k\' x B_simple over the '
           'last quarter before the crossing (the hypothesis that the noise scale near the '
           'target tracks B_crit); pilots at B0 and 4 B0 (B_crit fitted, both batches in '
           'sample, refused where a seed there missed). The **baselines** ignore the noise '
           'scale: one constant B_crit, a power law S0 (B / B0)^-alpha, perfect scaling S0 B0 / '
           'B. Their parameters come from calibration tasks only. The band is an approximate '
           f'{100 * planner.BAND_LEVEL:.0f} % prediction interval for the mean of the point\'s '
           'seeds.', '',
           '**Points where seeds missed the target are counted as bounds**, not dropped: their '
           'mean is at least the lower bound (each miss at its budget), so the error is at most '
           'predicted / bound - 1 ("≤ -34 %": at least 34 % too few steps). Medians and worsts '
           'that include a bound are lower bounds ("≥"); "every point within 30 %" is "no" when '
           'a bound is past it and "not shown" when a bound leaves it open; a bound above the '
           'band counts as outside it, one inside it as undetermined. Coverage carries its '
           'Clopper-Pearson 95 % interval.', '',
           'Two scorings: **validation** (the pilot\'s recorded target, the split the planner is '
           'given) and **test** (the same target value on the test split, the split the studies '
           'publish; every run stopped at the later of both crossings).', '']
  if registered is not None:
    lines += [f'Registration: `{registered["source"]}` (sha256 {registered["sha256"][:12]}); '
              'each held-out study recorded it before its first run (below, per task).', '']
    if registered.get('unscored'):
      lines += [f'**An interim score**: the registered studies {", ".join(registered["unscored"])} '
                'are not among those scored here (not run, or not given). The registered '
                'decision rule is for all of them: it is not applied to this subset '
                '(`--apply_decision` refuses it).', '']
  lines += parameter_lines(check, registered)
  lines += [POOLED_HEADER, '|---|---|---|---|---|---|---|---|---|---|---|']
  for split in ('validation', 'test'):
    for title, scores in pooled.get(split, []):
      lines += [f'| {split} | {title} | {row}' for row in pooled_rows(scores)]
  for split in ('validation', 'test'):
    if split not in pooled:
      lines += ['', f'No {split}-split scoring: a study\'s runs evaluated no test split.']
      continue
    for title, scores in pooled[split]:
      lines += ['', _targets_line(scores['seeds'], f'{split}, {title}')]
  lines += ['', '## The planner against each baseline, point by point', '',
            'Per point where both are measured (bounds have no difference): the baseline\'s '
            '|error| minus the planner\'s, in points of %: positive when the planner is closer. '
            'The interval counts each task once (its points share a pilot); the one over points '
            'treats them as independent (optimistic).', '']
  lines += paired_lines(paired)
  lines += [''] + decision_lines(decision, (registered or {}).get('rule_text', ''))
  lines += ['## Tasks, validation split', '']
  for task in tasks:
    lines += task_lines(task)
  if test_tasks:
    lines += ['## Tasks, test split', '']
    for task in test_tasks:
      lines += task_lines(task)
  if diagnostics:
    lines += diagnosis_lines(tasks, diagnostics)
  text = '\n'.join(lines) + '\n'
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, 'report.md'), 'w') as f:
    f.write(text)
  with open(os.path.join(out, 'results.json'), 'w') as f:
    json.dump({'tasks': tasks, 'pooled': pooled.get('validation'), 'tasks_test': test_tasks,
               'pooled_test': pooled.get('test'), 'targets': validation.HELDOUT_TARGETS,
               'paired': [{'split': s, 'group': g, 'baseline': b, 'comparison': c}
                          for (s, g, b), c in paired],
               'diagnostics': diagnostics, 'calibration': sorted(calibration),
               'calibration_check': check, 'registration': registered, 'decision': decision},
              f, indent=2)
  plot(out, tasks)
  return text


def plot(out, tasks):
  plt = plotting.pyplot()
  fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 4), squeeze=False)
  for ax, task in zip(axes[0], tasks):
    for label, style in (('seeds', 's-'), ('constant', 'v--'), ('perfect', ':')):
      rows = task[label]['score']['rows']
      b = [r['batch'] for r in rows]
      line, = ax.plot(b, [r['predicted'] for r in rows], style, label=dict(SHOWN)[label])
      if label == 'seeds':
        ax.fill_between(b, [r['low'] for r in rows], [r['high'] for r in rows],
                        color=line.get_color(), alpha=0.15)
    rows = task['seeds']['score']['rows']
    done = [r for r in rows if r['measured'] is not None]
    ax.errorbar([r['batch'] for r in done], [r['measured'] for r in done],
                yerr=[[r['measured'] - (r['measured_low'] or r['measured']) for r in done],
                      [(r['measured_high'] or r['measured']) - r['measured'] for r in done]],
                fmt='ko', label='measured mean (95 % CI)')
    missed = [r for r in rows if r['measured'] is None and r.get('lower_bound')]
    ax.plot([r['batch'] for r in missed], [r['lower_bound'] for r in missed], 'k^',
            label='seeds missed: lower bound')
    ax.set(xscale='log', yscale='log', xlabel='global batch', ylabel='steps to target',
           title=_name(task))
    ax.legend(fontsize=7)
  plotting.save_figure(fig, os.path.join(out, 'steps_heldout.png'))


def registered_parameters(content):
  """Every predictor's parameters from a registration's ``predictors`` and ``baselines``."""
  entries = {**content.get('predictors', {}), **content.get('baselines', {})}
  return {k: entries[k].get('parameters', {}) for k in predictors.PREDICTORS if k in entries}


def decision_file(winner: str, registered, decision, content, pooled_winner,
                  current: str) -> str:
  """The text of `default_predictor.py` after applying a registration's decision; its
  docstring is the one of `current` (the file it replaces, read before anything is written)."""
  best_base = decision['best_baseline']
  paired = decision['paired']
  ranking = dict(decision['ranking'])

  def score(entry) -> str:  # A score with points that missed is a bound on the error.
    at_least = '>= ' if entry.get('bounded') else ''
    ci = entry.get('coverage_ci') or {}
    inside = (f', inside its 90 % band {entry["inside"]}/{entry["banded"]}'
              + (f' [{100 * ci["low"]:.0f}, {100 * ci["high"]:.0f}] %' if ci else '')
              if entry.get('banded') else '')
    return (f'median |error| {at_least}{_pct(entry["median_abs_error"], False)}, worst '
            f'{at_least}{_pct(entry["max_abs_error"], False)}{inside}')

  compared = f'{score(pooled_winner)} ({len(decision["ranking"])} predictors ranked)'
  if best_base and best_base != winner:
    compared += (f' against the best baseline ({predictors.NAMES[best_base]}) '
                 f'{score(ranking[best_base])}')
    if paired and paired['low'] is not None:
      compared += (f'; paired, {100 * paired["mean"]:+.1f} points of |error| '
                   f'[{100 * paired["low"]:+.1f}, {100 * paired["high"]:+.1f}] over tasks')
  elif winner in predictors.NOISE_FREE:
    readers = [k for k, _ in decision['ranking'] if k not in predictors.NOISE_FREE]
    if readers:
      compared += (f'; the best predictor that reads the noise scale '
                   f'({predictors.NAMES[readers[0]]}): {score(ranking[readers[0]])}')
      if 'factor' in ranking and readers[0] != 'factor':
        compared += f'; B_crit = k x B_noise: {score(ranking["factor"])}'
    if paired and paired['low'] is not None and paired.get('baseline') == winner:
      compared += (f'; paired, {predictors.NAMES.get(paired["label"], paired["label"])} closer '
                   f'by {100 * paired["mean"]:+.1f} points of |error| [{100 * paired["low"]:+.1f}, '
                   f'{100 * paired["high"]:+.1f}] over tasks')
    compared += ('; the pilot\'s noise scale added nothing shown over it: the plan rests on the '
                 'pilot\'s steps and this baseline')
  tasks = ', '.join(sorted(content.get('studies', {})))
  default = {
      'predictor': winner,
      'parameters': {k: {kk: vv for kk, vv in v.items() if kk != 'values'}
                     for k, v in registered_parameters(content).items()},
      'calibration': content.get('calibration', {}).get('text', ''),
      'heldout': (f'On the registered held-out tasks ({tasks}; {content["decision_rule"]["split"]} '
                  f'split): {compared}. {decision["reason"]}.'),
      'decided_by': (f'{registered["source"]} (sha256 {registered["sha256"][:12]}), applied '
                     f'{datetime.date.today().isoformat()} by experiments/'
                     'plan_validation_heldout.py --apply_decision'),
  }
  head = current[:current.index('DEFAULT = {')]
  return head + 'DEFAULT = ' + pprint.pformat(default, width=96, sort_dicts=False) + '\n'


def main(argv) -> int:
  runtime.configure(tensorflow=False)
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  try:
    dirs = [os.path.normpath(os.path.expanduser(d)) for d in FLAGS.studies]
    calibration = [os.path.normpath(os.path.expanduser(d)) for d in FLAGS.calibration]
    if unknown := [d for d in calibration if d not in dirs]:
      raise ValueError(f'--calibration {unknown}: not among --studies.')
    if FLAGS.apply_decision and not FLAGS.registration:
      raise ValueError('--apply_decision applies a registration\'s rule: give --registration.')
    diagnostics = [validation.task_diagnostics(d) for d in dirs]
    params, check = validation.calibration_parameters(dirs, set(calibration), diagnostics,
                                                      FLAGS.metric, FLAGS.target)
    registered = content = None
    lines = {}
    if FLAGS.registration:
      content = registration.load(FLAGS.registration)
      registered = {'source': FLAGS.registration,
                    'sha256': registration.file_hash(registration.resolve_path(
                        FLAGS.registration)),
                    'parameters': registered_parameters(content),
                    'rule_text': content['decision_rule'].get('text', '')}
      for d in dirs:
        if d not in calibration:
          registration.verify(d, FLAGS.registration)
          params[d] = registered['parameters']
      registered['unscored'] = registration.unscored(content, dirs)
      if FLAGS.apply_decision and registered['unscored']:
        raise ValueError(
            f'--apply_decision: the registered studies {", ".join(registered["unscored"])} are '
            'not among --studies; the registered rule decides on all of them (score a subset '
            'without --apply_decision: an interim report).')
    for d in dirs:
      lines[d] = registration.describe(d)
    tasks = [validation.heldout_task(d, FLAGS.metric, FLAGS.target, parameters=params[d])
             for d in dirs]
    test_tasks = ([validation.heldout_task(d, FLAGS.metric, FLAGS.target, split='test',
                                           parameters=params[d])
                   for d in dirs] if all(_has_test(d) for d in dirs) else None)
    for t in tasks + (test_tasks or []):
      t['registration_line'] = lines[t['study']]
    decision = None
    if content is not None and not registered['unscored']:  # The rule decides on all of them.
      rule = content['decision_rule']
      split_tasks = test_tasks if rule.get('split') == 'test' else tasks
      held = [t for t in split_tasks if t['study'] not in calibration]
      decision = validation.apply_rule(held, rule)
    text = write(os.path.expanduser(FLAGS.out), tasks, test_tasks, diagnostics, calibration,
                 check, registered, decision)
    print(text)
    if FLAGS.apply_decision:
      winner = decision['winner']
      path = FLAGS.decision_out or os.path.join(os.path.dirname(predictors.__file__),
                                                'default_predictor.py')
      # The new text is made whole (from the file it replaces, read first) before the file is
      # replaced atomically: opening it for writing first had emptied it and then failed.
      source = path if os.path.exists(path) else os.path.join(
          os.path.dirname(predictors.__file__), 'default_predictor.py')
      with open(source) as f:
        current = f.read()
      text = decision_file(winner, registered, decision, content,
                           dict(decision['ranking'])[winner], current)
      with open(path + '.tmp', 'w') as f:
        f.write(text)
      os.replace(path + '.tmp', path)
      print(f'The planner\'s default predictor is now {winner} ({path}).')
  except (ValueError, OSError, KeyError) as e:
    print(f'ERROR: {e}', file=sys.stderr)
    return cli.EXIT_USAGE
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
