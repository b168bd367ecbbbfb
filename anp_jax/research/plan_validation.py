"""The planner's validation against committed measurements: the computations behind
``experiments/plan_validation.py`` and ``experiments/plan_validation_heldout.py`` (which read the
results, call these and write the reports). No JAX at import (`trainer_mismatch` imports the
setup when it runs).

* `validate_pilot` / `validate_model`: steps to target at every batch predicted from one run (or
  any steps model), against a sweep's measured steps;
* `validate_leave_one_out`: each batch predicted by the S_min, B_crit fit to the other batches;
* `validate_methods`: each arm of the sync/async/mixed experiment predicted from the sync arm and
  the convergence penalty fitted without that arm (leave one out);
* `seed_paper_rows`: the seed paper's set-up on the MinoTauro preset for assumed inputs;
* `trainer_mismatch`: whether a committed pilot's recorded sizes are what today's trainer
  computes for its config (a pilot of an earlier trainer is no evidence about this one);
* `heldout_task`, `pooled_score`, `feasibility_check`: the held-out tasks' studies (preset
  ``study_plan_validation``) scored with every predictor and baseline (`planner.predictors`):
  errors out of sample, points where seeds missed as bounds, band coverage, budget flags;
  `calibrate_parameters` / `calibration_parameters`: the predictors' parameters from
  calibration tasks' fits (leaving each calibration task out when it is scored);
  `paired_comparison`: two predictors point by point, over tasks; `apply_rule`: a
  registration's decision rule on the scored tasks.
"""

import json
import math
import os
import statistics
from typing import Dict, List, Optional, Sequence

from anp_jax.configs import default as default_config
from anp_jax import noise_scale
from anp_jax.metrics_io import read_metrics, target_crossing
from anp_jax.research import eval_seam, stats
from anp_jax.research import perfmodel as pm
from anp_jax.research.planner import (PlanError, StepsModel, convergence_penalty,
                                      epochs_to_level, feasibility, fit_steps_to_target,
                                      load_pilot, penalty_kind, pilot_model, pilot_train_size,
                                      plan_row, run_record, score_predictions)
from anp_jax.research.planner import predictors, scoring, steps_model
from anp_jax.research.planner.inputs import (DEFAULT_METRIC, chosen_metric, read_pilot,
                                             recorded_target)


def validate_pilot(points: Dict[int, Dict], pilot_batch: int) -> List[Dict]:
  """Steps to target at every batch predicted from the pilot batch's run alone, vs measured.

  ``points`` as from `sweep_points` (the pilot's B_simple is its row's ``b_simple``).
  """
  pilot = points[pilot_batch]
  return validate_model(pilot_model(pilot_batch, pilot['steps'], pilot['b_simple']), points)


def validate_model(model: StepsModel, points: Dict[int, Dict]) -> List[Dict]:
  """A steps model's predictions (central, low, high) against measured steps per batch."""
  out = []
  for b, p in sorted(points.items()):
    central, lo, hi = model.steps(b)
    out.append({'batch': b, 'measured': p['steps'], 'predicted': central, 'low': lo, 'high': hi,
                'error': central / p['steps'] - 1 if p['steps'] else None})
  return out


def validate_leave_one_out(points: Dict[int, Dict]) -> List[Dict]:
  """Each batch's steps to target from the S_min, B_crit fit to all the other batches."""
  reached = {b: p['steps'] for b, p in points.items() if p['steps'] is not None}
  out = []
  for b in sorted(reached):
    others = {k: v for k, v in reached.items() if k != b}
    if len(others) < 2:
      continue
    s_min, b_crit = fit_steps_to_target(list(others), list(others.values()))
    pred = s_min * (1 + b_crit / b)
    out.append({'batch': b, 'measured': reached[b], 'predicted': pred,
                'error': pred / reached[b] - 1, 's_min': s_min, 'b_crit': b_crit})
  return out


