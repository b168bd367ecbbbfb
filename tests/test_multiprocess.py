"""Real multi-process jobs on 127.0.0.1 (jax.distributed, gloo): equivalence leaf by leaf, shards,
exact evaluation, restore onto another process count, failures."""

import json
import os
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from anp_jax import distributed, errors, metrics, trainer
from conftest import (ROOT, TINY_SYNTHETIC, assert_leaves_close, coordinator_like_listener,
                      direct_eval, finish, launch, leaves, main_cmd, multiprocess_env,
                      port_nobody_serves, run_workers, subprocess_env, tiny_config, wait)

# Constant learning rate: a run of fewer steps is a prefix of a longer one (resume tests).
OVERRIDES = dict(num_train_steps=5, log_every_steps=1, bn_mode='global', eval_every_epochs=0,
                 schedule='constant', checkpoint_every_steps=2)
# Gloo's all-reduce sums in another order than XLA's in-process one: float rounding only.
TOL = dict(rtol=2e-4, atol=2e-6)


@pytest.fixture(scope='module')
def reference(data_dir, tmp_path_factory):
  """The same job in one process with 8 devices."""
  assert jax.device_count() == 8
  config = tiny_config(data_dir, **OVERRIDES)
  return trainer.train_and_evaluate(config, str(tmp_path_factory.mktemp('single')))


def _state_leaves(result):
  return leaves((result.state.params, result.state.batch_stats))


def _losses(history):
  return [h['train/loss'] for h in history if 'train/loss' in h]


@pytest.mark.slow(100)
def test_four_processes_on_an_empty_data_dir_equal_one_process_leaf_by_leaf(tmp_path, reference):
  """Four processes of 2 devices = one process of 8, leaf by leaf (the only job here with more
  than two processes). The job starts on a fresh data_dir: process 0 generates synthetic_anp,
  the other three wait at a barrier and then read it (before: a second process read a
  half-written dataset and failed); the reference trained on the session's dataset, so the
  equality also shows that the job read the whole, same dataset. (One job for both claims: a
  separate 2-process job on an empty data_dir cost as much as this one.)"""
  fresh = tmp_path / 'fresh_tfds'
  assert not fresh.exists()
  outs = run_workers(tiny_config(fresh, **OVERRIDES), 4, tmp_path)
  assert [o['process_count'] for o in outs] == [4] * 4
  assert all(o['devices'] == 8 and o['local_devices'] == 2 for o in outs)
  for o in outs:  # Every process holds the same replicated state and metrics.
    np.testing.assert_allclose(o['losses'], _losses(reference.records), rtol=1e-4)
    assert_leaves_close(o['leaves'], _state_leaves(reference), **TOL)
    assert o['final_eval']['eval/anp_top1'] == reference.final_eval['eval/anp_top1']
  # Each process read a different part of the global batch, together all of it.
  digests = [set(o['first_batch_digests']) for o in outs]
  assert all(len(d) == 8 for d in digests)
  assert len(set.union(*digests)) == 32


