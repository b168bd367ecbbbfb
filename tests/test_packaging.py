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


def _pins(name: str):
  """(distribution, version) of every `name==version` line of a requirements file."""
  pins = []
  for line in open(os.path.join(ROOT, name)):
    line = line.split('#')[0].strip()
    if line:
      dist, version = line.split('==')
      pins.append((dist.split('[')[0], version))
  return pins


def test_the_environment_has_every_pinned_version():
  """requirements.txt is the environment: each pin is installed at its version (an unpinned or
  missing tool, such as IPython before it was listed, fails here, not on a user's first day)."""
  from importlib import metadata
  wrong = []
  for dist, version in _pins('requirements.txt'):
    try:
      installed = metadata.version(dist)
    except metadata.PackageNotFoundError:
      installed = None
    if installed != version:
      wrong.append(f'{dist}=={version} (installed: {installed})')
  assert not wrong, wrong
  assert 'ipython' in {d.lower() for d, _ in _pins('requirements.txt')}


def test_ipython_runs_the_library_in_the_environment(tmp_path):
  """Interactive use is one of the three ways this project is used: the environment's IPython
  starts and imports anp_jax."""
  env = dict(os.environ, IPYTHONDIR=str(tmp_path / 'ipython'), PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, '-m', 'IPython', '--no-banner', '--quick', '-c',
                        'import anp_jax.runtime, IPython; print("ipython", IPython.__version__)'],
                       env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-2000:]
  expected = dict(_pins('requirements.txt'))['ipython']
  assert f'ipython {expected}' in out.stdout, out.stdout