def validate_methods(results: Sequence[Dict], level_frac: float = 0.5) -> List[Dict]:
  """Predicted vs measured time to a level for every arm of the sync/async/mixed experiment.

  Measured: the arm's epochs to ``level_frac`` x the sync arm's best top-1 (interpolated) times
  its predicted epoch time on the seed paper's cluster (the experiment's own mapping).
  Predicted: the sync arm's epochs times the penalty fitted *without this arm's worker count or
  sync period* (leave one out), times the same epoch time. None where an arm never got there.
  """
  sync = next(r for r in results if r['method'] == 'sync')
  level = level_frac * max(c['top1'] for c in sync['curve'])
  e_sync = epochs_to_level(sync['curve'], level)
  rows = []
  for r in results:
    measured = epochs_to_level(r['curve'], level)
    if r['method'] == 'sync':
      factor = 1.0
    else:
      kind = penalty_kind(r['method'])
      kind_x = 'workers' if kind == 'async' else 'sync_every'
      rest = [o for o in results if o['method'] == 'sync' or
              (penalty_kind(o['method']) == kind and o[kind_x] != r[kind_x])]
      pen = convergence_penalty(rest, levels=(level_frac,)).get(kind)
      x = r[kind_x] - 1
      factor = pen.factor(x)[0] if pen else None
    epoch_h = r['predicted_epoch_s'] / 3600
    rows.append({'name': r['name'], 'method': r['method'], 'level': level,
                 'measured_epochs': measured, 'predicted_epochs':
                 e_sync * factor if factor is not None else None,
                 'measured_h': measured * epoch_h if measured is not None else None,
                 'predicted_h': e_sync * factor * epoch_h if factor is not None else None})
  return rows


# The sizes a run records that follow from its config and the trainer's rules.
SETUP_FIELDS = ('steps_per_epoch', 'total_steps', 'eval_every_steps')


def trainer_mismatch(workdir: str) -> List[str]:
  """How the sizes a pilot recorded differ from what today's trainer computes for its config.

  Recorded: its run record's ``steps_per_epoch``, ``total_steps`` and ``eval_every_steps``
  (``sweep_run.json``), else the steps per epoch its training log implies (step / ``train/epoch``).
  Computed: `anp_jax.setup.resolve_setup` on the recorded config, its devices and the training
  split's size. [] when they agree; one line per field that differs (or saying why nothing
  could be checked).
  """
  from anp_jax import setup  # Imports JAX: only when a pilot is checked.
  config = default_config.read_run_config(workdir)
  records = read_metrics(workdir)
  recorded = {k: v for k, v in run_record(workdir).items() if k in SETUP_FIELDS + ('devices',)}
  if 'steps_per_epoch' not in recorded:
    logged = next((r for r in records if r.get('train/epoch')), None)
    if logged is None:
      return [f'{workdir}: no run record and no train/epoch in its log: its sizes cannot be '
              'checked against the current trainer']
    recorded['steps_per_epoch'] = logged['step'] / logged['train/epoch']
  train_size = pilot_train_size(workdir, config, records)
  if train_size is None:
    return [f'{workdir}: the size of its training split is unknown: its sizes cannot be checked']
  devices = int(recorded.get('devices', 1))
  # The evaluation split's size only sets the number of evaluation batches, not compared here.
  now = setup.resolve_setup(config, train_size, eval_size=train_size, devices=devices,
                            local_devices=devices, process_count=1)
  return [f'{name}: recorded {recorded[name]:g}, the current trainer computes '
          f'{getattr(now, name):g}' for name in SETUP_FIELDS
          if name in recorded and abs(recorded[name] - getattr(now, name)) > 1e-9]


def seed_paper_rows(penalties: Dict, b_noise: float, b_noise_range: Sequence[float],
                    epochs: float, train_images: int, batch: int = 128,
                    nodes: Sequence[int] = (1, 2, 4, 8, 16)) -> Dict:
  """The seed paper's set-up on the `minotauro` preset: {(nodes, method): Row}.

  The recipe is assumed to reach its accuracy after ``epochs`` epochs of ``train_images`` at
  batch ``batch`` on one node (S0 = epochs x train_images / batch), with ``b_noise`` (the range
  ``b_noise_range`` through the same anchor). Sync keeps ``batch`` per node (global batch x
  nodes, the paper's weak scaling); mixed-asynchronous sends one node's ``batch`` per update.
  """
  model = pilot_model(batch, epochs * train_images / batch, b_noise, list(b_noise_range),
                      source='assumed')
  workload = pm.resnet50(train_images)
  cluster = pm.minotauro(nodes=max(nodes))
  return {(n, m): plan_row(model, penalties, cluster, workload, n, batch * n, m)
          for n in nodes for m in ('sync', 'mixed')}


