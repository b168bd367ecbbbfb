"""Several seeds at once: runs that differ only in ``config.seed``, trained as one computation.

`train_seed_group(configs, workdirs)` trains a *seed group* (the runs of one study point, same
config but the seed; `refusal` says when runs cannot be one) with one compiled step: the
per-device step of the sync jit executor (`anp_jax.steps.per_device_train_step`) under
`jax.vmap` over a leading seed axis, inside the executor's `jax.shard_map` over the job's mesh.
The state is the seeds' states stacked on axis 0 (replicated, like a run's state); the batch is
the seeds' global batches stacked, ``[S, B, ...]`` sharded ``P(None, 'data')``, so every device
holds its shard of each seed's batch. Under `vmap` the step's collectives (the gradients' and
BatchNorm statistics' all-reduce, the metric sums) reduce each seed's values over the devices
separately: each seed computes what its separate run computes.

Each seed is still its own run, built from the pieces of `anp_jax.trainer` (its `Run` methods
for records, finiteness, evaluation and the target; its checkpointer, config and final-metrics
writers):

* **Initialisation**: `steps.init_state` under `vmap` over the seeds (one program); bit for bit
  the separate runs' initial states (tested).
* **Data**: each seed's own training stream (`pipeline.train_dataset` of its config: its epoch
  order and augmentation), the S host batches of a step stacked. Evaluation data is shared:
  evaluations do not depend on the seed, and each seed's state is evaluated by the group's
  evaluators (one compiled evaluation for all seeds).
* **Logs, checkpoints, results**: each seed writes its own run directory as its separate run
  would (``config.json``, ``metrics.jsonl``, its checkpoints, readable by ``eval_only`` and by a
  resume of that run alone, ``final_metrics.json`` with the same fields). The training rates in
  the logs and ``wall_time_s`` are the group's (each seed advanced one step per group step).
* **Stopping**: each seed stops where its separate run would: at its target (config.stop_at_target;
  with `continuation`, a caller's rule to continue a stopped run with another config, the study
  runner's test continuation, it continues inside the group exactly as the resumed run would),
  at the budget's end, or when it diverges (a NaN/Inf loss or state, checked at the separate
  run's points: every log, evaluation and checkpoint; recorded as the trainer's error). A seed
  that stopped or diverged keeps its slot in the computation (no recompilation) but nothing of it
  is read or written afterwards: its files are those of its stopping step; its slot is fed
  another seed's batch instead of reading its own stream. The group ends when every seed has.
* **Resume**: a group resumes when every seed's latest checkpoint is of the same step; otherwise
  `GroupRefused` (the runner then trains them separately, and says so).

Equal to separate runs to float tolerance, not bit for bit: `vmap` turns each convolution with
per-seed kernels into one grouped convolution (``feature_group_count`` = S) and XLA may order the
reductions otherwise; a step's loss differs by a few ulp (tests/test_seed_group.py states the
tolerance), which over many steps can move a crossing by one evaluation (the test checks a
deterministic CPU run crosses at the same step).

Scope: the sync method on the ``jit`` executor in a job of one process, default input backend,
no ``init_from``. Everything else trains separately (`refusal` gives the one-line reason).

Speed (experiments/seeds_at_once.py, experiments/results/seeds_at_once/): on XLA:CPU the grouped
step is *slower* than the S separate steps: 1.4x their CPU time at 16 examples per device, 2.2x
at 64, 2.4x at 256 (3 seeds, ResNet-20 of the plan_validation:a task, 2 devices on 2 cores). The
grouped convolutions run on a slow path, and a step at 16 per device already keeps both cores
busy, so there is no idle capacity for a batched step to fill. The study runner's
``--seeds_at_once auto`` therefore groups only where a committed measurement of the platform
shows the grouped step faster (`anp_jax.research.runner.seeds_at_once_faster`): never on CPU.
"""

import dataclasses
import functools
import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tensorflow_datasets as tfds
from jax.sharding import PartitionSpec as P

from anp_jax import (checkpointing, phases, preemption, reporting, steps, trainer, workdir_lock)
from anp_jax import evaluators as evaluators_lib
from anp_jax.configs import default as default_config
from anp_jax.data import pipeline
from anp_jax.errors import NonFiniteLossError, Preempted
from anp_jax.executors import common
from anp_jax.metrics import MetricWriter
from anp_jax.setup import validate_config

