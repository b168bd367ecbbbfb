"""One writer per workdir (issue 31, item 3): readers (eval_only, load_checkpoint) change nothing
in a workdir, in particular not another job's checkpoint saves in flight; a second training job
on a workdir that a live job holds is refused naming the holder; a stale lock is taken over."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from anp_jax import trainer, workdir_lock
from conftest import ROOT, main_cmd, subprocess_env, tiny_config

# A save in flight of another job: orbax writes it under a temporary name, renamed when done.
IN_FLIGHT = os.path.join('checkpoints', '8.orbax-checkpoint-tmp-1234', 'state', 'data')


def _snapshot(directory):
  """Every file and folder under `directory`, with sizes and modification times."""
  out = {}
  for root, dirs, files in os.walk(directory):
    for name in dirs + files:
      path = os.path.join(root, name)
      st = os.stat(path)
      out[os.path.relpath(path, directory)] = (st.st_size if name in files else None,
                                               st.st_mtime_ns)
  return out


@pytest.fixture(scope='module')
def finished(data_dir, tmp_path_factory):
  """A finished 3-step run with a checkpoint, and a save of 'another job' in flight."""
  workdir = tmp_path_factory.mktemp('finished')
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=3, checkpoint_every_steps=3),
                             str(workdir))
  os.makedirs(os.path.dirname(workdir / IN_FLIGHT))
  (workdir / IN_FLIGHT).write_text('half-written')
  return workdir


def test_eval_only_changes_nothing_in_the_workdir(data_dir, finished):
  """The issue's reproduction: eval_only deleted the temporary folder of a save in flight."""
  before = _snapshot(finished)
  result = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=3, eval_only=True),
                                      str(finished))
  assert result.step == 3 and 0 <= result.final_eval['eval/anp_top1'] <= 1
  assert (finished / IN_FLIGHT).read_text() == 'half-written'
  assert _snapshot(finished) == before


def test_eval_only_from_the_command_line_writes_only_where_asked(data_dir, finished, tmp_path):
  before = _snapshot(finished)
  out = tmp_path / 'metrics.json'
  proc = subprocess.run(main_cmd(data_dir, finished, num_train_steps=3, eval_only=True)
                        + [f'--eval_output={out}'], env=subprocess_env(2), cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'Evaluated the checkpoint of step 3' in proc.stdout
  written = json.loads(out.read_text())
  assert written['step'] == 3 and 'eval/anp_top1' in written
  assert json.loads(proc.stdout.split('Results: ', 1)[1].splitlines()[0]) == written
  assert _snapshot(finished) == before


def test_load_checkpoint_changes_nothing_in_the_workdir(finished):
  before = _snapshot(finished)
  _, variables, config = trainer.load_checkpoint(str(finished))
  assert variables['params'] and config.num_train_steps == 3
  assert _snapshot(finished) == before


HOLD = '''
import sys, time
from anp_jax import workdir_lock
lock = workdir_lock.acquire(sys.argv[1])
print('held', flush=True)
time.sleep(600)
'''


def test_a_second_training_job_is_refused_naming_the_holder(data_dir, finished):
  holder = subprocess.Popen([sys.executable, '-c', HOLD, str(finished)], env=subprocess_env(1),
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
  try:
    assert holder.stdout.readline().strip() == 'held'
    before = _snapshot(finished)
    with pytest.raises(workdir_lock.WorkdirBusyError,
                       match=rf'in use by another training job: pid {holder.pid} on host '
                       rf'{socket.gethostname()} \(since .*-c'):
      trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=6), str(finished))
    assert _snapshot(finished) == before  # Its save in flight included.
    # The command line says so and exits 2.
    proc = subprocess.run(main_cmd(data_dir, finished, num_train_steps=6), cwd=ROOT,
                          env=subprocess_env(2), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and f'pid {holder.pid} on host' in proc.stderr, proc.stderr
  finally:
    holder.kill()
    holder.wait()
  # The holder is gone (killed: its record is still there, its flock went with it).
  assert workdir_lock.holder(str(finished))['pid'] == holder.pid
  result = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=4,
                                                  checkpoint_every_steps=2), str(finished))
  assert result.step == 4
  assert workdir_lock.holder(str(finished)) is None  # Released at the end of the run.
  assert not (finished / IN_FLIGHT).exists()  # The writer cleans its workdir.


def _write_record(workdir, **fields):
  record = dict(dict(host=socket.gethostname(), pid=1, since=time.time() - 60,
                     command='python x'), **fields)
  path = os.path.join(workdir, workdir_lock.LOCK_FILE)
  with open(path, 'w') as f:
    json.dump(record, f)
  return path


def test_a_stale_lock_of_a_dead_process_is_taken_over(data_dir, tmp_path, caplog):
  gone = subprocess.Popen([sys.executable, '-c', 'pass'])
  gone.wait()
  _write_record(tmp_path, pid=gone.pid)
  result = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=2), str(tmp_path))
  assert result.step == 2
  assert f'process {gone.pid} no longer runs on this host' in caplog.text
  assert workdir_lock.holder(str(tmp_path)) is None


def test_another_hosts_lock_is_live_while_its_heartbeat_is_fresh(tmp_path, caplog):
  """Where flock does not reach other nodes (Lustre's localflock), the record's heartbeat
  decides."""
  path = _write_record(tmp_path, host='node-elsewhere', pid=4242)
  with pytest.raises(workdir_lock.WorkdirBusyError, match=r'pid 4242 on host node-elsewhere '
                     r'\(since .*last heartbeat \d+ s ago'):
    workdir_lock.acquire(str(tmp_path))
  old = time.time() - workdir_lock.STALE_S - 10
  os.utime(path, (old, old))
  lock = workdir_lock.acquire(str(tmp_path))
  try:
    assert 'its heartbeat is' in caplog.text
    assert workdir_lock.holder(str(tmp_path))['pid'] == os.getpid()
  finally:
    lock.release()
  assert workdir_lock.holder(str(tmp_path)) is None


def test_the_holder_refreshes_its_heartbeat(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lock, 'HEARTBEAT_S', 0.05)
  lock = workdir_lock.acquire(str(tmp_path))
  try:
    path = os.path.join(tmp_path, workdir_lock.LOCK_FILE)
    os.utime(path, (0, 0))
    deadline = time.time() + 10
    while os.stat(path).st_mtime == 0 and time.time() < deadline:
      time.sleep(0.05)
    assert time.time() - os.stat(path).st_mtime < 5
  finally:
    lock.release()
