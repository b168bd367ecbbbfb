"""SLURM preemption end to end on a real one-node cluster (conftest's `slurm` fixture).

The shipped experiments/slurm/train.sbatch, submitted with sbatch as a user would, two tasks
(two processes of one JAX job) on the one node (.ci/run installs Debian's slurm-wlm and munge;
tests/slurm_cluster.py writes a slurm.conf into a temporary directory, starts the daemons and
stops them afterwards):

* the uninterrupted job runs as one JAX job of two processes and finishes;
* ``scancel --signal=USR1`` (what ``#SBATCH --signal=USR1@300`` sends before the time limit) ->
  both processes checkpoint at one step -> exit 75 -> the job requeues itself -> the requeued job
  resumes from that checkpoint and ends with the per-step losses and final parameters of an
  uninterrupted job, bit for bit;
* ``kill -9`` of one task's trainer -> the job ends within a bound far below the default
  heartbeat time-out, its log names the lost task, and a resubmission resumes from the last
  checkpoint.

The timings printed (signal -> exit, requeue -> resume, kill -> end) are wall-clock figures
on whatever machine runs the tests, i.e. under that machine's load.
"""

import json
import os
import signal
import subprocess
import time

import jax
import numpy as np
import pytest

import slurm_cluster
from anp_jax import checkpointing
from conftest import ROOT, TEST_XLA_FLAGS, assert_leaves_close, config_flags, tiny_config

POLL_S = 0.25
EXITED_75 = 'preempted; checkpoint written (exit 75)'  # run.sh, per task.
ENDED = ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY')


def _flags(data_dir, workdir, **overrides):
  config = tiny_config(data_dir, **dict(dict(
      batch_size=16, eval_batch_size=16, log_every_steps=1, noise_scale=False), **overrides))
  return [f'--workdir={workdir}'] + config_flags(config)


def _submit(env, script, out_file, flags, wait=False, **job_env):
  """sbatch of `script` with two tasks on the one node; returns the job id (`wait`: after the
  job ended, asserting that sbatch exited 0)."""
  cmd = (['sbatch', '--parsable', '--nodes=1', '--ntasks=2', '--ntasks-per-node=2',
          '--cpus-per-task=1', '--time=10', f'--output={out_file}']
         + (['--wait'] if wait else []) + [str(script)] + flags)
  env = dict(env, ANP_INIT_TIMEOUT='60', XLA_FLAGS=TEST_XLA_FLAGS, JAX_PLATFORMS='cpu',
             **{k: str(v) for k, v in job_env.items()})
  result = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
  log = out_file.read_text() if out_file.exists() else ''
  assert result.returncode == 0, (result.stdout, result.stderr, log[-5000:])
  return result.stdout.strip().split(';')[0]


class _Watch:
  """Polls a job's state and its output file; remembers when each text first appeared."""

  def __init__(self, env, job_id, out_file):
    self.env, self.job_id, self.out_file = env, job_id, out_file
    self.seen = {}
    self.info = {}
    self.log = ''

  def poll(self, texts=()):
    self.info = slurm_cluster.job_info(self.env, self.job_id)
    self.log = self.out_file.read_text() if self.out_file.exists() else ''
    now = time.time()
    for text in texts:
      if text in self.log:
        self.seen.setdefault(text, now)
    state = self.info.get('JobState', 'GONE')
    self.seen.setdefault(f'{state}/{self.info.get("Restarts")}', now)
    return self.info

  def until(self, done, texts=(), timeout=300, what=''):
    """Polls until `done(self)`; fails with the job's state and log after `timeout` s."""
    deadline = time.time() + timeout
    while True:
      self.poll(texts)
      if done(self):
        return time.time()
      assert time.time() < deadline, (f'timed out waiting for {what}', self.info,
                                      self.log[-5000:])
      time.sleep(POLL_S)


def _losses(workdir):
  """{step: train loss} from metrics.jsonl; a step logged twice must have logged one value."""
  out = {}
  for line in open(workdir / 'metrics.jsonl'):
    row = json.loads(line)
    if 'train/loss' in row:
      assert out.setdefault(row['step'], row['train/loss']) == row['train/loss'], row
  return out


def _final_state(workdir):
  """The whole train state (parameters, BatchNorm statistics, optimizer state, step) of the
  latest checkpoint in `workdir`, restored onto this process's first device (the job saved it
  sharded over two processes' devices, which do not exist here)."""
  directory = workdir / 'checkpoints'
  step = max(int(n) for n in os.listdir(directory) if n.isdigit())
  _, state = checkpointing.restore_state(str(workdir), step)
  return step, [np.asarray(x) for x in jax.tree.leaves(state)]


