"""Checkpoints with exact resume and preemption handling (orbax-checkpoint).

* ``workdir/checkpoints/<step>``: the whole `TrainState` (params, optimizer state, BN statistics,
  step, noise-scale EMAs) plus a JSON record of the run's identity. The data pipeline needs no
  state: its position is a pure function of the step (see `anp_jax.data.pipeline`).
* Saves every ``checkpoint_every_steps`` steps and/or ``checkpoint_every_minutes`` minutes, keep
  the last ``keep_checkpoints``; optionally the best by ``keep_best_metric`` in
  ``workdir/checkpoints_best``. Saves are asynchronous; orbax commits atomically (a checkpoint is
  written under a temporary name and renamed when complete), so a half-written one is never seen.
* Restore goes into targets carrying the *current* mesh's shardings, so a run saved on 8 devices
  resumes on 4. A corrupt latest checkpoint is reported and the previous one used; a checkpoint
  of another model fails with the mismatching fields named.
* Readers (config.eval_only) restore only the fields they read, and beside a job training in the
  workdir they take the newest checkpoint that exists: one removed while they read it (the job's
  keep_checkpoints) is listed again, not called unreadable (`Checkpointer.restore_latest`).
* One writer per array: the state is replicated, and orbax's default on CPU and TPU backends
  ("replica-parallel", every device writes a slice of every replicated array) compiles and runs a
  slicing program per array and device. On 8 CPU devices of one process the first save of
  ResNet-50 blocked training for 18.0 s instead of 0.6 s, later saves 0.85 s instead of 0.27 s
  (experiments/results/checkpoint_overhead). `single_writer_arrays` switches it off, as orbax
  already does on GPUs.
* SIGTERM / SIGUSR1 (what SLURM sends with ``--signal``) set a process-wide flag
  (`anp_jax.preemption`); within a few steps all processes agree on one step, save there, and the
  run exits with `EXIT_PREEMPTED` for the launcher to requeue.
"""

import json
import logging
import math
import os
import shutil
import time
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import jax

from anp_jax import cli, distributed, preemption, reporting
from anp_jax.configs import default as default_config

# Config fields that must match for a checkpoint to be restorable into this run. The data
# position is a function of the step and the batch size (see `anp_jax.data.pipeline`), so a
# resume with another batch_size (or accumulation, BN mode, dtype: another computation) is
# refused rather than silently continued at another point of the data. So is another seed: the
# data order and the augmentation draws are functions of it.
IDENTITY_FIELDS = ('model.name', 'model.width', 'model.adjective_head', 'model.noun_head',
                   'dataset', 'image_size', 'optimizer', 'method', 'batch_size',
                   'grad_accum_steps', 'bn_mode', 'model.dtype', 'init_from', 'freeze',
                   'backbone_lr_multiplier', 'seed')
# What the data is, past its position: a resume that changed one of these would continue on other
# data (another example order, other augmentations, another generated dataset) after a checkpoint
# of this one. Only the fields of the config's augmentation and dataset count (`_data_fields`).
DATA_FIELDS = ('augment',)
DATA_FIELDS_OF = {'augment': {'cifar': ('crop_padding',), 'inception': ('crop_fraction',)},
                  'dataset': {'synthetic_anp': ('synthetic.*',), 'anp': ('anp.config_name',)}}
# Likewise the fields that say which optimizer runs where `optimizer` alone does not: 'optax' is
# any optax function by name (adam and adamw share a state structure, so a resume from one into
# the other would not even fail to restore).
OPTIMIZER_FIELDS_OF = {'optimizer': {'optax': ('optax_name',)}}
# Besides these config fields, the identity holds what they resolve to on the job
# (`Checkpointer`'s identity_extra, from `trainer._checkpointer`): the label sets, the
# executor's state layout, and ``bn_statistics_batch``, the examples each BatchNorm normalises
# over in training (`models.statistics_batch`: bn_group_size with ghost BN, the per-device
# micro-batch with per-device BN, which follows the device count). A resume that changed it
# (another group size, per-device BN on other devices) would train on with other statistics than
# the steps so far; one that keeps it (ghost or global BN on any number of devices or processes)
# resumes. Older checkpoints do not record it and are not compared on it (`identity_diff`).

