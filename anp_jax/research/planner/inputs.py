"""The planner's inputs from run directories: a pilot run's workdir (`load_pilot`), a finished
batch-size sweep (`load_sweep`), the results.json of either experiment (`check_rows`,
`read_rows`), and the workload of the pilot's own model (`workload_for`)."""

import dataclasses
import json
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

from anp_jax import cli, noise_scale
from anp_jax.configs import default as default_config
from anp_jax.metrics_io import read_metrics, target_crossing
from anp_jax.research import eval_seam
from anp_jax.research import perfmodel as pm
from anp_jax.research.planner.budget import Budget
from anp_jax.research.planner import default_predictor, predictors, steps_model
from anp_jax.research.planner.errors import PlanError
from anp_jax.research.planner.steps_model import (StepsModel, log_sd_over_seeds, pilot_model,
                                                  sweep_arm, sweep_model, sweep_points)


# Config fields in which the seeds of one pilot may differ: the seeds, and what never changes
# the training (where files go, how often they are written, the progress bar).
PILOT_SEED_FIELDS = ('seed', 'data_dir', 'progress_bar', 'checkpoint_every_steps',
                     'checkpoint_every_minutes', 'async_checkpointing', 'keep_checkpoints',
                     'log_every_steps')


@dataclasses.dataclass
class PilotRun:
  """What the planner reads from one pilot run: its steps to target and noise scale."""
  workdir: str
  config: object
  records: List[Dict]
  crossing: float  # Steps to target (interpolated between evaluations).
  b_noise: float  # B_simple over the window up to the crossing.
  windows: List[float]  # B_simple of sub-windows of that window.
  late: Optional[float]  # B_simple over the second half of the run (as the sweep reports it).
  near: Optional[float] = None  # B_simple of the last of the sub-windows: near the crossing.


def pilot_dirs(pilot) -> List[str]:
  """One pilot workdir, several (a list, or one string of comma-separated paths: the seeds of
  one configuration, e.g. a sweep point's runs)."""
  dirs = [d for d in (pilot.split(',') if isinstance(pilot, str) else pilot) if d]
  if not dirs:
    raise PlanError('--pilot is empty: give a pilot run\'s workdir (or several, comma-separated).')
  return dirs


def read_pilot(workdir: str, metric: str, target: float, windows: int) -> PilotRun:
  """One pilot run's `PilotRun` for the target ``metric`` >= ``target``."""
  records = read_metrics(workdir)
  config = default_config.read_run_config(workdir)
  if config.method != 'sync':
    # Its steps to target already include the cost of stale (async, mixed) or averaged
    # (local_sgd) updates: taken as synchronous, S_min would be too high and the plan would
    # charge that cost a second time on the asynchronous rows.
    raise PlanError(f"The pilot in {workdir!r} trained with method {config.method!r}: a pilot "
                    "must be a synchronous run (config.method='sync'), whose steps measure the "
                    'batch size alone. Use a synchronous run of the same model as the pilot.')
  crossing = target_crossing(records, target, metric)
  if crossing is None:
    best = max((r[metric] for r in records if metric in r), default=None)
    raise PlanError(f'The pilot {workdir!r} never reached {metric} >= {target} (best: {best}). '
                    'Lower --target, or train the pilot longer.')
  # B_noise as it was while the pilot trained towards the target: the noise scale grows during
  # training (a later window measures a later, larger B_simple), and what sets the steps to
  # the target is the stretch of training before it.
  end = crossing['step']
  b_noise = noise_scale.window_b_simple(records, -math.inf, end)
  if b_noise is None:
    has_fields = any(noise_scale.G2_FIELD in r for r in records)
    raise PlanError(
        f'The pilot in {workdir!r} has no usable noise-scale logs before its target crossing at '
        f'step {end:.0f} ({noise_scale.G2_FIELD} / {noise_scale.TRACE_FIELD}'
        + (': the mean |G|² of that window is not positive' if has_fields else ' missing')
        + '). Train it with config.noise_scale=True, more than one device (or '
        "grad_accum_steps > 1) and bn_mode='ghost' or 'per_device', logging often enough "
        '(config.log_every_steps) to have records before the target.')
  last = max(r['step'] for r in records)
  parts = noise_scale.b_simple_windows(records, windows, -math.inf, end)
  return PilotRun(workdir, config, records, end, b_noise, [b for b in parts if b],
                  noise_scale.window_b_simple(records, last / 2, last),
                  parts[-1] if parts else None)


