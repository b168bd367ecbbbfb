"""run.sh's environment set-up: only process 0 of a job installs into the shared venv.

Two processes of one job started on one host (the README's explicit multi-process launch,
ANP_PROCESS_ID) both used to run `pip install -e` into the same venv at once when the package
needed (re)installing; one of them failed (`__editable__...pth`: No such file). A fake venv
whose `python` only logs its arguments shows which process installs."""

import os
import shutil
import signal
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup(tmp_path, *args, **env):
  """Runs `ANP_SETUP_ONLY=1 run.sh ARGS` on a fake venv whose requirements are current and whose
  package is not installed for this checkout; returns what its `python` was asked to do."""
  venv = tmp_path / 'venv'
  (venv / 'bin').mkdir(parents=True)
  log = tmp_path / 'calls.log'
  python = venv / 'bin' / 'python'
  python.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
  python.chmod(0o755)
  shutil.copy(os.path.join(ROOT, 'requirements.txt'), venv / '.anp_requirements_ok')
  proc = subprocess.run(['bash', os.path.join(ROOT, 'run.sh'), *args], capture_output=True,
                        text=True, timeout=60,
                        env=dict(_clean_env(), ANP_VENV=str(venv), ANP_SETUP_ONLY='1', **env))
  assert proc.returncode == 0, proc.stderr
  return log.read_text() if log.exists() else ''


def _clean_env():
  return {k: v for k, v in os.environ.items()
          if k not in ('SLURM_PROCID', 'ANP_PROCESS_ID', 'SLURM_JOB_ID')}


@pytest.mark.parametrize('env', [{}, {'ANP_PROCESS_ID': '0'}, {'SLURM_PROCID': '0'}])
def test_process_0_installs_the_package(tmp_path, env):
  assert '-m pip install' in _setup(tmp_path, **env) and (tmp_path / 'venv' / '.anp_package_ok'
                                                         ).read_text().strip() == ROOT


@pytest.mark.parametrize('env', [{'ANP_PROCESS_ID': '1'}, {'SLURM_PROCID': '1'}])
def test_other_processes_leave_the_venv_alone(tmp_path, env):
  assert 'pip' not in _setup(tmp_path, **env)


@pytest.mark.parametrize('args', [('--process_id=1',), ('--process_id', '1'),
                                  ('-process_id=1',), ('-process_id', '1')])
def test_the_process_id_flag_counts_as_the_rank(tmp_path, args):
  # The README's flag-launched job: every process was "rank 0" and ran pip into the venv.
  assert 'pip' not in _setup(tmp_path, '--coordinator_address=127.0.0.1:1234',
                             '--num_processes=2', *args)


def _fake_trainer(tmp_path, script: str):
  """A venv (requirements current, package installed for this checkout) whose `python` is
  `script` (sh): run.sh then launches it as the trainer."""
  venv = tmp_path / 'venv'
  (venv / 'bin').mkdir(parents=True)
  python = venv / 'bin' / 'python'
  python.write_text('#!/bin/sh\n' + script)
  python.chmod(0o755)
  shutil.copy(os.path.join(ROOT, 'requirements.txt'), venv / '.anp_requirements_ok')
  (venv / '.anp_package_ok').write_text(ROOT + '\n')
  return dict(_clean_env(), ANP_VENV=str(venv))


def _started(log, timeout=30):
  deadline = time.time() + timeout
  while not (log.exists() and 'started' in log.read_text()):
    assert time.time() < deadline
    time.sleep(0.05)


def test_ctrl_c_stops_the_trainer_with_a_checkpoint_and_no_requeue(tmp_path):
  """SIGINT to run.sh: the trainer (a script's background child, which ignores SIGINT) kept
  training after its launcher died; now it gets SIGTERM (checkpoint, exit 75)."""
  log = tmp_path / 'trainer.log'
  env = _fake_trainer(tmp_path, f"trap 'echo TERM >> {log}; exit 75' TERM\n"
                                f'echo started "$@" >> {log}\n'
                                'while :; do sleep 0.05; done\n')
  proc = subprocess.Popen(['bash', os.path.join(ROOT, 'run.sh')], env=dict(env, SLURM_JOB_ID='7'),
                          stderr=subprocess.PIPE, text=True)
  _started(log)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=30)
  assert proc.returncode == 75, err
  assert 'TERM' in log.read_text()
  assert 'interrupted (Ctrl-C): not requeued' in err and 'requeued SLURM job' not in err


def test_the_trainers_exit_code_survives_a_signal_that_interrupts_the_wait(tmp_path):
  """A trainer that exits 75 at once on SIGTERM: run.sh's `wait` returns 143 (the trap's), and
  the child is already gone; that 143 was reported as "killed by signal 15" (no requeue)."""
  log = tmp_path / 'trainer.log'
  env = _fake_trainer(tmp_path, f"trap 'exit 75' TERM\necho started >> {log}\n"
                                'while :; do sleep 0.01; done\n')
  for _ in range(5):
    log.unlink(missing_ok=True)
    proc = subprocess.Popen(['bash', os.path.join(ROOT, 'run.sh')], env=env,
                            stderr=subprocess.PIPE, text=True)
    _started(log)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 75, err


def test_a_workdir_in_a_flagfile_is_not_overridden_by_the_demo_default(tmp_path):
  log = tmp_path / 'trainer.log'
  env = _fake_trainer(tmp_path, f'echo started "$@" >> {log}\n')
  flagfile = tmp_path / 'flags.txt'
  flagfile.write_text('--workdir=/somewhere/run1\n')
  for args in (['--flagfile', str(flagfile)], [f'--flagfile={flagfile}'], ['-workdir=/x'],
               ['-workdir', '/x']):  # absl takes one dash too.
    log.unlink(missing_ok=True)
    subprocess.run(['bash', os.path.join(ROOT, 'run.sh'), *args], env=env, check=True,
                   capture_output=True, timeout=30)
    assert 'workdirs/demo' not in log.read_text()
  log.unlink()
  subprocess.run(['bash', os.path.join(ROOT, 'run.sh')], env=env, check=True,
                 capture_output=True, timeout=30)
  assert f'--workdir={ROOT}/workdirs/demo' in log.read_text()  # Still the default otherwise.