def _steps_in(log, text):
  """The step numbers at the end of each line of `log` that contains `text`."""
  return [int(l.rsplit(' ', 1)[-1].rstrip('.')) for l in log.splitlines() if text in l]


@pytest.fixture(scope='module')
def script(tmp_path_factory):
  return slurm_cluster.example_script(tmp_path_factory.mktemp('sbatch') / 'train.sbatch')


def test_the_submitted_script_is_the_shipped_one_with_its_preemption_settings(script):
  """What the two jobs below rely on, in the script they submit: the shipped train.sbatch less
  only its GPU request, asking for SIGUSR1 before the time limit, requeueable, appending to its
  log across the requeue, and ending the step when a task dies. (Also this file's quick test,
  in the fast tier: its others start a cluster.)"""
  shipped = open(os.path.join(ROOT, 'experiments', 'slurm', 'train.sbatch')).read().splitlines()
  submitted = script.read_text().splitlines()
  assert submitted == [line for line in shipped if '--gpus-per-node' not in line]
  assert len(submitted) == len(shipped) - 1 and submitted[0] == '#!/bin/bash'
  directives = {line.split()[1].split('=')[0]: line.split()[1]
                for line in submitted if line.startswith('#SBATCH ')}
  assert directives['--signal'].startswith('--signal=USR1@'), directives
  assert directives['--requeue'] == '--requeue'
  assert directives['--open-mode'] == '--open-mode=append'
  assert 'srun --kill-on-bad-exit=1 ./run.sh "$@"' in submitted
  assert subprocess.run(['bash', '-n', str(script)], capture_output=True).returncode == 0


@pytest.mark.slow(180)
def test_usr1_checkpoints_requeues_and_the_job_resumes_equal_to_an_uninterrupted_one(
    slurm, script, data_dir, tmp_path):
  env, _ = slurm
  # Long enough that the signal (sent after the first logged step: a poll, then scancel ->
  # slurmctld -> slurmd -> the tasks, ~1 s here) and the agreed stop STOP_MARGIN steps later fall
  # well inside the run: a tiny step takes ~16 ms on idle cores, so 60 steps ended before the stop
  # and the job completed without a requeue (seen once in CI under load).
  steps = 300
  # The uninterrupted job: the example script as shipped, with this one-node CPU cluster's sizes
  # on the command line (they override its #SBATCH lines), runs two tasks as one JAX job.
  ref_dir = tmp_path / 'ref'
  _submit(env, script, tmp_path / 'ref.out', _flags(data_dir, ref_dir, num_train_steps=steps),
          wait=True)
  log = (tmp_path / 'ref.out').read_text()
  assert 'process 0/2' in log and 'process 1/2' in log, log[-5000:]
  assert '2 process(es)' in log and 'Done in' in log, log[-5000:]
  assert (ref_dir / 'final_metrics.json').exists()
  want_losses = _losses(ref_dir)
  assert sorted(want_losses) == list(range(1, steps + 1))

  # The same job, signalled as soon as it has trained a step.
  workdir = tmp_path / 'work'
  out_file = tmp_path / 'job.out'
  job = _submit(env, script, out_file, _flags(data_dir, workdir, num_train_steps=steps))
  watch = _Watch(env, job, out_file)
  metrics = workdir / 'metrics.jsonl'
  watch.until(lambda w: metrics.exists() and metrics.read_text().strip(),
              what='a first logged step')
  t_signal = time.time()
  slurm_cluster.command(['scancel', '--signal=USR1', job], env=env, check=True)
  marks = (EXITED_75, 'Resumed from checkpoint', 'Done in')
  watch.until(lambda w: not w.info or w.info.get('JobState') in ENDED, texts=marks,
              timeout=400, what='the requeued job to finish')
  log = watch.log
  assert watch.info.get('JobState') == 'COMPLETED', (watch.info, log[-6000:])
  assert watch.info.get('Restarts') == '1', watch.info
  assert watch.info.get('ExitCode') == '0:0', watch.info

  # Both processes stopped at one step, which was checkpointed, and the requeued job resumed there.
  stops = [_steps_in(log, f'Preempted: process {i} stops at step') for i in range(2)]
  assert len(stops[0]) == 1 and stops[0] == stops[1], (stops, log[-6000:])
  stop = stops[0][0]
  assert 1 <= stop < steps
  assert f'Resumed from checkpoint at step {stop} ' in log, log[-6000:]
  assert 'requeued SLURM job' in log, log[-6000:]
  assert 'Done in' in log

  # ... and ended as the uninterrupted job did: every step's loss and the final variables.
  assert _losses(workdir) == want_losses
  got_step, got = _final_state(workdir)
  want_step, want = _final_state(ref_dir)
  assert got_step == want_step == steps
  assert_leaves_close(got, want)

  t_exit = watch.seen[EXITED_75]
  t_requeued = min(t for k, t in watch.seen.items() if k.endswith('/1'))
  t_resumed = watch.seen['Resumed from checkpoint']
  print(f'\nSLURM preemption timings (under this machine\'s load): signal -> exit 75 '
        f'{t_exit - t_signal:.1f} s (stop at step {stop}); requeued -> resumed '
        f'{t_resumed - t_requeued:.1f} s, of which SLURM holds a requeued job '
        f'{slurm_cluster.REQUEUE_HOLD_S} s here (cred_expire); whole job '
        f'{watch.seen["Done in"] - t_signal:.1f} s after the signal.')


