"""Checkpoints: exact resume after kill -9 (also mid-save, and mid-batch across an epoch
boundary), SIGTERM preemption, fewer devices, corrupt checkpoints, incompatible configs, NaN
safety, eval-only and load_checkpoint; a refused or failed run leaves its workdir as it was,
eval-only needs a checkpoint and writes nothing."""

import json
import os
import random
import signal
import subprocess
import sys
import time
import types

import jax
import numpy as np
import pytest

from anp_jax import checkpointing, errors, metrics, trainer
from conftest import (ROOT, assert_leaves_close, assert_resume_is_exact, leaves, main_cmd,
                      subprocess_env, tiny_config)

STEPS = 24  # Of the uninterrupted run that the kill/SIGTERM tests must end equal to.


def _cmd(data_dir, workdir, steps=STEPS, every=3, **extra):
  return main_cmd(data_dir, workdir, num_train_steps=steps, checkpoint_every_steps=every,
                  log_every_steps=1, async_checkpointing=True, **extra)


def _run(cmd, devices=8, timeout=600):
  return subprocess.run(cmd, env=subprocess_env(devices), capture_output=True, text=True,
                        timeout=timeout, cwd=ROOT)


def _popen(cmd, **kw):
  return subprocess.Popen(cmd, env=subprocess_env(), cwd=ROOT, **kw)


def _final_params(workdir):
  _, variables, _ = trainer.load_checkpoint(str(workdir))
  return leaves(variables)


def _logged_steps(workdir, skip_lines=0):
  """The highest training step logged after the first `skip_lines` lines of metrics.jsonl."""
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return 0
  lines = open(path).read().splitlines()[skip_lines:]
  steps = [json.loads(l)['step'] for l in lines if l.endswith('}') and 'train/loss' in l]
  return max(steps, default=0)


def _line_count(workdir):
  path = os.path.join(workdir, 'metrics.jsonl')
  return len(open(path).read().splitlines()) if os.path.exists(path) else 0


def _tmp_dirs(ckpt_dir):
  """orbax's temporary folders of saves in flight: {name: step}."""
  try:
    names = os.listdir(ckpt_dir)
  except FileNotFoundError:
    return {}
  return {n: int(n.split('.')[0]) for n in names if '.orbax-checkpoint-tmp' in n}


def _resume_in_process(data_dir, workdir, capsys, every=3):
  """The run of `_cmd` resumed in this process (the same config on the same 8 devices gives the
  same bits as a child, see `uninterrupted`; the interruption is what needs a child, not the
  resume); returns what it printed."""
  capsys.readouterr()
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=STEPS,
                                         checkpoint_every_steps=every, log_every_steps=1,
                                         async_checkpointing=True), str(workdir))
  return capsys.readouterr().out


def _assert_same_final_state(workdir, reference):
  assert_leaves_close(_final_params(workdir), _final_params(reference))
  ref_eval = json.load(open(reference / 'final_metrics.json'))
  got_eval = json.load(open(workdir / 'final_metrics.json'))
  assert ref_eval['eval/anp_top1'] == got_eval['eval/anp_top1']
  assert ref_eval['eval/loss'] == got_eval['eval/loss']


@pytest.fixture(scope='module')
def uninterrupted(data_dir, tmp_path_factory):
  """The run of `_cmd` without interruption, trained in this process (a child process would
  only add its start-up: the same config on the same 8 devices gives the same bits)."""
  workdir = tmp_path_factory.mktemp('uninterrupted')
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=STEPS, checkpoint_every_steps=3,
                                         log_every_steps=1, async_checkpointing=True),
                             str(workdir))
  return workdir


def _stopped(proc, timeout=10.0) -> bool:
  """SIGSTOPs `proc` and waits until all its threads (the background save's too) are stopped;
  False if it exited first."""
  proc.send_signal(signal.SIGSTOP)
  deadline = time.time() + timeout
  task_dir = f'/proc/{proc.pid}/task'
  while time.time() < deadline:
    if proc.poll() is not None:
      return False
    try:
      states = [open(f'{task_dir}/{t}/stat').read().rsplit(')', 1)[1].split()[0]
                for t in os.listdir(task_dir)]
    except (FileNotFoundError, ProcessLookupError):
      continue
    if all(s in 'tTZX' for s in states):
      return True
    time.sleep(0.001)
  raise AssertionError('the run did not stop on SIGSTOP')


