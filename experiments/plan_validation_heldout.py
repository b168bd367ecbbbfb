"""The planner on held-out tasks: steps to target predicted from a pilot vs measured, scored.

  python experiments/plan_validation_heldout.py --studies DIR_A,...,DIR_F \
      --calibration DIR_A,DIR_B,DIR_C --out experiments/results/plan_validation/heldout

Each DIR is a finished study of the ``plan_validation`` preset (``anp_jax/configs/
study_plan_validation.py``: one generated task, the global batch at 1/4 ... 8x the pilot's,
several seeds, stopping at the target). Reads its ``points.json`` and ``results.json`` and the
pilot point's run directories (no training), and writes ``report.md``, ``results.json`` and
``steps_heldout.png`` into ``--out``: per task the pilot's prediction at every batch (from all
the pilot's seeds, from its first seed alone, with B_crit = B_noise, and from pilots at two
batch sizes: every seed of the pilot and of the point at 4x its batch, B_crit fitted, both
batches in sample, refused where a seed there missed the target) with its 90 % band for
the mean of the point's seeds, the measured mean and its 95 % interval, the error out of sample
(the pilot's batch never counted), whether the measured mean lies inside the band, and each
point's predicted share of its budget against what its seeds did; pooled over the tasks, the
median and worst |error| and the coverage against the targets (median <= 15 %, every point <=
30 % up to 8x, coverage >= 80 %).

``--calibration``: the studies whose fitted B_crit / B_noise calibrated the planner's
`B_CRIT_FACTOR`. Each of them is scored with the factor of the *other* calibration tasks (leave
one task out); every other study with the planner's default, and those are the held-out score.
The report checks that the default is what the calibration tasks give. The logic:
`anp_jax.research.plan_validation`.
"""

import json
import os
import sys

from absl import app, flags

from anp_jax import cli, plotting, runtime
from anp_jax.research import plan_validation as validation
from anp_jax.research import planner

FLAGS = flags.FLAGS
flags.DEFINE_list('studies', None, 'The task studies (study directories), comma-separated.')
flags.DEFINE_list('calibration', [], 'Those of --studies that calibrated the planner\'s '
                  'B_crit / B_noise factor (scored leaving each out); the others are held out.')
flags.DEFINE_string('out', None, 'Directory for report.md, results.json and the PNG.')
flags.DEFINE_string('metric', None, "The target's metric (default: the pilot's recorded).")
flags.DEFINE_float('target', None, "The target's value (default: the pilot's recorded).")
flags.mark_flags_as_required(['studies', 'out'])


def _pct(x):
  return '—' if x is None else f'{100 * x:+.1f} %'


def _measured(r):
  if r['measured'] is not None:
    interval = (f' ({r["measured_low"]:.0f}–{r["measured_high"]:.0f})'
                if r.get('measured_low') is not None else '')
    return f'{r["measured"]:.0f}{interval}'
  bound = f' ≥ {r["lower_bound"]:.0f}' if r.get('lower_bound') is not None else ''
  return f'{r["reached"]}/{r["seeds"]} reached{bound}'


def _factor_text(task):
  m = task['seeds']['model']
  f = task.get('factor')
  how = ('the planner\'s default' if f is None else
         f'from the other calibration tasks ({f["tasks"]}), leaving this one out')
  sd = f', log-sd {m["factor_log_sd"]:.3g}' if m.get('factor_log_sd') else ''
  return f'B_crit = {m["b_crit_factor"]:.3g} x B_noise ({how}{sd})'


