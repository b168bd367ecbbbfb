"""The start-up GPU check (`anp_jax.accelerator`): a node with NVIDIA GPUs and a CPU-only JAX
exits 2 with the fix (`ANP_ACCELERATOR=cuda ./run.sh`) instead of training on its CPU.

Without a GPU: a fake `nvidia-smi` first on PATH, or a fake driver folder (ANP_NVIDIA_PROC_DIR).
The environment of this suite (and its JAX) is CPU-only, so "GPUs listed" must stop a run unless
the CPU was chosen explicitly.
"""

import os
import subprocess
import sys

import pytest

from anp_jax import accelerator
from conftest import ROOT

SMI_GPUS = ('echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n'
            'echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"\n')
SMI_NO_DRIVER = ('echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA '
                 'driver." >&2\nexit 9\n')


def _env(tmp_path, smi=None, proc_entries=(), **extra):
  """This process's environment less the suite's CPU choices, with a fake `nvidia-smi` (a sh
  body) first on PATH (or no nvidia-smi) and a fake driver folder holding `proc_entries`."""
  env = {k: v for k, v in os.environ.items()
         if k not in ('CUDA_VISIBLE_DEVICES', 'JAX_PLATFORMS', 'JAX_PLATFORM_NAME',
                      'ANP_ALLOW_CPU')}
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir(exist_ok=True)
  if smi is not None:
    (bin_dir / 'nvidia-smi').write_text('#!/bin/sh\n' + smi)
    (bin_dir / 'nvidia-smi').chmod(0o755)
  proc = tmp_path / 'proc_gpus'
  proc.mkdir(exist_ok=True)
  for name in proc_entries:
    (proc / name).mkdir()
  # Without a fake nvidia-smi, none at all (a real one, on a GPU machine, would answer).
  path = (f'{bin_dir}:{env.get("PATH", "")}' if smi is not None else
          f'{bin_dir}:{os.path.dirname(sys.executable)}')
  env.update(PATH=path, ANP_NVIDIA_PROC_DIR=str(proc), PYTHONPATH=ROOT,
             TF_CPP_MIN_LOG_LEVEL='2')
  env.update(extra)
  return env


def _main(tmp_path, env, *args):
  return subprocess.run([sys.executable, '-m', 'anp_jax.main', f'--workdir={tmp_path / "w"}',
                         *args], env=env, capture_output=True, text=True, timeout=300,
                        cwd=tmp_path)


@pytest.mark.parametrize('gpus', ['smi', 'proc'])
def test_gpus_with_a_cpu_only_jax_exit_2_with_the_fix(tmp_path, gpus):
  env = (_env(tmp_path, smi=SMI_GPUS) if gpus == 'smi' else
         _env(tmp_path, proc_entries=('0000:17:00.0', '0000:65:00.0')))
  out = _main(tmp_path, env)
  assert out.returncode == 2, out.stderr[-2000:]
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('ERROR: this node has 2 NVIDIA GPU(s)'), lines
  assert 'ANP_ACCELERATOR=cuda ./run.sh' in lines[0] and 'ANP_ALLOW_CPU=1' in lines[0]
  assert not (tmp_path / 'w').exists()  # Before anything was written.


# Past the check, the run stops at the next one: a topology no job can have (exit 2 there).
BAD_TOPOLOGY = ('--num_processes=2', '--process_id=5', '--coordinator_address=127.0.0.1:1')


@pytest.mark.parametrize('choice', [dict(ANP_ALLOW_CPU='1'), dict(CUDA_VISIBLE_DEVICES=''),
                                    dict(CUDA_VISIBLE_DEVICES='-1'), dict(JAX_PLATFORMS='cpu')])
def test_an_explicit_cpu_choice_passes(tmp_path, choice):
  out = _main(tmp_path, _env(tmp_path, smi=SMI_GPUS, **choice), *BAD_TOPOLOGY)
  assert out.returncode == 2, out.stderr[-2000:]
  assert 'NVIDIA GPU' not in out.stderr and 'process id 5' in out.stderr, out.stderr[-2000:]


