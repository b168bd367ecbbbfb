"""config.eval_only (issue 42, items 1 and 4).

Beside a live training job: the job's keep_checkpoints deletes a checkpoint as soon as it commits a
newer one, possibly while an evaluation reads it. The evaluation then reads the newest one again
(a bounded number of times), never calls the removed one unreadable, never advises moving the live
run's checkpoints away, and moves nothing. Simulated deterministically (the "writer" commits a
newer checkpoint and deletes the one being read at a chosen point), and for real beside a training
subprocess.

What it restores: only what evaluation reads (step, parameters, BatchNorm statistics), so that the
fields that only shape training (freeze, grad_clip_norm, momentum, init_from, whose file may be
gone) may differ from the run's, with every executor (jit sync, pmap, async, local SGD).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import orbax.checkpoint as ocp
import pytest

from anp_jax import checkpointing, trainer
from conftest import ROOT, finish, launch, main_cmd, subprocess_env, tiny_config

# The advice the reader gave for a checkpoint the live run had deleted (issue 42, item 1).
DESTRUCTIVE = 'move the checkpoints folder away'


def _evaluate(data_dir, workdir, **overrides):
  config = tiny_config(data_dir, **dict(dict(num_train_steps=6, eval_only=True), **overrides))
  return trainer.train_and_evaluate(config, str(workdir))


def _model_metrics(record):
  """An evaluation record without the progress at its step (examples seen, passes, epoch)."""
  return {k: v for k, v in record.items()
          if k not in ('eval/examples_seen', 'eval/passes', 'eval/epoch')}


def _names(workdir):
  return sorted(os.listdir(workdir / 'checkpoints'))


@pytest.fixture(scope='module')
def finished(data_dir, tmp_path_factory):
  """A finished 6-step run whose only checkpoint is its last (as a live run with
  keep_checkpoints=1 has one), and its own evaluation of it."""
  workdir = tmp_path_factory.mktemp('finished')
  result = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=6), str(workdir))
  assert _names(workdir) == ['6']
  return workdir, result.final_eval


@pytest.fixture(scope='module')
def plain(data_dir, finished):
  """eval_only of `finished` with the run's own config."""
  return _evaluate(data_dir, finished[0])


@pytest.fixture
def live(finished, tmp_path):
  """A copy of `finished` for a test whose simulated writer changes its checkpoints."""
  workdir = tmp_path / 'live'
  shutil.copytree(finished[0], workdir)
  return workdir


def _writer_saves_next(directory, step):
  """What the training job's next save does with keep_checkpoints=1 (orbax `_finalize`): commit
  checkpoint step + 1 (here a copy of `step`: written under a temporary name, then renamed), then
  delete `step`. Returns the new step."""
  tmp = os.path.join(directory, f'{step + 1}.orbax-checkpoint-tmp-1')
  shutil.copytree(os.path.join(directory, str(step)), tmp)
  os.rename(tmp, os.path.join(directory, str(step + 1)))
  shutil.rmtree(os.path.join(directory, str(step)))
  return step + 1


def _inside(path):
  """(the checkpoints directory, the step) of a path inside a checkpoint:
  .../checkpoints/<step>/..."""
  parts = os.path.normpath(str(path)).split(os.sep)
  at = parts.index('checkpoints')
  return os.sep.join(parts[:at + 1]), int(parts[at + 1])


def _on_meta_open(monkeypatch, times):
  """The writer saves its next checkpoint (deleting the one being read) when the reader opens a
  checkpoint's metadata, the first `times` times: between the reader's listing and its opening.
  Returns the steps removed so (a list that grows)."""
  real_open = open
  removed = []

  def hooked(path, *args, **kwargs):
    if str(path).endswith(os.path.join('meta', 'metadata')) and len(removed) < times:
      directory, step = _inside(path)
      removed.append(step)
      _writer_saves_next(directory, step)
    return real_open(path, *args, **kwargs)
  monkeypatch.setattr(checkpointing, 'open', hooked, raising=False)
  return removed