def task_lines(task):
  """One task's section: the pilot, the table (all seeds' pilot; seed 0 alone; B_crit =
  B_noise), the scores of the three."""
  seeds, one, raw, two = (task['seeds'], task['one_seed'], task['uncorrected'],
                          task['two_batch'])
  two_rows = two['score']['rows'] or [None] * len(seeds['score']['rows'])
  m = seeds['model']
  lines = [f'### {task["study"]}', '',
           f'Pilot: {len(task["pilot_runs"])} seeds at B0 = {task["pilot_batch"]} '
           f'({", ".join(task["pilot_runs"])}); target {m["metric"]} >= {m["target"]:g}; '
           f'S(B) = {m["s_min"]:.4g} (1 + {m["b_crit"]:.4g} / B): B_noise {m["b_noise"]:.4g} '
           f'up to the target crossing (the late window gives '
           f'{m["b_simple_late"] or float("nan"):.4g}), {_factor_text(task)}; seed spread: '
           f'{m["seed_source"]}.', '',
           '| batch | ×pilot | predicted (90 % band for the mean) | measured mean (95 % CI) | '
           'error | inside | predicted share of budget | flag | late crossings | seed 0 '
           'alone | error | B_crit = B_noise (band) | error | pilots at B0 and '
           f'{validation.TWO_BATCH_RATIO} B0 (band) | error |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  for r, o, u, t in zip(seeds['score']['rows'], one['score']['rows'], raw['score']['rows'],
                        two_rows):
    fitted = ('— | —' if t is None else
              f'{t["predicted"]:.0f} ({t["low"]:.0f}–{t["high"]:.0f}) | '
              + ('in sample' if t['in_sample'] else _pct(t['error'])))
    share = '—' if r['budget_share'] is None else f'{100 * r["budget_share"]:.0f} %'
    inside = '—' if r['inside'] is None else ('yes' if r['inside'] else 'no')
    error = 'in sample' if r['in_sample'] else _pct(r['error'])
    lines.append(f'| {r["batch"]} | {r["ratio"]:g} | {r["predicted"]:.0f} ({r["low"]:.0f}–'
                 f'{r["high"]:.0f}) | {_measured(r)} | {error} | {inside} | {share} | '
                 f'{r["feasibility"]} | {r["late_crossings"]} | {o["predicted"]:.0f} | '
                 f'{"in sample" if o["in_sample"] else _pct(o["error"])} | '
                 f'{u["predicted"]:.0f} ({u["low"]:.0f}–{u["high"]:.0f}) | '
                 f'{"in sample" if u["in_sample"] else _pct(u["error"])} | {fitted} |')
  lines += ['', planner.describe_score(seeds['score'], 'predictions from the pilot\'s seeds'),
            planner.describe_score(one['score'], 'predictions from seed 0 alone'),
            planner.describe_score(raw['score'], 'predictions with B_crit = B_noise'),
            (f'Pilots at B0 and {validation.TWO_BATCH_RATIO} B0: not available ('
             f'{two["unavailable"]}).' if two.get('unavailable') else
             f'Pilots at B0 and {validation.TWO_BATCH_RATIO} B0: S(B) = '
             f'{two["model"]["s_min"]:.4g} (1 + {two["model"]["b_crit"]:.4g} / B) fitted. '
             + planner.describe_score(two['score'], 'their predictions')), '']
  return lines


def _has_test(study_dir) -> bool:
  with open(os.path.join(study_dir, 'points.json')) as f:
    return all(p.get('test_steps_to_target') is not None for p in json.load(f))


LABELS = (('seeds', 'all the pilot\'s seeds'), ('one_seed', 'seed 0 alone'),
          ('uncorrected', 'all seeds, B_crit = B_noise'),
          ('two_batch', f'pilots at B0 and {validation.TWO_BATCH_RATIO} B0, B_crit fitted'))


def _pooled_rows(pooled):
  rows = []
  for label, name in LABELS:
    p = pooled[label]
    f = p['feasibility']
    fmt = lambda v: '—' if v is None else f'{100 * v:.1f} %'
    if p.get('unavailable'):
      name += (f' (not {", ".join(p["unavailable"])}: a seed missed at '
               f'{validation.TWO_BATCH_RATIO} B0)')
    rows.append((name, f'{p["n"]} | {fmt(p["median_abs_error"])} | '
                       f'{fmt(p["max_abs_error"])} | {fmt(p["coverage"])} | '
                       f'{f["missed_flagged"]}/{f["missed"]} | {f["flagged_but_reached"]} |'))
  return rows


