"""Training and evaluation: `train_and_evaluate(config, workdir)`, and `build(config)`.

`build` turns a config into a `Run`: the dataset (generated on first use), the job's mesh, the
model, the optimizer, the executor (`anp_jax.executors`) that runs the per-device step
(`anp_jax.steps`) and the evaluators of config.evals (`anp_jax.evaluators`). A `Run` is also the
handle for interactive use (the README's IPython snippet): ``run.train_step(state, batch)``,
``run.evaluate(state)``.

`train_and_evaluate` is the loop, and only the loop: accept the workdir, build the run, take the
workdir (`anp_jax.workdir_lock`), restore the latest checkpoint (or start fresh, optionally from
pretrained weights), then per step: next batch → `Run.train_step` → metrics every
``log_every_steps`` → before an evaluation or a save, `Run.check_finite` (a result comes only from
a finite state) → every evaluator every ``eval_every_steps`` → checkpoint when due → stop at the
target (config.target_metric) or on preemption. Process 0 writes the logs (`anp_jax.metrics`,
`anp_jax.reporting`). With config.eval_only it only evaluates the latest checkpoint, writing
nothing in the workdir (docs/checkpointing.md).
"""

import dataclasses
import json
import logging
import math
import os
import re
import time
from typing import Any, Dict, List, Optional, Tuple

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax

from anp_jax import (checkpointing, collectives, compile_cache, distributed, durations, executors,
                     metrics_io, models, noise_scale, optim, phases, preemption, pretrained,
                     reporting, steps)
from anp_jax import evaluators as evaluators_lib
from anp_jax import workdir_lock
from anp_jax.configs import default as default_config
from anp_jax.data import pipeline
from anp_jax.errors import NonFiniteLossError, Preempted
from anp_jax.executors import Executor
from anp_jax.metrics import MetricWriter, summarize
from anp_jax.evaluators import classification
from anp_jax.setup import Setup, job_identity, resolve_setup, validate_config
from anp_jax.steps import TrainState


# What an evaluation reads of a state, in every executor's layout: the step it reports, and the
# parameters and BatchNorm statistics of `steps.per_device_eval_step` (local SGD's evaluation
# averages those two over its nodes first; async's reads the current parameters, not its history).
# config.eval_only restores only these: the optimizer state, the noise-scale EMAs and the async
# parameter history are the training's, whose layout an evaluation's config may change.
EVALUATED_FIELDS = ('step', 'params', 'batch_stats')

_DIVERGED_ADVICE = ('Lower config.base_lr, add warmup (config.warmup_epochs) or gradient clipping '
                    '(config.grad_clip_norm).')
_ALL_FINITE = jax.jit(steps.all_finite)  # Any executor's state layout; one scalar out.