# Fields in which the runs of one group may differ: the seed, and the metric each stops at (a
# run continued to its test crossing stops at the test metric, the others at validation).
PER_SEED_FIELDS = ('seed', 'target_metric')


class GroupRefused(ValueError):
  """The runs cannot train as one group (raised before anything in their workdirs changed)."""


@dataclasses.dataclass
class SeedOutcome:
  """What one seed of a group did: `result` (as `trainer.train_and_evaluate` returns it) or
  `error` (it diverged: the trainer's error); `continued`: test continuations run in the group."""
  workdir: str
  result: Optional[trainer.TrainResult] = None
  error: Optional[NonFiniteLossError] = None
  continued: int = 0


def _flat(config) -> Dict:
  return default_config.flat_fields(json.loads(config.to_json_best_effort()))


def refusal(configs: Sequence[ml_collections.ConfigDict]) -> str:
  """Why `configs` cannot train as one seed group ('' if they can): fewer than two runs, runs that
  differ in more than `PER_SEED_FIELDS` or repeat a seed, or a case outside the scope (see the
  module docstring)."""
  if len(configs) < 2:
    return 'a single run'
  first = _flat(configs[0])
  for config in configs[1:]:
    other = _flat(config)
    differ = sorted(k for k in set(first) | set(other)
                    if k not in PER_SEED_FIELDS and first.get(k) != other.get(k))
    if differ:
      return f'the runs differ in more than the seed ({", ".join(differ[:3])})'
  seeds = [int(c.seed) for c in configs]
  if len(set(seeds)) != len(seeds):
    return 'two runs have the same seed'
  if not all(0 <= s < 2 ** 31 for s in seeds):
    return 'a seed outside [0, 2^31)'
  c = configs[0]
  if c.method != 'sync' or c.executor != 'jit':
    return (f'method={c.method!r} on executor={c.executor!r}: only the sync method on the jit '
            'executor trains seeds at once')
  if jax.process_count() > 1:
    return 'a job of several processes'
  if c.init_from:
    return 'config.init_from (fine-tuning)'
  if c.input_backend != 'tf':
    return f'input_backend={c.input_backend!r} (only the default tf input)'
  if c.eval_only:
    return 'config.eval_only'
  return ''


def latest_checkpoint_step(workdir: str) -> int:
  """The step of the newest committed checkpoint in `workdir` (0: none), from the listing."""
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    return 0
  return max((int(n) for n in os.listdir(directory)
              if n.isdigit() and os.path.isdir(os.path.join(directory, n))), default=0)


@dataclasses.dataclass
class GroupProgram:
  """The compiled pieces of a group on one `trainer.Run` (the first seed's)."""
  init: Callable  # seeds (int32 [S]) -> the stacked initial state, on the mesh.
  step: Callable  # (stacked state, stacked batch) -> (state, stacked metric sums); state donated.
  take: Callable  # (stacked state, index) -> that seed's state (replicated).
  stack: Callable  # (*states) -> the stacked state.
  finite: Callable  # stacked state -> bool [S]: `steps.all_finite` per seed.
  to_device: Callable  # Host batch [S, local B, ...] -> global array sharded P(None, 'data').
  fetch: Callable


def group_program(run: trainer.Run) -> GroupProgram:
  """`GroupProgram` of `run`'s sync jit executor (`anp_jax.executors.sync`), with a seed axis."""
  config, setup = run.config, run.setup
  train_fn, _, _ = common.per_device_functions(config, run.model, run.tx, setup)
  helper = common.MeshHelper(run.mesh, batch_spec=P(None, common.AXIS))
  replicated = helper.replicated
  options = common.INIT_COMPILER_OPTIONS if jax.default_backend() == 'cpu' else None
  init_one = functools.partial(steps.init_state, run.model, run.tx, config.image_size)
  init = jax.jit(jax.vmap(init_one), compiler_options=options)

  def init_state(seeds):
    # As `common.host_init`: computed once, then put on every device (a transfer, no arithmetic).
    return jax.device_put(jax.device_get(init(jnp.asarray(seeds, jnp.int32))), replicated)

  return GroupProgram(
      init=init_state,
      step=helper.jit_train_step(jax.vmap(functools.partial(train_fn, in_shard_map=True))),
      take=jax.jit(lambda state, i: jax.tree.map(lambda x: x[i], state),
                   out_shardings=replicated),
      stack=jax.jit(lambda *states: jax.tree.map(lambda *x: jnp.stack(x), *states),
                    out_shardings=replicated),
      finite=jax.jit(jax.vmap(steps.all_finite), out_shardings=replicated),
      to_device=helper.to_device, fetch=helper.fetch)