def test_a_checkpoint_removed_between_listing_and_opening_is_listed_again(data_dir, live,
                                                                          plain, monkeypatch,
                                                                          capsys):
  """Was: 'checkpoint 6 is unreadable', then 'None of the 1 checkpoint(s) ... move the
  checkpoints folder away to start over' (exit 2)."""
  removed = _on_meta_open(monkeypatch, times=1)
  result = _evaluate(data_dir, live)
  out = capsys.readouterr().out
  assert removed == [6] and result.step == 7
  assert _model_metrics(result.final_eval) == _model_metrics(plain.final_eval)  # 6's state.
  assert 'Checkpoint 6' in out and 'was removed while this evaluation read it' in out
  assert 'unreadable' not in out and DESTRUCTIVE not in out
  assert _names(live) == ['7']  # Nothing moved aside or written.


def test_a_checkpoint_removed_while_its_arrays_are_restored_is_listed_again(data_dir, live,
                                                                           plain, monkeypatch,
                                                                           capsys):
  """The checkpoint goes during orbax's restore of its arrays (after its metadata was read)."""
  real_restore = ocp.PyTreeCheckpointHandler.restore
  removed = []

  def hooked(self, directory, *args, **kwargs):
    if not removed:
      checkpoints, step = _inside(directory)
      removed.append(step)
      _writer_saves_next(checkpoints, step)
    return real_restore(self, directory, *args, **kwargs)
  monkeypatch.setattr(ocp.PyTreeCheckpointHandler, 'restore', hooked)
  result = _evaluate(data_dir, live)
  out = capsys.readouterr().out
  assert removed == [6] and result.step == 7
  assert _model_metrics(result.final_eval) == _model_metrics(plain.final_eval)
  assert 'could not be restored' not in out and DESTRUCTIVE not in out
  assert _names(live) == ['7']


def test_a_checkpoint_removed_while_orbax_lists_the_folder_is_listed_again(data_dir, live,
                                                                          plain, monkeypatch,
                                                                          capsys):
  """orbax's listing (making the manager, `reload`) reads each step's files: a step the writer
  deleted meanwhile raised FileNotFoundError out of the reader ('ERROR: [Errno 2] No such file or
  directory: .../checkpoints/34', exit 2; seen beside a live job under load)."""
  real_reload = ocp.CheckpointManager.reload
  removed = []

  def hooked(self, *args, **kwargs):
    if not removed:  # The writer moves on while the reader lists: 6 goes mid-listing.
      removed.append(6)
      _writer_saves_next(str(live / 'checkpoints'), 6)
      raise FileNotFoundError(2, 'No such file or directory', str(live / 'checkpoints' / '6'))
    return real_reload(self, *args, **kwargs)
  monkeypatch.setattr(ocp.CheckpointManager, 'reload', hooked)
  result = _evaluate(data_dir, live)
  out = capsys.readouterr().out
  assert removed == [6] and result.step == 7
  assert _model_metrics(result.final_eval) == _model_metrics(plain.final_eval)
  assert 'listing it again' in out and DESTRUCTIVE not in out
  assert _names(live) == ['7']


def test_a_listing_that_never_settles_gives_a_bounded_clear_error(data_dir, live, monkeypatch):
  def always(self, *args, **kwargs):
    raise FileNotFoundError(2, 'No such file or directory', str(live / 'checkpoints' / '6'))
  monkeypatch.setattr(ocp.CheckpointManager, 'reload', always)
  with pytest.raises(FileNotFoundError, match=r'changed while this evaluation listed it, '
                     f'{checkpointing.READ_ATTEMPTS} times in a row'):
    _evaluate(data_dir, live)
  assert _names(live) == ['6']


def test_a_writer_faster_than_the_reader_gives_a_bounded_clear_error(data_dir, live,
                                                                     monkeypatch):
  """Every checkpoint the reader chooses is gone before it reads it: it stops after
  READ_ATTEMPTS listings, saying so, and changes nothing."""
  removed = _on_meta_open(monkeypatch, times=100)
  with pytest.raises(FileNotFoundError) as info:
    _evaluate(data_dir, live)
  message = str(info.value)
  attempts = checkpointing.READ_ATTEMPTS
  assert 2 <= attempts <= 10 and len(removed) == attempts
  assert f'removed while it read them, {attempts} times in a row' in message
  assert 'keep_checkpoints' in message and DESTRUCTIVE not in message
  assert _names(live) == [str(6 + attempts)]  # Only the writer's doing.