def flat_config(config) -> Dict[str, object]:
  """A config as {dotted field: value}."""
  return default_config.flat_fields(config.to_dict())


def _check_same_configuration(runs: Sequence[PilotRun]) -> None:
  """Several pilots must be seeds of one configuration, or of one configuration at several batch
  sizes: configs equal but for the seeds and ``batch_size`` (the learning rate follows the
  batch by the config's rule)."""
  first = dict(flat_config(runs[0].config), target_metric=chosen_metric(runs[0].config))
  for run in runs[1:]:
    other = dict(flat_config(run.config), target_metric=chosen_metric(run.config))
    differ = sorted(k for k in set(first) | set(other)
                    if k not in PILOT_SEED_FIELDS + ('batch_size',)
                    and first.get(k) != other.get(k))
    if differ:
      raise PlanError(f'The pilots {runs[0].workdir!r} and {run.workdir!r} differ in '
                      f'{differ[:6]}: several pilots must be seeds of one configuration, at one '
                      'batch size or several (they may differ only in '
                      f'{list(PILOT_SEED_FIELDS) + ["batch_size"]}).')


def load_pilot(pilot, metric: Optional[str] = None, target: Optional[float] = None,
               windows: int = 4, b_crit_factor: Optional[float] = None,
               factor_log_sd: float = 0.0, factor_tasks: int = 0,
               predictor: Optional[str] = None,
               parameters: Optional[Dict] = None) -> StepsModel:
  """The steps model of one pilot run's workdir, or of several seeds of one configuration, or
  of that configuration at several batch sizes (seeds each): then S_min and B_crit are fitted to
  the batches' mean steps (`steps_model.multi_batch_pilot_model`; no factor, and
  ``b_crit_factor`` is refused).

  ``pilot``: a workdir (``metrics.jsonl`` + ``config.json``), a list of them or a string of
  comma-separated ones. S0 is the steps to target as the sweep counts them
  (`metrics_io.target_crossing`: interpolated between the evaluations around the crossing), the
  mean over the seeds. B_noise is `noise_scale.window_b_simple` over the window up to each
  seed's crossing (their mean over seeds); the `b_simple_windows` of ``windows`` sub-windows
  of each give B_noise's uncertainty, and the late window (the second half of the run, as the
  sweep reports B_simple) is noted beside it. Several seeds measure the run-to-run spread of
  S0 (else `steps_model.DEFAULT_SEED_LOG_SD`). The pilot's budget and schedule come with the
  model when its training split's size is known. Every pilot must be synchronous
  (``config.method`` 'sync'; runs recorded before the field existed were): the model's steps
  are synchronous updates, to which the plan adds the asynchrony penalty itself.

  ``b_crit_factor``: B_crit / B_noise; a given value (1: McCandlish et al.'s B_crit ~ B_noise)
  is taken as exact unless ``factor_log_sd`` (its log-sd over ``factor_tasks`` calibration
  tasks) comes with it. Without it, ``predictor`` (one of `predictors.PREDICTORS`, default the
  planner's `default_predictor.DEFAULT`) with ``parameters`` (default: the calibrated ones)
  makes the model (`predictors.build`); the default's note says how it compared with the
  baselines on held-out tasks.
  """
  dirs = pilot_dirs(pilot)
  for workdir in dirs:
    if not read_metrics(workdir) or not os.path.exists(os.path.join(workdir, 'config.json')):
      raise PlanError(f'{workdir!r} is not a trainer workdir (no metrics.jsonl / config.json).')
  targets = {resolve_target(default_config.read_run_config(d), metric, target) for d in dirs}
  if len(targets) > 1:
    raise PlanError(f'The pilots recorded different targets {sorted(targets)}: give --metric and '
                    '--target.')
  ((metric, target, target_source),) = targets
  runs = [read_pilot(d, metric, target, windows) for d in dirs]
  _check_same_configuration(runs)
  by_batch = {}
  for r in runs:
    by_batch.setdefault(int(r.config.batch_size), []).append(r)
  if len(by_batch) > 1:
    if b_crit_factor is not None:
      raise PlanError('--b_crit_factor carries one pilot\'s B_noise to B_crit; pilots at '
                      f'{len(by_batch)} batch sizes fit B_crit itself. Drop one of them.')
    if predictor is not None:
      raise PlanError(f'--predictor {predictor} carries one batch\'s pilot to other batches; '
                      f'pilots at {len(by_batch)} batch sizes fit B_crit itself: drop it.')
    return _multi_batch_model(by_batch, metric, target, target_source)
  crossings = [r.crossing for r in runs]
  config = runs[0].config
  batch = int(config.batch_size)
  fields = {'anchor_runs': len(runs)}
  if len(runs) > 1:
    sd, dof = log_sd_over_seeds([crossings])
    fields.update(seed_log_sd=sd, seed_dof=dof,
                  seed_source=f'measured over the {len(runs)} pilot seeds ({dof} degree(s) of '
                              f'freedom: Student\'s t quantile), log-sd {sd:.3f}')
  train_size = pilot_train_size(dirs[0], config, runs[0].records)
  if train_size:
    fields['budget'] = Budget.from_config(config, train_size)
  names = ', '.join(os.path.basename(os.path.normpath(d)) for d in dirs)
  steps, b_noise = sum(crossings) / len(runs), sum(r.b_noise for r in runs) / len(runs)
  windows_all = [b for r in runs for b in r.windows]
  if b_crit_factor is None:
    kind = predictor or default_predictor.DEFAULT['predictor']
    near = [r.near for r in runs if r.near]
    model = predictors.build(kind, batch, steps, b_noise, windows_all,
                             sum(near) / len(near) if len(near) == len(runs) else None,
                             parameters, source=f'pilot {names}', **fields)
    if kind in ('factor', 'near_crossing') and parameters is None:
      model.notes['b_crit_factor_source'] = (
          steps_model.B_CRIT_FACTOR_SOURCE if kind == 'factor' else
          f'B_crit / B_simple near the crossing fitted on '
          f'{default_predictor.DEFAULT["calibration"]}')
    elif kind == 'factor':
      model.notes['b_crit_factor_source'] = (
          f'given: {model.b_crit_factor:.4g}, log-sd {model.factor_log_sd:.3g} over '
          f'{model.factor_tasks} tasks')
    if predictor is None and parameters is None:
      model.notes['default_heldout'] = default_predictor.DEFAULT['heldout']
  else:
    if factor_log_sd:
      fields.update(b_crit_factor=b_crit_factor, factor_log_sd=factor_log_sd,
                    factor_tasks=factor_tasks)
      factor_source = (f'given: {b_crit_factor:.4g}, log-sd {factor_log_sd:.3g} over '
                       f'{factor_tasks} tasks')
    else:
      fields['b_crit_factor'] = b_crit_factor
      factor_source = f'--b_crit_factor {b_crit_factor:g}, taken as exact'
    model = pilot_model(batch, steps, b_noise, windows_all, source=f'pilot {names}', **fields)
    model.notes['b_crit_factor_source'] = factor_source
    model.notes['predictor'] = 'pollux' if b_crit_factor == 1.0 and not factor_log_sd else 'factor'
  late = [r.late for r in runs if r.late]
  near = [r.near for r in runs if r.near]
  if len(near) == len(runs):
    model.notes.setdefault('b_simple_near', sum(near) / len(near))
  model.notes.update(metric=metric, target=target, target_source=target_source,
                     b_simple_window=f'steps up to the target crossing')
  if late:
    model.notes['b_simple_late'] = sum(late) / len(late)
  if len(runs) > 1:
    model.notes['pilot_steps_each'] = [round(c, 1) for c in crossings]
  return model


