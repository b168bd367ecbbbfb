"""Checkpoints: exact resume after kill -9 (also mid-save), SIGTERM preemption, fewer devices,
corrupt checkpoints, incompatible configs, NaN safety, eval-only and load_checkpoint."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from anp_jax import checkpointing, train
from conftest import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cmd(data_dir, workdir, steps=16, every=3, extra=()):
  c = tiny_config(data_dir)
  cmd = [sys.executable, '-m', 'anp_jax.main', f'--workdir={workdir}',
         f'--config.data_dir={data_dir}', f'--config.num_train_steps={steps}',
         f'--config.checkpoint_every_steps={every}', '--config.log_every_steps=1',
         '--config.model.name=resnet8', '--config.model.width=0.5', '--config.image_size=16',
         '--config.batch_size=32', '--config.bn_group_size=4', '--config.eval_batch_size=32',
         '--config.progress_bar=False', '--config.eval_every_epochs=0',
         '--config.warmup_epochs=0', '--config.async_checkpointing=True']
  cmd += [f'--config.synthetic.{k}={v}' for k, v in c.synthetic.items()]
  return cmd + list(extra)


def _env(devices=8):
  return dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='2', JAX_PLATFORMS='cpu',
              XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')


def _run(cmd, devices=8, timeout=600):
  return subprocess.run(cmd, env=_env(devices), capture_output=True, text=True, timeout=timeout,
                        cwd=ROOT)


def _final_params(workdir):
  _, variables, _ = checkpointing.load_checkpoint(str(workdir))
  return jax.tree.map(np.asarray, variables)


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


@pytest.fixture(scope='module')
def uninterrupted(data_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp('uninterrupted')
  out = _run(_cmd(data_dir, workdir))
  assert out.returncode == 0, out.stderr[-3000:]
  return workdir


def test_kill_9_at_random_steps_then_resume_is_bit_identical(data_dir, tmp_path, uninterrupted):
  workdir = tmp_path / 'killed'
  rng = random.Random(0)
  kills = 0
  # Kill points (absolute steps; saves every 3): after the first save, during a save, later on.
  targets = [rng.randint(4, 6), None, rng.randint(10, 13)]
  for target in targets:
    skip = _line_count(workdir)
    proc = subprocess.Popen(_cmd(data_dir, workdir), env=_env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
      ckpt_dir = workdir / 'checkpoints'
      if target is None and ckpt_dir.exists() and any('tmp' in n for n in os.listdir(ckpt_dir)):
        break  # A save is in flight: kill now.
      if target is not None and _logged_steps(workdir, skip) >= target:
        break
      time.sleep(0.01)
    if proc.poll() is None:
      proc.send_signal(signal.SIGKILL)
      kills += 1
    proc.wait()
  assert kills >= 2
  out = _run(_cmd(data_dir, workdir))
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'Resumed from checkpoint' in out.stdout
  ref, got = _final_params(uninterrupted), _final_params(workdir)
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
    np.testing.assert_array_equal(a, b)
  ref_eval = json.load(open(uninterrupted / 'final_metrics.json'))
  got_eval = json.load(open(workdir / 'final_metrics.json'))
  assert ref_eval['eval/anp_top1'] == got_eval['eval/anp_top1']
  assert ref_eval['eval/loss'] == got_eval['eval/loss']


def test_sigterm_checkpoints_and_exits_75_then_resumes(data_dir, tmp_path):
  workdir = tmp_path / 'preempted'
  cmd = _cmd(data_dir, workdir, steps=40, every=0)
  proc = subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 300
  while _logged_steps(workdir) < 3:
    assert time.time() < deadline and proc.poll() is None
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  output, _ = proc.communicate(timeout=120)
  assert proc.returncode == checkpointing.EXIT_PREEMPTED, output[-3000:]
  steps = [int(n) for n in os.listdir(workdir / 'checkpoints') if n.isdigit()]
  assert len(steps) == 1 and 3 <= steps[0] < 40
  out = _run(_cmd(data_dir, workdir, steps=steps[0] + 2, every=0))
  assert out.returncode == 0, out.stderr[-3000:]
  assert f'Resumed from checkpoint at step {steps[0]}' in out.stdout


def test_resume_on_fewer_devices(data_dir, tmp_path):
  workdir = tmp_path / 'eight_to_four'
  assert _run(_cmd(data_dir, workdir, steps=4, every=2)).returncode == 0
  out = _run(_cmd(data_dir, workdir, steps=6, every=2), devices=4)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'Resumed from checkpoint at step 4' in out.stdout
  assert '4 devices' in out.stdout


def _in_process(data_dir, workdir, **kw):
  config = tiny_config(data_dir, checkpoint_every_steps=3, **kw)
  return train.train_and_evaluate(config, str(workdir))


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
  assert result.history[0]['step'] > 3 and int(result.state.step) == 8


def test_checkpoint_of_another_model_is_rejected_by_name(data_dir, tmp_path):
  _in_process(data_dir, tmp_path, num_train_steps=3)
  with pytest.raises(ValueError, match=r'model\.width'):
    _in_process(data_dir, tmp_path, num_train_steps=6, **{'model.width': 1.0})


def test_nan_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path):
  _in_process(data_dir, tmp_path, num_train_steps=3)
  with pytest.raises(train.NonFiniteLossError):
    _in_process(data_dir, tmp_path, num_train_steps=9, base_lr=1e30, log_every_steps=1)
  steps = sorted(int(n) for n in os.listdir(tmp_path / 'checkpoints') if n.isdigit())
  assert steps == [3]
  _, variables, _ = checkpointing.load_checkpoint(str(tmp_path))
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(variables))


def test_eval_only_and_load_checkpoint(data_dir, tmp_path):
  trained = _in_process(data_dir, tmp_path, num_train_steps=3)
  again = _in_process(data_dir, tmp_path, num_train_steps=3, eval_only=True)
  assert again.final_eval['eval/anp_top1'] == pytest.approx(trained.final_eval['eval/anp_top1'])
  model, variables, config = checkpointing.load_checkpoint(str(tmp_path))
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


def test_disk_full_while_saving_is_a_clear_error_and_keeps_older_checkpoints(data_dir,
                                                                             small_disk):
  workdir = small_disk / 'run'
  _in_process(data_dir, workdir, num_train_steps=3)
  stat = os.statvfs(small_disk)
  with open(small_disk / 'filler', 'wb') as f:  # Leave a few KiB: too little for a checkpoint.
    f.write(b'\0' * max(0, stat.f_bavail * stat.f_frsize - 16 * 1024))
  with pytest.raises(OSError) as info:
    _in_process(data_dir, workdir, num_train_steps=6)
  assert 'No space left' in str(info.value) or 'space' in str(info.value).lower()
  os.remove(small_disk / 'filler')
  steps = sorted(int(n) for n in os.listdir(workdir / 'checkpoints') if n.isdigit())
  assert steps == [3]
  _, variables, _ = checkpointing.load_checkpoint(str(workdir))
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