def _kill_mid_save(data_dir, workdir):
  """Starts the run (saving every step) and kill -9s it while one of *its own* saves is in
  flight. The run is sampled frozen (SIGSTOP: no thread moves while we look): a temporary
  folder that was not there at launch, after a step logged by this launch, means a save is
  under way; then SIGKILL. Returns that save's step, after checking that its temporary folder
  is still there and no final folder for it exists."""
  ckpt_dir = workdir / 'checkpoints'
  skip, before = _line_count(workdir), set(_tmp_dirs(ckpt_dir))
  proc = _popen(_cmd(data_dir, workdir, every=1), stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
  deadline = time.time() + 600
  seen = None
  try:
    while time.time() < deadline and _stopped(proc):
      new = {n: s for n, s in _tmp_dirs(ckpt_dir).items() if n not in before}
      if new and _logged_steps(workdir, skip) > 0:
        seen = next(iter(new.items()))
        break
      proc.send_signal(signal.SIGCONT)
      time.sleep(0.005)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert seen is not None, 'no save of the run was caught in flight'
  assert (ckpt_dir / seen[0]).exists() and not (ckpt_dir / str(seen[1])).exists()
  return seen[1]


@pytest.mark.slow(75)
def test_kill_9_at_random_steps_and_mid_save_then_resume_is_bit_identical(data_dir, tmp_path,
                                                                          uninterrupted, capsys):
  workdir = tmp_path / 'killed'
  rng = random.Random(0)
  # Kill points (absolute steps; saves every 3): after the first save, during a save, later on.
  for target in [rng.randint(4, 6), None, rng.randint(14, 18)]:
    if target is None:
      _kill_mid_save(data_dir, workdir)
      continue
    skip = _line_count(workdir)
    proc = _popen(_cmd(data_dir, workdir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
      if _logged_steps(workdir, skip) >= target:
        break
      time.sleep(0.01)
    assert proc.poll() is None, 'the run ended before the kill'
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _logged_steps(workdir, skip) < STEPS
  assert 'Resumed from checkpoint' in _resume_in_process(data_dir, workdir, capsys)
  _assert_same_final_state(workdir, uninterrupted)


@pytest.mark.slow(25)
def test_sigterm_checkpoints_and_exits_75_then_resumes_equal_to_an_uninterrupted_run(
    data_dir, tmp_path, uninterrupted, capsys):
  workdir = tmp_path / 'preempted'
  proc = _popen(_cmd(data_dir, workdir, every=0), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 300
  while _logged_steps(workdir) < 3:
    assert time.time() < deadline and proc.poll() is None
    time.sleep(0.01)
  proc.send_signal(signal.SIGTERM)
  output, _ = proc.communicate(timeout=120)
  assert proc.returncode == errors.EXIT_PREEMPTED, output[-3000:]
  steps = [int(n) for n in os.listdir(workdir / 'checkpoints') if n.isdigit()]
  assert len(steps) == 1 and 3 <= steps[0] < STEPS, steps
  assert f'Preempted: checkpoint written at step {steps[0]}' in output
  out = _resume_in_process(data_dir, workdir, capsys, every=0)
  assert f'Resumed from checkpoint at step {steps[0]}' in out
  _assert_same_final_state(workdir, uninterrupted)


@pytest.mark.slow(70)
def test_restore_onto_fewer_and_more_devices(data_dir, tmp_path, capsys):
  """8 -> 4: the 4-device job restores the 8-device state (its evaluation of it gives the same
  hits over all 104 examples and the same loss) and trains on to step 6. 4 -> 8: that step-6
  checkpoint, saved by 4 devices, restored by 8 is the checkpoint's state, leaf for leaf, its
  8-device evaluation is the 4-device one, and training continues (the data order then follows
  the new device count, so there is no uninterrupted run to compare with). One workdir serves
  both directions: the 4-device run that 8 devices restore is the one that resumed 8 -> 4."""
  workdir = tmp_path / 'eight_four_eight'
  trained = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=4,
                                                 checkpoint_every_steps=2), str(workdir))
  assert trained.setup.devices == 8
  lines = _line_count(workdir)
  out = _run(_cmd(data_dir, workdir, steps=4, every=2, eval_only=True)
             + [f'--eval_output={tmp_path / "eval4.json"}'], devices=4)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'Evaluating the checkpoint of step 4' in out.stdout and '4 devices' in out.stdout
  # The 4-device evaluation of the restored state; the training logs are left as they were.
  assert _line_count(workdir) == lines
  got = json.load(open(tmp_path / 'eval4.json'))
  assert got['step'] == 4
  for head in metrics.HEADS:
    assert got[f'eval/{head}_top1'] == trained.final_eval[f'eval/{head}_top1']
  assert got['eval/loss'] == pytest.approx(trained.final_eval['eval/loss'], rel=1e-5)
  out = _run(_cmd(data_dir, workdir, steps=6, every=2), devices=4)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'Resumed from checkpoint at step 4' in out.stdout and '4 devices' in out.stdout
  assert sorted(int(n) for n in os.listdir(workdir / 'checkpoints') if n.isdigit()) == [2, 4, 6]

  saved = _final_params(workdir)  # The step-6 checkpoint, written by the 4-device job.
  four_eval = json.load(open(workdir / 'final_metrics.json'))  # Evaluated on 4 devices.
  assert four_eval['step'] == 6
  capsys.readouterr()
  again = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=6, eval_only=True),
                                   str(workdir))
  assert 'Evaluating the checkpoint of step 6' in capsys.readouterr().out
  assert_leaves_close(leaves({'batch_stats': again.state.batch_stats,
                              'params': again.state.params}), saved)
  assert int(again.state.step) == 6 and again.setup.devices == 8
  for head in metrics.HEADS:
    assert again.final_eval[f'eval/{head}_top1'] == four_eval[f'eval/{head}_top1']
  assert again.final_eval['eval/loss'] == pytest.approx(four_eval['eval/loss'], rel=1e-5)
  resumed = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=8), str(workdir))
  assert int(resumed.state.step) == 8 and [h['step'] for h in resumed.records] == [8, 8]