def _multi_batch_model(by_batch: Dict[int, List[PilotRun]], metric: str, target: float,
                       target_source: str) -> StepsModel:
  """Pilots at several batch sizes: `steps_model.multi_batch_pilot_model` on their crossings,
  with the budget of the smallest batch's pilot (the pilots share epochs and schedule) and each
  batch's B_noise (up to the crossing, mean over its seeds) shown beside the fit."""
  first = by_batch[min(by_batch)][0]
  fields = {}
  train_size = pilot_train_size(first.workdir, first.config, first.records)
  if train_size:
    fields['budget'] = Budget.from_config(first.config, train_size)
  names = ', '.join(os.path.basename(os.path.normpath(r.workdir))
                    for b in sorted(by_batch) for r in by_batch[b])
  model = steps_model.multi_batch_pilot_model(
      {b: [r.crossing for r in rs] for b, rs in by_batch.items()},
      source=f'pilots at {len(by_batch)} batch sizes: {names}', **fields)
  model.notes.update(metric=metric, target=target, target_source=target_source,
                     b_noise_by_batch=', '.join(
                         f'{sum(r.b_noise for r in rs) / len(rs):.4g} at {b}'
                         for b, rs in sorted(by_batch.items())))
  return model


# The metric a target means when none is named (the trainer's config.target_metric default).
DEFAULT_METRIC = default_config.DEFAULT_TARGET_METRIC


