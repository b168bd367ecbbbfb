"""The study runner: every run of a study trained once, resumably, then results and a report.

One runner for any study (`anp_jax.research.study.Study`: points over config fields x seeds x
a learning-rate grid). `run_study`:

1. **Plans** every run before any training: the point's fields, seed and rate applied to the
   base config, validated, sized (`setup.resolve_setup`), every problem listed at once
   (`StudyError`, exit 2); a run directory trained with other settings, and other runs in
   ``--out`` whose settings differ outside the study's axes, are refused (one directory holds
   one study, whose results are read together); ``--out`` holding another kind of study is
   refused. A study with a registration (`anp_jax.research.registration`) records it in
   ``--out`` before its first run; a registration changed after that run is refused.
2. **Trains** what has not finished (`run_grid`): a finished run (``final_metrics.json``) is
   skipped, an interrupted one continues from its checkpoints, a NaN/Inf loss is recorded as a
   diverged outcome and not retried, preemption (SIGTERM/SIGUSR1) exits 75 between or inside
   runs so a requeued job continues.
3. **Chooses** each point's learning rate on the validation split and **extends** the grid by a
   factor beyond an edge choice (`study_results.choose_rates` / `extensions`), round after
   round, until every choice is interior or its point used its extensions.
4. **Writes** ``results.json`` / ``results.csv`` (a row per run), ``points.json`` /
   ``points.csv`` (statistics per point over seeds: `study_results.aggregate`) and the report
   (`study_report.make_report`, or the study's own), on process 0 while every other process
   waits at a bounded barrier (``ANP_BARRIER_TIMEOUT``) that says what it waits for; so a slow
   report never meets JAX's 60 s shutdown barrier of processes that already left.

The command lines (flags, presets) are `anp_jax.research.study_cli`.
"""

import dataclasses
import json
import math
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import ml_collections

from anp_jax import (checkpointing, cli, distributed, errors, metrics_io, optim, phases,
                     preemption, reporting, seed_group, trainer)
from anp_jax.configs import default as default_config
from anp_jax.data import pipeline
from anp_jax.research import (eval_seam, registration, run_costs, study_report,
                              study_results)
from anp_jax.research.study import LrGrid, RunKey, Study, StudyError
from anp_jax.setup import flat_fields, resolve_setup, validate_config

is_finished = study_results.is_finished
write_text_atomic = study_results.write_text_atomic


# ----------------------------------------------------------------------------------------------
# Run directories: identity and ownership.


# Fields that do not change what a run computes; they may differ between invocations.
NEUTRAL_FIELDS = ('progress_bar', 'data_dir', 'checkpoint_every_steps',
                  'checkpoint_every_minutes', 'async_checkpointing', 'keep_checkpoints',
                  'log_every_steps', 'keep_best_metric', 'eval_only')


def config_diff(old: Dict, config) -> Dict[str, Tuple]:
  """(value there, value now) of every field but the `NEUTRAL_FIELDS` where a run's recorded
  ``config.json`` (`old`, as loaded) and `config` differ. A field added to the config after that
  run was trained counts as its default value there. The target (``target_metric`` /
  ``target_value``) changes what a run computes only when the run stops at it."""
  old = flat_fields(old)
  new = flat_fields(json.loads(config.to_json_best_effort()))
  defaults = flat_fields(json.loads(default_config.get_config().to_json_best_effort()))
  old.update({k: defaults[k] for k in new if k not in old and k in defaults})
  neutral = set(NEUTRAL_FIELDS)
  if not (old.get('stop_at_target') or new.get('stop_at_target')):
    neutral |= set(eval_seam.TARGET_FIELDS)
  elif is_test_continuation(old.get('target_metric'), new.get('target_metric')):
    neutral.add('target_metric')  # The same run, continued to its test crossing.
  return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
          if k not in neutral and old.get(k) != new.get(k)}


def is_test_continuation(recorded: Optional[str], planned: Optional[str]) -> bool:
  """Whether a run recorded with target `recorded` is the run planned with target `planned`
  continued past its validation crossing to its test crossing (`test_continuation`)."""
  if not (isinstance(recorded, str) and isinstance(planned, str)):
    return False
  return (planned.startswith(eval_seam.VALIDATION_PREFIX)
          and recorded == eval_seam.TEST_PREFIX + planned[len(eval_seam.VALIDATION_PREFIX):])


def test_continuation(config, run_dir: str):
  """The config that continues a run stopped at its validation crossing to its test crossing, or
  None when the run needs no more training.

  With ``stop_at_target``, published steps to the target are on the test split, so a run must
  not stop before both splits crossed. The trainer stops at ``config.target_metric`` (the
  validation metric: choices are made on it). When it stopped there (``stopped_at_target``)
  before the budget's end and its finite evaluations up to that step never reached the target
  on the test split, the run continues from its stopping checkpoint with the test metric as its
  target: the same run (batches and schedule are functions of the step), stopped at the later of
  the two crossings. The test split crossing first needs nothing: the validation crossing is the
  later one. None too for a run without a test evaluation, one that diverged, missed or ended at
  its budget, and one already continued.
  """
  if not eval_seam.stops_at_target(config):
    return None
  metric = eval_seam.test_metric(str(config.target_metric))
  prefix = metric.split('/', 1)[0]
  final_path = os.path.join(run_dir, study_results.FINAL_FILE)
  if prefix not in config.evals or not os.path.exists(final_path):
    return None
  final = study_results.read_json(final_path)
  if final.get('diverged') or not final.get('stopped_at_target'):
    return None
  evals = study_results.finite_evals(metrics_io.read_metrics(run_dir))
  if metrics_io.target_crossing(evals, float(config.target_value), metric) is not None:
    return None
  continued = ml_collections.ConfigDict(config.to_dict())
  continued.target_metric = metric
  return continued