# ----------------------------------------------------------------------------------------------
# Held-out tasks: a study of the `plan_validation` preset per task (one pilot point, its seeds).

PILOT_PREFIX = 'pilot_'  # The study's point whose seeds are the planner's pilot.


def calibrate_factor(pairs: Sequence[Sequence[float]]) -> Dict:
  """A ratio from tasks' (fitted B_crit, pilot noise scale) pairs: the geometric mean of the
  ratios (``factor``), their log-sd (``log_sd``, None from one task) and ``tasks``; the planner's
  `B_CRIT_FACTOR` is this over the committed tasks a-f (`default_predictor`)."""
  ratios = [b_crit / b_noise for b_crit, b_noise in pairs]
  if not ratios or min(ratios) <= 0:
    raise ValueError(f'calibrate_factor needs positive ratios, got {ratios}.')
  logs = [math.log(r) for r in ratios]
  return {'factor': math.exp(statistics.mean(logs)),
          'log_sd': statistics.stdev(logs) if len(logs) > 1 else None,
          'tasks': len(logs), 'ratios': ratios}


def _fitted_b_crit(study_dir: str, diagnostics: Dict) -> float:
  """B_crit fitted to a task's measured means (`task_diagnostics`)."""
  if not diagnostics.get('fit'):
    raise ValueError(f'{study_dir}: too few batches reached the target to fit B_crit.')
  return diagnostics['fit']['b_crit']


def task_factor_pair(task: Dict, diagnostics: Dict) -> Sequence[float]:
  """A scored task's (fitted B_crit on its measured means, its pilot's measured B_noise)."""
  return _fitted_b_crit(task['study'], diagnostics), task['seeds']['model']['b_noise']


def task_calibration(study_dir: str, diagnostics: Dict, metric=None, target=None) -> Dict:
  """What a calibration task gives the predictors' parameters: its fitted B_crit (on its
  measured means, `task_diagnostics`), its pilot's B_noise (window up to the crossing, mean over
  the seeds) and B_simple near the crossing (the last quarter of that window), and the slope
  of log steps against log batch through its pilot (least squares over its complete points)."""
  model = load_pilot(pilot_runs(study_dir)[2], metric, target, b_crit_factor=1.0)
  runs = [read_pilot(d, model.notes['metric'], model.notes['target'], 4)
          for d in pilot_runs(study_dir)[2]]
  near = [r.near for r in runs]
  means = {int(b): m for b, m in diagnostics['measured'].items()}
  b0 = int(model.notes['pilot_batch'])
  if b0 not in means:
    raise ValueError(f'{study_dir}: the pilot\'s own point has no mean: no power-law slope.')
  xy = [(math.log(b / b0), math.log(m / means[b0])) for b, m in means.items() if b != b0]
  return {'study': study_dir, 'b_crit': _fitted_b_crit(study_dir, diagnostics),
          'b_noise': model.b_noise,
          'b_near': statistics.mean(near) if None not in near else None,
          'alpha': -sum(x * y for x, y in xy) / sum(x * x for x, _ in xy), 'points': xy}


def _log_spread(values: Sequence[float]) -> Dict:
  logs = [math.log(v) for v in values]
  return {'log_sd': statistics.stdev(logs) if len(logs) > 1 else None, 'tasks': len(logs)}


