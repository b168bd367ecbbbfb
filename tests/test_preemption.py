"""Preemption: a process-wide flag that survives between runs, a bounded signal-to-checkpoint
delay, and one agreed stop step for all processes of a job (no per-step collective)."""

import dataclasses
import json
import os
import signal
import threading
import time

import jax
import pytest

from anp_jax import errors, executors, preemption, trainer
from anp_jax.research import sweep
from anp_jax.research import sync_async_mixed as sam
from conftest import finish, launch, main_cmd, tiny_config


@pytest.fixture(autouse=True)
def clean_flag():
  preemption.install()  # SIGTERM must set the flag, not end the test session.
  preemption.reset()
  yield
  preemption.reset()


def _checkpoint_steps(workdir):
  directory = os.path.join(workdir, 'checkpoints')
  return sorted(int(n) for n in os.listdir(directory) if n.isdigit())


def _ready(tree) -> bool:
  return all(x.is_ready() for x in jax.tree.leaves(tree))


def test_signal_is_acted_on_within_a_few_steps_whatever_the_log_cadence(data_dir, tmp_path,
                                                                        monkeypatch):
  """A signal while the device runs step s+1: checkpoint at <= s + MAX_IN_FLIGHT + 1, although
  metrics are fetched only every 1000 steps (before: at the next fetch, here never: the run
  went on to its end and exited 0)."""
  signal_after = 5
  outputs, seen = [], {}
  make_executor = executors.make_executor

  def recording_executor(*args, **kwargs):
    executor = make_executor(*args, **kwargs)
    step_fn = executor.train_step

    def train_step(state, batch, *step_args):
      state, sums = step_fn(state, batch, *step_args)
      outputs.append(sums)
      return state, sums
    return dataclasses.replace(executor, train_step=train_step)

  def watcher():  # Sends SIGTERM as soon as the device has finished step `signal_after`.
    deadline = time.time() + 300
    while time.time() < deadline:
      done = 0
      while done < len(outputs) and _ready(outputs[done]):
        done += 1
      if done >= signal_after:
        seen['completed'] = done
        os.kill(os.getpid(), signal.SIGTERM)
        return
      time.sleep(0.0005)

  monkeypatch.setattr(executors, 'make_executor', recording_executor)
  # Large batches: slow steps, so that the loop (before: unbounded) runs far ahead of the device.
  config = tiny_config(data_dir, num_train_steps=60, log_every_steps=1000, batch_size=256)
  thread = threading.Thread(target=watcher, daemon=True)
  thread.start()
  with pytest.raises(errors.Preempted) as info:
    trainer.train_and_evaluate(config, str(tmp_path / 'work'))
  thread.join()
  bound = seen['completed'] + preemption.MAX_IN_FLIGHT + 1
  assert info.value.code == errors.EXIT_PREEMPTED
  assert seen['completed'] <= info.value.step <= bound
  assert _checkpoint_steps(tmp_path / 'work') == [info.value.step]


def test_the_flag_survives_between_runs(data_dir, tmp_path):
  """A signal after a run's last step boundary stops the next run at its first step."""
  config = tiny_config(data_dir, num_train_steps=3)
  trainer.train_and_evaluate(config, str(tmp_path / 'a'))
  os.kill(os.getpid(), signal.SIGUSR1)
  time.sleep(0.1)
  assert preemption.requested() == signal.SIGUSR1
  with pytest.raises(errors.Preempted) as info:
    trainer.train_and_evaluate(config, str(tmp_path / 'b'))
  assert info.value.step == 1 and _checkpoint_steps(tmp_path / 'b') == [1]


class _FakeStore:
  """The coordination service's key-value store, for processes simulated in one."""

  def __init__(self):
    self.data = {}

  def key_value_set(self, key, value, allow_overwrite=False):
    if key in self.data and not allow_overwrite:
      raise RuntimeError(f'ALREADY_EXISTS: {key}')
    self.data[key] = value

  def key_value_dir_get(self, prefix):
    return sorted((k, v) for k, v in self.data.items() if k.startswith(prefix))