@dataclasses.dataclass
class Run:
  """Everything a run is built from; also the handle for interactive use."""
  config: ml_collections.ConfigDict
  builder: Any
  meta: pipeline.DatasetMeta
  setup: Setup
  mesh: jax.sharding.Mesh
  model: nn.Module
  schedule: optax.Schedule
  tx: optax.GradientTransformation
  executor: Executor
  init: Optional[pretrained.LoadedWeights] = None  # config.init_from, read and checked.
  frozen: str = ''  # config.freeze's start-up line (what it matches).
  # config.evals, by metric prefix (`anp_jax.evaluators`); built by `build`.
  evaluators: Dict[str, evaluators_lib.Evaluator] = dataclasses.field(default_factory=dict)
  # `evaluate`'s classification evaluators, by split.
  _by_split: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

  def init_state(self):
    """A fresh state in the executor's layout (with the pretrained weights, if any)."""
    state = self.executor.init()
    return state if self.init is None else pretrained.place(state, self.init)

  def train_batches(self, start_step: int = 0):
    """Global training batches (device arrays), from `start_step` on."""
    ds = pipeline.train_dataset(self.builder, self.config,
                                per_device_batch=self.setup.per_device_batch,
                                num_shards=self.setup.devices,
                                shards=pipeline.local_shards(self.mesh), start_step=start_step)
    return pipeline.global_batches(ds, to_device=self.executor.to_device)

  def train_step(self, state, batch, step: Optional[int] = None):
    """One step; `step` (0-based, default: read from `state`) picks tau / the averaging."""
    if step is None:
      step = int(self.executor.fetch(state.step))
    return self.executor.train_step(state, batch, *self.executor.step_args(step))

  def evaluate(self, state, split: Optional[str] = None) -> Dict[str, float]:
    """Exact classification evaluation of `split` (default: the split of config.evals' ``eval``
    entry): every example counted once, padding masked out. Named as the trainer logs that
    split (`split_prefix`): ``eval/...`` for the default, ``test/...`` for 'test'. For IPython;
    the trainer runs every evaluator of config.evals (`eval_record`)."""
    split = split or default_config.default_eval_split(self.config)
    if split not in self._by_split:
      self._by_split[split] = classification.Classification(self.split_prefix(split),
                                                            {'split': split}, self)
    return self._by_split[split].evaluate(state)

  def split_prefix(self, split: str) -> str:
    """The metric prefix of a classification of `split`: that of config.evals' classification
    evaluator of the split (``eval`` first), else the split's name, ``trainset`` for 'train'
    (``train/`` holds the training metrics; config.evals refuses it as a prefix)."""
    for prefix in sorted(self.config.evals, key=lambda p: (p != 'eval', p)):
      spec = self.config.evals[prefix]
      if spec.get('kind') == 'classification' and spec.get('split', 'validation') == split:
        return prefix
    name = re.sub(r'\W', '_', split)
    return 'trainset' if name == 'train' else name

  def eval_record(self, state, step: int) -> Dict[str, float]:
    """The metrics of every evaluator of config.evals (``<prefix>/<name>``), plus the progress
    at `step` (``eval/examples_seen``, ``eval/epoch``, ...): one logged record.

    Raises NonFiniteLossError if a metric is NaN/Inf (a finite state whose evaluation loss
    overflows has diverged too). The caller checks the state first (`check_finite`)."""
    record = {}
    for prefix in sorted(self.evaluators):
      with phases.phase(f'eval:{prefix}'):
        record.update(self.evaluators[prefix].evaluate(state))
    bad = {k: v for k, v in record.items() if not math.isfinite(v)}
    if bad:
      raise NonFiniteLossError(
          f'Training stopped: the evaluation at step {step} is not finite '
          f'({", ".join(f"{k} = {v}" for k, v in sorted(bad.items()))}): the state after step '
          f'{step} has diverged (learning rate {float(self.schedule(step - 1)):.4g}). '
          + _DIVERGED_ADVICE, step=step + 1)
    return {**record, **self.setup.progress(step, 'eval')}

  def train_record(self, pending: List[Any], state, step: int) -> Dict[str, float]:
    """The metric sums of the steps since the last record (`pending`) as logged means, with
    the gradient norm, learning rate, progress and noise scale; raises on a NaN/Inf loss."""
    noise_ema = self.executor.fetch(state.noise_ema) if self.config.noise_scale else None
    return self.host_train_record([self.executor.fetch(s) for s in pending], noise_ema, step)

  def host_train_record(self, host: List[Dict[str, Any]], noise_ema, step: int
                        ) -> Dict[str, float]:
    """`train_record` of metric sums already on the host (`host`, one dict per step) and the
    noise-scale EMAs (`noise_ema`, on the host; None without config.noise_scale): also a seed
    group's (`anp_jax.seed_group`), whose sums hold every seed's."""
    self._check_losses([h['loss'] for h in host], step)
    host = [dict(h) for h in host]
    grad_norm = float(np.mean([h.pop('_grad_norm') for h in host]))
    record = summarize({k: sum(h[k] for h in host) for k in host[0]}, 'train')
    record['train/grad_norm'] = grad_norm
    record['train/lr'] = float(self.schedule(step - 1))
    record.update(self.setup.progress(step, 'train'))
    if self.config.noise_scale:
      record.update(noise_scale.log_fields(noise_ema))
    return record

  def check_finite(self, state, pending: List[Any], step: int) -> None:
    """Raises NonFiniteLossError unless the losses of the steps in `pending` (the metric sums
    of the steps up to `step` not checked yet) and every value of `state` (parameters, BatchNorm
    statistics, optimizer state) are finite. Before every evaluation, checkpoint and target
    check: a result comes only from a finite state. One fused reduction on the devices and one
    scalar fetched (`steps.all_finite`)."""
    self._check_losses([self.executor.fetch(s['loss']) for s in pending], step)
    if not bool(np.asarray(_ALL_FINITE(state).addressable_data(0))):
      raise self.state_diverged(step)

  def state_diverged(self, step: int) -> NonFiniteLossError:
    """The error of a state that is not finite after `step` (`check_finite`)."""
    # `step` + 1: the first step whose loss would come from the diverged state.
    return NonFiniteLossError(
        f'Training stopped: the state after step {step} is not finite (NaN/Inf in the '
        'parameters, BatchNorm statistics or optimizer state) (learning rate '
        f'{float(self.schedule(step - 1)):.4g}). ' + _DIVERGED_ADVICE, step=step + 1)

  def _check_losses(self, losses: List[Any], step: int) -> None:
    """Raises NonFiniteLossError if one of `losses` (the summed losses of the steps up to
    `step`, in order) is NaN/Inf, naming the first such step."""
    bad = [i for i, loss in enumerate(losses) if not math.isfinite(float(loss))]
    if bad:
      # The loss of that step was computed from the state of the step before, which is
      # therefore diverged too (see `_diverged`).
      first = step - len(losses) + 1 + bad[0]
      raise NonFiniteLossError(
          f'Training stopped at step {step}: the loss is {float(losses[bad[0]])}, first '
          f'non-finite at step {first} (learning rate {float(self.schedule(first - 1)):.4g}). '
          + _DIVERGED_ADVICE, step=first)

  def target_reached(self, evaluated: Optional[Dict[str, float]]) -> bool:
    """Whether the run stops at `evaluated`: config.stop_at_target and config.target_metric >=
    config.target_value."""
    metric = self.config.target_metric
    return bool(self.config.stop_at_target and evaluated and
                evaluated.get(metric, -math.inf) >= self.config.target_value)

  def fetch(self, tree):
    return self.executor.fetch(tree)