@pytest.mark.slow(35)
def test_pmap_executor_resumes_bit_identically(data_dir, tmp_path, capsys):
  """The pmap restore branch (host restore, then replicated to the local devices)."""
  assert_resume_is_exact(
      lambda n: tiny_config(data_dir, executor='pmap', num_train_steps=n, schedule='constant',
                            checkpoint_every_steps=2, log_every_steps=1), 4, 2, tmp_path, capsys)


@pytest.mark.slow(25)
def test_exit_codes_2_and_3_at_the_process_level(data_dir, tmp_path):
  out = _run(_cmd(data_dir, tmp_path / 'bad', batch_size=36))
  assert out.returncode == errors.EXIT_CONFIG, out.stderr[-3000:]
  assert 'ERROR:' in out.stderr and 'not divisible by the 8 devices' in out.stderr
  out = _run(_cmd(data_dir, tmp_path / 'nan', steps=6, every=0, base_lr=1e30))
  assert out.returncode == errors.EXIT_DIVERGED, out.stderr[-3000:]
  assert 'ERROR:' in out.stderr and 'loss is' in out.stderr


@pytest.mark.parametrize('args,message', [
    (['--workdir='], '--workdir is empty'),  # E.g. --workdir=$UNSET: was the current directory.
    (['--workdir=/tmp/x', 'extra'], "Unexpected arguments: ['extra']"),  # Was exit 1.
])
def test_an_empty_workdir_or_a_stray_argument_exits_2_writing_nothing(tmp_path, args, message):
  out = subprocess.run([sys.executable, '-m', 'anp_jax.main', *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
  assert out.returncode == errors.EXIT_CONFIG, out.stderr[-2000:]
  assert message in out.stderr and 'Traceback' not in out.stderr
  assert len(out.stderr.strip().splitlines()) == 1, out.stderr  # One line, not the help text.
  assert os.listdir(tmp_path) == []


def _in_process(data_dir, workdir, **kw):
  config = tiny_config(data_dir, **dict(dict(checkpoint_every_steps=3), **kw))
  return trainer.train_and_evaluate(config, str(workdir))


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(data_dir, tmp_path, capsys):
  _in_process(data_dir, tmp_path, num_train_steps=6)
  state_dir = tmp_path / 'checkpoints' / '6' / 'state'
  for root, _, files in os.walk(state_dir):
    for f in files:
      path = os.path.join(root, f)
      with open(path, 'r+b') as fh:
        fh.truncate(max(0, os.path.getsize(path) // 3))
  result = _in_process(data_dir, tmp_path, num_train_steps=8)
  out = capsys.readouterr().out
  assert 'checkpoint 6' in out and 'falling back' in out
  assert 'Resumed from checkpoint at step 3' in out
  assert result.records[0]['step'] > 3 and int(result.state.step) == 8
  # Moved aside, so that step 6 was saved again (orbax saves no step at or below its latest:
  # left in place, the corrupt 6 swallowed the saves, a preemption save included, up to 6).
  names = os.listdir(tmp_path / 'checkpoints')
  assert '6.unreadable' in names and {'6', '8'} <= set(names), names
  _, restored, _ = trainer.load_checkpoint(str(tmp_path), 6)
  assert int(restored['params'] is not None)


def test_corrupt_latest_metadata_falls_back_to_the_previous(data_dir, tmp_path, capsys):
  _in_process(data_dir, tmp_path, num_train_steps=6)
  (tmp_path / 'checkpoints' / '6' / 'meta' / 'metadata').write_text('{"step": 6, "ident')
  capsys.readouterr()
  result = _in_process(data_dir, tmp_path, num_train_steps=8)
  out = capsys.readouterr().out
  assert 'checkpoint 6 is unreadable' in out and 'Resumed from checkpoint at step 3' in out
  assert result.records[0]['step'] == 4 and int(result.state.step) == 8


@pytest.mark.parametrize('overrides', [dict(grad_clip_norm=1.0), dict(momentum=0.0)])
def test_a_config_change_that_reshapes_the_optimizer_state_is_refused(data_dir, tmp_path,
                                                                     overrides):
  # Not identity fields, but the optimizer state's tree differs: no checkpoint restores. That
  # used to read as 'all corrupt' and the run silently started again from step 0.
  _in_process(data_dir, tmp_path, num_train_steps=3)
  before = sorted(os.listdir(tmp_path / 'checkpoints'))
  with pytest.raises(ValueError, match=r'None of the 1 checkpoint\(s\) .* could be restored .* '
                     r'grad_clip_norm 0 vs not'):
    _in_process(data_dir, tmp_path, num_train_steps=6, keep_best_metric='eval/anp_top1',
                **overrides)
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == before
  assert not (tmp_path / 'checkpoints_best').exists()  # Made at the first evaluation only.


@pytest.mark.parametrize('overrides,field', [
    ({'model.width': 1.0}, r'model\.width: checkpoint 0\.5 vs config 1\.0'),
    ({'optimizer': 'adamw'}, "optimizer: checkpoint 'nesterov' vs config 'adamw'"),
    ({'image_size': 24}, 'image_size: checkpoint 16 vs config 24'),
    ({'seed': 1}, 'seed: checkpoint 0 vs config 1'),  # Another data order and augmentation.
    ({'dataset': None}, "dataset: checkpoint 'anp' vs config 'synthetic_anp'"),
])
def test_checkpoint_of_another_configuration_is_rejected_by_name(data_dir, tmp_path, overrides,
                                                                 field):
  _in_process(data_dir, tmp_path, num_train_steps=3)
  if overrides == {'dataset': None}:  # Another dataset: its record, as a real-ANP run writes it.
    meta = tmp_path / 'checkpoints' / '3' / 'meta' / 'metadata'
    record = json.loads(meta.read_text())
    record['identity']['dataset'] = 'anp'
    meta.write_text(json.dumps(record))
    overrides = {}
  with pytest.raises(ValueError, match=field):
    _in_process(data_dir, tmp_path, num_train_steps=6, **overrides)
  assert sorted(n for n in os.listdir(tmp_path / 'checkpoints') if n.isdigit()) == ['3']


def test_checkpoint_of_a_dataset_with_other_classes_is_rejected(data_dir, tmp_path):
  """Same dataset name, other label set (6 ANPs instead of 8): refused, not silently restarted."""
  _in_process(data_dir, tmp_path, num_train_steps=3)
  other = tmp_path / 'other_data'
  with pytest.raises(ValueError, match='num_anps: checkpoint 8 vs config 6'):
    _in_process(other, tmp_path, num_train_steps=6, **{'synthetic.num_pairs': 6})
  assert sorted(n for n in os.listdir(tmp_path / 'checkpoints') if n.isdigit()) == ['3']


def test_checkpoint_every_minutes_saves_by_wall_clock(data_dir, tmp_path, monkeypatch):
  now = [1000.0]
  monkeypatch.setattr(checkpointing, 'time', types.SimpleNamespace(time=lambda: now[0]))
  config = tiny_config(data_dir, checkpoint_every_minutes=1.0, checkpoint_every_steps=0,
                       async_checkpointing=False)
  ckpt = checkpointing.Checkpointer(str(tmp_path), config)
  assert ckpt.save_due(1) == (False, False)
  now[0] += 59
  assert ckpt.save_due(2) == (False, False)
  now[0] += 2
  assert ckpt.save_due(3) == (True, False)
  ckpt.save(3, {'x': np.arange(3.0)})
  assert ckpt.save_due(4) == (False, False)  # The clock restarts at each save.
  now[0] += 61
  assert ckpt.save_due(5) == (True, False)
  assert ckpt.save_due(6, force=True) == (True, False)
  ckpt.close()
  assert sorted(n for n in os.listdir(tmp_path / 'checkpoints') if n.isdigit()) == ['3']


def test_nan_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path):
  _in_process(data_dir, tmp_path, num_train_steps=3)
  with pytest.raises(errors.NonFiniteLossError):
    _in_process(data_dir, tmp_path, num_train_steps=9, base_lr=1e30, log_every_steps=1)
  steps = sorted(int(n) for n in os.listdir(tmp_path / 'checkpoints') if n.isdigit())
  assert steps == [3]
  # Saving every step: the loss of step s + 1 is the first sign that the state saved at s
  # diverged; that checkpoint is moved aside, so the rerun resumes from a healthy one.
  with pytest.raises(errors.NonFiniteLossError, match=r'first non-finite at step (\d+).*The '
                     r'checkpoint of step \d+ holds the state this came from and was moved '
                     r'aside') as info:
    _in_process(data_dir, tmp_path, num_train_steps=9, base_lr=1e30, log_every_steps=1,
                checkpoint_every_steps=1)
  first = info.value.step
  steps = sorted(int(n) for n in os.listdir(tmp_path / 'checkpoints') if n.isdigit())
  assert steps and max(steps) == first - 2, (steps, first)
  assert f'{first - 1}.diverged' in os.listdir(tmp_path / 'checkpoints')
  result = _in_process(data_dir, tmp_path, num_train_steps=9)  # The advised lower rate.
  assert np.isfinite(result.final_eval['eval/loss'])
  _, variables, _ = trainer.load_checkpoint(str(tmp_path))
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(variables))


def test_eval_only_and_load_checkpoint(data_dir, tmp_path):
  trained = _in_process(data_dir, tmp_path, num_train_steps=3)
  again = _in_process(data_dir, tmp_path, num_train_steps=3, eval_only=True)
  assert again.final_eval['eval/anp_top1'] == pytest.approx(trained.final_eval['eval/anp_top1'])
  model, variables, config = trainer.load_checkpoint(str(tmp_path))
  x = np.zeros((2, 16, 16, 3), np.float32)
  assert model.apply(variables, x, train=False)['anp'].shape == (2, 8)
  assert config.model.name == 'resnet8'


def test_unwritable_workdir_is_a_clear_error(data_dir, tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('not a directory')
  with pytest.raises(PermissionError, match='not writable'):
    _in_process(data_dir, blocker / 'sub', num_train_steps=3)


@pytest.fixture
def small_disk(tmp_path):
  """A 4 MiB tmpfs (the tests run as root, as CI does)."""
  mount = tmp_path / 'small'
  mount.mkdir()
  subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=4M', 'tmpfs', str(mount)], check=True)
  yield mount
  subprocess.run(['umount', '-l', str(mount)], check=False)


@pytest.mark.parametrize('background', [False, True])
def test_disk_full_while_saving_is_a_clear_error_and_keeps_older_checkpoints(data_dir,
                                                                             small_disk,
                                                                             background):
  """Also for a failed background (asynchronous) save: the error surfaces, not lost."""
  workdir = small_disk / 'run'
  _in_process(data_dir, workdir, num_train_steps=3, async_checkpointing=background)
  stat = os.statvfs(small_disk)
  with open(small_disk / 'filler', 'wb') as f:  # Leave a few KiB: too little for a checkpoint.
    f.write(b'\0' * max(0, stat.f_bavail * stat.f_frsize - 16 * 1024))
  with pytest.raises(OSError) as info:
    _in_process(data_dir, workdir, num_train_steps=6, async_checkpointing=background)
  assert 'Saving the checkpoint of step 6' in str(info.value)
  assert 'intact (latest: 3)' in str(info.value)
  assert 'No space left' in str(info.value) or 'space' in str(info.value).lower()
  os.remove(small_disk / 'filler')
  steps = sorted(int(n) for n in os.listdir(workdir / 'checkpoints') if n.isdigit())
  assert steps == [3]
  _, variables, _ = trainer.load_checkpoint(str(workdir))
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(variables))


def test_best_checkpoint_is_kept_by_metric(data_dir, tmp_path):
  _in_process(data_dir, tmp_path, num_train_steps=6, eval_every_epochs=0.25,
              keep_checkpoints=1, keep_best_metric='eval/anp_top1')
  best = [n for n in os.listdir(tmp_path / 'checkpoints_best') if n.isdigit()]
  assert len(best) == 1
  history = [json.loads(l) for l in open(tmp_path / 'metrics.jsonl')]
  evals = {h['step']: h['eval/anp_top1'] for h in history if 'eval/anp_top1' in h}
  assert evals[int(best[0])] == max(evals.values())
  assert [n for n in os.listdir(tmp_path / 'checkpoints') if n.isdigit()] == ['6']


def test_resumed_run_stops_logs_and_times_as_one_run(data_dir, tmp_path, monkeypatch):
  """A run continued from a checkpoint that was not an evaluation step (here the end of a
  shorter first run; also a preemption checkpoint): no extra evaluation there (it could stop an
  early-stopping run where the whole run would not, and was never logged), wall_time_s counts
  both segments, curves.png shows the whole history, and a rerun of the finished run leaves
  final_metrics.json as it was."""
  common = dict(target_value=1.0, stop_at_target=True, eval_every_epochs=0.25,
                log_every_steps=1, checkpoint_every_steps=0)
  every = trainer.build(tiny_config(data_dir, **common)).setup.eval_every_steps
  assert every > 1
  first = every + 1  # Not an evaluation step of the longer run.
  _in_process(data_dir, tmp_path, num_train_steps=first, **common)
  meta = json.loads((tmp_path / 'checkpoints' / str(first) / 'meta' / 'metadata').read_text())
  assert meta['wall_time_s'] > 0
  evaluated, plotted = [], []
  eval_record = trainer.Run.eval_record
  monkeypatch.setattr(trainer.Run, 'eval_record',
                      lambda self, state, step: evaluated.append(step) or
                      eval_record(self, state, step))
  monkeypatch.setattr(trainer.reporting, 'plot_curves',
                      lambda records, path: plotted.extend(r['step'] for r in records))
  t0 = time.time()
  _in_process(data_dir, tmp_path, num_train_steps=3 * every, **common)
  second = time.time() - t0
  assert evaluated == [2 * every, 3 * every], evaluated
  assert min(plotted) == 1 and max(plotted) == 3 * every
  final = json.loads((tmp_path / 'final_metrics.json').read_text())
  assert meta['wall_time_s'] < final['wall_time_s'] <= meta['wall_time_s'] + second
  before = (tmp_path / 'final_metrics.json').read_bytes()
  _in_process(data_dir, tmp_path, num_train_steps=3 * every, **common)  # Finished: re-evaluates.
  assert (tmp_path / 'final_metrics.json').read_bytes() == before


# ----------------------------------------------------------------------------------------------
# A refused run leaves its workdir as it was; eval-only needs a checkpoint and writes nothing.


def _train(data_dir, workdir, **overrides):
  from anp_jax import trainer
  config = tiny_config(data_dir, **overrides)
  return trainer.train_and_evaluate(config, str(workdir))


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp('trained')
  _train(data_dir, workdir, num_train_steps=3)
  return workdir


def _snapshot(workdir):
  return {name: (workdir / name).read_bytes() for name in ('config.json', 'metrics.jsonl')}


def test_refused_resume_leaves_the_workdir_untouched(data_dir, trained):
  from anp_jax import trainer
  before = _snapshot(trained)
  with pytest.raises(ValueError, match=r'model\.width'):
    _train(data_dir, trained, num_train_steps=6, **{'model.width': 1.0})
  assert _snapshot(trained) == before
  model, variables, _ = trainer.load_checkpoint(str(trained))
  model.apply(variables, np.zeros((1, 16, 16, 3), np.float32), train=False)


def test_failed_validation_leaves_no_new_workdir(data_dir, tmp_path):
  workdir = tmp_path / 'new' / 'run'
  with pytest.raises(ValueError, match='not divisible'):
    _train(data_dir, workdir, batch_size=36)  # 8 devices.
  assert not (tmp_path / 'new' / 'run').exists()


def test_eval_only_without_a_checkpoint_is_an_error(data_dir, tmp_path):
  workdir = tmp_path / 'typo'
  with pytest.raises(FileNotFoundError, match='no checkpoint found in'):
    _train(data_dir, workdir, eval_only=True)
  assert not workdir.exists()


def test_eval_only_evaluates_the_checkpoint_and_writes_nothing(data_dir, trained):
  before = _snapshot(trained), sorted(os.listdir(trained))
  result = _train(data_dir, trained, num_train_steps=3, eval_only=True, batch_size=64)
  assert (_snapshot(trained), sorted(os.listdir(trained))) == before
  assert result.step == 3
  final = json.loads((trained / 'final_metrics.json').read_text())  # The training's evaluation.
  assert result.final_eval['eval/anp_top1'] == pytest.approx(final['eval/anp_top1'])


def test_workdir_that_is_a_file_says_so(data_dir, tmp_path):
  path = tmp_path / 'file'
  path.write_text('not a directory')
  with pytest.raises(OSError, match='is a file'):
    _train(data_dir, path)


# ----------------------------------------------------------------------------------------------
# Exact resume mid-batch across an epoch boundary.


def _per_device_config(data_dir, **kw):
  return tiny_config(data_dir, batch_size=24, bn_mode='per_device', **kw)


def test_trainer_resume_across_an_epoch_boundary_is_exact(data_dir, tmp_path, capsys):
  """B=24 on 256 examples: 10.67 steps per epoch; resuming at step 10 re-enters mid-batch."""
  assert_resume_is_exact(lambda n: _per_device_config(data_dir, num_train_steps=n,
                                                     schedule='constant'), 13, 10,
                         tmp_path, capsys)


def test_load_checkpoint_resolves_relative_and_home_paths(trained, monkeypatch):
  from anp_jax import trainer
  monkeypatch.chdir(trained.parent)
  trainer.load_checkpoint(trained.name)
  monkeypatch.setenv('HOME', str(trained.parent))
  trainer.load_checkpoint(os.path.join('~', trained.name))