def test_any_process_requested_asks_the_coordination_service_with_a_bounded_wait(monkeypatch):
  """Between a sweep's runs: a key-value exchange and a barrier bounded by ANP_BARRIER_TIMEOUT
  (before: a device all-gather, which waits without saying for what: on GPUs for ever)."""
  from jax._src import distributed as jax_distributed
  from jax.experimental import multihost_utils
  from anp_jax import distributed
  other = {'signalled': '0'}

  class Client(_FakeStore):
    barriers = []

    def wait_at_barrier(self, barrier_id, timeout_ms):
      self.barriers.append((barrier_id, timeout_ms))
      self.data[f'{barrier_id}/1'] = other['signalled']  # Process 1 arrived with its flag.

  monkeypatch.setattr(jax_distributed.global_state, 'client', Client())
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(jax, 'process_index', lambda: 0)
  monkeypatch.setattr(distributed.coordination, '_barrier_uses', {})
  monkeypatch.setattr(multihost_utils, 'process_allgather',
                      lambda *a, **k: pytest.fail('a device collective'))
  monkeypatch.setenv('ANP_BARRIER_TIMEOUT', '7')
  assert preemption.any_process_requested() is False
  other['signalled'] = '1'
  assert preemption.any_process_requested() is True  # Process 1's signal counts here too.
  other['signalled'] = '0'
  monkeypatch.setattr(preemption, '_signal', signal.SIGTERM)
  assert preemption.any_process_requested() is True
  assert Client.barriers == [(f'anp_jax/preemption_check/{i}', 7000) for i in range(3)]


@pytest.mark.parametrize('signal_step', [8, 9, 10, 11])  # Every phase of READ_EVERY = 4.
@pytest.mark.parametrize('lag', [-3, 0, 1, 3])
def test_processes_agree_on_one_stop_and_save_step(lag, signal_step, monkeypatch):
  """Process 1 (running `lag` steps behind process 0 or ahead of it; the most the bounded
  run-ahead allows is MAX_IN_FLIGHT + 1) gets the signal at its step `signal_step`; process 0's
  clock asks for a save at its step 3. Both save at the same steps and stop at the same step,
  although each reads the store only every READ_EVERY steps."""
  assert abs(lag) <= preemption.MAX_IN_FLIGHT + 1
  assert preemption.READ_EVERY > 1  # The phases above matter.
  store = _FakeStore()
  reads = []
  get = store.key_value_dir_get
  store.key_value_dir_get = lambda prefix: reads.append(prefix) or get(prefix)
  procs = [preemption.StepAgreement(store, i, 2, run_id=f'lag{lag}_{signal_step}')
           for i in range(2)]
  decisions = [{}, {}]
  for t in range(1, 40):
    for i, step in ((0, t), (1, t - lag)):
      if step < 1 or 'stop' in decisions[i]:
        continue
      monkeypatch.setattr(preemption, '_signal',
                          signal.SIGTERM if i == 1 and step >= signal_step else None)
      # Process 0's timer is due from step 3 until the save is taken (then it restarts).
      timer_due = 3 <= step <= 3 + preemption.STOP_MARGIN
      save, stop = procs[i].due(step, local_save=timer_due)
      if save:
        decisions[i].setdefault('saves', []).append(step)
      if stop:
        decisions[i]['stop'] = step
  assert decisions[0] == decisions[1]
  assert decisions[0]['stop'] == signal_step + preemption.STOP_MARGIN
  assert decisions[0]['saves'] == [3 + preemption.STOP_MARGIN, decisions[0]['stop']]
  # One store read per READ_EVERY steps and process, not one per step.
  assert len(reads) == 2 * (decisions[0]['stop'] // preemption.READ_EVERY)


# ----------------------------------------------------------------------------------------------
# The sweep: a signal in the final evaluation or between runs -> exit 75, then an exact resume.


def _sweep_argv(out, data_dir):
  return ['--preset', 'tiny', '--out', str(out), '--target_top1', '0.05', '--no_report',
          f'--config.data_dir={data_dir}']


_COMPARED = ('name', 'final_step', 'final_top1', 'final_top5', 'best_top1', 'steps_to_target',
             'status')


def _rows(out):
  rows = json.load(open(os.path.join(out, 'results.json')))
  return [{k: r[k] for k in _COMPARED} for r in rows]


@pytest.fixture(scope='module')
def reference_sweep(data_dir, tmp_path_factory):
  out = tmp_path_factory.mktemp('reference_sweep')
  assert sweep.main(_sweep_argv(out, data_dir)) == 0
  return _rows(out)


@pytest.mark.slow(30)
@pytest.mark.parametrize('when', ['final_evaluation', 'between_runs'])
def test_sweep_exits_75_on_a_late_signal_and_resumes_exactly(data_dir, tmp_path, monkeypatch,
                                                             reference_sweep, when):
  out = tmp_path / 'sweep'
  sent = []
  if when == 'final_evaluation':
    evaluate = trainer.Run.eval_record  # Every evaluation of the loop goes through it.

    def evaluate_and_signal(run, state, step):
      if not sent and int(run.fetch(state.step)) == run.setup.total_steps:
        sent.append(True)
        os.kill(os.getpid(), signal.SIGTERM)
      return evaluate(run, state, step)
    monkeypatch.setattr(trainer.Run, 'eval_record', evaluate_and_signal)
  else:
    train_and_evaluate = trainer.train_and_evaluate

    def train_then_signal(config, workdir):
      result = train_and_evaluate(config, workdir)
      if not sent:
        sent.append(True)
        os.kill(os.getpid(), signal.SIGTERM)
      return result
    monkeypatch.setattr(trainer, 'train_and_evaluate', train_then_signal)
  with pytest.raises(SystemExit) as info:
    sweep.main(_sweep_argv(out, data_dir))
  assert info.value.code == errors.EXIT_PREEMPTED and sent
  finished = sorted(os.listdir(out / 'runs'))
  assert [os.path.exists(out / 'runs' / n / 'final_metrics.json') for n in finished] == [True]
  monkeypatch.undo()
  preemption.reset()  # The requeued job is a new process.
  assert sweep.main(_sweep_argv(out, data_dir)) == 0
  assert _rows(out) == reference_sweep


def test_sync_async_mixed_exits_75_between_runs(data_dir, tmp_path):
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.1)
  with pytest.raises(SystemExit) as info:
    sam.main(['--preset', 'tiny', '--out', str(tmp_path / 'sam'),
              f'--config.data_dir={data_dir}'])
  assert info.value.code == errors.EXIT_PREEMPTED
  assert not (tmp_path / 'sam' / 'runs').exists()  # Nothing was started.