def build(config: ml_collections.ConfigDict) -> Run:
  """Validates `config`, prepares the dataset and builds mesh, model, optimizer and executor."""
  validate_config(config)
  return _build_validated(config)


def _build_validated(config: ml_collections.ConfigDict) -> Run:
  phases.watch_compiles()
  compile_cache.use_atomic_writes()  # Entries other processes read whole (`compile_cache`).
  with phases.phase('dataset'):
    builder = pipeline.get_builder(config)
    meta = pipeline.dataset_meta(builder, config)
    pipeline.check_input_backend(builder, config)  # A GPU for 'dali', images of a bounded size.
  with phases.phase('build'):
    return _build_parts(config, builder, meta)


def _build_parts(config, builder, meta) -> Run:
  setup = resolve_setup(config, meta.train_size, meta.eval_size)
  mesh = executors.make_run_mesh(config, setup.devices, setup.process_count)
  model = models.create_model(config, meta, axis_name=executors.model_axis_name(config))
  schedule = optim.create_lr_schedule(config, setup.steps_per_epoch, setup.total_steps)
  tx_config = executors.optimizer_config(config)
  # Read and checked here, on the host, before anything compiles.
  init = pretrained.load(config, model) if config.init_from else None
  frozen = optim.freeze_summary(config, model)
  tx = optim.create_optimizer(tx_config, schedule, init.loaded_params if init else None)
  executor = executors.make_executor(tx_config, model, tx, setup, mesh)
  run = Run(config, builder, meta, setup, mesh, model, schedule, tx, executor, init, frozen)
  run.evaluators = evaluators_lib.create_all(config, run)  # Checks their splits: before any write.
  return run


@dataclasses.dataclass
class TrainResult:
  state: TrainState  # Unreplicated final state (config.eval_only: `EVALUATED_FIELDS` only).
  records: List[Dict[str, float]]  # The train/eval records logged (metrics.jsonl), in order.
  final_eval: Dict[str, float]
  setup: Setup
  wall_time_s: float
  step: int = 0  # The step of `state` (config.eval_only: of the checkpoint evaluated).