# Fields an evaluation (config.eval_only) of a checkpoint may set for itself: those that only
# shape the training (the data position and order, the initialisation, the updates, the
# BatchNorm statistics batch: evaluation normalises with the running statistics) and the
# evaluation's own preprocessing (augment / crop_fraction: the centre crop).
IDENTITY_TRAINING_ONLY = ('batch_size', 'grad_accum_steps', 'init_from', 'freeze',
                          'backbone_lr_multiplier', 'seed', 'augment',
                          'crop_padding', 'crop_fraction', 'bn_statistics_batch')


# How many times a reader (config.eval_only) lists the checkpoints again when the one it chose was
# removed while it read it. A job training in the workdir deletes its older checkpoints
# (keep_checkpoints) right after committing a newer one, which the next listing then finds: a
# retry fails only if that one too goes before it is read, i.e. when the job saves faster than a
# checkpoint can be read. No wait between the attempts (waiting would only let the newest age).
READ_ATTEMPTS = 5


def single_writer_arrays() -> None:
  """Makes orbax write each replicated jax.Array once, from its first replica (process 0's first
  device), instead of in slices from all replicas (see the module docstring for the cost).

  orbax takes this setting from its process-wide type-handler registry (StandardSave has no
  per-call option), so it is set there, once (later calls find it done), and only while the
  registered jax.Array handler is orbax's own class: a handler you registered yourself is left
  alone. The format on disk is the same either way; checkpoints written with slices restore as
  before. Sharded arrays (local SGD's per-node state) are still written by the process that
  holds each shard.
  """
  import orbax.checkpoint as ocp
  # What orbax's default handler uses, and its registry's `add`, which (unlike
  # `register_type_handler`) can override without a warning on every run's first screen.
  from orbax.checkpoint._src.metadata import array_metadata_store
  from orbax.checkpoint._src.serialization import type_handler_registry
  global _SINGLE_WRITER
  handlers = ocp.type_handlers
  current = handlers.get_type_handler(jax.Array)
  if current is _SINGLE_WRITER or type(current) is not handlers.ArrayHandler:
    return  # Done already, or a handler of the user's own.
  handler = handlers.ArrayHandler(use_replica_parallel=False,
                                  array_metadata_store=array_metadata_store.Store())
  type_handler_registry.GLOBAL_TYPE_HANDLER_REGISTRY.add(jax.Array, handler, override=True,
                                                         ignore_warnings=True)
  _SINGLE_WRITER = handler


_SINGLE_WRITER = None  # The handler `single_writer_arrays` registered, if any.


def get_field(config, dotted: str):
  """``config.a.b`` for ``'a.b'``; None where a part is absent (configs of older versions)."""
  node = config
  for part in dotted.split('.'):
    node = node.get(part) if hasattr(node, 'get') else None
  return node


def _data_fields(config):
  """`DATA_FIELDS` and those of `DATA_FIELDS_OF` (`OPTIMIZER_FIELDS_OF`) that `config`'s
  augmentation and dataset (optimizer) use (``section.*``: every field of that section)."""
  fields = list(DATA_FIELDS)
  for switch, by_value in {**DATA_FIELDS_OF, **OPTIMIZER_FIELDS_OF}.items():
    for field in by_value.get(get_field(config, switch), ()):
      if field.endswith('.*'):
        section = get_field(config, field[:-2])
        fields += [f'{field[:-2]}.{k}' for k in sorted(section.keys())] if section else []
      else:
        fields.append(field)
  return fields