def calibrate_parameters(tasks: Sequence[Dict]) -> Dict:
  """Every predictor's parameters from calibration tasks (`task_calibration`): ``factor``
  (B_crit / B_noise: geometric mean, log-sd), ``near_crossing`` (B_crit / B_simple near the
  crossing, alike), ``constant`` (the geometric mean of the fitted B_crit, its log-sd),
  ``power_law`` (alpha: least squares through the pilots of all the tasks' log steps against log
  batch; ``sd``: of the tasks' own slopes), ``pollux`` and ``perfect`` (none). Each with the
  values it came from."""
  if not tasks:
    raise ValueError('calibrate_parameters needs at least one calibration task.')
  names = [os.path.basename(os.path.normpath(t['study'])) for t in tasks]
  out = {'pollux': {}, 'perfect': {}}
  f = calibrate_factor([(t['b_crit'], t['b_noise']) for t in tasks])
  out['factor'] = {'factor': f['factor'], 'log_sd': f['log_sd'], 'tasks': f['tasks'],
                   'values': dict(zip(names, f['ratios']))}
  if all(t['b_near'] for t in tasks):
    n = calibrate_factor([(t['b_crit'], t['b_near']) for t in tasks])
    out['near_crossing'] = {'factor': n['factor'], 'log_sd': n['log_sd'], 'tasks': n['tasks'],
                            'values': dict(zip(names, n['ratios']))}
  crit = [t['b_crit'] for t in tasks]
  out['constant'] = {'b_crit': math.exp(statistics.mean(math.log(c) for c in crit)),
                     **_log_spread(crit), 'values': dict(zip(names, crit))}
  xy = [p for t in tasks for p in t['points']]
  slopes = [t['alpha'] for t in tasks]
  out['power_law'] = {'alpha': -sum(x * y for x, y in xy) / sum(x * x for x, _ in xy),
                      'sd': statistics.stdev(slopes) if len(slopes) > 1 else None,
                      'tasks': len(slopes), 'values': dict(zip(names, slopes))}
  return out


def calibration_parameters(dirs: Sequence[str], calibration, diagnostics: Sequence[Dict],
                           metric=None, target=None):
  """Per study, the predictors' parameters it is scored with (None: the planner's
  `default_predictor` ones, when no calibration task is given; a calibration task: those of the
  *other* calibration tasks; any other task: those of all of them), and the parameters of all
  the calibration tasks with the check of the planner's factor against them (None without
  any)."""
  cal = {d: task_calibration(d, g, metric, target)
         for d, g in zip(dirs, diagnostics) if d in calibration}
  out = {}
  everything = calibrate_parameters(list(cal.values())) if cal else None
  for d in dirs:
    if d not in calibration:
      out[d] = everything
      continue
    others = [c for o, c in cal.items() if o != d]
    if not others:
      raise ValueError(f'--calibration {d}: leaving it out leaves no task to calibrate on.')
    out[d] = calibrate_parameters(others)
  check = None
  if everything:
    f = everything['factor']
    check = dict(factor=f['factor'], log_sd=f['log_sd'], tasks=f['tasks'],
                 ratios=list(f['values'].values()), default=steps_model.B_CRIT_FACTOR,
                 default_log_sd=steps_model.B_CRIT_FACTOR_LOG_SD,
                 default_tasks=steps_model.B_CRIT_FACTOR_TASKS,
                 matches=(round(f['factor'], 3) == round(steps_model.B_CRIT_FACTOR, 3)
                          and f['log_sd'] is not None
                          and round(f['log_sd'], 3) == round(steps_model.B_CRIT_FACTOR_LOG_SD, 3)
                          and f['tasks'] == steps_model.B_CRIT_FACTOR_TASKS),
                 parameters=everything)
  return out, check


def calibration_factors(dirs: Sequence[str], calibration, diagnostics: Sequence[Dict],
                        metric=None, target=None):
  """`calibration_parameters` with each study's B_crit / B_noise factor alone ({'factor',
  'log_sd', 'tasks'}, None: the planner's default) and the check."""
  params, check = calibration_parameters(dirs, calibration, diagnostics, metric, target)
  return {d: None if p is None else p['factor'] for d, p in params.items()}, check


def _study(study_dir: str):
  """A study's (points, run rows): its ``points.json`` and ``results.json``."""
  with open(os.path.join(study_dir, 'points.json')) as f:
    points = json.load(f)
  with open(os.path.join(study_dir, 'results.json')) as f:
    return points, json.load(f)


def _chosen_runs(study_dir: str, rows: Sequence[Dict], point: Dict):
  """A point's runs at its chosen rate, by seed, and their run directories."""
  runs = sorted((r for r in rows if r['point'] == point['point']
                 and r['lr_mult'] == point['lr_mult']), key=lambda r: r['seed'])
  return runs, [os.path.join(study_dir, 'runs', r['name']) for r in runs]


def _pilot_point(study_dir: str, points: Sequence[Dict]) -> Dict:
  pilots = [p for p in points if p['point'].startswith(PILOT_PREFIX)]
  if len(pilots) != 1:
    raise ValueError(f'{study_dir}: expected one point named {PILOT_PREFIX}..., the pilot, got '
                     f'{[p["point"] for p in pilots]}: is it a study of the plan_validation '
                     'preset?')
  return pilots[0]