@pytest.mark.slow(100)
def test_restore_from_one_process_onto_two_and_from_two_onto_one(data_dir, tmp_path, reference,
                                                                  capsys):
  """1 -> 2: a 1-process checkpoint at step 2 resumed by a 2-process job (which saves step 4);
  2 -> 1: its step-4 checkpoint resumed by one process. Both end equal to the uninterrupted run;
  the 2-process job's evaluation equals a direct count over the split, for an eval batch that
  divides the split per process (8: 13 batches of 4) and one that does not (32)."""
  workdir = tmp_path / 'work'
  trainer.train_and_evaluate(tiny_config(data_dir, **dict(OVERRIDES, num_train_steps=2)),
                           str(workdir))
  config = tiny_config(data_dir, **OVERRIDES)
  outs = run_workers(config, 2, tmp_path, workdir=workdir, MP_EVAL_BATCHES='8,32')
  assert 'Resumed from checkpoint at step 2' in open(tmp_path / 'proc0.log').read()
  assert [o['process_count'] for o in outs] == [2, 2]
  ref_leaves = _state_leaves(reference)
  for o in outs:
    np.testing.assert_allclose(o['losses'], _losses(reference.records)[2:], rtol=1e-4)
    assert_leaves_close(o['leaves'], ref_leaves, **TOL)
  digests = [set(o['first_batch_digests']) for o in outs]
  assert all(len(d) == 16 for d in digests) and len(set.union(*digests)) == 32
  # Exact evaluation across processes: the same hits as counting every example directly.
  params, stats = jax.tree.unflatten(jax.tree.structure(
      (reference.state.params, reference.state.batch_stats)), outs[0]['leaves'])
  direct = direct_eval(config, params, stats)
  assert 0 < direct['anp_hits'] < direct['count'] == 104
  for o in outs:
    for got in (o['final_eval'], *o['evals'].values()):
      for head in metrics.HEADS:
        assert got[f'eval/{head}_top1'] == direct[f'eval/{head}_top1'], (head, got)
      assert got['eval/loss'] == pytest.approx(direct['eval/loss'], rel=1e-5)
  assert set(outs[0]['evals']) == {'8', '32'}
  # Only process 0 writes logs: every step once in metrics.jsonl, one event file per run (the
  # 1-process run's and the job's), the start-up and final lines in process 0's output only.
  logged = [json.loads(l) for l in open(workdir / 'metrics.jsonl')]
  assert [l['step'] for l in logged if 'train/loss' in l] == [1, 2, 3, 4, 5]
  assert len([f for f in os.listdir(workdir) if f.startswith('events.out.tfevents')]) == 2
  logs = [open(tmp_path / f'proc{i}.log').read() for i in range(2)]
  assert 'anp_jax | 2 process(es)' in logs[0] and 'anp_jax |' not in logs[1]

  # 2 -> 1: drop the final checkpoint so that one process resumes from the 2-process step 4.
  steps = sorted(int(n) for n in os.listdir(workdir / 'checkpoints') if n.isdigit())
  assert steps == [2, 4, 5], steps
  shutil.rmtree(workdir / 'checkpoints' / '5')
  capsys.readouterr()
  resumed = trainer.train_and_evaluate(config, str(workdir))
  assert 'Resumed from checkpoint at step 4' in capsys.readouterr().out
  assert_leaves_close(_state_leaves(resumed), ref_leaves, **TOL)
  assert int(resumed.state.step) == 5


@pytest.mark.slow(60)
def test_a_dead_process_makes_the_others_exit_within_the_heartbeat_timeout(data_dir, tmp_path):
  """kill -9 of one process: the survivor exits non-zero after about ANP_HEARTBEAT_TIMEOUT
  seconds (set to 5 here, against the default 30), not at some later time-out."""
  heartbeat = 5
  cmd = main_cmd(data_dir, tmp_path / 'work', num_train_steps=100000, batch_size=8,
                 log_every_steps=5)
  procs = launch(cmd, 2, 1, tmp_path, ANP_HEARTBEAT_TIMEOUT=heartbeat)
  metrics = tmp_path / 'work' / 'metrics.jsonl'
  deadline = time.time() + 300
  while not (metrics.exists() and metrics.read_text().count('\n') >= 2):
    assert time.time() < deadline, open(tmp_path / 'proc0.log').read()[-3000:]
    assert procs[0].poll() is None, open(tmp_path / 'proc0.log').read()[-3000:]
    time.sleep(0.2)
  procs[1].kill()
  t0 = time.time()
  try:
    rc = procs[0].wait(timeout=120)
  finally:
    procs[0].kill()
  elapsed = time.time() - t0
  assert rc != 0
  # Detection takes a few heartbeat intervals at most; the default (30 s) would take longer.
  assert elapsed < 25, elapsed


