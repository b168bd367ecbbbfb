"""The package and its scripts: the wheel holds every module, and the experiment scripts run
from any directory."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT


def test_package_builds_with_every_module(tmp_path):
  """pyproject.toml: the wheel (what `pip install -e .` installs) holds all of anp_jax."""
  import shutil
  src = tmp_path / 'src'  # setuptools builds in the source tree: not in the checkout.
  shutil.copytree(os.path.join(ROOT, 'anp_jax'), src / 'anp_jax',
                  ignore=shutil.ignore_patterns('__pycache__'))
  for name in ('pyproject.toml', 'requirements.txt', 'README.md'):
    shutil.copy(os.path.join(ROOT, name), src / name)
  out = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps',
                        '--no-build-isolation', '-w', str(tmp_path), str(src)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-2000:]
  import zipfile
  wheel, = [p for p in os.listdir(tmp_path) if p.endswith('.whl')]
  names = set(zipfile.ZipFile(tmp_path / wheel).namelist())
  ours = {os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(
      os.path.join(ROOT, 'anp_jax')) for f in fs if f.endswith('.py')}
  assert ours <= names, sorted(ours - names)


@pytest.mark.slow(30)
def test_experiment_scripts_run_from_another_directory(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env.pop('PYTHONPATH', None)
  for script in ('report.py', 'batch_size_sweep.py', 'perfmodel_validation.py',
                 'sync_async_mixed.py'):
    out = subprocess.run([sys.executable, os.path.join(ROOT, 'experiments', script), '--help'],
                         env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, (script, out.stderr[-2000:])