def test_an_unreadable_checkpoint_is_reported_without_advice_to_move_it(data_dir, live):
  """A reader whose only checkpoint is damaged (no writer) fails, names it, moves nothing, and
  gives no advice that would harm a job training in the workdir."""
  meta = live / 'checkpoints' / '6' / 'meta' / 'metadata'
  meta.write_text('{"step": 6, "ident')
  with pytest.raises(ValueError) as info:
    _evaluate(data_dir, live)
  assert 'None of the 1 checkpoint(s)' in str(info.value) and 'step 6' in str(info.value)
  assert DESTRUCTIVE not in str(info.value) and 'Nothing was changed' in str(info.value)
  assert _names(live) == ['6'] and meta.read_text() == '{"step": 6, "ident'


def test_an_unreadable_newest_checkpoint_falls_back_and_stays_in_place(data_dir, live, plain,
                                                                       capsys):
  """No writer, a damaged newest checkpoint 7: the reader falls back to 6 (what the training job
  would resume from), and leaves 7 where it is (only the training job moves checkpoints)."""
  shutil.copytree(live / 'checkpoints' / '6', live / 'checkpoints' / '7')
  (live / 'checkpoints' / '7' / 'meta' / 'metadata').write_text('{"step": 7, "ident')
  result = _evaluate(data_dir, live)
  assert result.step == 6 and result.final_eval == plain.final_eval
  assert 'checkpoint 7 is unreadable' in capsys.readouterr().out
  assert _names(live) == ['6', '7']


def _output(proc):
  return proc.stdout + proc.stderr