# ----------------------------------------------------------------------------------------------
# Several processes: SIGTERM to one of them.


@pytest.mark.slow(120)
def test_sigterm_to_one_process_stops_all_at_the_same_step(data_dir, tmp_path):
  workdir = tmp_path / 'work'

  def cmd(steps):  # 2 processes x 1 device, 4 examples each (one ghost-BN group).
    return main_cmd(data_dir, workdir, num_train_steps=steps, batch_size=8, log_every_steps=1)

  procs = launch(cmd(100000), 2, 1, tmp_path)
  metrics = workdir / 'metrics.jsonl'
  deadline = time.time() + 300
  while not (metrics.exists() and metrics.read_text().count('\n') >= 3):
    assert time.time() < deadline, open(tmp_path / 'proc0.log').read()[-3000:]
    assert all(p.poll() is None for p in procs), open(tmp_path / 'proc0.log').read()[-3000:]
    time.sleep(0.2)
  procs[1].send_signal(signal.SIGTERM)
  logs = finish(procs, tmp_path, timeout=180)
  assert [p.returncode for p in procs] == [errors.EXIT_PREEMPTED] * 2, [l[-3000:] for l in logs]
  stops = []
  for i, log in enumerate(logs):
    line = [l for l in log.splitlines() if f'Preempted: process {i} stops at step' in l]
    assert len(line) == 1, log[-3000:]
    stops.append(int(line[0].rsplit(' ', 1)[-1].rstrip('.')))
  assert stops[0] == stops[1]
  assert _checkpoint_steps(workdir) == [stops[0]]
  procs = launch(cmd(stops[0] + 2), 2, 1, tmp_path)
  log0 = finish(procs, tmp_path, timeout=300)[0]
  assert [p.returncode for p in procs] == [0, 0], log0[-3000:]
  assert f'Resumed from checkpoint at step {stops[0]}' in log0