def identity(config, extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """Config fields (plus `extra`, e.g. a state layout) a restorable checkpoint must share: the
  model, the optimizer and the batch (`IDENTITY_FIELDS`) and the data (`_data_fields`)."""
  fields = list(IDENTITY_FIELDS) + _data_fields(config)
  return {**{k: get_field(config, k) for k in fields}, **(extra or {})}


class Checkpointer:
  """Owns the orbax managers, the save cadence and the preemption flag of one run."""

  def __init__(self, workdir: str, config, identity_extra=None, best_mode: str = '',
               read_only: bool = False):
    """`best_mode`: 'max' or 'min', whether a higher or lower config.keep_best_metric is better
    (the evaluator that logs it knows: `anp_jax.evaluators.metric_goal`); needed with one.

    `read_only` (config.eval_only): restores only; nothing in the workdir is created, cleaned,
    renamed or written (another job may be training there: its saves in flight are orbax
    temporary folders, which only the job holding the workdir lock removes)."""
    import orbax.checkpoint as ocp
    self.best_metric = config.keep_best_metric
    if self.best_metric and best_mode not in ('max', 'min'):
      raise ValueError(f'config.keep_best_metric={self.best_metric!r} needs best_mode '
                       f"'max' or 'min', got {best_mode!r}.")
    self.best_mode = best_mode
    self._ocp = ocp
    self.config = config
    # What else must match (e.g. the async parameter history or the local-SGD node count: a
    # state of another layout would otherwise fail to restore and look like a corrupt file).
    self.identity_extra = dict(identity_extra or {})
    self.directory = os.path.join(workdir, 'checkpoints')
    self.every_steps = int(config.checkpoint_every_steps)  # 0 disables.
    self.every_s = float(config.checkpoint_every_minutes) * 60
    self._last_save_time = time.time()
    self._agreement = preemption.StepAgreement()  # Installs the signal handler (once).
    self._last_saved_step = None  # The step of the latest save (asynchronous: maybe in flight).
    # Training wall time of the earlier segments of a resumed run (from its checkpoint).
    self.restored_wall_time_s = 0.0
    self.read_only = read_only
    if jax.process_index() == 0 and not read_only:
      # Leftovers of a save that was killed midway: this job holds the workdir lock
      # (`anp_jax.workdir_lock`), so no other job's save is in flight here.
      remove_incomplete(self.directory)
    single_writer_arrays()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=int(config.keep_checkpoints),
        enable_async_checkpointing=bool(config.async_checkpointing),
        # The background part of an asynchronous save (the writes, then the wait for the other
        # processes' writes) is bounded like the job's other waits for long work (orbax's own
        # bound, 1200 s, is not the user's to set).
        async_options=ocp.AsyncOptions(timeout_secs=distributed.barrier_timeout_s()),
        create=not read_only)
    self.manager = self._listed(lambda: ocp.CheckpointManager(self.directory, options=options))
    # A reader restores through a handler of its own, not the manager (see `_restore_state`).
    self._reader = ocp.PyTreeCheckpointHandler() if read_only else None
    self.best_directory = os.path.join(workdir, 'checkpoints_best')
    self.best_manager = None  # Made at the first evaluation: a refused resume creates nothing.

  # -- preemption ------------------------------------------------------------------------------

  def save_due(self, step: int, force: bool = False) -> Tuple[bool, bool]:
    """(save now?, preempted?) for the step just dispatched; identical on every process.

    Step-based saves and `force` are the same everywhere by construction; time-based saves
    (process 0's clock) and preemption are agreed through `preemption.StepAgreement`, which
    needs no device collective and no host fetch.
    """
    by_steps = self.every_steps > 0 and step % self.every_steps == 0
    by_time = self.every_s > 0 and time.time() - self._last_save_time >= self.every_s
    save, preempt = self._agreement.due(step, local_save=by_time)
    return bool(save or by_steps or force), bool(preempt)

  # -- save / restore --------------------------------------------------------------------------

  def steps(self):
    """The steps of the checkpoints in the directory."""
    return list(self.manager.all_steps())

  def save(self, step: int, state, wall_time_s: float = 0.0):
    """Saves `state`, a pytree of arrays (all processes must call). ``wall_time_s``: this
    segment's training time so far; the checkpoint records the run's total."""
    self._check_writable('save a checkpoint')
    args = self._save_args(step, state, wall_time_s=self.restored_wall_time_s + wall_time_s)
    if self.manager.latest_step() != step:
      try:
        saved = self.manager.save(step, args=args)
      except Exception as e:
        raise self._save_error(step, e) from e
      if not saved:  # orbax skips a step at or below its latest: never report it as written.
        raise self._save_error(step, RuntimeError(
            f'orbax declined the save (latest checkpoint: step {self.manager.latest_step()})'))
      self._last_saved_step = step
    self._last_save_time = time.time()

  def save_best(self, step: int, state, eval_metrics: Dict[str, float]):
    """After each evaluation: keeps the best state by `keep_best_metric` (if configured)."""
    if not self.best_metric or self.best_metric not in eval_metrics:
      return
    self._check_writable('save the best checkpoint')
    value = float(eval_metrics[self.best_metric])
    if not math.isfinite(value):  # orbax orders NaN as equal to anything: it would be kept.
      raise ValueError(f'{self.best_metric} = {value} at step {step}: a non-finite evaluation '
                       'is never kept as the best checkpoint.')
    if self.best_manager is None:
      metric = self.best_metric
      self.best_manager = self._ocp.CheckpointManager(
          self.best_directory,
          options=self._ocp.CheckpointManagerOptions(
              max_to_keep=1, best_fn=lambda m: m[metric],
              best_mode=self.best_mode,
              keep_checkpoints_without_metrics=False,
              enable_async_checkpointing=False, create=True))
    args = self._save_args(step, state, **{self.best_metric: value})
    self.best_manager.save(step, args=args,
                           metrics={self.best_metric: value})

  def _save_args(self, step: int, item, **extra):
    """The state plus a JSON record of the run's identity (checked on restore)."""
    ocp = self._ocp
    meta = {'step': int(step), 'identity': identity(self.config, self.identity_extra),
            'time': time.time(),
            'process_count': jax.process_count(), 'device_count': jax.device_count(), **extra}
    return ocp.args.Composite(state=ocp.args.StandardSave(item), meta=ocp.args.JsonSave(meta))

  def restore_latest(self, target, fields: Optional[Sequence[str]] = None) -> Tuple[Any, int]:
    """Restores the newest readable checkpoint into `target`, an abstract pytree (shape, dtype
    and sharding per leaf: the executor's `restore_target`, so that a state saved on other
    devices lands on this run's mesh).

    Returns (state, step); (target, 0) when there is none. Falls back past corrupt ones and
    moves them aside (``<step>.unreadable``, kept for inspection; `read_only`: left where they
    are): orbax saves no step at or below its latest, so left in place they would silently
    swallow every save, the preemption save included, until the run passed them. If checkpoints
    exist but none restores (typically a config change that shapes the optimizer state
    differently, e.g. ``grad_clip_norm`` or ``momentum`` switched on), this is an error, never a
    silent restart from step 0.

    `fields` (a reader's, e.g. the evaluation's 'step', 'params', 'batch_stats'): only these
    fields of the state are read, each into its part of `target`, and returned as a dict; the
    others (the optimizer state, the async parameter history) are not read, so their layout in
    this config does not matter.

    A reader lists the checkpoints when it is called (not when it was made: compilation came in
    between), and a checkpoint removed between that listing and the end of its reading, by a job
    training in the workdir whose keep_checkpoints deletes it once a newer one is committed, is
    neither unreadable nor a reason to fall back: the reader lists again and takes the newest,
    at most `READ_ATTEMPTS` times, then stops saying so (FileNotFoundError). In a job of several
    processes every process tries the steps process 0 listed, and all list again when any of
    them found one removed (`_listing`, `_removed_anywhere`): they retry in step, and `_agree`
    still compares one choice, made from one listing.
    """
    if fields is not None and not self.read_only:  # Its manager restores what it saves.
      raise ValueError('Checkpointer.restore_latest: `fields` is for readers (read_only).')
    attempts = READ_ATTEMPTS if self.read_only else 1
    removed = []  # The steps removed while this reader read them, attempt by attempt.
    for attempt in range(attempts):
      found = self._restore_pass(self._listing(), target, fields)
      gone = self._removed_anywhere(found.removed)
      if not gone:
        break
      removed.append(gone)
      if attempt + 1 < attempts:
        which = (f'Checkpoint {gone[0]} was' if len(gone) == 1 else
                 f'Checkpoints {", ".join(map(str, gone))} were')
        reporting.say(f'{which} removed while this evaluation read it, in {self.directory} (a '
                      'job training there deletes its older checkpoints); reading the newest '
                      f'again (attempt {attempt + 2} of {attempts}).')
    else:
      raise FileNotFoundError(
          f'The checkpoints this evaluation chose in {self.directory} were removed while it read '
          f'them, {attempts} times in a row (steps '
          f'{", ".join(str(s) for gone in removed for s in gone)}): a job training in the workdir '
          'deletes its older checkpoints (config.keep_checkpoints) faster than this evaluation '
          'reads one. Nothing was changed; evaluate again, or once that run has ended or keeps '
          'more checkpoints.')
    step, failed = found.step, found.failed
    self._agree(step, failed)
    if step:
      if failed and not self.read_only:
        self.move_aside([s for s, _ in failed], reason='unreadable')
      self.restored_wall_time_s = float(found.meta.get('wall_time_s', 0.0))
      return found.state, step
    if failed:
      newest, reason = failed[0]
      if self.read_only:
        raise ValueError(
            f'None of the {len(failed)} checkpoint(s) in {self.directory} could be read by this '
            f'evaluation (newest, step {newest}: {reason}). Nothing was changed (an evaluation '
            'only reads; a job training in the workdir is not affected). Check that the config '
            "is the run's (its config.json) and that this machine sees the files whole.")
      raise ValueError(
          f'None of the {len(failed)} checkpoint(s) in {self.directory} could be restored into '
          f"this run's state (newest, step {newest}: {reason}). If the config changed a field "
          'that shapes the optimizer state (optimizer, momentum 0 vs not, grad_clip_norm 0 vs '
          'not, freeze, backbone_lr_multiplier), rerun with the config the run started with, or '
          'use a fresh --workdir; if the files are damaged, move the checkpoints folder away to '
          'start over. Nothing was changed.')
    return target, 0

  def _listing(self) -> List[int]:
    """The steps `restore_latest` tries, newest first. A reader reads the directory again, and in
    a job of several processes takes process 0's list: a checkpoint committed between two
    processes' listings would otherwise make them choose different steps. (The training job
    holds the workdir: its list, read when the manager was made, cannot change.)"""
    if self.read_only:
      self._reload()
    steps = sorted(self.manager.all_steps(), reverse=True)
    if self.read_only and self._several_processes():
      steps = json.loads(distributed.exchange('checkpoint_steps', json.dumps(steps),
                                              'lists of checkpoints to read')[0])
    return steps

  def _restore_pass(self, steps: List[int], target, fields) -> '_Pass':
    """Tries `steps` (newest first) until one restores; the newer ones that could not be read
    are `failed`. A reader's pass also ends at a checkpoint removed while it read it
    (`_removed`): that is the writer moving on, not a damaged file."""
    failed = []  # (step, reason) of the newer checkpoints that could not be restored.
    for step in steps:
      meta_path = os.path.join(self.directory, str(step), 'meta', 'metadata')
      try:
        with open(meta_path) as f:
          meta = json.load(f)
      except (OSError, ValueError) as e:
        if self._removed(step, steps):
          return _Pass(failed=failed, removed=step)
        reporting.say(f'WARNING: checkpoint {step} is unreadable ({e}); falling back to an older '
                      'one.', logging.WARNING)
        failed.append((step, f'{type(e).__name__}: {e}'))
        continue
      self._check_identity(meta, step)
      try:
        state = self._restore_state(step, target, fields)
      except Exception as e:  # Corrupt or truncated files, or a state of another layout.
        if self._removed(step, steps):
          return _Pass(failed=failed, removed=step)
        reason = f'{type(e).__name__}: {_short(e)}'
        reporting.say(f'WARNING: checkpoint {step} could not be restored ({reason}); falling '
                      'back to an older one.', logging.WARNING)
        failed.append((step, reason))
        continue
      return _Pass(state=state, step=step, meta=meta, failed=failed)
    return _Pass(failed=failed)

  def _restore_state(self, step: int, target, fields):
    """The state of checkpoint `step`, restored into `target` (only its `fields`: a dict).

    The training job restores through its manager. A reader restores through its own handler:
    orbax's `Checkpointer.restore` ends with a barrier of all processes (a device collective),
    which a process that found the checkpoint removed would never reach, leaving the others
    waiting there instead of listing again with it."""
    ocp = self._ocp
    if not self.read_only:
      return self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target)))['state']
    from etils import epath
    if fields is not None:
      target = {name: getattr(target, name) for name in fields}
    args = ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        partial_restore=fields is not None)
    return self._reader.restore(epath.Path(self.directory) / str(step) / 'state', args=args)

  def _removed(self, step: int, listed: List[int]) -> bool:
    """Whether a reader's failure to read checkpoint `step` (of the listing `listed`) is its
    removal by the job training in the workdir. orbax deletes a checkpoint only after committing
    a newer one (its `_finalize`), so it is when a fresh listing lacks `step` or holds a step
    newer than all of `listed` (the deletion may still be under way). Never for the training job
    itself: nothing removes its checkpoints."""
    if not self.read_only:
      return False
    self._reload()
    now = self.manager.all_steps()
    return step not in now or max(now, default=-1) > max(listed)

  def _reload(self) -> None:
    """A reader's fresh listing of the checkpoints (`_listed`)."""
    self._listed(self.manager.reload)

  def _listed(self, list_steps):
    """`list_steps()` (orbax listing the checkpoints: making the manager, `reload`). orbax's
    listing reads each step's files, so a step the training job deletes meanwhile fails it
    (FileNotFoundError): for a reader that is the writer moving on, and the listing is taken
    again, at most `READ_ATTEMPTS` times. The training job's own listing is never retried."""
    if not self.read_only:
      return list_steps()
    for attempt in range(READ_ATTEMPTS):
      try:
        return list_steps()
      except FileNotFoundError as e:
        gone = e
        if attempt + 1 < READ_ATTEMPTS:
          reporting.say(f'{self.directory} changed while this evaluation listed it ({e.filename} '
                        'was removed: a job training there deletes its older checkpoints); '
                        f'listing it again (attempt {attempt + 2} of {READ_ATTEMPTS}).')
    raise FileNotFoundError(
        f'{self.directory} changed while this evaluation listed it, {READ_ATTEMPTS} times in a '
        f'row (last: {gone.filename} removed): a job training in the workdir deletes its older '
        'checkpoints (config.keep_checkpoints) faster than this evaluation lists them. Nothing '
        'was changed; evaluate again, or once that run has ended or keeps more checkpoints.')

  def _removed_anywhere(self, removed: Optional[int]) -> List[int]:
    """The steps that the processes of this job found removed in this pass (`removed`: this
    process's, or None); a reader only. Any one makes every process list again: they must all
    retry, or some would wait for the others at the next agreement."""
    if not self.read_only:
      return []
    if not self._several_processes():
      return [] if removed is None else [removed]
    by_process = distributed.exchange('checkpoint_removed', json.dumps(removed),
                                      'checkpoints found removed while read')
    return sorted({s for v in by_process.values() if (s := json.loads(v)) is not None})

  @staticmethod
  def _several_processes() -> bool:
    """Whether this job has processes to agree with (through jax.distributed's coordination
    service, whose waits are bounded by ANP_BARRIER_TIMEOUT)."""
    return jax.process_count() > 1 and distributed.coordination_client() is not None

  def _agree(self, step: int, failed) -> None:
    """Every process restored the same step and found the same checkpoints unrestorable (a
    file readable from some nodes only would otherwise start them at different steps, or leave
    some at `move_aside`'s barrier)."""
    distributed.check_same_everywhere(
        'restored checkpoint', {'step': int(step), 'unrestorable': [int(s) for s, _ in failed]},
        hint=f'Some processes could not read checkpoints in {self.directory} that others could: '
        'check that every node sees the same files (a shared file system, no stale cache).')

  def move_aside(self, steps, reason: str):
    """Renames checkpoints to ``<step>.<reason>[.N]`` (kept for inspection, never restored);
    process 0 renames, every process then reloads the manager's step list. Returns the new
    paths."""
    self._check_writable('move checkpoints aside')
    moved = []
    for step in steps:
      source = os.path.join(self.directory, str(step))
      dest, n = f'{source}.{reason}', 1
      while os.path.exists(dest):
        dest, n = f'{source}.{reason}.{n}', n + 1
      moved.append(dest)
      if jax.process_index() == 0:
        os.rename(source, dest)
        reporting.say(f'WARNING: moved the {reason} checkpoint {step} to {dest}.',
                      logging.WARNING)
    distributed.barrier('checkpoints_moved_aside')
    self.manager.reload()
    return moved

  def _check_writable(self, what: str) -> None:
    if self.read_only:
      raise RuntimeError(f'A read-only Checkpointer (config.eval_only) cannot {what}.')

  def _check_identity(self, meta, step):
    diff = identity_diff(meta.get('identity', {}), identity(self.config, self.identity_extra),
                         eval_only=self.config.eval_only)
    if diff:
      detail = ', '.join(f'{k}: checkpoint {a!r} vs config {b!r}' for k, (a, b) in diff.items())
      raise ValueError(f'The checkpoint at step {step} in {self.directory} belongs to another '
                       f'configuration ({detail}). Use a fresh --workdir or the matching config.')

  def _save_error(self, step, error) -> OSError:
    good = [s for s in self.manager.all_steps() if s != step]
    # orbax's waits for the other processes (its barriers, ANP_BARRIER_TIMEOUT above) ran out.
    if isinstance(error, TimeoutError) or 'DEADLINE_EXCEEDED' in str(error):
      remedy = (f'another process did not finish its part of the save within '
                f'{distributed.barrier_timeout_s()} s (ANP_BARRIER_TIMEOUT): its log says why')
    else:
      remedy = 'free disk space or fix the workdir'
    return OSError(f'Saving the checkpoint of step {step} in {self.directory} failed '
                   f'({type(error).__name__}: {error}). Checkpoints saved before are intact '
                   f'(latest: {max(good) if good else "none"}); {remedy}, then rerun the same '
                   'command to resume.')

  def wait(self):
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # An asynchronous save failed: name its step, not the last good one.
      step = self._last_saved_step
      raise self._save_error(self.manager.latest_step() if step is None else step, e) from e

  def close(self):
    self.wait()
    self.manager.close()
    if self._reader is not None:
      self._reader.close()
    if self.best_manager is not None:
      self.best_manager.close()