@pytest.mark.slow(50)
def test_eval_only_beside_a_live_training_job_succeeds_every_time(data_dir, tmp_path):
  """The issue's reproduction: a job saving every step and keeping 1 checkpoint, evaluated 3
  times while it trains (was: 3 of 3 exit 2, advising to move its checkpoints away)."""
  workdir = tmp_path / 'live'
  log = open(tmp_path / 'writer.log', 'w')
  writer = subprocess.Popen(
      main_cmd(data_dir, workdir, num_train_steps=100000, checkpoint_every_steps=1,
               keep_checkpoints=1, async_checkpointing=True),
      env=subprocess_env(1), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
  try:
    deadline = time.time() + 300
    while not checkpointing.has_checkpoint(str(workdir)) and time.time() < deadline:
      assert writer.poll() is None, open(tmp_path / 'writer.log').read()[-3000:]
      time.sleep(0.2)
    assert checkpointing.has_checkpoint(str(workdir)), 'the training job saved nothing in 300 s'
    steps = []
    for _ in range(3):
      proc = subprocess.run(main_cmd(data_dir, workdir, eval_only=True), env=subprocess_env(1),
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
      assert proc.returncode == 0, _output(proc)[-3000:]
      assert DESTRUCTIVE not in _output(proc)
      steps.append(json.loads(proc.stdout.split('Results: ', 1)[1].splitlines()[0])['step'])
      assert writer.poll() is None, 'the training job stopped'
    assert steps == sorted(steps) and steps[0] > 0, steps
  finally:
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    log.close()
  assert not any(n.endswith('.unreadable') for n in os.listdir(workdir / 'checkpoints'))


# `python -m anp_jax.main` in which process 1 alone sees the training job's next save (it commits
# step + 1, a copy, and deletes the step) just before it opens the newest checkpoint: after process
# 0's listing, which every process reads, and while process 0 may be reading that checkpoint.
MAIN_WITH_A_WRITER_ON_PROCESS_1 = r'''
import os, runpy, shutil, sys
from anp_jax import checkpointing
real_open, done = open, []

def hooked(path, *args, **kwargs):
  path_text = str(path)
  if (os.environ['ANP_PROCESS_ID'] == '1' and not done
      and path_text.endswith(os.path.join('meta', 'metadata'))):
    step_dir = os.path.dirname(os.path.dirname(path_text))
    directory, step = os.path.dirname(step_dir), int(os.path.basename(step_dir))
    done.append(step)
    tmp = os.path.join(directory, f'{step + 1}.orbax-checkpoint-tmp-1')
    shutil.copytree(step_dir, tmp)
    os.rename(tmp, os.path.join(directory, str(step + 1)))
    shutil.rmtree(step_dir)
  return real_open(path, *args, **kwargs)

checkpointing.open = hooked
sys.argv = ['anp_jax.main'] + sys.argv[1:]
runpy.run_module('anp_jax.main', run_name='__main__')
'''


@pytest.mark.slow(25)
def test_processes_of_a_job_read_again_together_when_one_finds_a_checkpoint_removed(
    data_dir, live, tmp_path):
  """Two processes: process 1 finds checkpoint 6 removed, process 0 may have read it whole. Both
  list again (process 0's list) and evaluate step 7 (was: process 1 alone called 6 unreadable;
  a process left in orbax's restore barrier would have waited for the other)."""
  cmd = [sys.executable, '-c', MAIN_WITH_A_WRITER_ON_PROCESS_1] + main_cmd(
      data_dir, live, num_train_steps=6, eval_only=True)[3:]
  procs = launch(cmd, 2, 1, tmp_path)
  logs = finish(procs, tmp_path)
  assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  assert 'Evaluated the checkpoint of step 7' in logs[0], logs[0][-3000:]
  assert 'Checkpoint 6' in logs[0] and 'was removed while this evaluation read it' in logs[0]
  assert not any('unreadable' in log or DESTRUCTIVE in log for log in logs)
  assert _names(live) == ['7']


# ----------------------------------------------------------------------------------------------
# Item 4: evaluation restores what it reads, so training-only fields may differ.


@pytest.mark.parametrize('changed', [{'freeze': 'bn_init/.*'}, {'grad_clip_norm': 1.0},
                                     {'momentum': 0.0}])
def test_eval_only_may_change_what_only_shapes_training(data_dir, finished, plain, changed):
  """Was: exit 2, 'tree structures do not match: opt_state' (the optimizer state of the changed
  config has another layout)."""
  result = _evaluate(data_dir, finished[0], **changed)
  assert result.step == plain.step == 6
  assert result.final_eval == plain.final_eval
  assert plain.final_eval['eval/anp_top1'] == pytest.approx(finished[1]['eval/anp_top1'])
  assert plain.final_eval['eval/loss'] == pytest.approx(finished[1]['eval/loss'], rel=1e-6)


@pytest.mark.slow(15)
def test_eval_only_of_a_fine_tuned_run_needs_no_init_from_file(data_dir, tmp_path):
  """A run fine-tuned from another run's weights (freeze, a backbone learning-rate multiplier:
  another optimizer-state layout) is evaluated with its own config after the weights it started
  from were deleted (was: exit 2, 'config.init_from=... does not exist')."""
  pre = tmp_path / 'pre'
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=2), str(pre))
  common = dict(init_from=str(pre), init_exclude=('head_.*',), freeze='conv_init/.*',
                backbone_lr_multiplier=0.1, num_train_steps=3)
  tuned = trainer.train_and_evaluate(tiny_config(data_dir, **common), str(tmp_path / 'tuned'))
  shutil.rmtree(pre)
  result = _evaluate(data_dir, tmp_path / 'tuned', **common)
  assert result.step == 3
  assert result.final_eval['eval/anp_top1'] == pytest.approx(tuned.final_eval['eval/anp_top1'])
  assert result.final_eval['eval/loss'] == pytest.approx(tuned.final_eval['eval/loss'], rel=1e-6)


EXECUTORS = {
    'jit sync': {},
    'pmap': {'executor': 'pmap'},
    'async': {'method': 'async', 'async_sgd.staleness': 'constant', 'async_sgd.tau': 1,
              'async_sgd.max_tau': 2},
    'local_sgd': {'method': 'local_sgd', 'local_sgd.nodes': 2, 'local_sgd.sync_every': 2},
}