def _targets_line(pooled, what):
  targets, met = validation.HELDOUT_TARGETS, pooled['seeds']['targets_met']
  return (f'Targets ({what}, pilot\'s seeds): median |error| <= '
          f'{100 * targets["median_abs_error"]:.0f} % — '
          f'{"met" if met["median_abs_error"] else "not met"}; every point <= '
          f'{100 * targets["max_abs_error"]:.0f} % — {"met" if met["max_abs_error"] else "not met"}'
          f'; coverage >= {100 * targets["coverage"]:.0f} % — '
          f'{"met" if met["coverage"] else "not met"}.')


def _name(task):
  return os.path.basename(os.path.normpath(task['study']))


def groups(tasks, calibration):
  """(title, tasks) of the held-out tasks (scored with the planner's default factor) and of the
  calibration tasks (each with the factor of the others)."""
  out = []
  held = [t for t in tasks if t['study'] not in calibration]
  cal = [t for t in tasks if t['study'] in calibration]
  if held:
    out.append(('held out (' + ', '.join(_name(t) for t in held) + '; the default factor)', held))
  if cal:
    out.append(('calibration (' + ', '.join(_name(t) for t in cal) + '; each with the others\' '
                'factor)', cal))
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
    lines.append(f'| {os.path.basename(os.path.normpath(task["study"]))} | {crit} | '
                 f'{b_noise:.0f} | {ratio} | {loo} | {simple} |')
  return lines + ['']


def calibration_lines(calibration_check):
  c = calibration_check
  if not c:
    return []
  ratios = ', '.join(f'{r:.2f}' for r in c['ratios'])
  agree = 'the same' if c['matches'] else '**not** the same: re-calibrate `B_CRIT_FACTOR`'
  return [f'The planner\'s default B_crit / B_noise factor: {c["default"]:.4g} (log-sd '
          f'{c["default_log_sd"]:.3g} over {c["default_tasks"]} tasks). From the calibration '
          f'tasks\' fits here (ratios {ratios}): {c["factor"]:.4g} (log-sd {c["log_sd"]:.3g}), '
          f'{agree}.', '']


def write(out, tasks, test_tasks=None, diagnostics=None, calibration=(),
          calibration_check=None):
  calibration = set(calibration)
  scored = [('validation', tasks), ('test', test_tasks)]
  pooled = {}
  for split, these in scored:
    if these:
      pooled[split] = [(title, {label: validation.pooled_score(group, label)
                                for label, _ in LABELS})
                       for title, group in groups(these, calibration)]
  targets = validation.HELDOUT_TARGETS
  lines = ['# The planner on held-out tasks', '',
           'Generated by `python experiments/plan_validation_heldout.py` from the studies of '
           'the `plan_validation` preset listed below (see `anp_jax/configs/'
           'study_plan_validation.py` for the tasks). Errors are out of sample: the pilot\'s '
           'batch is never counted, and points up to 8× the pilot\'s batch are scored. The band '
           f'is an approximate {100 * planner.BAND_LEVEL:.0f} % prediction interval for the '
           'mean of the point\'s seeds.', '',
           'The planner takes B_crit = factor x the pilot\'s B_noise. The calibration tasks '
           'are those whose fits set the default factor: each is scored with the factor of the '
           'others (leave one task out). The held-out tasks were fixed after the factor and '
           'are scored with the default: they are the planner\'s out-of-sample test. "B_crit '
           '= B_noise" is the planner before the factor, beside it. "Pilots at B0 and '
           f'{validation.TWO_BATCH_RATIO} B0" is the planner given every seed of the pilot and '
           f'of the point at {validation.TWO_BATCH_RATIO}x its batch: S_min and B_crit fitted '
           'to their means, no factor, scored on the other points (both batches in sample); '
           'where a seed at the second batch missed the target the planner refuses the pair '
           'and the task is not scored. This pair was fixed before its scores were seen.', '',
           'Two scorings: on **validation** (the pilot\'s recorded target, the split the '
           'planner is given: its crossing predicts the points\' validation crossings) and on '
           '**test** (the same target value: the pilot\'s test crossing predicts the points\' '
           'test crossings, the split the studies publish; every run stopped at the later of '
           'both crossings, so both are measured).', '']
  lines += calibration_lines(calibration_check)
  lines += ['| split | tasks | pilot | points | median abs. error | worst | coverage | missed '
            'points flagged | flagged but reached |', '|---|---|---|---|---|---|---|---|---|']
  for split in ('validation', 'test'):
    for title, scores in pooled.get(split, []):
      lines += [f'| {split} | {title} | {name} | {cells}' for name, cells in _pooled_rows(scores)]
  for split in ('validation', 'test'):
    if split not in pooled:
      lines += ['', f'No {split}-split scoring: a study\'s runs evaluated no test split.']
      continue
    for title, scores in pooled[split]:
      lines += ['', _targets_line(scores, f'{split}, {title}')]
  lines += ['', '## Tasks, validation split', '']
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
               'pooled_test': pooled.get('test'), 'targets': targets,
               'diagnostics': diagnostics, 'calibration': sorted(calibration),
               'calibration_check': calibration_check}, f, indent=2)
  plot(out, tasks)
  return text