def pilot_runs(study_dir: str):
  """A plan_validation study's (points, its pilot point's runs by seed, their run directories)."""
  points, rows = _study(study_dir)
  return (points, *_chosen_runs(study_dir, rows, _pilot_point(study_dir, points)))


# The second pilot of the two-batch scoring: at this multiple of the pilot's batch.
TWO_BATCH_RATIO = 4


# The predictions scored per task: label -> (predictor, the pilot: 'seeds' all of its seeds,
# 'first' its first seed alone). 'two_batch' (pilots at B0 and 4 B0) is scored beside them.
LABELS = {'seeds': ('factor', 'seeds'), 'one_seed': ('factor', 'first'),
          'uncorrected': ('pollux', 'seeds'), 'near_crossing': ('near_crossing', 'seeds'),
          'constant': ('constant', 'seeds'), 'power_law': ('power_law', 'seeds'),
          'perfect': ('perfect', 'seeds')}
# The label of each predictor scored from all the pilot's seeds.
PREDICTOR_LABEL = {predictor: label for label, (predictor, pilot) in LABELS.items()
                   if pilot == 'seeds'}


def _summary(model) -> Dict:
  return {'predictor': model.notes.get('predictor'), 's_min': model.s_min,
          'b_noise': model.b_noise, 'b_crit': model.b_crit,
          'b_crit_factor': model.b_crit_factor, 'factor_log_sd': model.factor_log_sd,
          'alpha': getattr(model, 'alpha', None), 'form': model.form(),
          'seed_log_sd': model.seed_log_sd, 'seed_source': model.seed_source,
          'target': model.notes['target'], 'metric': model.notes['metric'],
          'b_simple_late': model.notes.get('b_simple_late'),
          'b_simple_near': model.notes.get('b_simple_near')}