@pytest.mark.slow(12)
@pytest.mark.parametrize('name', list(EXECUTORS))
def test_eval_only_works_for_every_executor(data_dir, tmp_path, name):
  """Each executor's checkpoint evaluated as the training evaluated its state, also with a
  changed optimizer layout (grad_clip_norm): only the step, parameters and BN statistics are
  read (async's parameter history and local SGD's per-node optimizer state are not)."""
  common = dict(num_train_steps=3, noise_scale=False, **EXECUTORS[name])
  trained = trainer.train_and_evaluate(tiny_config(data_dir, **common), str(tmp_path))
  for changed in ({}, {'grad_clip_norm': 1.0}):
    result = _evaluate(data_dir, tmp_path, **common, **changed)
    assert result.step == 3 and int(result.state.step) == 3
    for key, value in trained.final_eval.items():
      assert result.final_eval[key] == pytest.approx(value, rel=1e-6), key
  assert _names(tmp_path) == ['3']


# ----------------------------------------------------------------------------------------------
# Issue 45, item 5: from the command line, eval_only starts from the run's recorded config.


def _eval_cli(workdir, *flags):
  """``python -m anp_jax.main --workdir=W --config.eval_only=True FLAGS``: no training flag."""
  return subprocess.run([sys.executable, '-m', 'anp_jax.main', f'--workdir={workdir}',
                         '--config.eval_only=True', *flags], env=subprocess_env(2), cwd=ROOT,
                        capture_output=True, text=True, timeout=600)


def _results(proc):
  return json.loads(proc.stdout.split('Results: ', 1)[1].splitlines()[0])


@pytest.mark.slow(20)
def test_eval_only_needs_no_training_flag(finished):
  """The run's own config.json (tiny: another model, image size and dataset than the default
  config) is what an evaluation starts from. Was: exit 2, 'The checkpoint at step 6 ... belongs
  to another configuration (model.name: checkpoint 'resnet8' vs config 'resnet20', ...). Use a
  fresh --workdir or the matching config.'"""
  workdir, final_eval = finished
  proc = _eval_cli(workdir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"evaluating with the run's config ({workdir}/config.json)" in proc.stdout
  got = _results(proc)
  assert got['step'] == 6 and got['eval/anp_top1'] == pytest.approx(final_eval['eval/anp_top1'])
  assert got['eval/loss'] == pytest.approx(final_eval['eval/loss'], rel=1e-6)


@pytest.mark.slow(20)
def test_eval_only_takes_evaluation_settings_and_keeps_the_runs_training(finished):
  """What an evaluation may choose (here the split and the batch) comes from the command line;
  a training setting that differs from the run's is not used, and said so (the progress fields
  still count the run's batch size)."""
  workdir, final_eval = finished
  proc = _eval_cli(workdir, '--config.evals.eval.split=test', '--config.eval_batch_size=8',
                   '--config.batch_size=64', '--config.base_lr=0.9')
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(l for l in proc.stdout.splitlines() if "evaluating with the run's config" in l)
  assert '--config.evals.eval.split=test' in line and '--config.eval_batch_size=8' in line
  assert 'not used' in line and '--config.base_lr=0.9 (the run: 0.2)' in line, line
  assert '--config.batch_size=64 (the run: 32)' in line, line
  got = _results(proc)
  assert got['eval/examples_seen'] == 6 * 32  # The run's batch size.
  assert got['eval/anp_top1'] != final_eval['eval/anp_top1'] or (
      got['eval/loss'] != pytest.approx(final_eval['eval/loss']))  # Another split.


def test_eval_only_refuses_another_model_with_advice_for_an_evaluation(finished):
  """Exit 2, one line that names the flag and the run's value; not 'use a fresh --workdir'."""
  workdir, _ = finished
  proc = _eval_cli(workdir, '--config.model.name=resnet20')
  assert proc.returncode == 2, proc.stderr[-3000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith('ERROR')]
  assert len(errors) == 1, proc.stderr
  assert ("--config.model.name=resnet20: the run in" in errors[0]
          and "was trained with model.name='resnet8'" in errors[0]
          and 'drop the flag' in errors[0] and 'fresh --workdir' not in errors[0]), errors[0]
