"""The planner's inputs from run directories: a pilot run's workdir (`load_pilot`), a finished
batch-size sweep (`load_sweep`), the results.json of either experiment (`check_rows`,
`read_rows`), and the workload of the pilot's own model (`workload_for`)."""

import json
import os
from typing import Dict, List, Optional, Tuple

from anp_jax import noise_scale
from anp_jax.configs import default as default_config
from anp_jax.metrics_io import read_metrics, target_crossing
from anp_jax.research import perfmodel as pm
from anp_jax.research.planner.errors import PlanError
from anp_jax.research.planner.steps_model import StepsModel, pilot_model, sweep_model, sweep_points


def load_pilot(workdir: str, metric: Optional[str] = None, target: Optional[float] = None,
               windows: int = 4) -> StepsModel:
  """The steps model of a pilot run's workdir (``metrics.jsonl`` + ``config.json``).

  S0 is the pilot's steps to target as the sweep counts them (`metrics_io.target_crossing`:
  interpolated between the evaluations around the crossing), so one run gives the same S0 as a
  pilot and as a sweep row. B_noise is `noise_scale.window_b_simple` over the second half of
  the steps the pilot trained (as the sweep reports it), its range the `b_simple_windows` of
  ``windows`` sub-windows. The pilot must be synchronous (``config.method`` 'sync'; runs
  recorded before the field existed were): the model's steps are synchronous updates, to which
  the plan adds the asynchrony penalty itself.
  """
  records = read_metrics(workdir)
  cfg_path = os.path.join(workdir, 'config.json')
  if not records or not os.path.exists(cfg_path):
    raise PlanError(f'{workdir!r} is not a trainer workdir (no metrics.jsonl / config.json).')
  config = default_config.read_run_config(workdir)
  if config.method != 'sync':
    # Its steps to target already include the cost of stale (async, mixed) or averaged
    # (local_sgd) updates: taken as synchronous, S_min would be too high and the plan would
    # charge that cost a second time on the asynchronous rows.
    raise PlanError(f"The pilot in {workdir!r} trained with method {config.method!r}: a pilot "
                    "must be a synchronous run (config.method='sync'), whose steps measure the "
                    'batch size alone. Use a synchronous run of the same model as the pilot.')
  metric, target, target_source = resolve_target(config, metric, target)
  crossing = target_crossing(records, target, metric)
  if crossing is None:
    best = max((r[metric] for r in records if metric in r), default=None)
    raise PlanError(f'The pilot never reached {metric} >= {target} (best: {best}). Lower '
                    '--target, or train the pilot longer.')
  last = max(r['step'] for r in records)
  b_noise = noise_scale.window_b_simple(records, last / 2, last)
  if b_noise is None:
    has_fields = any(noise_scale.G2_FIELD in r for r in records)
    raise PlanError(
        f'The pilot in {workdir!r} has no usable noise-scale logs '
        f'({noise_scale.G2_FIELD} / {noise_scale.TRACE_FIELD}'
        + (': the mean |G|² of its second half is not positive' if has_fields else
           ' missing') + '). Train it with config.noise_scale=True, more than one device (or '
        "grad_accum_steps > 1) and bn_mode='ghost' or 'per_device'.")
  samples = noise_scale.b_simple_windows(records, windows, last / 2, last)
  model = pilot_model(int(config['batch_size']), crossing['step'], b_noise, samples,
                      source=f'pilot {os.path.basename(os.path.normpath(workdir))}')
  model.notes.update(metric=metric, target=target, target_source=target_source)
  return model


# The metric a target means when none is named (what the trainer's target meant before
# config.target_metric existed; its default since).
DEFAULT_METRIC = 'eval/anp_top1'


def recorded_target(config) -> Optional[Tuple[str, float]]:
  """The (metric, value) target a run's config recorded, or None if it had none.

  The trainer's fields are ``target_metric`` / ``target_value`` (0: no target); a config.json
  written before they existed has ``stop_at_metric`` / ``stop_at_value`` ('' : no target).
  """
  if config.get('target_value') is not None and 'target_metric' in config:
    value = float(config.target_value)
    return (str(config.target_metric), value) if value else None
  if config.get('stop_at_metric'):
    return str(config.stop_at_metric), float(config.stop_at_value)
  return None


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


def pilot_train_size(workdir: str, config, records: List[Dict]) -> Optional[int]:
  """The examples of one epoch of the pilot's training split, or None if nothing says.

  In order: the size its run record holds; the generated dataset's (``synthetic.num_pairs`` x
  ``train_per_class``); what its training log implies (``train/examples_seen`` over
  ``train/passes``). A prepared folder's size is in none of its config's fields.
  """
  recorded = run_record(workdir).get('train_size')
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
                    'recompute them with `python experiments/batch_size_sweep.py ... '
                    f'--target_top1 {target}` (no retraining), then plan again.')
  model = sweep_model(sweep_points(rows, rule, warmup), use=use)
  model.notes.update(metric=DEFAULT_METRIC, target=rows[0]['target_top1'] if rows else target,
                     target_source="the sweep's target")
  return model


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
