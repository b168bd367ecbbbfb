"""run.sh's environment set-up: only process 0 of a job installs into the shared venv.

Two processes of one job started on one host (the README's explicit multi-process launch,
ANP_PROCESS_ID) both used to run `pip install -e` into the same venv at once when the package
needed (re)installing; one of them failed (`__editable__...pth`: No such file). A fake venv
whose `python` only logs its arguments shows which process installs."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup(tmp_path, **env):
  """Runs `ANP_SETUP_ONLY=1 run.sh` on a fake venv whose requirements are current and whose
  package is not installed for this checkout; returns what its `python` was asked to do."""
  venv = tmp_path / 'venv'
  (venv / 'bin').mkdir(parents=True)
  log = tmp_path / 'calls.log'
  python = venv / 'bin' / 'python'
  python.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
  python.chmod(0o755)
  shutil.copy(os.path.join(ROOT, 'requirements.txt'), venv / '.anp_requirements_ok')
  clean = {k: v for k, v in os.environ.items() if k not in ('SLURM_PROCID', 'ANP_PROCESS_ID')}
  proc = subprocess.run(['bash', os.path.join(ROOT, 'run.sh')], capture_output=True, text=True,
                        timeout=60, env=dict(clean, ANP_VENV=str(venv), ANP_SETUP_ONLY='1', **env))
  assert proc.returncode == 0, proc.stderr
  return log.read_text() if log.exists() else ''


@pytest.mark.parametrize('env', [{}, {'ANP_PROCESS_ID': '0'}, {'SLURM_PROCID': '0'}])
def test_process_0_installs_the_package(tmp_path, env):
  assert '-m pip install' in _setup(tmp_path, **env) and (tmp_path / 'venv' / '.anp_package_ok'
                                                         ).read_text().strip() == ROOT


@pytest.mark.parametrize('env', [{'ANP_PROCESS_ID': '1'}, {'SLURM_PROCID': '1'}])
def test_other_processes_leave_the_venv_alone(tmp_path, env):
  assert 'pip' not in _setup(tmp_path, **env)