class _Pass(NamedTuple):
  """What one pass of `Checkpointer.restore_latest` over a listing found."""
  state: Any = None  # The restored state (None if no checkpoint restored).
  step: int = 0  # Its step (0: none).
  meta: Optional[Dict[str, Any]] = None  # Its JSON record.
  failed: Sequence[Tuple[int, str]] = ()  # (step, reason) of the newer ones not readable.
  removed: Optional[int] = None  # A reader's: the step removed while it read it (pass ended).


def identity_diff(saved: Dict[str, Any], current: Dict[str, Any],
                  eval_only: bool = False) -> Dict[str, Tuple[Any, Any]]:
  """(saved, current) of every identity entry on which a checkpoint's recorded identity and this
  run's differ. An entry the checkpoint does not record is compared with the value older runs
  used where the one registry of fields added later knows it (`default.ADDED_FIELDS`: the field
  did not exist, every run had that value), and not compared otherwise (the field existed, it
  was only recorded later: its value is unknown). With `eval_only`, the
  `IDENTITY_TRAINING_ONLY` entries are not compared either."""
  added = default_config.ADDED_FIELDS
  diff = {}
  for key, value in current.items():
    if eval_only and key in IDENTITY_TRAINING_ONLY:
      continue
    if key in saved:
      old = saved[key]
    elif key in added:
      old = added[key]
    else:
      continue
    if _as_recorded(old) != _as_recorded(value):  # A tuple is recorded as a list.
      diff[key] = (old, value)
  return diff