def heldout_task(study_dir: str, metric=None, target=None, split: str = 'validation',
                 factor: Optional[Dict] = None, parameters: Optional[Dict] = None) -> Dict:
  """Every predictor's predictions for one held-out task's study against its measured points.

  The pilot is the point named ``pilot_...`` (all its seeds; the first seed alone as the
  one-run pilot too); every point's steps to the target are predicted at its batch with the
  band for the mean of its seeds, and scored out of sample (the pilot's batch not counted, up
  to 8x it; `planner.score_predictions`). A point whose seeds did not all reach the target has
  no mean: it is scored as a bound (its mean is at least the lower bound, each miss counted at
  its budget), with the prediction's share of its budget and flag beside it.

  ``split``: 'validation' scores the pilot's recorded target (or `metric` / `target`) against
  the points' validation steps; 'test' the same target value on the test split: the pilot's
  test crossing predicts the points' test steps (the split the studies publish; the runs
  stopped at the later of both crossings, so both are measured).

  ``parameters``: every predictor's calibrated parameters (`calibrate_parameters`, e.g. on other
  tasks); None: the planner's (`default_predictor`). ``factor`` ({'factor', 'log_sd', 'tasks'})
  replaces the factor's. Scored (`LABELS`): ``seeds`` (B_crit = k x B_noise from all the pilot's
  seeds: the planner), ``one_seed`` (its first seed alone), ``uncorrected`` (B_crit = B_noise:
  Pollux / AdaptDL's model), ``near_crossing`` (k' x B_simple near the crossing) and the
  baselines ``constant``, ``power_law``, ``perfect``; and ``two_batch``: pilots at two batch
  sizes, every seed of the pilot and of the point at `TWO_BATCH_RATIO` x its batch (S_min and
  B_crit fitted, no factor), scored on the other points; where the planner refuses that pair (a
  seed of the second batch missed the target) it holds the reason (``unavailable``) and no
  scored points.
  """
  if split not in ('validation', 'test'):
    raise ValueError(f'split must be validation or test, got {split!r}.')
  points, rows = _study(study_dir)
  pilot = _pilot_point(study_dir, points)
  runs, dirs = _chosen_runs(study_dir, rows, pilot)
  b0 = int(pilot['fields']['batch_size'])
  key = 'steps_to_target'
  if split == 'test':
    recorded = recorded_target(default_config.read_run_config(dirs[0]))
    metric = eval_seam.test_metric(metric or (recorded[0] if recorded else DEFAULT_METRIC))
    target = target if target is not None else (recorded[1] if recorded else None)
    key = 'test_steps_to_target'
    if any(p.get(key) is None for p in points):
      raise ValueError(f'{study_dir}: a point has no test-split steps (its runs evaluated no '
                       'test split): score it on validation.')
  params = {k: predictors.parameters_of(k, (parameters or {}).get(k))
            for k in predictors.PREDICTORS}
  if factor is not None:
    params['factor'] = {'factor': factor['factor'], 'log_sd': factor['log_sd'] or 0.0,
                        'tasks': factor['tasks']}
  out = {'study': study_dir, 'pilot_batch': b0, 'pilot_runs': [r['name'] for r in runs],
         'split': split, 'factor': factor, 'parameters': params}
  models = []
  for label, (kind, which) in LABELS.items():
    try:
      model = load_pilot(dirs if which == 'seeds' else dirs[:1], metric, target,
                         predictor=kind, parameters=params[kind])
    except PlanError as e:
      out[label] = {'unavailable': str(e), 'pilot_batches': [b0], 'score': {'rows': []}}
      continue
    models.append((label, model, [b0]))
  second = TWO_BATCH_RATIO * b0
  second_point = next((p for p in points if int(p['fields']['batch_size']) == second), None)
  second_dirs = _chosen_runs(study_dir, rows, second_point)[1] if second_point else []
  try:
    if not second_dirs:
      raise PlanError(f'the study has no point at {second}')
    models.append(('two_batch', load_pilot(dirs + second_dirs, metric, target), [b0, second]))
  except PlanError as e:
    out['two_batch'] = {'unavailable': str(e), 'pilot_batches': [b0, second],
                        'score': {'rows': []}}
  for label, model, in_sample in models:
    predicted = []
    for p in points:
      batch, s = int(p['fields']['batch_size']), p[key]
      central, low, high = model.steps(batch, runs=max(1, s['n']))
      _, share, flag = feasibility(model.budget, central, batch)
      predicted.append({
          'batch': batch, 'ratio': batch / b0, 'predicted': central, 'low': low, 'high': high,
          'measured': s['mean'] if s['kind'] == 'complete' else None,
          'measured_low': s.get('low'), 'measured_high': s.get('high'), 'seeds': s['n'],
          'reached': s['reached'], 'missed': s['missed'], 'diverged': s['diverged'],
          'lower_bound': s.get('lower_bound') if s['kind'] == 'censored' else None,
          'late_crossings': p.get('late_crossings', 0),
          'budget_share': share, 'feasibility': flag,
          'extrapolated': model.extrapolation(batch)})
    out[label] = {'model': _summary(model), 'pilot_batches': in_sample,
                  'score': score_predictions(predicted, in_sample=in_sample, max_batch=8 * b0)}
  return out