class _Seed:
  """One seed's run inside the group: its config, files and where its logs stand."""

  def __init__(self, index: int, run: trainer.Run, workdir: str):
    self.index, self.run, self.workdir = index, run, workdir
    self.ckpt: Optional[checkpointing.Checkpointer] = None
    self.writer: Optional[MetricWriter] = None
    self.records: List[Dict] = []
    self.since = 0  # Steps after this one are not in a training record yet.
    self.start_step = 0
    self.final_eval: Dict[str, float] = {}
    self.done = False
    self.outcome = SeedOutcome(workdir)

  def log(self, step: int, record: Dict[str, float]) -> None:
    self.writer.write(step, record)
    self.records.append({'step': step, **record})

  def close(self) -> None:
    if self.writer is not None:
      self.writer.close()
      self.writer = None
    if self.ckpt is not None:
      with phases.phase('checkpoint'):
        self.ckpt.close()


def train_seed_group(configs: Sequence[ml_collections.ConfigDict], workdirs: Sequence[str],
                     continuation: Optional[Callable[[int], Optional[ml_collections.ConfigDict]]]
                     = None) -> List[SeedOutcome]:
  """Trains the runs `configs` (a seed group: `refusal` is '') in `workdirs` as one computation
  (module docstring); one `SeedOutcome` per run, in order.

  `continuation(i)`, called after seed i stopped at its target with its files written, returns
  the config it continues with (its workdir's run continued, e.g. to its test crossing) or None.
  Raises `GroupRefused` (nothing changed in the workdirs) when the seeds' checkpoints are of
  different steps or the runs are finished; `Preempted` after checkpointing every seed still
  training."""
  t_start = time.time()
  why = refusal(configs)
  if why:
    raise GroupRefused(why)
  for config in configs:
    validate_config(config)
  workdirs = [os.path.abspath(os.path.expanduser(w)) for w in workdirs]
  starts = {latest_checkpoint_step(w) for w in workdirs}
  if len(starts) > 1:
    raise GroupRefused(f'their checkpoints are of different steps ({sorted(starts)})')
  for w in workdirs:
    checkpointing.check_workdir(w, writable=True)
  run = trainer._build_validated(configs[0])
  if starts.pop() >= run.setup.total_steps:
    raise GroupRefused('their checkpoints are at the end of the budget')
  locks = []
  try:
    for w in workdirs:
      checkpointing.make_workdir(w, True)
      locks.append(workdir_lock.acquire(w))
    seeds = [_Seed(i, dataclasses.replace(run, config=c), w)
             for i, (c, w) in enumerate(zip(configs, workdirs))]
    return _train(run, seeds, continuation, t_start)
  finally:
    for held in locks:
      held.release()