def check_existing(run_dir: str, config):
  """A run directory already trained with other settings is an error, not silently reused.

  Stricter than the checkpoint's identity (`checkpointing.identity`, the fields a checkpoint
  must share to be *restorable*: model, data, batch): a run is one computation, so every field
  but the `NEUTRAL_FIELDS` (logging, paths, checkpoint cadence) must match the run's
  ``config.json`` — another schedule, lr or epoch budget is another run.
  """
  path = os.path.join(run_dir, 'config.json')
  if not os.path.exists(path):
    return
  with open(path) as f:
    diff = config_diff(json.load(f), config)
  if diff:
    detail = ', '.join(f'{k}: {a!r} there vs {b!r} now' for k, (a, b) in diff.items())
    raise StudyError(f'{run_dir} was trained with other settings ({detail}). Use another --out, '
                     'or the settings of that study.')


def claim_out_dir(out: str, kind: str, write: bool) -> None:
  """Refuses `out` if it holds another study's results (StudyError: exit 2, before any
  training; its results would be overwritten); with `write`, marks it as `kind`'s."""
  if os.path.exists(out) and not os.path.isdir(out):
    raise StudyError(f'--out={out!r} is a file; give a directory.')
  found = study_results.out_dir_kind(out)
  if found and found != kind:
    raise StudyError(f'--out={out!r} holds the results of {found.replace("_", " ")} '
                     f'({study_results.EXPERIMENT_FILE}); this {kind.replace("_", " ")} would '
                     'overwrite its '
                     'results: use another --out.')
  if write and not found:
    os.makedirs(out, exist_ok=True)
    reporting.write_json_atomic(os.path.join(out, study_results.EXPERIMENT_FILE), {'kind': kind})


# ----------------------------------------------------------------------------------------------
# Planning: every run's config and sizes, checked before any training.


@dataclasses.dataclass
class Run:
  """One run of a study made concrete: its directory name, config, sizes and record (written to
  ``runs/<name>/sweep_run.json`` before it trains; what its results row is read with)."""
  key: RunKey
  config: ml_collections.ConfigDict
  setup: Any  # anp_jax.setup.Setup
  record: Dict

  @property
  def name(self) -> str:
    return self.key.name


def apply_fields(config, fields: Dict[str, Any], where: str) -> None:
  """Sets dotted `fields` on `config`; an unknown field or a value of the wrong type is a
  StudyError naming `where` (the point)."""
  known = cli.config_fields(config)
  for key, value in fields.items():
    if key not in known:
      raise StudyError(f'{where}: {cli.unknown_field_message(key, known)}')
    *parents, leaf = key.split('.')
    node = config
    for part in parents:
      node = node[part]
    try:
      node[leaf] = value
    except (TypeError, ValueError) as e:
      raise StudyError(f'{where}: config.{key}={value!r}: {e}') from None


def stops_at_target(base, flag: Optional[bool]) -> bool:
  """Whether a study's runs stop at their target: ``--stop_at_target`` / ``--nostop_at_target``
  when given (`flag`), else the preset config's own ``stop_at_target``."""
  return eval_seam.stops_at_target(base) if flag is None else bool(flag)


def make_run_config(base, study: Study, key: RunKey, stop_at_target: Optional[bool] = None):
  """The base config with the point's fields, the seed, the rate multiplier and the target;
  the run stops at it as `stops_at_target` says (`stop_at_target`: the flag, None when not
  given: the preset's own setting)."""
  c = ml_collections.ConfigDict(base.to_dict())
  apply_fields(c, dict(key.fields), f'Point {key.point!r}')
  c.seed = key.seed
  c.base_lr = float(base.base_lr) * key.lr_mult
  eval_seam.set_target(c, study.target_metric, study.target_value,
                       stops_at_target(base, stop_at_target))
  return c


def default_cadences(config, setup, user_fields, *, checkpoint_epochs: float,
                     log_epochs: float, log_cap: int) -> None:
  """Sets a run's checkpoint and training-log cadences unless the user's --config gave them
  (`user_fields`): a checkpoint every `checkpoint_epochs` (0: none), a training-log record every
  `log_epochs` (at least every step, at most every `log_cap` steps). Results are read from the
  evaluations and final metrics, whatever was logged or checkpointed."""
  if 'checkpoint_every_steps' not in user_fields:
    config.checkpoint_every_steps = (setup.steps(checkpoint_epochs, minimum=1)
                                     if checkpoint_epochs > 0 else 0)
  if 'log_every_steps' not in user_fields:
    config.log_every_steps = max(1, min(log_cap, setup.steps(log_epochs, rounding='floor')))


def dataset_meta(base, planned: bool = False):
  """The dataset's sizes for `base` (StudyError if it cannot be read); `planned`: without
  generating a generated dataset (`pipeline.planned_meta`: a dry run writes nothing)."""
  try:
    if planned:
      return pipeline.planned_meta(base)
    return pipeline.dataset_meta(pipeline.get_builder(base), base)
  except (FileNotFoundError, ValueError) as e:
    raise StudyError(f'The dataset {base.dataset!r} is not usable: {e}') from e