def _as_recorded(value):
  return json.loads(json.dumps(value, default=repr))


def has_checkpoint(workdir: str) -> bool:
  """Whether ``workdir/checkpoints`` holds a committed checkpoint (a ``<step>`` directory)."""
  directory = os.path.join(workdir, 'checkpoints')
  return os.path.isdir(directory) and any(
      name.isdigit() and os.path.isdir(os.path.join(directory, name))
      for name in os.listdir(directory))


def check_workdir(workdir: str, require_checkpoint: bool = False,
                  writable: bool = True) -> None:
  """Refuses an unusable workdir before anything is built; creates and changes nothing.

  A run that is refused later (bad config, another model's checkpoint) must leave no trace, so
  the directory is only created once the run is accepted (`make_workdir`). ``require_checkpoint``
  (evaluation only): a missing checkpoint, e.g. a typo in the path, is an error instead of an
  evaluation of a randomly initialised model. ``writable=False``: a reader (evaluation only),
  which may read another user's read-only workdir.
  """
  if os.path.isfile(workdir):
    raise FileExistsError(f'The workdir {workdir!r} is a file, not a directory; pass another '
                          '--workdir.')
  if require_checkpoint and not has_checkpoint(workdir):
    raise FileNotFoundError(f'config.eval_only: no checkpoint found in {workdir} (nothing under '
                            f'{os.path.join(workdir, "checkpoints")}); check --workdir.')
  if not writable:
    return
  parent = cli.nearest_existing(workdir)
  if not os.path.isdir(parent):
    raise PermissionError(f'The workdir {workdir!r} is not writable: {parent!r} is a file.')
  if not os.access(parent, os.W_OK | os.X_OK):
    raise PermissionError(f'The workdir {workdir!r} is not writable (no write permission on '
                          f'{parent!r}).')


