"""Start-up check: a node with NVIDIA GPUs never trains on its CPU without a word.

`run.sh` builds the CPU environment unless asked for CUDA (``ANP_ACCELERATOR=cuda``, README "On
a GPU cluster"), and JAX without its CUDA plugin, or with a plugin that fails to start (a driver
too old for it), quietly runs on the CPU: a 4-node GPU job then trains for days at a CPU's speed.
The training entry points call `check_or_exit` before any work:

* the node has NVIDIA GPUs for this process: ``nvidia-smi -L`` lists them or, without
  ``nvidia-smi``, the driver's ``/proc/driver/nvidia/gpus/`` (``ANP_NVIDIA_PROC_DIR`` overrides
  the folder, for tests) does;
* and nobody chose the CPU: ``CUDA_VISIBLE_DEVICES=''`` (or ``-1``), ``JAX_PLATFORMS`` without
  ``cuda`` / ``gpu`` (e.g. ``cpu``), or ``ANP_ALLOW_CPU=1`` (the opt-out, documented);
* but this environment's JAX has no CUDA plugin (checked before JAX starts), or, given the
  backend JAX started (``jax.default_backend()``, after ``jax.distributed.initialize``), that
  backend is the CPU.

Then the process exits with code 2 and one line saying how to fix it. No JAX import here: the
first check runs before JAX picks its backend (and before the XLA flags are final).
"""

import glob
import importlib.metadata
import os
import shutil
import subprocess
import sys
from typing import List, Optional, Sequence

PROC_DIR = '/proc/driver/nvidia/gpus'
CUDA_PLUGINS = ('jax-cuda12-plugin', 'jax-cuda13-plugin')
FIX = ('build the environment with CUDA JAX: ANP_ACCELERATOR=cuda ./run.sh ... (README "On a '
       'GPU cluster"), or set ANP_ALLOW_CPU=1 to train on the CPU anyway')


def nvidia_gpus() -> List[str]:
  """The NVIDIA GPUs this process can use, as the driver lists them ([] without a driver).

  ``nvidia-smi -L`` first: it lists only the GPUs this process may open (a SLURM job's cgroup
  hides the others of a shared node). Without it, the driver's folder, which lists every GPU of
  the node."""
  smi = shutil.which('nvidia-smi')
  if smi:
    try:
      out = subprocess.run([smi, '-L'], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
      return []
    if out.returncode != 0:  # Installed, but no driver loaded: no usable GPU.
      return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith('GPU ')]
  proc = os.environ.get('ANP_NVIDIA_PROC_DIR', PROC_DIR)
  return sorted(os.path.basename(p) for p in glob.glob(os.path.join(proc, '*')))


def cpu_chosen() -> str:
  """The setting by which the user chose the CPU on purpose ('' if none)."""
  if os.environ.get('ANP_ALLOW_CPU', '') not in ('', '0'):
    return 'ANP_ALLOW_CPU'
  visible = os.environ.get('CUDA_VISIBLE_DEVICES')
  if visible is not None and visible.strip() in ('', '-1'):
    return f'CUDA_VISIBLE_DEVICES={visible!r}'
  platforms = os.environ.get('JAX_PLATFORMS', '') or os.environ.get('JAX_PLATFORM_NAME', '')
  names = {p.strip().lower() for p in platforms.split(',') if p.strip()}
  if names and not names & {'cuda', 'gpu'}:
    return f'JAX_PLATFORMS={platforms}'
  return ''


def cuda_plugin() -> str:
  """The installed JAX CUDA plugin ('jax-cuda12-plugin 0.10.2'), '' if none."""
  for name in CUDA_PLUGINS:
    try:
      return f'{name} {importlib.metadata.version(name)}'
    except importlib.metadata.PackageNotFoundError:
      continue
  return ''


def unused_gpus_error(backend: Optional[str] = None) -> str:
  """One line if this node's NVIDIA GPUs would sit idle while JAX trains on the CPU, else ''.

  Without `backend` (before JAX starts): the environment has no CUDA plugin. With it (the name
  JAX's default backend reports): that backend is the CPU although a plugin is installed.
  """
  if cpu_chosen():
    return ''
  gpus = nvidia_gpus()
  if not gpus:
    return ''
  where = (f'this node has {len(gpus)} NVIDIA GPU(s) ({gpus[0]}{", ..." if len(gpus) > 1 else ""})')
  if backend is None:
    if cuda_plugin():
      return ''
    return (f'{where} but this environment\'s JAX is CPU-only ({sys.prefix}): {FIX}.')
  if backend == 'cpu':
    return (f'{where} but JAX started on the CPU although {cuda_plugin() or "CUDA JAX"} is '
            'installed (JAX\'s warning above says why: often a driver older than its CUDA '
            f'12; check `nvidia-smi`): fix the driver or the environment, or set '
            'ANP_ALLOW_CPU=1 to train on the CPU anyway.')
  return ''


SKIP_ARGS = ('-?', '--help', '--helpshort', '--helpfull', '--helpxml', '--dry_run')


def check_or_exit(backend: Optional[str] = None, argv: Sequence[str] = ()) -> None:
  """Exits with code 2 and the one-line fix when `unused_gpus_error(backend)` says so; a help
  request or a dry run in `argv` trains nothing and is let through."""
  if any(a in SKIP_ARGS or (a.startswith('--dry_run=') and
                            a.split('=', 1)[1].lower() not in ('false', '0')) for a in argv):
    return
  error = unused_gpus_error(backend)
  if error:
    print(f'ERROR: {error}', file=sys.stderr, flush=True)
    sys.exit(2)