def load_checkpoint(workdir: str, step: Optional[int] = None):
  """For IPython: ``model, variables, config = load_checkpoint(workdir)``.

  Rebuilds the model from ``workdir/config.json`` and restores params + BN statistics on the
  default device (no mesh needed); a local-SGD run's node replicas are averaged.
  """
  config, state = checkpointing.restore_state(workdir, step)  # With default.ADDED_FIELDS.
  meta = pipeline.dataset_meta(pipeline.get_builder(config), config)
  model = models.create_model(config, meta)
  variables = {'params': state['params'], 'batch_stats': state['batch_stats']}
  if config.method == 'local_sgd':  # One replica per node: their average.
    variables = jax.tree.map(lambda x: collectives.replica_mean(np.asarray(x)), variables)
  return model, variables, config


def _step_devices(run: Run) -> int:
  """The devices one step's gradient all-reduce (and global BatchNorm) spans: a node's under
  local SGD."""
  return run.setup.devices // dict(run.mesh.shape).get(executors.NODE, 1)


def noise_scale_unmeasured(run: Run) -> str:
  """Why `run` does not measure the gradient noise scale B_simple ('' if it does): switched off,
  global BatchNorm over several devices (`noise_scale.unmeasurable_reason`), or a single
  micro-batch per step (one device of the step's all-reduce, no accumulation: the step's
  gradient is the only one, and the estimator compares gradients of two batch sizes, see
  `steps.per_device_train_step`)."""
  if not run.config.noise_scale:
    return 'config.noise_scale=False'
  step_devices = _step_devices(run)
  reason = noise_scale.unmeasurable_reason(run.config.bn_mode, step_devices)
  if not reason and step_devices * run.setup.accum_steps == 1:
    reason = ONE_GRADIENT_PER_STEP
  return reason


# Why a run on one device without accumulation (the CPU demo, a 1-GPU run) measures no B_simple.
ONE_GRADIENT_PER_STEP = (
    'one device without gradient accumulation computes a single gradient per step, and the '
    'estimator needs gradients of two batch sizes; use more devices or '
    'config.grad_accum_steps >= 2 to measure it')


def _announce(run: Run, training: bool = True) -> None:
  """The start-up lines: sizes, the method, what a training run does not measure.

  B_simple unmeasured is a warning where the config chose it (global BatchNorm over several
  devices), said once. On one device without accumulation it is the expected case (every
  1-device run, the CPU demo included), not something to act on: it goes to the log, and
  final_metrics.json records why (``noise_scale_not_measured_because``)."""
  reporting.say(f'anp_jax | {run.setup.describe()}')
  if run.executor.describe:
    reporting.say(f'anp_jax | {run.executor.describe}')
  if run.frozen:
    reporting.say(f'anp_jax | {run.frozen}')
  unmeasured = training and run.config.noise_scale and noise_scale_unmeasured(run)
  if unmeasured == ONE_GRADIENT_PER_STEP:
    logging.info('Noise scale not measured: %s.', unmeasured)
  elif unmeasured:
    reporting.say(f'anp_jax | WARNING: B_simple is not measured: {unmeasured}.')