def make_workdir(workdir: str, is_main: bool) -> None:
  """Creates `workdir` and proves it writable (process 0 writes a probe file)."""
  try:
    os.makedirs(workdir, exist_ok=True)
    if is_main:
      probe = os.path.join(workdir, '.write_test')
      with open(probe, 'w') as f:
        f.write('ok')
      os.remove(probe)
  except OSError as e:
    raise PermissionError(f'The workdir {workdir!r} is not writable: {e}') from e


def restore_state(workdir: str, step: Optional[int] = None):
  """(config, state) of a workdir's checkpoint (the latest, or `step`), on this process's first
  device, also when other devices or processes saved it.

  The state is the plain pytree that was saved (nested dicts of arrays, no executor layout);
  the config is ``workdir/config.json`` (`default.read_run_config`: older versions' configs
  get the fields added since). Reads only.
  """
  import orbax.checkpoint as ocp
  workdir = os.path.abspath(os.path.expanduser(workdir))  # orbax needs absolute paths.
  config = default_config.read_run_config(workdir)
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'No checkpoint in {directory}.')
  # A reader: creates, cleans and writes nothing (a job may be training in `workdir`).
  with ocp.CheckpointManager(directory,
                             options=ocp.CheckpointManagerOptions(create=False)) as manager:
    step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f'No checkpoint in {directory}.')
  # Onto this process's first device, whatever devices saved it: the shardings recorded in the
  # checkpoint name the saving job's devices (8 simulated ones, or other processes' GPUs), which
  # orbax refuses to restore into ("Topology mismatch") where they do not exist.
  path = os.path.join(directory, str(step), 'state')
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  with ocp.StandardCheckpointer() as checkpointer:
    with reporting.hidden_log_messages(reporting.ORBAX_ITEM_METADATA):
      metadata = checkpointer.metadata(path).item_metadata
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          metadata)
    state = checkpointer.restore(path, target)
  return config, state


def _short(error: Exception, limit: int = 300) -> str:
  """An orbax/tensorstore error on one line, cut to `limit` characters."""
  text = ' '.join(str(error).split())
  return text if len(text) <= limit else text[:limit] + ' ...'


def remove_incomplete(directory: str):
  """Deletes orbax temporary directories left by a killed save (they are never restored)."""
  if not os.path.isdir(directory):
    return
  for name in os.listdir(directory):
    if '.orbax-checkpoint-tmp' in name:
      shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