@pytest.mark.slow(120)
def test_kill_9_of_one_task_ends_the_job_within_the_heartbeat_timeout_and_a_resubmission_resumes(
    slurm, script, data_dir, tmp_path):
  """The survivor must stop by itself: the job's srun here lacks the example's
  --kill-on-bad-exit (SLURM's default, and what a hand-written `srun ./run.sh` gets), so only the
  trainer's own failure detection (ANP_HEARTBEAT_TIMEOUT, 5 s here) can end the job in time;
  with the default (30 s) it could not. The resubmission is the shipped example."""
  env, directory = slurm
  heartbeat, default_heartbeat = 5, 30
  plain = tmp_path / 'plain.sbatch'
  plain.write_text(script.read_text().replace('srun --kill-on-bad-exit=1 ', 'srun '))
  assert plain.read_text() != script.read_text()
  workdir = tmp_path / 'work'
  out_file = tmp_path / 'job.out'
  every = 5
  job = _submit(env, plain, out_file, _flags(data_dir, workdir, num_train_steps=100000,
                                             checkpoint_every_steps=every),
                ANP_HEARTBEAT_TIMEOUT=heartbeat)
  watch = _Watch(env, job, out_file)
  checkpoints = workdir / 'checkpoints'
  watch.until(lambda w: checkpoints.exists() and any(n.isdigit() for n in os.listdir(checkpoints)),
              timeout=400, what='a first checkpoint')
  trainers = [pid for pid in slurm_cluster.job_processes(directory, SLURM_JOB_ID=job,
                                                         SLURM_PROCID='1')
              if b'anp_jax.main' in open(f'/proc/{pid}/cmdline', 'rb').read()]
  assert len(trainers) == 1, trainers
  os.kill(trainers[0], signal.SIGKILL)
  t_kill = time.time()
  t_end = watch.until(lambda w: w.info.get('JobState') not in ('RUNNING', 'COMPLETING'),
                      timeout=300, what='the job to end after kill -9 of task 1')
  elapsed = t_end - t_kill
  log = watch.log
  assert watch.info.get('JobState') == 'FAILED', (watch.info, log[-5000:])
  assert watch.info.get('Restarts') == '0', watch.info  # Not mistaken for a preemption.
  assert (f'run.sh: task 1 (host ' in log and f'the trainer (pid {trainers[0]}) was killed by '
          'signal 9 (SIGKILL)' in log), log[-5000:]
  # A dead task is declared after between half and all of the time-out (heartbeats go every
  # half time-out): 2.5-5 s here, 15-30 s with the default; the survivor then aborts.
  assert elapsed < default_heartbeat / 2, (elapsed, log[-5000:])

  # A resubmission of the same command resumes from the last checkpoint.
  saved = max(int(n) for n in os.listdir(checkpoints) if n.isdigit())
  assert saved % every == 0
  out2 = tmp_path / 'job2.out'
  _submit(env, script, out2, _flags(data_dir, workdir, num_train_steps=saved + 2,
                                    checkpoint_every_steps=every), wait=True)
  log2 = out2.read_text()
  assert f'Resumed from checkpoint at step {saved} ' in log2, log2[-5000:]
  assert 'Done in' in log2
  assert _final_state(workdir)[0] == saved + 2
  print(f'\nkill -9 of task 1 -> job ended {elapsed:.1f} s later (ANP_HEARTBEAT_TIMEOUT='
        f'{heartbeat}; under this machine\'s load).')