def recorded_target(config) -> Optional[Tuple[str, float]]:
  """The (metric, value) target a run's config recorded (``target_metric`` / ``target_value``;
  `default_config.read_run_config` maps an older config.json's ``stop_at_metric`` /
  ``stop_at_value`` to them), or None if it had none (``target_value`` 0). A study run that
  stopped at its validation crossing and was continued to its test crossing
  (`runner.test_continuation`) records the test metric: its target is the validation one."""
  value = float(config.get('target_value') or 0.0)
  return (chosen_metric(config), value) if value else None


def chosen_metric(config) -> str:
  """The target metric a run's choices were made on: the validation twin of a test-split target
  recorded by a run continued to its test crossing (`runner.test_continuation`)."""
  metric = str(config.target_metric)
  if config.get('stop_at_target') and metric.startswith(eval_seam.TEST_PREFIX):
    return eval_seam.VALIDATION_PREFIX + metric[len(eval_seam.TEST_PREFIX):]
  return metric


def resolve_target(config, metric: Optional[str], target: Optional[float]
                   ) -> Tuple[str, float, str]:
  """(metric, value, where it came from): the one given, else the pilot's recorded target.

  A ``metric`` without a ``target`` is taken only when it is the recorded target's metric:
  another metric's value is not the recorded one, and guessing it would plan for a target
  nobody chose.
  """
  if target is not None:
    return metric or DEFAULT_METRIC, float(target), 'given'
  recorded = recorded_target(config)
  if recorded is None:
    raise PlanError('Give --target (and --metric, default eval/anp_top1): the pilot recorded no '
                    'target to take it from.')
  if metric is not None and metric != recorded[0]:
    raise PlanError(f'--metric {metric} without --target: the pilot recorded the target '
                    f'{recorded[0]} >= {recorded[1]:g}, for another metric. Give --target for '
                    f'{metric}, or drop --metric.')
  return recorded[0], recorded[1], "the pilot's recorded target"


# The preset config files (a sweep's preset: sweep_<name>.py).
CONFIGS_DIR = os.path.dirname(os.path.abspath(default_config.__file__))
# A sweep or study run's record of its sizes, next to its config.json.
RUN_RECORD_FILE = 'sweep_run.json'


