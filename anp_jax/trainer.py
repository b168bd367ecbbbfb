"""Training and exact evaluation: `train_and_evaluate(config, workdir)`, and `build(config)`.

`build` turns a config into a `Run`: the dataset (generated on first use), the job's mesh, the
model, the optimizer and the executor (`anp_jax.executors`) that runs the per-device step
(`anp_jax.steps`). A `Run` is also the handle for interactive use (see the README):
``run.train_step(state, batch)``, ``run.evaluate(state)``.

`train_and_evaluate` is the loop, and only the loop: accept the workdir, build the run, restore
the latest checkpoint (or start fresh, optionally from pretrained weights), then per step:
next batch → `Run.train_step` → metrics every ``log_every_steps`` (fetched before every save,
with a NaN/Inf guard) → evaluation every ``eval_every_steps`` → checkpoint when due → stop at the
target accuracy or on preemption. Process 0 writes the logs (`anp_jax.metrics`, `anp_jax.reporting`).
"""

import dataclasses
import logging
import math
import os
import time
from typing import Any, Dict, List, Optional

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax

from anp_jax import (checkpointing, collectives, distributed, durations, executors, metrics_io,
                     models, optim, preemption, pretrained, reporting)
from anp_jax import evaluators as evaluators_lib
from anp_jax.data import pipeline
from anp_jax.errors import EXIT_PREEMPTED, NonFiniteLossError, Preempted
from anp_jax.executors import Executor
from anp_jax.metrics import MetricWriter, summarize
from anp_jax.research import noise_scale
from anp_jax.setup import Setup, job_identity, resolve_setup, validate_config
from anp_jax.evaluators import classification
from anp_jax.steps import TrainState