def _train(run: trainer.Run, seeds: List[_Seed], continuation, t_start: float):
  """The loop of `train_seed_group` (that of `trainer._train`, per seed where it differs)."""
  config, setup, executor = run.config, run.setup, run.executor
  prog = group_program(run)
  trainer._announce(run)
  reporting.say(f'anp_jax | {len(seeds)} seeds at once: '
                + ', '.join(str(s.run.config.seed) for s in seeds))
  token = phases.begin('init')
  abstract = jax.eval_shape(functools.partial(steps.init_state, run.model, run.tx,
                                              config.image_size, 0))
  restored = []
  for s in seeds:
    s.ckpt = trainer._checkpointer(s.run, s.workdir)
    restored.append(s.ckpt.restore_latest(executor.restore_target(abstract)))
  start_step = restored[0][1]
  if any(step != start_step for _, step in restored):  # A newest checkpoint was unreadable.
    for s in seeds:
      s.close()
    raise GroupRefused('their readable checkpoints are of different steps '
                       f'({[step for _, step in restored]})')
  if start_step:
    state = prog.stack(*[executor.from_checkpoint(r) for r, _ in restored])
    for s in seeds:
      reporting.say(f'Resumed from checkpoint at step {start_step} in {s.ckpt.directory}')
  else:
    state = prog.init([int(s.run.config.seed) for s in seeds])
  for s in seeds:
    s.start_step = s.since = start_step
    trainer.write_config(s.workdir, s.run.config)
    s.writer = MetricWriter(s.workdir)
  if start_step:
    finite = prog.fetch(prog.finite(state))
    for s in seeds:
      if not finite[s.index]:  # A checkpoint an older version wrote may not be.
        _diverge(s, run.state_diverged(start_step))
  phases.end(token)

  token = phases.begin('train')
  batches = pipeline.transferred(_host_batches(run, seeds, start_step), prog.to_device,
                                 prefetch=2)
  bar = reporting.ProgressBar(setup.total_steps, setup.batch_size, start_step,
                              enabled=config.progress_bar)
  pending: List[list] = []  # [step, stacked metric sums (device), their host copy or None]
  step = start_step
  run_ahead = preemption.RunAhead()

  def host(entry):
    if entry[2] is None:
      entry[2] = prog.fetch(entry[1])
    return entry[2]

  def seed_sums(s: _Seed) -> List[Dict]:
    return [{k: v[s.index] for k, v in host(e).items()} for e in pending if e[0] > s.since]

  def evaluate(s: _Seed, seed_state) -> Dict[str, float]:
    evaluated = s.run.eval_record(seed_state, step)
    s.log(step, evaluated)
    bar.close()
    reporting.say(f'seed {s.run.config.seed}: eval @ step {step}: '
                  f'{evaluators_lib.summary(s.run.config, evaluated)}')
    return evaluated

  try:
    if (config.stop_at_target and 0 < start_step < setup.total_steps
        and start_step % setup.eval_every_steps == 0):
      # As `trainer._train`: a resumed run may have stopped at this checkpoint already.
      for s in _active(seeds):
        try:
          evaluated = s.run.eval_record(prog.take(state, s.index), step)
        except NonFiniteLossError as e:
          _diverge(s, e)
          continue
        if s.run.target_reached(evaluated):
          s.final_eval = evaluated
          _finish(s, step, True, t_start, continuation)
    while step < setup.total_steps and _active(seeds):
      batch = next(batches)
      state, sums = prog.step(state, batch)
      pending.append([step + 1, sums, None])
      run_ahead.push(sums)
      step += 1
      if step == start_step + 1:
        bar.reset_clock(step)
      last = step == setup.total_steps
      evaluate_now = step % setup.eval_every_steps == 0 or last
      active = _active(seeds)
      due = {s.index: s.ckpt.save_due(step, force=last) for s in active}
      preempted = any(p for _, p in due.values())
      finite = None
      if evaluate_now or any(save for save, _ in due.values()):
        finite = prog.fetch(prog.finite(state))
      noise = None
      t_eval = None
      for s in active:
        save_now = due[s.index][0]
        try:
          if step % config.log_every_steps == 0 or last or save_now:
            if noise is None and config.noise_scale:
              noise = prog.fetch(state.noise_ema)
            record = run.host_train_record(
                seed_sums(s), {k: v[s.index] for k, v in noise.items()} if noise else None,
                step)
            s.since = step
            record['train/steps_per_s'], record['train/images_per_s'] = bar.rates(step)
            s.log(step, record)
          if save_now or evaluate_now:  # A result comes only from a finite state.
            run._check_losses([h['loss'] for h in seed_sums(s)], step)
            if not finite[s.index]:
              raise run.state_diverged(step)
          seed_state = evaluated = None
          if evaluate_now:
            if t_eval is None:
              jax.block_until_ready(state)  # The steps dispatched so far are training time.
              t_eval = time.time()
            seed_state = prog.take(state, s.index)
            s.final_eval = evaluated = evaluate(s, seed_state)
          stopped = s.run.target_reached(evaluated)
          if stopped:
            reporting.say(f'seed {s.run.config.seed}: {s.run.config.target_metric} = '
                          f'{evaluated[s.run.config.target_metric]:.4f} reached '
                          f'config.target_value={s.run.config.target_value:g} at step {step}: '
                          'stopping.')
            save_now = True
          if save_now or evaluated:
            with phases.phase('checkpoint'):
              tree = executor.to_checkpoint(
                  seed_state if seed_state is not None else prog.take(state, s.index))
              if save_now:
                s.ckpt.save(step, tree, wall_time_s=time.time() - t_start)
              if evaluated:
                s.ckpt.save_best(step, tree, evaluated)
        except NonFiniteLossError as e:
          _diverge(s, e)
          continue
        if stopped or last:
          _finish(s, step, stopped, t_start, continuation)
      if t_eval is not None:
        bar.exclude(time.time() - t_eval)
      keep = min((s.since for s in _active(seeds)), default=step)
      pending = [e for e in pending if e[0] > keep]
      if preempted and not last and _active(seeds):
        bar.close()
        for s in _active(seeds):
          s.ckpt.wait()
        reporting.say(preemption.stop_message(step))
        raise Preempted(step)
  finally:
    bar.close()
    for s in seeds:
      s.close()
    phases.end(token)
  return [s.outcome for s in seeds]