def _diverged(error: NonFiniteLossError, ckpt: checkpointing.Checkpointer) -> NonFiniteLossError:
  """The error to raise for a diverged run, after making sure no checkpoint holds the diverged
  state. ``error.step`` is the first step whose loss is (or would be) computed from a diverged
  state, the state after step ``error.step - 1``: a checkpoint of that step (a finite state that
  gave a NaN/Inf loss, or one an older version saved) is moved aside, so that the rerun with a
  lower learning rate resumes from the one before. No other checkpoint can hold a diverged state:
  every save follows `Run.check_finite`."""
  ckpt.wait()
  suspect = None if error.step is None else error.step - 1
  if suspect and suspect in ckpt.steps():
    dest = ckpt.move_aside([suspect], reason='diverged')[0]
    note = (f' The checkpoint of step {suspect} holds the state this came from and was moved '
            f'aside to {dest}; earlier checkpoints are intact.')
  else:
    note = ' The checkpoints written before this step are intact.'
  return NonFiniteLossError(str(error) + note, step=error.step)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> TrainResult:
  """Trains `config` with the devices of this job, writing logs (and checkpoints) to `workdir`;
  with config.eval_only, evaluates the latest checkpoint of `workdir` without writing there."""
  token = phases.begin('start')  # Where its time goes: `anp_jax.phases`.
  try:
    return _train_and_evaluate(config, workdir)
  finally:
    phases.end(token)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> TrainResult:
  t_start = time.time()
  if config.eval_only:  # Before the checks: an evaluation reads no init_from file.
    config = evaluation_config(config)
  validate_config(config)
  if not str(workdir or '').strip():  # '' would be the current directory.
    raise ValueError('The workdir is empty (--workdir=): give the directory for the logs and '
                     'checkpoints.')
  workdir = os.path.abspath(os.path.expanduser(workdir))
  # Before anything is read or written: every process runs this code, config and workdir.
  distributed.check_same_everywhere('software', distributed.software_identity,
                                    hint=distributed.SAME_SOFTWARE_HINT)
  distributed.check_same_everywhere('configs or workdirs', job_identity(config, workdir))
  # Nothing in the workdir changes until the run is accepted (config valid, checkpoint ours).
  checkpointing.check_workdir(workdir, require_checkpoint=config.eval_only,
                              writable=not config.eval_only)

  run = _build_validated(config)
  distributed.check_same_everywhere(
      'datasets', pipeline.dataset_identity(run.builder, run.meta),
      hint='A data_dir of each node\'s own holds another preparation of the dataset there: '
      'prepare every copy from the same source (or share one data_dir).')
  if config.eval_only:
    return _evaluate_checkpoint(run, workdir, t_start)
  checkpointing.make_workdir(workdir, jax.process_index() == 0)
  lock = []  # Process 0's, for the run's life: one training job per workdir.
  distributed.on_process_0('workdir_lock', lambda: lock.append(workdir_lock.acquire(workdir)),
                           f'lock the workdir {workdir}')
  try:
    return _train(run, workdir, t_start)
  finally:
    for held in lock:
      held.release()


def evaluation_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """config.eval_only's config: `config` without where its initial weights came from
  (init_from, and backbone_lr_multiplier, which applies to them). The checkpoint holds the
  trained weights, and the file a fine-tuned run started from may be gone; neither field is
  compared with the checkpoint's in an evaluation (`checkpointing.IDENTITY_TRAINING_ONLY`)."""
  config = config.copy_and_resolve_references()
  config.init_from = ''
  config.backbone_lr_multiplier = 1.0
  return config


# What an evaluation (config.eval_only) given on the command line takes from there (a field, or
# every field under a section); everything else comes from the run's recorded config.json: what
# is evaluated and how it is read, where the data is, how the job runs.
EVALUATION_SETTINGS = ('evals', 'eval_batch_size', 'data_dir', 'eval_only', 'progress_bar',
                       'executor', 'input_backend', 'cache', 'crop_fraction', 'model.conv_impl')