def test_a_signal_during_start_up_still_gives_a_checkpoint_and_exit_75(data_dir, tmp_path):
  """SIGUSR1 while the trainer imports TensorFlow (before: the handler came after the imports and
  jax.distributed's wait for the other processes, so the signal's default action killed it: no
  checkpoint, no exit 75, no requeue)."""
  import subprocess
  import sys
  from conftest import config_flags, subprocess_env
  code = ('import os, signal\n'
          'from anp_jax import runtime\n'
          'configure = runtime.configure\n'
          'def signalled(*args, **kwargs):\n'
          '  os.kill(os.getpid(), signal.SIGUSR1)\n'
          '  return configure(*args, **kwargs)\n'
          'runtime.configure = signalled\n'
          'from anp_jax import main\n'
          'main.run()\n')
  workdir = tmp_path / 'work'
  out = subprocess.run(
      [sys.executable, '-c', code, f'--workdir={workdir}',
       *config_flags(tiny_config(data_dir, num_train_steps=6))],
      env=subprocess_env(), capture_output=True, text=True, timeout=600)
  assert out.returncode == errors.EXIT_PREEMPTED, (out.returncode, out.stderr[-3000:])
  assert _checkpoint_steps(workdir) == [1]


@pytest.mark.parametrize('launcher', ['python', 'run.sh'])
def test_ctrl_c_stops_with_a_checkpoint_and_says_how_to_resume(data_dir, tmp_path, launcher):
  """Ctrl-C at a terminal: SIGINT to the trainer's process group. Under run.sh the trainer (a
  script's background child: SIGINT ignored when it starts) also gets run.sh's SIGTERM. Was:
  'Preempted: checkpoint written at step 1; exiting with code 75 so that the launcher requeues
  the job.' (run.sh then: 'not requeued'), or, without run.sh, a KeyboardInterrupt traceback and
  no checkpoint."""
  import subprocess
  import sys
  from conftest import config_flags, subprocess_env
  sent = 'SIGINT' if launcher == 'python' else 'SIGINT); os.kill(os.getpid(), signal.SIGTERM'
  code = ('import os, signal\n'
          'from anp_jax import runtime\n'
          'configure = runtime.configure\n'
          'def signalled(*args, **kwargs):\n'
          f'  os.kill(os.getpid(), signal.{sent})\n'
          '  return configure(*args, **kwargs)\n'
          'runtime.configure = signalled\n'
          'from anp_jax import main\n'
          'main.run()\n')
  ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if launcher == 'run.sh' else None
  workdir = tmp_path / 'work'
  out = subprocess.run(
      [sys.executable, '-c', code, f'--workdir={workdir}',
       *config_flags(tiny_config(data_dir, num_train_steps=6))],
      env=subprocess_env(), capture_output=True, text=True, timeout=600, preexec_fn=ignore)
  assert out.returncode == errors.EXIT_PREEMPTED, (out.returncode, out.stderr[-3000:])
  assert _checkpoint_steps(workdir) == [1]
  assert 'Ctrl-C: stopping at the next step boundary with a checkpoint' in out.stderr
  assert ('Stopped (Ctrl-C) at step 1, checkpoint written. Rerun the same command to resume.'
          in out.stdout), out.stdout
  assert 'requeue' not in out.stdout + out.stderr and 'Traceback' not in out.stderr
  assert 'Received signal' not in out.stderr  # run.sh's SIGTERM after the Ctrl-C: said already.


def test_a_second_ctrl_c_stops_at_once_without_a_traceback(tmp_path):
  """The first Ctrl-C waits for the next step boundary (a step of a large model on CPU can take
  minutes); a second one stops at once: exit 130 and what it means, not a KeyboardInterrupt
  traceback."""
  import subprocess
  import sys
  from conftest import subprocess_env
  code = ('import os, signal\n'
          'from anp_jax import runtime\n'
          'def signalled(*args, **kwargs):\n'
          '  os.kill(os.getpid(), signal.SIGINT)\n'
          '  os.kill(os.getpid(), signal.SIGINT)\n'
          'runtime.configure = signalled\n'
          'from anp_jax import main\n'
          'main.run()\n')
  out = subprocess.run([sys.executable, '-c', code, f'--workdir={tmp_path / "work"}'],
                       env=subprocess_env(), capture_output=True, text=True, timeout=300)
  assert out.returncode == 130, (out.returncode, out.stderr[-3000:])
  assert 'Stopped at once (Ctrl-C twice), without a checkpoint' in out.stderr
  assert 'Traceback' not in out.stderr