def plot(out, tasks):
  plt = plotting.pyplot()
  fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 4), squeeze=False)
  for ax, task in zip(axes[0], tasks):
    rows = task['seeds']['score']['rows']
    b = [r['batch'] for r in rows]
    line, = ax.plot(b, [r['predicted'] for r in rows], 's-', label='predicted (90 % band)')
    ax.fill_between(b, [r['low'] for r in rows], [r['high'] for r in rows],
                    color=line.get_color(), alpha=0.15)
    done = [r for r in rows if r['measured'] is not None]
    ax.errorbar([r['batch'] for r in done], [r['measured'] for r in done],
                yerr=[[r['measured'] - (r['measured_low'] or r['measured']) for r in done],
                      [(r['measured_high'] or r['measured']) - r['measured'] for r in done]],
                fmt='ko', label='measured mean (95 % CI)')
    missed = [r for r in rows if r['measured'] is None and r.get('lower_bound')]
    ax.plot([r['batch'] for r in missed], [r['lower_bound'] for r in missed], 'k^',
            label='seeds missed: lower bound')
    ax.set(xscale='log', yscale='log', xlabel='global batch', ylabel='steps to target',
           title=os.path.basename(os.path.normpath(task['study'])))
    ax.legend(fontsize=7)
  plotting.save_figure(fig, os.path.join(out, 'steps_heldout.png'))


def main(argv) -> int:
  runtime.configure(tensorflow=False)
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  try:
    dirs = [os.path.normpath(os.path.expanduser(d)) for d in FLAGS.studies]
    calibration = [os.path.normpath(os.path.expanduser(d)) for d in FLAGS.calibration]
    if unknown := [d for d in calibration if d not in dirs]:
      raise ValueError(f'--calibration {unknown}: not among --studies.')
    diagnostics = [validation.task_diagnostics(d) for d in dirs]
    factor, check = validation.calibration_factors(dirs, set(calibration), diagnostics,
                                                   FLAGS.metric, FLAGS.target)
    tasks = [validation.heldout_task(d, FLAGS.metric, FLAGS.target, factor=factor[d])
             for d in dirs]
    test_tasks = ([validation.heldout_task(d, FLAGS.metric, FLAGS.target, split='test',
                                           factor=factor[d])
                   for d in dirs] if all(_has_test(d) for d in dirs) else None)
    print(write(os.path.expanduser(FLAGS.out), tasks, test_tasks, diagnostics, calibration,
                check))
  except (ValueError, OSError, KeyError) as e:
    print(f'ERROR: {e}', file=sys.stderr)
    return cli.EXIT_USAGE
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