def run_record(workdir: str) -> Dict:
  """The sizes a sweep or study run recorded (``sweep_run.json``), or {} for a plain trainer
  workdir."""
  path = os.path.join(workdir, RUN_RECORD_FILE)
  if not os.path.exists(path):
    return {}
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise PlanError(f'{path}: unreadable ({e}).') from None


def pilot_train_size(workdir: Optional[str], config, records: List[Dict]) -> Optional[int]:
  """The examples of one epoch of the pilot's training split, or None if nothing says.

  ``workdir`` None: a config not yet run (no run record, no log).

  In order: the size its run record holds; the generated dataset's (``synthetic.num_pairs`` x
  ``train_per_class``); what its training log implies (``train/examples_seen`` over
  ``train/passes``). A prepared folder's size is in none of its config's fields.
  """
  recorded = run_record(workdir).get('train_size') if workdir else None
  if recorded:
    return int(recorded)
  if config.dataset == 'synthetic_anp':
    return int(config.synthetic.num_pairs) * int(config.synthetic.train_per_class)
  for r in records:
    if r.get('train/passes') and r.get('train/examples_seen'):
      return int(round(r['train/examples_seen'] / r['train/passes']))
  return None


# The fields each experiment's results.json rows have (both write DIR/results.json).
SWEEP_FIELDS = ('batch', 'rule', 'warmup', 'status', 'steps_to_target')
PENALTY_FIELDS = ('name', 'method', 'curve')


def check_rows(rows, path: str, kind: str) -> List[Dict]:
  """`rows` (a results.json) if they are records of experiment `kind` ('sweep': batch_size_sweep.py,
  'penalty': sync_async_mixed.py); else `PlanError` naming the experiment expected."""
  fields, expected, other = {
      'sweep': (SWEEP_FIELDS, 'experiments/batch_size_sweep.py',
                'experiments/sync_async_mixed.py'),
      'penalty': (PENALTY_FIELDS, 'experiments/sync_async_mixed.py',
                  'experiments/batch_size_sweep.py')}[kind]
  if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
    raise PlanError(f'{path} is not a list of run records; give the results of {expected}.')
  lacking = sorted({f for r in rows for f in fields if f not in r})
  if lacking:
    other_fields = PENALTY_FIELDS if kind == 'sweep' else SWEEP_FIELDS
    looks = (f' (they look like the results of {other})'
             if rows and all(f in rows[0] for f in other_fields) else '')
    raise PlanError(f'{path} holds no {expected} results: its rows lack {lacking}{looks}. '
                    f'Give the --out directory (results.json) of {expected}.')
  return rows


def read_rows(path: str, kind: str, label: str) -> List[Dict]:
  """The checked rows (`check_rows`) of the results.json at `path`; `PlanError` naming `label`
  when it cannot be read or parsed."""
  try:
    with open(path) as f:
      rows = json.load(f)
  except (OSError, ValueError) as e:
    raise PlanError(f'{label}: unreadable ({e}).') from None
  return check_rows(rows, path, kind)


def load_sweep(out_dir: str, rule: Optional[str] = None, warmup: Optional[str] = None,
               target: Optional[float] = None, use: str = 'fit') -> StepsModel:
  """The steps model of a finished sweep directory (its ``results.json``)."""
  path = os.path.join(out_dir, 'results.json')
  if not os.path.exists(path):
    raise PlanError(f'{out_dir!r} has no results.json: not a finished sweep directory.')
  rows = read_rows(path, 'sweep', path)
  recorded = {r.get('target_top1') for r in rows}
  if target is not None and recorded != {target}:
    raise PlanError(f'The sweep results are for target {sorted(recorded)}, not {target}: '
                    'recompute them with `.venv/bin/python experiments/batch_size_sweep.py ... '
                    f'--target_top1 {target}` (no retraining), then plan again.')
  model = sweep_model(sweep_points(rows, rule, warmup), use=use)
  model.notes.update(metric=DEFAULT_METRIC, target=rows[0]['target_top1'] if rows else target,
                     target_source="the sweep's target")
  arm = sweep_arm(rows, rule, warmup)
  model.budget = sweep_budget(out_dir, [r for r in rows if (r['rule'], r['warmup']) == arm])
  return model