def task_diagnostics(study_dir: str, split: str = 'validation') -> Dict:
  """Why a task's pilot predictions miss, from its measurements alone (no planner choice is made
  from these: they diagnose, after the scoring).

  * ``fit``: S = S_min (1 + B_crit / B) fitted to every batch whose seeds all reached the target
    (their mean steps on ``split``): does the functional form hold, and where is B_crit?
  * ``leave_one_out``: each of those batches predicted from the fit to the others.
  * ``b_simple``: per batch, B_simple of each seed over its steps up to its crossing (the
    window the pilot's B_noise uses), mean over the seeds that reached the target with its
    t-interval (`stats.mean_interval`; none from one seed): is the noise scale a property of the
    task, or of the batch that measures it?
  """
  with open(os.path.join(study_dir, 'points.json')) as f:
    points = json.load(f)
  with open(os.path.join(study_dir, 'results.json')) as f:
    rows = json.load(f)
  key = 'test_steps_to_target' if split == 'test' else 'steps_to_target'
  means = {int(p['fields']['batch_size']): p[key]['mean'] for p in points
           if p.get(key) and p[key]['kind'] == 'complete'}
  out = {'split': split, 'measured': means, 'fit': None, 'leave_one_out': [], 'b_simple': {},
         'ratio_ci': None}
  if len(means) >= 2:
    s_min, b_crit = fit_steps_to_target(list(means), list(means.values()))
    out['fit'] = {'s_min': s_min, 'b_crit': b_crit}
    out['leave_one_out'] = validate_leave_one_out({b: {'steps': m} for b, m in means.items()})
  for p in points:
    batch = int(p['fields']['batch_size'])
    values = []
    for r in rows:
      if r['point'] != p['point'] or r['lr_mult'] != p['lr_mult']:
        continue
      run_dir = os.path.join(study_dir, 'runs', r['name'])
      records = read_metrics(run_dir)
      config = default_config.read_run_config(run_dir)
      crossing = target_crossing(records, float(config.target_value), chosen_metric(config))
      if crossing is not None:
        b = noise_scale.window_b_simple(records, end_step=crossing['step'])
        if b is not None:
          values.append(b)
    interval = stats.mean_interval(values) if len(values) > 1 else None
    out['b_simple'][batch] = {'mean': statistics.mean(values) if values else None,
                              'low': interval and interval['low'],
                              'high': interval and interval['high'], 'each': values}
  pilot = next((int(p['fields']['batch_size']) for p in points
                if p['point'].startswith(PILOT_PREFIX)), None)
  if out['fit'] and pilot in out['b_simple'] and out['b_simple'][pilot]['each']:
    # B_crit / the pilot's B_noise with a percentile bootstrap over seeds (seeds redrawn within
    # each batch, the fit redone; the pilot's B_simple seeds redrawn too).
    from anp_jax.research import sweep_report
    each = {int(p['fields']['batch_size']): [r[key] for r in rows if r['point'] == p['point']
                                             and r['lr_mult'] == p['lr_mult']]
            for p in points if int(p['fields']['batch_size']) in means}
    ci = sweep_report.bootstrap_fit(sorted(each), [each[b] for b in sorted(each)],
                                    [out['b_simple'][pilot]['each']])
    out['ratio_ci'] = ci['ratio']
  return out


def feasibility_check(rows: Sequence[Dict]) -> Dict:
  """How the budget flags fared, out of sample (the pilot's own batch not counted): points whose
  seeds missed the target, flagged or not; points flagged late or unreachable whose seeds all
  reached it."""
  rows = [r for r in rows if not r.get('in_sample')]
  missed = [r for r in rows if r['missed'] or r['diverged']]
  return {'missed': len(missed),
          'missed_flagged': sum(r['feasibility'] in ('late', 'unreachable') for r in missed),
          'flagged_but_reached': sum(r['feasibility'] in ('late', 'unreachable')
                                     and not (r['missed'] or r['diverged']) for r in rows)}


# The held-out validation's targets (issue 35: the planner on tasks it has not seen).
HELDOUT_TARGETS = {'median_abs_error': 0.15, 'max_abs_error': 0.30, 'coverage': 0.80}


def pooled_score(tasks: Sequence[Dict], label: str = 'seeds') -> Dict:
  """The counted (out-of-sample) points of every task together, points where seeds missed
  counted as bounds (`planner.scoring.summarize`): errors, coverage with its Clopper-Pearson
  interval, budget flags, and the targets, each met only where the bounds show it (a median
  whose every censored |error| could be 100 %, every point within 30 % with none undetermined,
  coverage over the points whose inclusion is known and the undetermined ones)."""
  rows = [r for t in tasks if label in t for r in t[label]['score']['rows']]
  counted = [r for r in rows if r['counted']]
  unavailable = [os.path.basename(os.path.normpath(t['study'])) for t in tasks
                 if t.get(label, {}).get('unavailable')]
  out = scoring.summarize(counted)
  out.update(feasibility=feasibility_check(rows), unavailable=unavailable)
  strict = scoring.summarize(counted, HELDOUT_TARGETS['max_abs_error'])
  known = out['banded'] + out['undetermined_band']
  out['targets_met'] = {
      'median_abs_error': (out['median_abs_error_high'] is not None
                           and out['median_abs_error_high'] <= HELDOUT_TARGETS['median_abs_error']),
      'max_abs_error': strict['every_within'] is True,
      'coverage': bool(known) and out['inside'] / known >= HELDOUT_TARGETS['coverage']}
  out['every_within_30'] = strict['every_within']
  return out