def recorded_evaluation_config(workdir: str, config: ml_collections.ConfigDict,
                               given: Dict[str, Any]) -> Tuple[ml_collections.ConfigDict, str]:
  """config.eval_only from a command line: (the config to evaluate with, its start-up line).

  The run's recorded config (``workdir/config.json`` through `default.read_run_config`, so a
  config of an older version works), with those `given` fields (the ``--config.x`` flags of the
  command line, dotted name -> value) that are `EVALUATION_SETTINGS`. `config` (the command
  line's) supplies the fields the record lacks. A given field that is part of what was trained
  (the checkpoint identity's model and data fields) and differs from the run's is a ValueError
  (one line, exit 2); a given training setting that differs is not used, and the line says so.
  Without a config.json: `config` as it is, with ('')."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.isfile(path):
    return config, ''
  recorded = default_config.read_run_config(workdir)
  merged = config.copy_and_resolve_references()
  merged.unlock()
  _overlay(merged, recorded)
  settable = lambda name: any(name == f or name.startswith(f + '.') for f in EVALUATION_SETTINGS)
  identity = set(checkpointing.identity(merged)) - set(checkpointing.IDENTITY_TRAINING_ONLY)
  used, unused = [], []
  for name, value in sorted(given.items()):
    flag = f'--config.{name}={_shown(value)}'
    if settable(name):
      try:
        merged.update_from_flattened_dict({name: value})
      except (AttributeError, KeyError) as e:  # E.g. an evaluator the run's config.evals lacks.
        raise ValueError(f'{flag}: the run\'s config ({path}) has no such field ({e}); its '
                         f'evaluators are config.evals.{{{",".join(recorded.evals)}}}.') from e
      if name != 'eval_only':
        used.append(flag)
      continue
    run_value = checkpointing.get_field(recorded, name)
    if _as_json(run_value) == _as_json(value):
      continue
    if name in identity:
      raise ValueError(f'{flag}: the run in {workdir} was trained with {name}={run_value!r} '
                       f'({path}), and an evaluation evaluates that model on that data: drop '
                       f'the flag (an evaluation may set {", ".join(EVALUATION_SETTINGS)}).')
    unused.append(f'{flag} (the run: {_shown(run_value)})')
  line = f"anp_jax | evaluating with the run's config ({path})"
  if used:
    line += f'; from the command line: {" ".join(used)}'
  if unused:
    line += f'; training settings not used by an evaluation: {", ".join(unused)}'
  return merged, line


def _overlay(config: ml_collections.ConfigDict, recorded) -> None:
  """Sets every field of `config` that `recorded` has to the recorded value (in place): a
  section field by field (config.evals whole: its entries are the run's own), a tuple from the
  list JSON recorded. A field `config` lacks (one removed since) or whose type changed is left
  as `config` has it."""
  for key, value in recorded.items():
    if key not in config:
      continue
    current = config[key]
    if isinstance(current, ml_collections.ConfigDict) and key != 'evals':
      if hasattr(value, 'items'):
        _overlay(current, value)
      continue
    if isinstance(current, tuple) and isinstance(value, list):
      value = tuple(value)
    elif hasattr(value, 'to_dict'):
      value = ml_collections.ConfigDict(value.to_dict())
    try:
      config[key] = value
    except TypeError:  # Another type in another version: this version's value stays.
      pass


def _as_json(value):
  return json.loads(json.dumps(value, default=repr, sort_keys=True))


def _shown(value) -> str:
  """A flag value as typed on a command line."""
  return ','.join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """``workdir/config.json``: the config of the run accepted there."""
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))


def write_final(run: Run, workdir: str, step: int, start_step: int, wall_time_s: float,
                stopped_at_target: bool, final_eval: Dict[str, float],
                records: List[Dict[str, float]]) -> None:
  """A finished run's ``final_metrics.json`` and ``curves.png`` (process 0): `step` reached,
  the run's training time (`wall_time_s`, earlier segments included), whether it stopped at the
  target, and the final evaluation."""
  final_path = os.path.join(workdir, 'final_metrics.json')
  setup = run.setup
  # A rerun of a finished run trains nothing: its final_metrics.json (training time, whether it
  # stopped at the target) stays as the run wrote it.
  if not (step == start_step and os.path.exists(final_path)):
    # Its existence means "this run is done" to the sweep: never seen half-written.
    unmeasured = noise_scale_unmeasured(run)
    reporting.write_json_atomic(final_path, {
        'step': step, 'wall_time_s': wall_time_s,
        'stopped_at_target': stopped_at_target,
        'examples_seen': durations.examples_seen(step, setup.batch_size),
        'passes': durations.passes(step, setup.batch_size, setup.train_size),
        'noise_scale_measured': not unmeasured,
        **({'noise_scale_not_measured_because': unmeasured} if unmeasured else {}),
        **final_eval})
  if records:  # The whole history, earlier segments of a resumed run included.
    reporting.plot_curves(metrics_io.read_metrics(workdir) or records,
                          os.path.join(workdir, 'curves.png'))


def _checkpointer(run: Run, workdir: str, read_only: bool = False) -> checkpointing.Checkpointer:
  config = run.config
  # The label sets are part of the identity: a checkpoint of a dataset with other classes would
  # otherwise fail to restore, look corrupt, and the run would silently start again from scratch.
  classes = {'num_anps': run.meta.num_anps, 'num_adjectives': run.meta.num_adjectives,
             'num_nouns': run.meta.num_nouns}
  best_mode = (evaluators_lib.metric_goal(config, config.keep_best_metric).mode
               if config.keep_best_metric else '')
  # So is the BatchNorm statistics batch (what bn_mode, bn_group_size, the batch and the devices
  # resolve to): another one would continue another computation (`checkpointing`).
  bn_batch = models.statistics_batch(config, run.setup.per_device_micro_batch,
                                     _step_devices(run))
  return checkpointing.Checkpointer(
      workdir, config, best_mode=best_mode, read_only=read_only,
      identity_extra={**classes, 'bn_statistics_batch': bn_batch,
                      **(run.executor.identity or {})})


def _evaluate_checkpoint(run: Run, workdir: str, t_start: float) -> TrainResult:
  """config.eval_only: every evaluator of config.evals on the latest checkpoint of `workdir`.

  A reader: takes no lock and creates, cleans or writes nothing there (the training job may
  still be running; its saves in flight stay untouched, and a checkpoint it deletes meanwhile is
  read again from its newer one: `Checkpointer.restore_latest`). It restores only
  `EVALUATED_FIELDS`; the state it evaluates (and returns) has no optimizer state, noise-scale
  EMAs or parameter history (None). The entry point prints the metrics (and writes them where
  ``--eval_output`` says)."""
  _announce(run, training=False)
  ckpt = _checkpointer(run, workdir, read_only=True)
  try:
    executor = run.executor
    restored, step = ckpt.restore_latest(executor.restore_target(executor.init()),
                                         fields=EVALUATED_FIELDS)
    if not step:
      raise FileNotFoundError(f'config.eval_only: no checkpoint found in {workdir} (none could '
                              'be restored).')
    state = executor.from_checkpoint(TrainState(opt_state=None, noise_ema=None, **restored))
    reporting.say(f'Evaluating the checkpoint of step {step} in {ckpt.directory}')
    run.check_finite(state, [], step)  # A checkpoint an older version wrote may not be.
    final = run.eval_record(state, step)
  finally:
    ckpt.close()
  return TrainResult(run.executor.unreplicate(state), [final], final, run.setup,
                     time.time() - t_start, step=step)


def _train(run: Run, workdir: str, t_start: float) -> TrainResult:
  """The training loop of `train_and_evaluate`, in a workdir this job holds."""
  config, setup, executor = run.config, run.setup, run.executor
  is_main = jax.process_index() == 0
  _announce(run)
  token = phases.begin('init')
  ckpt = _checkpointer(run, workdir)
  state = executor.init()
  restored, start_step = ckpt.restore_latest(executor.restore_target(state))
  if start_step:
    state = executor.from_checkpoint(restored)
    reporting.say(f'Resumed from checkpoint at step {start_step} in {ckpt.directory}')
    try:
      run.check_finite(state, [], start_step)  # A checkpoint an older version wrote may not be.
    except NonFiniteLossError as e:
      ckpt_error = _diverged(e, ckpt)
      ckpt.close()
      raise ckpt_error from None
  if run.init is not None and start_step == 0:  # A checkpoint in the workdir wins (resume).
    state = pretrained.place(state, run.init)
    reporting.say(f'anp_jax | {run.init.report}')
  if is_main:  # The run is accepted: record its config.
    write_config(workdir, config)
  writer = MetricWriter(workdir)
  records = []

  def log(step: int, record: Dict[str, float]) -> None:
    writer.write(step, record)
    records.append({'step': step, **record})

  phases.end(token)
  token = phases.begin('train')
  batches = run.train_batches(start_step)
  bar = reporting.ProgressBar(setup.total_steps, setup.batch_size, start_step,
                              enabled=config.progress_bar)
  pending = []
  final_eval: Dict[str, float] = {}
  step = start_step
  stopped_at_target = False
  run_ahead = preemption.RunAhead()  # Bounds the signal-to-checkpoint delay to a few steps.
  try:
    try:
      if (config.stop_at_target and 0 < start_step < setup.total_steps
          and start_step % setup.eval_every_steps == 0):
        # A resumed early-stopping run may have stopped at this checkpoint already (only at an
        # evaluation step: elsewhere, e.g. a preemption checkpoint, the run never evaluated, so
        # an evaluation here could stop it where the uninterrupted run would not).
        final_eval = run.eval_record(state, step)
        stopped_at_target = run.target_reached(final_eval)
        if not stopped_at_target:
          final_eval = {}
      while step < setup.total_steps and not stopped_at_target:
        batch = next(batches)
        state, sums = run.train_step(state, batch, step)
        pending.append(sums)
        run_ahead.push(sums)
        step += 1
        if step == start_step + 1:
          bar.reset_clock(step)  # Exclude compilation from the rates.
        last = step == setup.total_steps
        save_now, preempted = ckpt.save_due(step, force=last)
        evaluate_now = step % setup.eval_every_steps == 0 or last
        if step % config.log_every_steps == 0 or last or save_now:
          record = run.train_record(pending, state, step)
          pending = []
          record['train/steps_per_s'], record['train/images_per_s'] = bar.rates(step)
          log(step, record)
          bar.update(step, {'loss': record['train/loss'], 'top1': record['train/anp_top1']},
                     force=True)
        else:
          bar.update(step)
        if save_now or evaluate_now:
          # A result comes only from a finite state: no evaluation, checkpoint or target
          # reached from a diverged one (a NaN model scores chance accuracy, which can pass a
          # low target; orbax would keep a NaN best checkpoint as the newest equal one).
          run.check_finite(state, pending, step)
        evaluated = None
        if evaluate_now:
          jax.block_until_ready(state)  # The steps dispatched so far are training time.
          t_eval = time.time()
          final_eval = evaluated = run.eval_record(state, step)
          log(step, final_eval)
          bar.close()
          reporting.say(f'eval @ step {step}: {evaluators_lib.summary(config, final_eval)}')
          bar.exclude(time.time() - t_eval)  # Rates after an evaluation count training only.
        if run.target_reached(evaluated):
          stopped_at_target = True
          reporting.say(f'{config.target_metric} = {evaluated[config.target_metric]:.4f} '
                        f'reached config.target_value={config.target_value:g} at step {step}: '
                        'stopping.')
          save_now = True  # Keep the stopping point (and the progress) in a checkpoint.
        if save_now or evaluated:
          with phases.phase('checkpoint'):
            tree = executor.to_checkpoint(state)
            if save_now:
              ckpt.save(step, tree, wall_time_s=time.time() - t_start)
            if evaluated:
              ckpt.save_best(step, tree, evaluated)
        if preempted and not last:
          ckpt.wait()
          # Every process's log says where it stopped (the processes of a job compare them);
          # a job of one process says it on the terminal just below, once.
          logging.log(logging.INFO if jax.process_count() == 1 else logging.WARNING,
                      'Preempted: process %d stops at step %d.', jax.process_index(), step)
          bar.close()
          reporting.say(preemption.stop_message(step))
          raise Preempted(step)
      if not final_eval:  # Resumed a finished run: report its accuracy again.
        reporting.say(f'The run in {workdir} already finished (step {step}); evaluating its '
                      'final checkpoint. Use another --workdir for a new run.')
        final_eval = run.eval_record(state, step)
    except NonFiniteLossError as e:
      raise _diverged(e, ckpt) from None
  finally:
    bar.close()
    writer.close()
    phases.end(token)
    with phases.phase('checkpoint'):
      ckpt.close()
  token = phases.begin('finish')
  wall = time.time() - t_start
  if is_main:
    write_final(run, workdir, step, start_step, ckpt.restored_wall_time_s + wall,
                stopped_at_target, final_eval, records)
  distributed.barrier('train_and_evaluate_end')
  phases.end(token)
  return TrainResult(executor.unreplicate(state), records, final_eval, setup, wall, step=step)