def sweep_budget(out_dir: str, rows: Sequence[Dict]) -> Optional[Budget]:
  """The budget and schedule of a sweep arm's runs (the sweep gives every batch size the same
  epochs and schedule), or None.

  From the first run directory with its config.json; for results kept without their run
  directories (the committed ones), from a row's own sizes (training split, epochs, warmup,
  rule, base lr) and the schedule of the sweep's preset (``sweep.json``'s ``preset``).
  """
  for r in rows:
    run_dir = os.path.join(out_dir, 'runs', str(r.get('name', '')))
    if r.get('name') and os.path.exists(os.path.join(run_dir, 'config.json')):
      config = default_config.read_run_config(run_dir)
      train_size = pilot_train_size(run_dir, config, [])
      return Budget.from_config(config, train_size) if train_size else None
  settings_path = os.path.join(out_dir, 'sweep.json')
  if not rows or not os.path.exists(settings_path):
    return None
  with open(settings_path) as f:
    preset = json.load(f).get('preset')
  preset_file = os.path.join(CONFIGS_DIR, f'sweep_{preset}.py')
  row = rows[0]
  if not preset or not os.path.exists(preset_file) or 'steps_per_epoch' not in row:
    return None
  config = cli.load_config_file(preset_file)
  config.update(num_epochs=float(row['epochs']), warmup_epochs=float(row['warmup_epochs']),
                lr_scaling=str(row['rule']), base_lr=float(row['base_lr']),
                num_train_steps=-1)
  return Budget.from_config(config, round(row.get('train_size')
                                          or row['steps_per_epoch'] * row['batch']))


def pilot_classes(pilot: str, config) -> int:
  """The number of ANP classes the pilot run trained on. The head's size barely changes the FLOPs
  but is part of what every all-reduce moves (ResNet-50: 2048 x 553 of 25.6 M parameters).

  The generated dataset's count is in the config; a prepared folder's (dataset 'anp') is not,
  but the identity every checkpoint records holds it (`checkpointing.identity`): read from the
  newest readable one. (Before: the synthetic count was used for both, so a pilot on the real
  ANP folder was modelled with the default 32-class head.)
  """
  if config.dataset == 'synthetic_anp':
    return int(config.synthetic.num_pairs)
  directory = os.path.join(pilot, 'checkpoints')
  steps = sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True) \
      if os.path.isdir(directory) else []
  for step in steps:
    try:
      with open(os.path.join(directory, str(step), 'meta', 'metadata')) as f:
        classes = json.load(f).get('identity', {}).get('num_anps')
    except (OSError, ValueError):
      continue
    if classes:
      return int(classes)
  raise PlanError(f'--workload pilot: the pilot {pilot} trained on dataset {config.dataset!r}, '
                  'whose class count only its checkpoints record, and it has no readable '
                  f'checkpoint in {directory}. Use a --workload preset or a pilot with its '
                  'final checkpoint.')


def workload_for(name: str, dataset_size: int, pilot: Optional[str] = None) -> pm.Workload:
  """A `perfmodel.WORKLOADS` preset by name, or 'pilot': the pilot run's model from XLA."""
  if name in pm.WORKLOADS:
    return pm.WORKLOADS[name](dataset_size=dataset_size)
  if name == 'pilot' and pilot:
    config = default_config.read_run_config(pilot)
    from anp_jax import models
    model = models.create_model(config, models.Heads(pilot_classes(pilot, config)))
    return pm.workload_from_flax(model, config.image_size, name=config.model.name,
                                 dataset_size=dataset_size)
  raise PlanError(f'--workload {name!r}: choose one of {sorted(pm.WORKLOADS)} or '
                  '"pilot" (with --pilot).')