@dataclasses.dataclass
class Run:
  """Everything a run is built from; also the handle for interactive use (see README)."""
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
    entry), as ``eval/`` means: every example counted once, padding masked out. For IPython;
    the trainer runs every evaluator of config.evals (`eval_record`)."""
    split = split or default_eval_split(self.config)
    if split not in self._by_split:
      self._by_split[split] = classification.Classification('eval', {'split': split}, self)
    return self._by_split[split].evaluate(state)

  def eval_record(self, state, step: int) -> Dict[str, float]:
    """The metrics of every evaluator of config.evals (``<prefix>/<name>``), plus the progress
    at `step` (``eval/examples_seen``, ``eval/epoch``, ...): one logged record."""
    record = {}
    for prefix in sorted(self.evaluators):
      record.update(self.evaluators[prefix].evaluate(state))
    return {**record, **self.setup.progress(step, 'eval')}

  def train_record(self, pending: List[Any], state, step: int) -> Dict[str, float]:
    """The metric sums of the steps since the last record (`pending`) as logged means, with
    the gradient norm, learning rate, progress and noise scale; raises on a NaN/Inf loss."""
    host = [self.executor.fetch(s) for s in pending]
    grad_norm = float(np.mean([h.pop('_grad_norm') for h in host]))
    record = summarize({k: sum(h[k] for h in host) for k in host[0]}, 'train')
    record['train/grad_norm'] = grad_norm
    record['train/lr'] = float(self.schedule(step - 1))
    record.update(self.setup.progress(step, 'train'))
    if self.config.noise_scale:
      record.update(noise_scale.log_fields(self.executor.fetch(state.noise_ema)))
    loss = record['train/loss']
    if not math.isfinite(loss):
      # The first step of the window whose loss is NaN/Inf: its loss was computed from the
      # state of the step before, which is therefore diverged too (see train_and_evaluate).
      bad = [i for i, h in enumerate(host) if not math.isfinite(float(h['loss']))]
      first = step - len(host) + 1 + bad[0] if bad else step
      raise NonFiniteLossError(
          f'Training stopped: the loss is {loss} at step {step}, first non-finite at step '
          f'{first} (learning rate {record["train/lr"]:.4g}). Lower config.base_lr, add warmup '
          '(config.warmup_epochs) or gradient clipping (config.grad_clip_norm).', step=first)
    return record

  def target_reached(self, evaluated: Optional[Dict[str, float]]) -> bool:
    """Whether the run stops at `evaluated`: config.stop_at_target and config.target_metric >=
    config.target_value."""
    metric = self.config.target_metric
    return bool(self.config.stop_at_target and evaluated and
                evaluated.get(metric, -math.inf) >= self.config.target_value)

  def fetch(self, tree):
    return self.executor.fetch(tree)


def default_eval_split(config) -> str:
  """The split `Run.evaluate` evaluates by default: that of the ``eval`` evaluation."""
  spec = config.evals.get('eval')
  return spec.split if spec is not None and spec.kind == 'classification' else 'validation'


def dataset_meta(builder, config) -> pipeline.DatasetMeta:
  """`pipeline.dataset_meta` with `default_eval_split` as its evaluation split (it reads the
  split from a config field that config.evals replaced)."""
  return pipeline.dataset_meta(
      builder, ml_collections.ConfigDict({'eval_split': default_eval_split(config)}))


def build(config: ml_collections.ConfigDict) -> Run:
  """Validates `config`, prepares the dataset and builds mesh, model, optimizer and executor."""
  validate_config(config)
  return _build_validated(config)


def _build_validated(config: ml_collections.ConfigDict) -> Run:
  builder = pipeline.get_builder(config)
  meta = dataset_meta(builder, config)
  setup = resolve_setup(config, meta.train_size, meta.eval_size)
  mesh = executors.make_run_mesh(config, setup.devices, setup.process_count)
  model = models.create_model(config, meta.num_anps, meta.num_adjectives, meta.num_nouns,
                              axis_name=executors.model_axis_name(config))
  schedule = optim.create_lr_schedule(config, setup.steps_per_epoch, setup.total_steps)
  tx_config = executors.optimizer_config(config)
  # Read and checked here, on the host, before anything compiles.
  init = pretrained.load(config, model) if config.init_from else None
  frozen = pretrained.freeze_summary(config, model)
  tx = pretrained.create_optimizer(tx_config, schedule, init)
  executor = executors.make_executor(tx_config, model, tx, setup, mesh)
  run = Run(config, builder, meta, setup, mesh, model, schedule, tx, executor, init, frozen)
  run.evaluators = evaluators_lib.create_all(config, run)  # Checks their splits: before any write.
  return run


@dataclasses.dataclass
class TrainResult:
  state: TrainState  # Unreplicated final state.
  records: List[Dict[str, float]]  # The train/eval records logged (metrics.jsonl), in order.
  final_eval: Dict[str, float]
  setup: Setup
  wall_time_s: float


def load_checkpoint(workdir: str, step: Optional[int] = None):
  """For IPython: ``model, variables, config = load_checkpoint(workdir)``.

  Rebuilds the model from ``workdir/config.json`` and restores params + BN statistics on the
  default device (no mesh needed); a local-SGD run's node replicas are averaged.
  """
  config, state = checkpointing.restore_state(workdir, step)  # With default.ADDED_FIELDS.
  meta = dataset_meta(pipeline.get_builder(config), config)
  model = models.create_model(config, meta.num_anps, meta.num_adjectives, meta.num_nouns)
  variables = {'params': state['params'], 'batch_stats': state['batch_stats']}
  if config.method == 'local_sgd':  # One replica per node: their average.
    variables = jax.tree.map(lambda x: collectives.replica_mean(np.asarray(x)), variables)
  return model, variables, config


def _announce(run: Run) -> None:
  """The start-up lines: sizes, the method, what is not measured."""
  reporting.say(f'anp_jax | {run.setup.describe()}')
  if run.executor.describe:
    reporting.say(f'anp_jax | {run.executor.describe}')
  if run.frozen:
    reporting.say(f'anp_jax | {run.frozen}')
  # The devices one step's gradient all-reduce spans: a node's under local SGD.
  step_devices = run.setup.devices // dict(run.mesh.shape).get(executors.NODE, 1)
  unmeasurable = (run.config.noise_scale
                  and noise_scale.unmeasurable_reason(run.config.bn_mode, step_devices))
  if unmeasurable:  # Logged as a warning by every process; the terminal line on process 0.
    logging.warning('Noise scale not measured: %s.', unmeasurable)
    reporting.say(f'anp_jax | WARNING: B_simple is not measured: {unmeasurable}.')


def _diverged(error: NonFiniteLossError, ckpt: checkpointing.Checkpointer) -> NonFiniteLossError:
  """The error to raise for a NaN/Inf loss, after making sure no checkpoint holds the diverged
  state: the loss of step s + 1 is computed from the state after step s, so if the first
  non-finite loss is at the step right after a save, that checkpoint is moved aside (the rerun
  with a lower learning rate then resumes from the one before)."""
  ckpt.wait()
  suspect = None if error.step is None else error.step - 1
  if suspect and suspect in ckpt.steps():
    dest = ckpt.move_aside([suspect], reason='diverged')[0]
    note = (f' The checkpoint of step {suspect} gave this loss and was moved aside to {dest}; '
            'earlier checkpoints are intact.')
  else:
    note = ' The checkpoints written before this step are intact.'
  return NonFiniteLossError(str(error) + note, step=error.step)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> TrainResult:
  """Trains `config` with the devices of this job, writing logs (and checkpoints) to `workdir`."""
  t_start = time.time()
  validate_config(config)
  if not str(workdir or '').strip():  # '' would be the current directory.
    raise ValueError('The workdir is empty (--workdir=): give the directory for the logs and '
                     'checkpoints.')
  workdir = os.path.abspath(os.path.expanduser(workdir))
  # Before anything is read or written: every process runs this code, config and workdir.
  distributed.check_same_everywhere('software', distributed.software_identity,
                                    hint=distributed.SAME_SOFTWARE_HINT)
  distributed.check_same_everywhere('configs or workdirs', job_identity(config, workdir))
  is_main = jax.process_index() == 0
  # Nothing in the workdir changes until the run is accepted (config valid, checkpoint ours).
  checkpointing.check_workdir(workdir, require_checkpoint=config.eval_only)

  run = _build_validated(config)
  distributed.check_same_everywhere(
      'datasets', pipeline.dataset_identity(run.builder, run.meta),
      hint='A data_dir of each node\'s own holds another preparation of the dataset there: '
      'prepare every copy from the same source (or share one data_dir).')
  checkpointing.make_workdir(workdir, is_main)
  setup, executor = run.setup, run.executor
  _announce(run)

  # The label sets are part of the identity: a checkpoint of a dataset with other classes would
  # otherwise fail to restore, look corrupt, and the run would silently start again from scratch.
  classes = {'num_anps': run.meta.num_anps, 'num_adjectives': run.meta.num_adjectives,
             'num_nouns': run.meta.num_nouns}
  best_mode = (evaluators_lib.metric_goal(config, config.keep_best_metric).mode
               if config.keep_best_metric else '')
  ckpt = checkpointing.Checkpointer(workdir, config, best_mode=best_mode,
                                    identity_extra={**classes, **(executor.identity or {})})
  state = executor.init()
  restored, start_step = ckpt.restore_latest(executor.restore_target(state))
  if start_step:
    state = executor.from_checkpoint(restored)
    reporting.say(f'Resumed from checkpoint at step {start_step} in {ckpt.directory}')
  if config.eval_only:  # Beside the training logs, which stay as the training wrote them.
    if not start_step:
      ckpt.close()
      raise FileNotFoundError(f'config.eval_only: no checkpoint found in {workdir} (none '
                              'could be restored).')
    final = run.evaluate(state)
    ckpt.close()
    if is_main:
      reporting.write_json_atomic(os.path.join(workdir, 'eval_only_metrics.json'),
                                  {'step': start_step, 'time': time.time(), **final})
    return TrainResult(executor.unreplicate(state), [final], final, setup, time.time() - t_start)
  if run.init is not None and start_step == 0:  # A checkpoint in the workdir wins (resume).
    state = pretrained.place(state, run.init)
    reporting.say(f'anp_jax | {run.init.report}')
  if is_main:  # The run is accepted: record its config.
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  writer = MetricWriter(workdir)
  records = []

  def log(step: int, record: Dict[str, float]) -> None:
    writer.write(step, record)
    records.append({'step': step, **record})

  batches = run.train_batches(start_step)
  bar = reporting.ProgressBar(setup.total_steps, setup.batch_size, start_step,
                              enabled=config.progress_bar)
  pending = []
  final_eval: Dict[str, float] = {}
  step = start_step
  stopped_at_target = False
  run_ahead = preemption.RunAhead()  # Bounds the signal-to-checkpoint delay to a few steps.
  if (config.stop_at_target and 0 < start_step < setup.total_steps
      and start_step % setup.eval_every_steps == 0):
    # A resumed early-stopping run may have stopped at this checkpoint already (only at an
    # evaluation step: elsewhere, e.g. a preemption checkpoint, the run never evaluated, so an
    # evaluation here could stop it where the uninterrupted run would not).
    final_eval = run.eval_record(state, step)
    stopped_at_target = run.target_reached(final_eval)
    if not stopped_at_target:
      final_eval = {}
  try:
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
      # Metrics are fetched (and checked for NaN/Inf) before every save, so a diverged state is
      # never written over good checkpoints.
      if step % config.log_every_steps == 0 or last or save_now:
        try:
          record = run.train_record(pending, state, step)
        except NonFiniteLossError as e:
          raise _diverged(e, ckpt) from None
        pending = []
        record['train/steps_per_s'], record['train/images_per_s'] = bar.rates(step)
        log(step, record)
        bar.update(step, {'loss': record['train/loss'], 'top1': record['train/anp_top1']},
                   force=True)
      else:
        bar.update(step)
      evaluated = None
      if step % setup.eval_every_steps == 0 or last:
        jax.block_until_ready(state)  # The steps dispatched so far are training time.
        t_eval = time.time()
        final_eval = evaluated = run.eval_record(state, step)
        log(step, final_eval)
        bar.close()
        reporting.say(f'eval @ step {step}: {evaluators_lib.summary(config, final_eval)}')
        bar.exclude(time.time() - t_eval)  # Rates after an evaluation count training only.
      if run.target_reached(evaluated):
        stopped_at_target = True
        reporting.say(f'{config.target_metric} = {evaluated[config.target_metric]:.4f} reached '
                      f'config.target_value={config.target_value:g} at step {step}: stopping.')
        save_now = True  # Keep the stopping point (and the progress) in a checkpoint.
      if save_now or evaluated:
        tree = executor.to_checkpoint(state)
        if save_now:
          ckpt.save(step, tree, wall_time_s=time.time() - t_start)
        if evaluated:
          ckpt.save_best(step, tree, evaluated)
      if preempted and not last:
        ckpt.wait()
        logging.warning('Preempted: process %d stops at step %d.', jax.process_index(), step)
        bar.close()
        reporting.say(f'Preempted: checkpoint written at step {step}; exiting with code '
                      f'{EXIT_PREEMPTED} so that the launcher requeues the job.')
        raise Preempted(step)
    if not final_eval:  # Resumed a finished run: report its accuracy again.
      reporting.say(f'The run in {workdir} already finished (step {step}); evaluating its final '
                    'checkpoint. Use another --workdir for a new run.')
      final_eval = run.eval_record(state, step)
  finally:
    bar.close()
    writer.close()
    ckpt.close()
  wall = time.time() - t_start
  final_path = os.path.join(workdir, 'final_metrics.json')
  # A rerun of a finished run trains nothing: its final_metrics.json (training time, whether it
  # stopped at the target) stays as the run wrote it.
  if is_main and not (step == start_step and os.path.exists(final_path)):
    # Its existence means "this run is done" to the sweep: never seen half-written.
    reporting.write_json_atomic(final_path, {
        'step': step, 'wall_time_s': ckpt.restored_wall_time_s + wall,
        'stopped_at_target': stopped_at_target,
        'examples_seen': durations.examples_seen(step, setup.batch_size),
        'passes': durations.passes(step, setup.batch_size, setup.train_size), **final_eval})
  if is_main and records:  # The whole history, earlier segments of a resumed run included.
    reporting.plot_curves(metrics_io.read_metrics(workdir) or records,
                          os.path.join(workdir, 'curves.png'))
  distributed.barrier('train_and_evaluate_end')
  return TrainResult(executor.unreplicate(state), records, final_eval, setup, wall)