def paired_comparison(tasks: Sequence[Dict], label: str, baseline: str) -> Optional[Dict]:
  """``label`` against ``baseline`` point by point: |error| of the baseline minus |error| of
  ``label`` (positive: ``label`` closer) over the points where both are counted and measured
  (a bound has no difference), its mean with a 95 % t-interval over tasks (each task's points
  share a pilot: a task counts once; `stats.clustered_mean_interval`) and, beside it, over
  points. None without a common point."""
  diffs, clusters = [], []
  for t in tasks:
    if label not in t or baseline not in t:
      continue
    a = {r['batch']: r for r in t[label]['score']['rows']
         if r['counted'] and r['error'] is not None}
    b = {r['batch']: r for r in t[baseline]['score']['rows']
         if r['counted'] and r['error'] is not None}
    for batch in sorted(set(a) & set(b)):
      diffs.append(b[batch]['abs_error'] - a[batch]['abs_error'])
      clusters.append(t['study'])
  if not diffs:
    return None
  out = stats.clustered_mean_interval(diffs, clusters)
  out.update(label=label, baseline=baseline, better=sum(d > 0 for d in diffs),
             worse=sum(d < 0 for d in diffs))
  return out


def _better(a: Dict, b: Dict) -> bool:
  """Whether pooled score ``a`` ranks before ``b`` by the registered order: median |error|
  (bounds included), then the worst."""
  return (a['median_abs_error'], a['max_abs_error']) < (b['median_abs_error'],
                                                       b['max_abs_error'])


def apply_rule(tasks: Sequence[Dict], rule: Dict) -> Dict:
  """A registration's decision rule applied to scored held-out tasks (`heldout_task`, the
  registered split): which predictor becomes the planner's default, and why.

  ``rule``: ``candidates`` (predictors, `predictors.PREDICTORS`), ``tie`` (medians closer than
  this are tied: the worst |error| decides, then `predictors.SIMPLICITY`), ``noise_free``
  (the baselines), ``require_paired_win`` (a predictor that reads the noise scale becomes the
  default only if its paired comparison against the best baseline, over tasks, lies above 0;
  else the best baseline does). Returns {'ranking': [(predictor, pooled score)], 'best',
  'best_baseline', 'paired' (the best against the best baseline), 'winner', 'reason'}."""
  candidates = [k for k in rule['candidates'] if k in PREDICTOR_LABEL]
  pooled = {k: pooled_score(tasks, PREDICTOR_LABEL[k]) for k in candidates}
  pooled = {k: p for k, p in pooled.items() if p['n']}
  tie = float(rule.get('tie', 0.0))
  order = predictors.SIMPLICITY

  def key(k):
    p = pooled[k]
    return (round(p['median_abs_error'] / tie) if tie else p['median_abs_error'],
            p['max_abs_error'], order.index(k))
  ranking = sorted(pooled, key=key)
  if not ranking:
    raise ValueError('No candidate predictor has a scored point.')
  best = ranking[0]
  baselines = [k for k in ranking if k in rule.get('noise_free', predictors.NOISE_FREE)]
  best_baseline = baselines[0] if baselines else None
  paired = None
  winner, reason = best, f'{best} ranks first by median |error| (bounds counted)'
  if best_baseline and best != best_baseline:
    paired = paired_comparison(tasks, PREDICTOR_LABEL[best], PREDICTOR_LABEL[best_baseline])
    if rule.get('require_paired_win', True) and not (paired and paired['low'] is not None
                                                     and paired['low'] > 0):
      winner = best_baseline
      reason = (f'{best} ranks first, but its paired advantage over the best baseline '
                f'({best_baseline}) is not shown (95 % interval over tasks '
                + ('none' if not paired or paired['low'] is None else
                   f'{100 * paired["low"]:+.1f} to {100 * paired["high"]:+.1f} points')
                + f'): the simpler {best_baseline} becomes the default')
    else:
      reason += (f', and beats the best baseline ({best_baseline}) point by point: '
                 f'{100 * paired["low"]:+.1f} to {100 * paired["high"]:+.1f} points of |error| '
                 'over tasks')
  return {'ranking': [(k, pooled[k]) for k in ranking], 'best': best,
          'best_baseline': best_baseline, 'paired': paired, 'winner': winner, 'reason': reason}