def run_record(study: Study, run: Run) -> Dict:
  """``sweep_run.json``: the run's place in the study and its sizes (read back into its row)."""
  key, setup, config = run.key, run.setup, run.config
  record = {'name': key.name, 'study': study.kind, 'point': key.point,
            'fields': dict(key.fields), 'tune': dict(key.tune), 'seed': key.seed,
            'lr_mult': key.lr_mult,
            'base_lr': float(config.base_lr), 'lr': float(optim.scaled_lr(config)),
            'batch': setup.batch_size, 'warmup_epochs': float(config.warmup_epochs),
            'epochs': setup.total_steps * setup.batch_size / setup.train_size,
            'train_size': setup.train_size, 'devices': setup.devices,
            'per_device_batch': setup.per_device_batch, 'accum_steps': setup.accum_steps,
            'steps_per_epoch': setup.steps_per_epoch, 'total_steps': setup.total_steps,
            'eval_every_steps': setup.eval_every_steps}
  if study.record_extra is not None:
    record.update(study.record_extra(run))
  return record


@dataclasses.dataclass
class Options:
  """How this invocation runs a study (the command line's settings that are not the study)."""
  out: str
  preset: str = ''
  # --stop_at_target / --nostop_at_target; None (not given): the preset config's own setting.
  stop_at_target: Optional[bool] = None
  ci: str = 't'
  dry_run: bool = False
  report: bool = True
  user_fields: frozenset = frozenset()  # Config fields set with --config: not recomputed.
  invocation: Dict = dataclasses.field(default_factory=dict)  # Recorded in study.json.
  record_file: str = 'study.json'  # The study's settings and every invocation.
  # --seeds_at_once: train a point's seeds as one computation (`anp_jax.seed_group`): 'on'
  # wherever it can, 'off', or 'auto': where a committed measurement says it is faster.
  seeds_at_once: str = 'auto'


def plan_runs(study: Study, base, opts: Options, devices: Optional[int] = None,
              extended: Optional[Dict[str, List[float]]] = None, meta=None):
  """(runs, dataset meta): every run's config, sizes and record, checked before any training.

  Raises StudyError listing every run that does not fit (bad fields, sizes that do not split
  over the devices, ...), a run directory trained with other settings (`check_existing`), an
  ``--out`` of another kind of study, and other runs in ``--out`` of other settings
  (`check_other_runs`).
  """
  devices = jax.device_count() if devices is None else devices
  try:
    validate_config(base)
  except (ValueError, FileNotFoundError) as e:
    raise StudyError(f'The preset config with your overrides is invalid: {e}') from e
  meta = dataset_meta(base, planned=opts.dry_run) if meta is None else meta
  runs, problems = [], {}
  for key in study.runs(extended):
    try:
      config = make_run_config(base, study, key, opts.stop_at_target)
      validate_config(config)
      setup = resolve_setup(config, meta.train_size, meta.eval_size, devices=devices)
    except (ValueError, FileNotFoundError) as e:  # StudyError is a ValueError.
      problems.setdefault(key.point, str(e))
      continue
    default_cadences(config, setup, opts.user_fields,
                     checkpoint_epochs=study.checkpoint_every_epochs,
                     log_epochs=study.log_every_epochs, log_cap=int(base.log_every_steps))
    run = Run(key, config, setup, {})
    run.record = run_record(study, run)
    runs.append(run)
  if problems:
    listing = '; '.join(f'{point}: {why}' for point, why in problems.items())
    raise StudyError(f'These points do not fit {devices} device(s) and the dataset {meta.name} '
                     f'({meta.train_size} training examples): {listing}')
  for run in runs:
    check_existing(os.path.join(opts.out, 'runs', run.name), run.config)
  claim_out_dir(opts.out, study.kind, write=False)
  check_other_runs(study, base, opts, [r.name for r in runs])
  return runs, meta


def check_other_runs(study: Study, base, opts: Options, planned: Sequence[str]):
  """Refuses to add runs to ``--out`` when its other runs were trained with other settings.

  The results and the report read every run under ``DIR/runs`` together (studies split over
  several jobs add up), and `check_existing` guards only the runs planned now. So every other
  run there (one with a record and a ``config.json``) is planned again from its point fields,
  seed and rate under this invocation's settings, and must come out as the config it was
  trained with, up to the `NEUTRAL_FIELDS`: another budget, base lr, model or dataset would put
  two experiments into one table. New points, seeds or rates under the same settings pass.
  """
  runs_dir = os.path.join(opts.out, 'runs')
  if not os.path.isdir(runs_dir):
    return
  planned = set(planned)
  differ = {}  # field -> (value there, value now) -> run names.
  for name in sorted(os.listdir(runs_dir)):
    info_path = os.path.join(runs_dir, name, study_results.RECORD_FILE)
    config_path = os.path.join(runs_dir, name, 'config.json')
    if name in planned or not (os.path.exists(info_path) and os.path.exists(config_path)):
      continue
    info = study_results.read_json(info_path)
    old = study_results.read_json(config_path)
    fields = info.get('fields')
    if fields is None and study.fields_of_record is not None:
      fields = study.fields_of_record(info, old)
    key = RunKey(name, str(info.get('point', name)), fields or {},
                 float(info.get('lr_mult', 1.0)), int(info.get('seed', 0)))
    again = make_run_config(base, study, key, opts.stop_at_target)
    for field, (a, b) in config_diff(old, again).items():
      differ.setdefault(field, {}).setdefault((repr(a), repr(b)), []).append(name)
  if differ:
    def listed(names):
      return ', '.join(names[:3]) + (f' and {len(names) - 3} more' if len(names) > 3 else '')
    detail = '; '.join(f'{field}: {a} there vs {b} now ({listed(names)})'
                       for field, by_values in sorted(differ.items())
                       for (a, b), names in by_values.items())
    raise StudyError(
        f'{runs_dir} holds runs trained with other settings than this invocation, apart from '
        f'the study\'s points, seeds and learning rates ({detail}). The results and the report '
        'would read them together with the new runs. Use another --out, or the settings of '
        'those runs.')