def _active(seeds: Sequence[_Seed]) -> List[_Seed]:
  return [s for s in seeds if not s.done]


def _host_batches(run: trainer.Run, seeds: Sequence[_Seed], start_step: int):
  """The stacked host batches ``[S, local B, ...]``: each training seed's own stream (its
  separate run's batches); a seed that stopped is fed another's batch (its results are not
  read) and its stream is not read further."""
  setup = run.setup
  streams = [iter(tfds.as_numpy(pipeline.train_dataset(
      run.builder, s.run.config, per_device_batch=setup.per_device_batch,
      num_shards=setup.devices, shards=pipeline.local_shards(run.mesh), start_step=start_step)))
      for s in seeds]
  while True:
    got = {s.index: next(streams[s.index]) for s in seeds if not s.done}
    if not got:
      return
    fill = next(iter(got.values()))
    yield {k: np.stack([got.get(s.index, fill)[k] for s in seeds]) for k in fill}


def _diverge(s: _Seed, error: NonFiniteLossError) -> None:
  """Seed `s` diverged: no checkpoint keeps the diverged state (`trainer._diverged`); it stops."""
  s.outcome.error = trainer._diverged(error, s.ckpt)
  s.done = True
  s.close()
  s.writer = s.ckpt = None


def _finish(s: _Seed, step: int, stopped: bool, t_start: float, continuation) -> None:
  """Seed `s` stopped at `step` (at its target if `stopped`, else at the budget's end): its final
  metrics, as its separate run writes them; then, if `continuation` gives it a config, it goes on
  with that config as its separate run resumed from this checkpoint would."""
  restored_wall = s.ckpt.restored_wall_time_s
  s.close()
  wall = time.time() - t_start
  trainer.write_final(s.run, s.workdir, step, s.start_step, restored_wall + wall, stopped,
                      s.final_eval, s.records)
  s.outcome.result = trainer.TrainResult(None, s.records, s.final_eval, s.run.setup, wall,
                                         step=step)
  s.done = True
  more = continuation(s.index) if (stopped and continuation is not None) else None
  if more is None:
    s.writer = s.ckpt = None
    return
  # The run continued: a new segment from this step, as `trainer._train` resumes it.
  s.run = dataclasses.replace(s.run, config=more)
  trainer.write_config(s.workdir, more)
  s.ckpt = trainer._checkpointer(s.run, s.workdir)
  s.ckpt.restored_wall_time_s = restored_wall + wall
  s.writer = MetricWriter(s.workdir)
  s.records, s.final_eval = [], {}
  s.start_step = s.since = step
  s.done = False
  s.outcome.continued += 1
  reporting.say(f'seed {more.seed}: continuing with {more.target_metric} as its target.')