def test_no_gpu_no_driver_passes(tmp_path):
  for env in (_env(tmp_path), _env(tmp_path, smi=SMI_NO_DRIVER)):
    out = _main(tmp_path, env, *BAD_TOPOLOGY)
    assert out.returncode == 2 and 'NVIDIA GPU' not in out.stderr, out.stderr[-2000:]
    assert 'process id 5' in out.stderr, out.stderr[-2000:]


def test_the_study_scripts_check_too(tmp_path):
  env = _env(tmp_path, smi=SMI_GPUS)
  script = os.path.join(ROOT, 'experiments', 'study.py')
  out = subprocess.run([sys.executable, script, '--preset', 'ghost_bn', '--out',
                        str(tmp_path / 'o')], env=env, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
  assert out.returncode == 2 and 'ANP_ACCELERATOR=cuda ./run.sh' in out.stderr, out.stderr[-2000:]
  assert not (tmp_path / 'o').exists()


@pytest.mark.parametrize('argv, exits', [(['--help'], False), (['--out=x', '--dry_run'], False),
                                         (['--dry_run=true'], False), (['--out=x'], True),
                                         (['--dry_run=false'], True)])
def test_help_and_dry_runs_train_nothing_and_pass(tmp_path, monkeypatch, argv, exits):
  monkeypatch.setattr(accelerator, 'unused_gpus_error', lambda backend=None: 'GPUs idle')
  if exits:
    with pytest.raises(SystemExit) as e:
      accelerator.check_or_exit(argv=argv)
    assert e.value.code == 2
  else:
    accelerator.check_or_exit(argv=argv)


def test_a_cuda_backend_that_fell_back_to_the_cpu_is_refused(tmp_path, monkeypatch):
  """CUDA JAX installed but its backend did not start (a driver too old for CUDA 12): JAX falls
  back to the CPU with a warning; main checks the backend after jax.distributed.initialize."""
  for key, value in _env(tmp_path, smi=SMI_GPUS).items():
    monkeypatch.setenv(key, value)
  for key in ('CUDA_VISIBLE_DEVICES', 'JAX_PLATFORMS', 'JAX_PLATFORM_NAME', 'ANP_ALLOW_CPU'):
    monkeypatch.delenv(key, raising=False)
  monkeypatch.setattr(accelerator, 'cuda_plugin', lambda: 'jax-cuda12-plugin 0.10.2')
  assert accelerator.unused_gpus_error() == ''  # Before JAX starts: the plugin is there.
  message = accelerator.unused_gpus_error('cpu')
  assert 'JAX started on the CPU although jax-cuda12-plugin 0.10.2 is installed' in message
  assert accelerator.unused_gpus_error('gpu') == ''
  monkeypatch.setenv('ANP_ALLOW_CPU', '1')
  assert accelerator.unused_gpus_error('cpu') == ''
  monkeypatch.delenv('ANP_ALLOW_CPU')
  monkeypatch.setattr(accelerator, 'cuda_plugin', lambda: '')
  assert 'ANP_ACCELERATOR=cuda ./run.sh' in accelerator.unused_gpus_error()


def test_the_gpu_listing(tmp_path, monkeypatch):
  """nvidia-smi first (it lists the GPUs this process may open: a job's cgroup hides the others
  of a shared node), the driver's folder (every GPU of the node) only without it."""
  monkeypatch.setenv('PATH', _env(tmp_path, smi=SMI_GPUS)['PATH'])
  monkeypatch.setenv('ANP_NVIDIA_PROC_DIR', str(tmp_path / 'proc_gpus'))
  (tmp_path / 'proc_gpus' / '0000:17:00.0').mkdir()
  assert accelerator.nvidia_gpus() == ['GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)',
                                       'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)']
  (tmp_path / 'bin' / 'nvidia-smi').write_text('#!/bin/sh\n')  # This job: no GPU of its own.
  assert accelerator.nvidia_gpus() == []
  (tmp_path / 'bin' / 'nvidia-smi').unlink()
  monkeypatch.setenv('PATH', '/nonexistent')
  assert accelerator.nvidia_gpus() == ['0000:17:00.0']