def estimate_seconds(runs: Sequence[Run], eval_size: int, images_per_s: float,
                     overhead_s: float) -> float:
  """The flat estimate, for a platform without measured costs (`run_costs`): training images +
  evaluations (at 1/3 the cost) at the preset's ``images_per_s`` + ``overhead_s`` per run."""
  if not images_per_s > 0:
    return float('nan')
  total = 0.0
  for r in runs:
    s = r.setup
    evals = -(-s.total_steps // s.eval_every_steps) if s.eval_every_steps else 0
    total += (s.total_steps * s.batch_size + evals * eval_size / 3) / images_per_s + overhead_s
  return total


def run_shape(run: Run, out: Optional[str] = None) -> run_costs.RunShape:
  """`run_costs.RunShape` of a planned run; with `out`, the steps its folder there already
  trained (an interrupted run resumes from its last checkpoint, at most that)."""
  done = 0
  if out is not None:
    run_dir = os.path.join(out, 'runs', run.name)
    if os.path.isdir(run_dir) and not is_finished(run_dir):
      done = max((r['step'] for r in metrics_io.read_metrics(run_dir)), default=0)
  return run_costs.shape_of(run.name, run.config.to_dict(), dataclasses.asdict(run.setup),
                            done_steps=done)


@dataclasses.dataclass
class StudyEstimate:
  """What the dry run says a study costs: ``seconds`` of the runs still to train (NaN: no
  estimate), ``per_extension_s`` of one extension run, and the line that explains them."""
  seconds: float
  per_extension_s: float
  text: str
  estimate: Optional[run_costs.Estimate] = None


def estimate_study(study: Study, runs: Sequence[Run], out: str, eval_size: int,
                   platform: Optional[str] = None,
                   costs: Optional[run_costs.Costs] = None) -> StudyEstimate:
  """The time of `runs`' unfinished part: the cost model of `run_costs` with the measured
  constants (`costs`, default `run_costs.load`), refreshed from the runs of `out` that finished
  with their phases recorded; the preset's flat ``images_per_s`` where no constants were
  measured on this `platform` (default: JAX's backend)."""
  platform = platform or jax.default_backend()
  costs = costs or run_costs.load()
  todo = [r for r in runs if not is_finished(os.path.join(out, 'runs', r.name))]
  if costs is None or costs.platform != platform:
    why = (f'no measured costs for {platform}' if costs is not None else
           f'no measured costs ({run_costs.COSTS_FILE})')
    if not study.images_per_s > 0:
      return StudyEstimate(float('nan'), float('nan'),
                           f'no time estimate ({why}, and the preset gives no images_per_s)')
    eta = estimate_seconds(todo, eval_size, study.images_per_s, study.overhead_s)
    per = estimate_seconds(runs[:1], eval_size, study.images_per_s, study.overhead_s)
    return StudyEstimate(eta, per, f'estimated {eta / 60:.0f} min for the rest at '
                         f'~{study.images_per_s:.0f} img/s (the preset\'s; {why})')
  finished = [r.name for r in runs if r not in todo]
  costs, used = run_costs.refresh(costs, out, finished)
  shapes = [run_shape(r, out) for r in todo]
  est = run_costs.estimate(shapes, costs)
  # An extension run: a new rate, so a new train step; its initialisation and evaluation are
  # those of its point's other runs.
  known = [(p, s.programs[p]) for s in [run_shape(r) for r in runs] for p in ('init', 'eval')]
  per = (run_costs.estimate([run_shape(runs[0])], costs, process=False,
                            compiled=known).seconds if runs else 0.0)
  seconds = est.seconds if todo else 0.0
  where = (f'constants refreshed from {used} finished run(s) here' if used else
           'measured constants: ' + os.path.relpath(costs.sources.get('file', '?'),
                                                    run_costs.ROOT))
  minutes = f'{seconds / 60:.0f} min' if seconds >= 90 else f'{seconds:.0f} s'
  parts = est.describe() if todo else 'every run finished'
  return StudyEstimate(seconds, per, f'estimated {minutes} for the rest ({parts}; {where})', est)


# ----------------------------------------------------------------------------------------------
# Fresh-seed confirmation: the chosen configurations again, with seeds that chose nothing.

# A study's confirmation lives in this subdirectory of its --out: its own runs, results and
# report, never read by the selection (whose choices it takes).
CONFIRMATION_DIR = study_results.CONFIRMATION_DIR


def confirmation_study(study: Study, out: str, seeds: Sequence[int]) -> Study:
  """The fresh-seed confirmation of a finished study in ``out``: every point at the rate (and
  tuned values) chosen there on validation (its ``points.json``), trained with ``seeds`` only,
  no rate grid, no extension, no registration of its own. Published figures then come from runs
  that played no part in choosing them (the winner's curse of reporting the runs that won the
  choice). StudyError when the study has no settled choice for a point, or when a seed is one the
  selection used."""
  path = os.path.join(out, 'points.json')
  if not os.path.exists(path):
    raise StudyError(f'--confirm_seeds reruns the configurations a finished study chose: {path} '
                     'does not exist (run the study first).')
  chosen = {p['point']: p for p in study_results.read_json(path)}
  problems = [f'{name} ({"not a point there" if name not in chosen else "no settled choice"})'
              for name, _ in study.points
              if name not in chosen or not chosen[name].get('lr_chosen')
              or chosen[name].get('lr_pending')]
  if problems:
    raise StudyError(f'--confirm_seeds: {out} has no settled choice for {"; ".join(problems)}.')
  used = sorted({s for p in chosen.values() for s in p.get('seed_list') or ()} & set(seeds))
  if used:
    raise StudyError(f'--confirm_seeds {used}: seeds the selection runs used; a confirmation '
                     'needs fresh ones.')
  points = tuple((name, {**fields, **(chosen[name].get('tune') or {})})
                 for name, fields in study.points)
  return dataclasses.replace(
      study, points=points, seeds=tuple(seeds), lr=LrGrid((1.0,), 0), tune=(),
      point_lr=tuple((name, (float(chosen[name]['lr_mult']),)) for name, _ in study.points),
      registration='', title=(study.title or study.kind) + ': fresh-seed confirmation')


# ----------------------------------------------------------------------------------------------
# Training.


def run_grid(runs: Sequence[Run], out: str, is_main: bool, seeds_at_once: str = 'off'):
  """Trains every run of `runs` in ``out/runs/<name>`` that has not finished.

  Finished runs are skipped; an interrupted one continues from its checkpoints. A NaN/Inf loss
  is recorded as the run's outcome (``final_metrics.json`` with ``diverged``) and not retried.
  Preemption (`errors.Preempted`, or a signal between runs) propagates: exit 75. With
  ``stop_at_target``, a run that stopped at its validation crossing before its test split
  crossed continues to the test crossing (`test_continuation`): it stops at the later of both.
  With `seeds_at_once` ('on', 'auto': `seed_groups`) the runs of a point that differ only in
  the seed train as one computation (`anp_jax.seed_group`), each in its own directory as above.
  """
  count = len(runs)
  index = {run.name: i for i, run in enumerate(runs, 1)}
  grouped = {}  # The first run of each group -> the group's runs.
  for group, _, _ in seed_groups(runs, out, seeds_at_once):
    if group:
      grouped[group[0].name] = group
  in_group = {r.name for g in grouped.values() for r in g}
  for i, run in enumerate(runs, 1):
    if run.name in grouped:
      _train_group([(f'[{index[r.name]}/{count}] {r.name}', r) for r in grouped[run.name]],
                   out, is_main)
      continue
    if run.name in in_group:
      continue
    tag = f'[{i}/{count}] {run.name}'
    run_dir = os.path.join(out, 'runs', run.name)
    config = run.config
    if is_finished(run_dir):
      # A run stopped at its validation crossing (in this invocation or an interrupted earlier
      # one) continues to its test crossing; every process reads the same files here (written
      # by process 0 before the trainer's final barrier).
      config = test_continuation(run.config, run_dir)
      if config is None:
        if is_main:
          print(f'{tag}: finished earlier, skipped.', flush=True)
        continue
    _train_separately(tag, run, config, run_dir, is_main)


def _train_separately(tag: str, run: Run, config, run_dir: str, is_main: bool) -> None:
  """`run` with `config` (its own, or its test continuation), then its continuations."""
  while config is not None:
    if not _train_one(tag, run, config, run_dir, is_main):
      break
    config = test_continuation(run.config, run_dir)


# Where --seeds_at_once=auto reads whether a grouped step is faster (repository-relative; the
# measurement of experiments/seeds_at_once.py).
SEEDS_AT_ONCE_FILE = os.path.join('experiments', 'results', 'seeds_at_once', 'results.json')


def seeds_at_once_faster(per_device_batch: int, platform: Optional[str] = None) -> str:
  """'' when the committed measurement (`SEEDS_AT_ONCE_FILE`) of `platform` (default: JAX's
  backend) found the grouped step faster than the separate steps, in CPU time and wall time, at
  the measured per-device batch nearest to `per_device_batch` (in log2); else why not."""
  platform = platform or jax.default_backend()
  path = os.path.join(run_costs.ROOT, SEEDS_AT_ONCE_FILE)
  measured = []
  if os.path.exists(path):
    measured = study_results.read_json(path).get('platforms', {}).get(platform, [])
  if not measured:
    return f'not measured on {platform} ({SEEDS_AT_ONCE_FILE})'
  near = min(measured, key=lambda m: abs(math.log2(m['per_device_batch'] / per_device_batch)))
  ratio = max(near['cpu_ratio'], near['wall_ratio'])
  if ratio < 1:
    return ''
  return (f'slower on {platform} ({ratio:.2f}x the time of separate runs at '
          f'{near["per_device_batch"]}/device, {SEEDS_AT_ONCE_FILE})')


def seed_groups(runs: Sequence[Run], out: str, mode: str
                ) -> List[Tuple[List[Run], str, str]]:
  """The seed groups of `runs` with ``--seeds_at_once`` `mode`: (runs to train as one
  computation, label, '') for each group that will, ([], label, why not) for each that will
  not, in the order of their first runs. A group is the runs of one point, rate and tuned setting (the same config
  but the seed) still to train: fresh, or resuming (or continuing to the test crossing) from
  checkpoints of one step. 'auto' groups only where `seeds_at_once_faster`."""
  if mode == 'off':
    return []
  by_config: Dict[str, List[Run]] = {}
  for run in runs:
    key = json.dumps({k: v for k, v in flat_fields(json.loads(run.config.to_json_best_effort()))
                      .items() if k != 'seed'}, sort_keys=True, default=str)
    by_config.setdefault(key, []).append(run)
  result = []
  for members in by_config.values():
    if len(members) < 2:
      continue
    todo, configs = [], []
    for run in members:
      run_dir = os.path.join(out, 'runs', run.name)
      config = (test_continuation(run.config, run_dir) if is_finished(run_dir) else run.config)
      if config is not None:
        todo.append(run)
        configs.append(config)
    label = f'{members[0].key.point} x{members[0].key.lr_mult:g}'
    if len(todo) < 2:
      continue
    why = seed_group.refusal(configs)
    if not why:
      steps = {seed_group.latest_checkpoint_step(os.path.join(out, 'runs', r.name)) for r in todo}
      if len(steps) > 1:
        why = f'their checkpoints are of different steps ({sorted(steps)})'
    if not why and mode == 'auto':
      why = seeds_at_once_faster(todo[0].setup.per_device_batch)
    result.append((todo if not why else [], label, why))
  return result


def _train_group(members: Sequence[Tuple[str, Run]], out: str, is_main: bool) -> None:
  """The runs `members` ((tag, run)) as one seed group (`anp_jax.seed_group`); the
  separate runs' messages and files per run. A group refused at its start (e.g. a checkpoint
  unreadable) trains separately."""
  preemption.exit_if_requested(members[0][0])
  runs = [run for _, run in members]
  dirs = [os.path.join(out, 'runs', run.name) for run in runs]
  configs, resuming = [], []
  for run, run_dir in zip(runs, dirs):
    configs.append(test_continuation(run.config, run_dir) if is_finished(run_dir)
                   else run.config)
    resuming.append(checkpointing.has_checkpoint(run_dir))
    if is_main:
      os.makedirs(run_dir, exist_ok=True)
      reporting.write_json_atomic(os.path.join(run_dir, study_results.RECORD_FILE), run.record)
  if is_main:
    for (tag, run), config, resumed in zip(members, configs, resuming):
      what = ('continuing to the test crossing' if config.target_metric !=
              run.config.target_metric else 'resuming' if resumed else 'training')
      print(f'{tag}: {what}, {len(runs)} seeds at once — {run.setup.describe()}', flush=True)

  def continuation(i):
    return test_continuation(runs[i].config, dirs[i])

  names = [run.name for run in runs]
  try:
    with phases.section('+'.join(names)) as section:
      outcomes = seed_group.train_seed_group(configs, dirs, continuation)
  except seed_group.GroupRefused as e:
    if is_main:
      print(f'{members[0][0]} ...: seeds at once refused ({e}); training them separately.',
            flush=True)
    for (tag, run), config, run_dir in zip(members, configs, dirs):
      _train_separately(tag, run, config, run_dir, is_main)
    return
  except errors.Preempted:
    if is_main:
      print(f'{", ".join(names)}: preempted; rerun the same command to continue.', flush=True)
    raise
  if not is_main:
    return
  for (tag, run), outcome, run_dir, config, resumed in zip(members, outcomes, dirs, configs,
                                                            resuming):
    # The group's phases, in each run's folder, marked: not one run's costs (`run_costs`).
    reporting.write_json_atomic(
        os.path.join(run_dir, run_costs.PHASES_FILE),
        {'wall_s': section.get('wall_s'), 'resumed': resumed or config is not run.config,
         'setup': dataclasses.asdict(run.setup), 'phases': section['phases'],
         'seeds_at_once': names})
    if outcome.error is not None:
      _record_diverged(tag, run_dir, outcome.error)
      continue
    metric = eval_seam.target(config)[0]
    if outcome.continued:
      metric = eval_seam.test_metric(metric)
    value = outcome.result.final_eval.get(metric)
    shown = f', {metric} {100 * value:.2f} %' if isinstance(value, float) else ''
    print(f'{tag}: done in {outcome.result.wall_time_s:.0f} s (seeds at once){shown}',
          flush=True)


def _record_diverged(tag: str, run_dir: str, error: errors.NonFiniteLossError) -> None:
  """A diverged run's outcome (process 0): ``final_metrics.json`` with ``diverged``."""
  step = max((r['step'] for r in metrics_io.read_metrics(run_dir)), default=0)
  reporting.write_json_atomic(os.path.join(run_dir, study_results.FINAL_FILE),
                              {'diverged': True, 'step': step, 'error': str(error)})
  print(f'{tag}: diverged ({error})', flush=True)


def _train_one(tag: str, run: Run, config, run_dir: str, is_main: bool) -> bool:
  """Trains (or resumes) one run with `config`; False when it diverged (recorded as such)."""
  # A signal that came after the previous run's last step check (its final evaluation, its
  # plots, this loop) is still pending: stop before starting another run.
  preemption.exit_if_requested(tag)
  continuing = config.target_metric != run.config.target_metric
  resuming = False
  if is_main:
    os.makedirs(run_dir, exist_ok=True)
    reporting.write_json_atomic(os.path.join(run_dir, study_results.RECORD_FILE), run.record)
    resuming = checkpointing.has_checkpoint(run_dir)
    what = ('continuing to the test crossing' if continuing else
            'resuming' if resuming else 'training')
    print(f'{tag}: {what} — {run.setup.describe()}', flush=True)
  try:
    with phases.section(run.name) as section:
      result = trainer.train_and_evaluate(config, run_dir)
    if is_main:  # The run's own phases: its costs, for later estimates (`run_costs.refresh`).
      reporting.write_json_atomic(
          os.path.join(run_dir, run_costs.PHASES_FILE),
          {'wall_s': section.get('wall_s'), 'resumed': resuming or continuing,
           'setup': dataclasses.asdict(run.setup), 'phases': section['phases']})
  except errors.NonFiniteLossError as e:
    if is_main:
      _record_diverged(tag, run_dir, e)
    return False
  except errors.Preempted:
    if is_main:
      print(f'{tag}: preempted; rerun the same command to continue.', flush=True)
    raise
  if is_main:
    metric = eval_seam.target(config)[0]
    value = result.final_eval.get(metric)
    shown = f', {metric} {100 * value:.2f} %' if isinstance(value, float) else ''
    print(f'{tag}: done in {result.wall_time_s:.0f} s{shown}', flush=True)
  return True


# ----------------------------------------------------------------------------------------------
# Results.


def collect(study: Study, out: str, runs: Sequence[Run]) -> List[Dict]:
  """One row per run: the planned runs with the records planned now, then (unless the study
  says otherwise) every other run under ``out/runs`` with its recorded one (studies split over
  several jobs add up)."""
  def summarize(run_dir, record):
    if study.summarize is not None:
      return study.summarize(run_dir, record)
    return study_results.summarize_run(run_dir, study.target_metric, study.target_value,
                                       record, study.metrics)

  rows, planned = [], set()
  for run in runs:
    planned.add(run.name)
    run_dir = os.path.join(out, 'runs', run.name)
    if os.path.isdir(run_dir):
      rows.append(summarize(run_dir, trained_record(run, run_dir)))
  runs_dir = os.path.join(out, 'runs')
  if study.read_other_runs and os.path.isdir(runs_dir):
    for name in sorted(set(os.listdir(runs_dir)) - planned):
      row = summarize(os.path.join(runs_dir, name), None)
      if row is not None:
        rows.append(row)
  return rows


# What a run's record says about the devices it trained on (not about what it computes).
LAYOUT_KEYS = ('devices', 'per_device_batch', 'accum_steps')


def trained_record(run: Run, run_dir: str) -> Dict:
  """A planned run's record with the device layout it was trained with: a run trained by an
  earlier invocation on other devices (same config, so the same run) keeps that layout."""
  path = os.path.join(run_dir, study_results.RECORD_FILE)
  if not os.path.exists(path):
    return run.record
  recorded = study_results.read_json(path)
  return {**run.record, **{k: recorded[k] for k in LAYOUT_KEYS if k in recorded}}


def choices_of(study: Study, rows: Sequence[Dict]) -> Dict[str, Dict]:
  """`study_results.choose_rates` per point, on the validation target metric."""
  return study_results.choose_rates(rows, lambda r: r['point'],
                                    lambda r: r.get(study.target_metric))


def write_outputs(study: Study, opts: Options, rows, report: bool) -> None:
  """Results, points and the report of `rows` (process 0)."""
  points = study_results.aggregate(rows, study.target_metric, study.metrics,
                                   method=opts.ci, order=[p for p, _ in study.points])
  if study.write is not None:
    paths = study.write(opts.out, rows, points)
  else:
    paths = study_results.write_results(opts.out, rows, points)
  print(f'Results: {", ".join(paths)} ({len(rows)} runs)', flush=True)
  if report:
    make = study.report or study_report.make_report
    print(f'Report: {make(opts.out)}', flush=True)


def _record_invocation(study: Study, base, opts: Options, devices: int):
  """DIR/<record_file>: the study's settings (for the report) and every invocation."""
  path = os.path.join(opts.out, opts.record_file)
  record = study_results.read_json(path) if os.path.exists(path) else {}
  record.update(kind=study.kind, title=study.title, preset=opts.preset, devices=devices,
                epochs=base.num_epochs,
                model=f'{base.model.name} width {base.model.width}',
                image_size=base.image_size, dataset=base.dataset,
                target_metric=study.target_metric, target_value=study.target_value,
                seeds=list(study.seeds), lr_grid=list(study.lr.multipliers),
                point_lr={point: list(mults) for point, mults in study.point_lr},
                lr_extensions=study.lr.extensions, ci=opts.ci,
                points={name: dict(fields) for name, fields in study.points})
  record.setdefault('invocations', []).append({'time': time.time(), **opts.invocation})
  write_text_atomic(path, json.dumps(record, indent=2, default=str))


def _print_plan(study: Study, opts: Options, runs: Sequence[Run], meta) -> None:
  done = [r for r in runs if is_finished(os.path.join(opts.out, 'runs', r.name))]
  est = estimate_study(study, runs, opts.out, meta.eval_size)
  grid = ', '.join(f'{m:g}' for m in study.lr.multipliers)
  if study.point_lr:
    grid += '; per point: ' + ', '.join(f'{p} x{"/".join(f"{m:g}" for m in mults)}'
                                       for p, mults in study.point_lr)
  print(f'Study {study.kind} in {opts.out}: {len(runs)} runs ({len(done)} finished earlier) = '
        f'{len(study.points)} points x {len(study.seeds)} seed(s) x lr multipliers [{grid}], '
        f'{jax.device_count()} device(s), target {study.target_metric} >= '
        f'{study.target_value:g}; {est.text}.', flush=True)
  if study.lr.extensions:
    more = study.lr.extensions * len(study.points) * len(study.seeds)
    cost = (f' (~{more * est.per_extension_s / 60:.0f} min)'
            if math.isfinite(est.per_extension_s) else '')
    print(f'Points whose chosen rate is at the edge of their grid run again x'
          f'{study.lr.factor:g} beyond it, at most {study.lr.extensions} time(s) each: up to '
          f'{more} more runs{cost}.', flush=True)
  for r in runs:
    s = r.setup
    print(f'  {r.name}: lr {optim.scaled_lr(r.config):.4g}, {s.total_steps} steps '
          f'({s.steps_per_epoch:g}/epoch), {s.per_device_batch}/device'
          + (f' = {s.accum_steps} x {s.per_device_micro_batch}' if s.accum_steps > 1 else '')
          + (' [finished]' if r in done else ''), flush=True)
  groups = seed_groups(runs, opts.out, opts.seeds_at_once)
  together = [label for group, label, _ in groups if group]
  if together:
    print(f'Seeds at once (--seeds_at_once={opts.seeds_at_once}), each point\'s seeds as one '
          f'computation: {", ".join(together)}.', flush=True)
  apart: Dict[str, List[str]] = {}
  for group, label, why in groups:
    if not group:
      apart.setdefault(why, []).append(label)
  for why, labels in apart.items():
    print(f'Seeds separately (--seeds_at_once={opts.seeds_at_once}): {", ".join(labels)}: '
          f'{why}.', flush=True)


def pending_extensions(study: Study, opts: Options, runs: Sequence[Run]) -> Dict[str, float]:
  """`study_results.extensions` of the points whose planned runs have all finished."""
  rows = collect(study, opts.out, runs)
  unfinished = {r.key.point for r in runs
                if not is_finished(os.path.join(opts.out, 'runs', r.name))}
  planned = {r.key.point for r in runs}
  choices = {p: c for p, c in choices_of(study, rows).items()
             if p in planned and p not in unfinished}
  return study_results.extensions(choices, study.lr.multipliers, study.lr.extensions,
                                  study.lr.factor, study.grid_of)


def run_study(study: Study, base, opts: Options) -> List[Dict]:
  """Plans, trains (resumably), chooses rates (extending the grid), writes results and report.

  Returns the rows (every process; [] for a dry run). Raises StudyError on bad input (before
  any training; or before an extension round whose run directory is taken by other settings).
  Call after `distributed.initialize`. The time outside the runs, planning and the report is
  the runner's bookkeeping (`anp_jax.phases`: 'runner').
  """
  with phases.phase('runner'):
    return _run_study(study, base, opts)


def _run_study(study: Study, base, opts: Options) -> List[Dict]:
  is_main = jax.process_index() == 0
  with phases.phase('plan'):
    runs, meta = plan_runs(study, base, opts)
  # A registration changed after the first run, or missing before runs that exist: refused
  # before anything trains (`registration.check`); a new one is recorded below, before run 1.
  registered = registration.check(study, opts.out, opts.preset, write=False)
  if is_main:
    _print_plan(study, opts, runs, meta)
    if registered is not None:
      print(f'Registration {registered["source"]} (sha256 {registered["sha256"][:12]}): '
            + ('recorded in --out.' if registration.recorded(opts.out) else
               'to be recorded in --out before the first run.'), flush=True)
  if opts.dry_run:
    if is_main and study.lr.extensions:
      more = pending_extensions(study, opts, runs)
      if more:
        print('From the finished runs, the first extension: ' + ', '.join(
            f'{point} x{mult:g}' for point, mult in more.items()) + '.', flush=True)
    return []
  if is_main:
    claim_out_dir(opts.out, study.kind, write=True)
    registration.check(study, opts.out, opts.preset, write=True)
    _record_invocation(study, base, opts, jax.device_count())
  extended: Dict[str, List[float]] = {}
  todo = runs
  for round_ in range(study.lr.extensions + 1):
    run_grid(todo, opts.out, is_main, opts.seeds_at_once)
    # Every process decides the next round from the same files (written by process 0).
    distributed.barrier(f'study_round_{round_}')
    planned_points = {r.key.point for r in runs}
    choices = {p: c for p, c in choices_of(study, collect(study, opts.out, runs)).items()
               if p in planned_points}
    more = study_results.extensions(choices, study.lr.multipliers, study.lr.extensions,
                                    study.lr.factor, study.grid_of)
    if not more:
      break
    for point, mult in more.items():
      extended.setdefault(point, []).append(mult)
    if is_main:
      print('Chosen rate at the edge of its grid; extending: ' + ', '.join(
          f'{point} x{mult:g}' for point, mult in more.items()), flush=True)
    planned, _ = plan_runs(study, base, opts, extended=extended, meta=meta)
    known = {r.name for r in runs}
    todo, runs = [r for r in planned if r.name not in known], planned
  rows = collect(study, opts.out, runs)
  if jax.process_count() > 1 and not is_main:
    print(f'Process {jax.process_index()}: waiting (at most {distributed.barrier_timeout_s()} s, '
          'ANP_BARRIER_TIMEOUT) for process 0 to write the results and the report.', flush=True)
  with phases.phase('report'):
    distributed.on_process_0('study_results',
                             lambda: write_outputs(study, opts, rows, opts.report),
                             'write the study results and report')
  return rows