def test_inconsistent_process_id_fails_fast_with_exit_code_2(tmp_path):
  with port_nobody_serves() as port:
    out = subprocess.run([sys.executable, '-m', 'anp_jax.main', f'--workdir={tmp_path}'],
                         env=multiprocess_env(2, 5, port, 1), capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
  assert out.returncode == errors.EXIT_CONFIG, out.stderr[-2000:]
  assert 'inconsistent process counts' in out.stderr


def test_unreachable_coordinator_fails_with_a_message_and_exit_code_2(tmp_path):
  with port_nobody_serves() as port:
    env = multiprocess_env(2, 1, port, 1, ANP_INIT_TIMEOUT=4)
    t0 = time.time()
    out = subprocess.run([sys.executable, '-m', 'anp_jax.main', f'--workdir={tmp_path}'],
                         env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
  assert out.returncode == errors.EXIT_CONFIG, out.stderr[-2000:]
  assert time.time() - t0 < 60
  assert 'coordinator' in out.stderr and 'not reachable within 4 s' in out.stderr


def _exit_2_on_every_process(procs, tmp_path) -> list:
  """The job's logs, once every process has ended with exit code 2 (a bad-input error)."""
  logs = finish(procs, tmp_path, timeout=240)
  assert [p.returncode for p in procs] == [errors.EXIT_CONFIG] * len(procs), ''.join(
      log[-3000:] for log in logs)
  return logs


def test_processes_started_with_different_configs_or_workdirs_all_exit_2_naming_them(data_dir,
                                                                                   tmp_path):
  """A node launched with other flags, or the processes of two jobs merged through one
  coordinator port: every process exits 2 with each difference before anything is written,
  instead of a job that hangs at its first mismatched collective or trains wrong."""
  workdirs = [tmp_path / 'work', tmp_path / 'other']
  cmds = [main_cmd(data_dir, workdirs[0], batch_size=8),
          main_cmd(data_dir, workdirs[1], batch_size=16, progress_bar=True)]
  procs = launch(lambda pid: cmds[pid], 2, 1, tmp_path)
  logs = _exit_2_on_every_process(procs, tmp_path)
  for log in logs:
    assert 'different configs or workdirs' in log, log[-3000:]
    assert 'batch_size: process 0 has 8, process 1 has 16' in log, log[-3000:]
    assert f"workdir: process 0 has '{workdirs[0]}', process 1 has '{workdirs[1]}'" in log
    assert 'progress_bar' not in log  # A process's own terminal may differ.
  assert not any(w.exists() for w in workdirs)


def test_processes_whose_data_dirs_hold_different_datasets_all_exit_2(data_dir, tmp_path):
  """`data_dir` may differ between processes (a node-local copy), the dataset in it may not: a
  copy whose train split has other examples (here: a stale preparation that reports 240 of 256)
  stops every process, naming the split size, before the workdir is created."""
  other = tmp_path / 'node_local_tfds'
  shutil.copytree(data_dir, other)
  # The tiny dataset's own folder: other tests of this worker may have prepared other datasets
  # in the shared data_dir (e.g. a preset's dry run).
  from anp_jax.data import synthetic
  name = synthetic.make_config(**TINY_SYNTHETIC).name
  [info] = other.glob(f'synthetic_anp/{name}/*/dataset_info.json')
  text = info.read_text()
  assert text.count('"256"') == 1
  info.write_text(text.replace('"256"', '"240"'))
  workdir = tmp_path / 'work'
  cmds = [main_cmd(data_dir, workdir), main_cmd(other, workdir)]
  procs = launch(lambda pid: cmds[pid], 2, 1, tmp_path)
  logs = _exit_2_on_every_process(procs, tmp_path)
  for log in logs:
    assert 'run different datasets' in log, log[-3000:]
    assert 'train_size: process 0 has 256, process 1 has 240' in log, log[-3000:]
    assert 'configs or workdirs' not in log  # data_dir itself may differ.
  assert not workdir.exists()


def test_a_process_running_another_anp_jax_checkout_makes_every_process_exit_2(data_dir,
                                                                                tmp_path):
  """A node with a stale checkout (not on a shared filesystem): the sources' digest differs, and
  every process says so before anything is read or written."""
  other = tmp_path / 'other_checkout'
  shutil.copytree(os.path.join(ROOT, 'anp_jax'), other / 'anp_jax',
                  ignore=shutil.ignore_patterns('__pycache__'))
  with open(other / 'anp_jax' / 'steps.py', 'a') as f:
    f.write('\n# A local edit on one node.\n')
  workdir = tmp_path / 'work'
  roots = [ROOT, str(other)]
  procs = launch(main_cmd(data_dir, workdir), 2, 1, tmp_path, cwd=lambda pid: roots[pid],
                 PYTHONPATH=lambda pid: roots[pid])
  logs = _exit_2_on_every_process(procs, tmp_path)
  for log in logs:
    assert 'run different software' in log and 'anp_jax_sources_sha1: process 0 has' in log, log
    assert '  jax: process' not in log  # Same packages: only the sources differ.
  assert not workdir.exists()


def test_process_0_refuses_a_port_where_another_jobs_coordinator_listens(tmp_path):
  """Before: its coordinator bound beside the other one (both gRPC, SO_REUSEPORT) and the
  kernel shared the two jobs' connections out between them. Now: exit 2 at once, before the
  slow imports, with what to do."""
  with distributed.reserve_port() as held:
    port = held.getsockname()[1]
    with coordinator_like_listener(port):
      t0 = time.time()
      out = subprocess.run([sys.executable, '-m', 'anp_jax.main', f'--workdir={tmp_path}'],
                           env=multiprocess_env(2, 0, port, 1), capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
      elapsed = time.time() - t0
  assert out.returncode == errors.EXIT_CONFIG, out.stderr[-3000:]
  assert f'already accepts connections at the coordinator address 127.0.0.1:{port}' in out.stderr
  assert 'another job' in out.stderr
  assert elapsed < 30, elapsed  # Not ANP_INIT_TIMEOUT (60 s here) waiting for process 1.
  assert not os.listdir(tmp_path)


def test_processes_on_one_host_split_its_cores(tmp_path):
  """Two processes of a job on this host, started with the same affinity: right after
  jax.distributed.initialize each keeps its half (anp_jax.distributed.share_host_cores), or,
  with fewer cores than processes, all of them."""
  code = ('from anp_jax import distributed; distributed.initialize(); import os; '
          'print("CORES", sorted(os.sched_getaffinity(0)), flush=True)')
  procs = launch([sys.executable, '-c', code], 2, 1, tmp_path, ANP_PIN_CORES=1)
  logs = finish(procs, tmp_path, timeout=300)
  assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:]
  got = []
  for i in range(2):
    lines = [l for l in open(tmp_path / f'proc{i}.log') if l.startswith('CORES')]
    assert len(lines) == 1, open(tmp_path / f'proc{i}.log').read()[-3000:]
    got.append(json.loads(lines[0].split(' ', 1)[1]))
  cores = sorted(os.sched_getaffinity(0))
  if len(cores) >= 2:
    assert got == [cores[:len(cores) // 2], cores[len(cores) // 2:]], (got, cores)
  else:
    assert got == [cores, cores]


def test_processes_that_disagree_on_pinning_cores_all_exit_2_without_waiting(tmp_path):
  """ANP_PIN_CORES=0 on one process only: every process exits 2 naming the setting, at once.
  Before: the process that pins waited at the core census for the one that had opted out, until
  ANP_INIT_TIMEOUT (here 90 s) ran out, and then failed with a barrier time-out that did not
  say why; the other went on alone."""
  init_timeout = 90
  procs = launch([sys.executable, '-m', 'anp_jax.main', f'--workdir={tmp_path / "work"}'], 2, 1,
                 tmp_path, ANP_PIN_CORES=lambda pid: ['1', '0'][pid],
                 ANP_INIT_TIMEOUT=init_timeout)
  t0 = time.time()
  logs = _exit_2_on_every_process(procs, tmp_path)
  elapsed = time.time() - t0
  for log in logs:
    assert "ANP_PIN_CORES: process 0 has 'on', process 1 has 'off'" in log, log[-3000:]
  # Start-up (imports, jax.distributed) included: far less than the census time-out.
  assert elapsed < init_timeout, elapsed
  assert not (tmp_path / 'work').exists()


def test_a_hung_job_fails_with_the_stacks_of_its_processes(tmp_path):
  """The harness side of every `run_workers` job: a job that outlives its time-out is ended
  (SIGABRT, then SIGKILL) and the test fails with each process's Python stack, instead of
  pytest's time-out killing the test with no trace of where the processes were."""
  procs = launch([sys.executable, '-c', 'import time\nwhile True: time.sleep(0.1)'], 2, 1,
                 tmp_path)
  with pytest.raises(pytest.fail.Exception) as failure:
    wait(procs, tmp_path, timeout=3)
  message = str(failure.value)
  assert 'hung processes: [0, 1]' in message, message
  assert message.count('Fatal Python error: Aborted') == 2, message
  assert message.count('File "<string>", line 2 in <module>') == 2, message
  assert all(p.returncode is not None for p in procs)


def test_a_process_stuck_before_a_collective_fails_the_others_instead_of_hanging(tmp_path):
  """A process that is alive (its heartbeats go on) but never enters the next collective: the
  other fails after the gloo time-out (README: XLA's 30 min by default; 5 s here) with the
  error in its log, instead of waiting for ever."""
  code = ('from anp_jax import distributed; distributed.initialize()\n'
          'import os, time\n'
          'from jax.experimental import multihost_utils\n'
          'multihost_utils.sync_global_devices("first")\n'
          'print("FIRST DONE", flush=True)\n'
          'if os.environ["ANP_PROCESS_ID"] == "1": time.sleep(300)\n'
          't = time.time()\n'
          'try:\n'
          '  multihost_utils.sync_global_devices("second")\n'
          'finally:\n'
          '  print(f"SECOND ENDED after {time.time() - t:.1f} s", flush=True)\n')
  flags = f"{subprocess_env(1)['XLA_FLAGS']} --xla_cpu_collective_timeout_seconds=5"
  procs = launch([sys.executable, '-c', code], 2, 1, tmp_path, XLA_FLAGS=flags)
  deadline = time.time() + 240
  try:  # (Its exit then waits for process 1 at jax.distributed's shutdown: not timed here.)
    # Until the traceback that follows the line is written (its last line has the error;
    # before: a fixed 1 s, which a loaded machine can outlast) or process 0 has ended.
    while 'Timed out' not in open(tmp_path / 'proc0.log').read().partition('SECOND ENDED')[2]:
      if procs[0].poll() is not None:
        break
      assert time.time() < deadline, open(tmp_path / 'proc0.log').read()[-3000:]
      time.sleep(0.2)
  finally:
    for p in procs:
      p.kill()
      p.wait()
  log = open(tmp_path / 'proc0.log').read()
  assert 'FIRST DONE' in log, log[-3000:]
  waited = float(log.split('SECOND ENDED after ')[1].split(' s')[0])
  assert 4 < waited < 60, log[-3000:]
  assert 'Gloo' in log and 'Timed out' in log, log[-3000:]


# `python -m anp_jax.main` in which process 1's part of every asynchronous checkpoint save never
# ends: the process is alive (its heartbeats go on) but never reaches orbax's barrier after the
# writes, as a process whose writes hang on a stuck file system.
STUCK_SAVE = """
import os, time
if os.environ['ANP_PROCESS_ID'] == '1':
  from orbax.checkpoint._src.checkpointers import async_checkpointer
  def never_done(*args, **kwargs):
    print('PROCESS 1 STUCK IN ITS SAVE', flush=True)
    time.sleep(3600)
  async_checkpointer._background_wait_for_commit_futures = never_done
from anp_jax import main
main.run()
"""


@pytest.mark.slow(60)
def test_a_process_stuck_in_a_checkpoint_save_fails_the_job_within_the_barrier_timeout(
    data_dir, tmp_path):
  """Process 0 gives up on the save after ANP_BARRIER_TIMEOUT (15 s here: orbax waits it out
  twice, at its commit and its finalize barrier) with an error naming the step, orbax's barrier
  and the setting; process 1 then ends too (its coordinator is gone).
  Before: process 0 waited orbax's own 1200 s (stacks: in CheckpointManager.save's
  wait_until_finished), and the job outlived the harness's 240 s time-out."""
  workdir = tmp_path / 'work'
  flags = main_cmd(data_dir, workdir, num_train_steps=4, checkpoint_every_steps=2,
                   async_checkpointing=True, batch_size=8)[3:]
  procs = launch([sys.executable, '-c', STUCK_SAVE, *flags], 2, 1, tmp_path,
                 ANP_BARRIER_TIMEOUT=15, ANP_SHUTDOWN_TIMEOUT=10)
  logs = finish(procs, tmp_path, timeout=240)
  assert 'PROCESS 1 STUCK IN ITS SAVE' in logs[1], logs[1][-3000:]
  # Process 0 reports the error and returns 2; JAX's shutdown barrier, which process 1 never
  # reaches, then aborts it (exit -6): with a stuck process no exit code is certain.
  assert procs[0].returncode != 0 and procs[1].returncode != 0, logs[0][-3000:]
  assert 'Timed out while waiting for async_write_complete barrier' in logs[0], logs[0][-5000:]
  error = logs[0][logs[0].index('ERROR: Saving the checkpoint of step'):]
  assert 'another process did not finish its part of the save within 15 s' in error, error
  assert not (workdir / 'checkpoints' / '2').exists()  # Never committed.


@pytest.mark.slow(40)
def test_two_processes_resume_past_a_corrupt_checkpoint_and_move_it_aside_once(data_dir,
                                                                               tmp_path):
  """Both processes fall back to step 3, agree on it, process 0 alone renames the corrupt 6, and
  the job saves 6 again (orbax skipped every save up to a corrupt newer step left in place)."""
  workdir = tmp_path / 'work'
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=6, checkpoint_every_steps=3),
                             str(workdir))
  for path in (workdir / 'checkpoints' / '6' / 'state').rglob('*'):
    if path.is_file():
      path.write_bytes(path.read_bytes()[:path.stat().st_size // 3])
  procs = launch(main_cmd(data_dir, workdir, num_train_steps=8, checkpoint_every_steps=3), 2, 1,
                 tmp_path)
  logs = finish(procs, tmp_path)
  assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:]
  assert 'Resumed from checkpoint at step 3' in logs[0], logs[0][-2000:]
  assert all('checkpoint 6 could not be restored' in log for log in logs)  # Both fell back.
  assert ['moved the unreadable checkpoint 6' in log for log in logs] == [True, False]
  names = set(os.listdir(workdir / 'checkpoints'))
  assert {'3', '6', '6.unreadable', '8'} <= names, names
