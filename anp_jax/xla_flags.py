"""XLA:CPU defaults that anp_jax sets in ``XLA_FLAGS`` (`anp_jax.runtime.configure`).

XLA reads ``XLA_FLAGS`` when JAX starts its first backend (the first ``jax.devices()`` or
computation), not at ``import jax``, so `apply_cpu_defaults` must run before that; afterwards the
flags have no effect. What is set and why:

* ``--xla_cpu_experimental_ynn_fusion_type=individual_dot``: jaxlib 0.10 sends convolutions to
  YNNPACK by default, whose filter-gradient convolution (a "kernel" as large as the image, a 3x3
  output) runs 3-4x slower than XLA's Eigen convolution. This keeps YNNPACK for dots and gives
  convolutions back to Eigen: a ResNet-20 training step (batch 128, 32 px, 2 idle cores) goes
  from 68.5 to 106 images/s (experiments/results/benchmark_cpu/README.md). GPU backends ignore
  ``xla_cpu_*`` flags.

* ``--xla_cpu_collective_call_terminate_timeout_seconds=300`` (and the "stuck" warning at 60
  instead of 20): XLA:CPU aborts the whole process (SIGABRT, "Termination timeout for `all
  reduce ...` of 40 seconds exceeded") when one simulated device's thread reaches an in-process
  collective 40 s after another. On an oversubscribed host that is starvation, not a hang: a
  ghost-BN study on 2 simulated devices, sharing 2 cores with the test suite, was killed this
  way mid-run (2026-12-05, run 17 of 27; it resumed). The wait stays bounded, at 5 minutes.
  Collectives across processes (gloo) have their own bound, ``xla_cpu_collective_timeout_seconds``.

* ``NPROC`` (an environment variable, not a flag) = 4 x max(simulated devices, cores) when
  ``--xla_force_host_platform_device_count`` asks for several CPU devices: XLA:CPU sizes the pool
  its devices' programs run on as max(NPROC or the core count, devices), "just enough threads for
  one collective" by its own comment, and the same pool runs the per-device launches of every
  multi-device program, which block while a device has too many programs in flight. On a 2-core
  host with 8 simulated devices that is 8 threads, and under load a collective program had 7 of
  its 8 participants waiting 300 s for the last and aborted the process (``Expected 8 threads to
  join the rendezvous, but only 7 of them arrived``; 2 of 11 tries of a pmap test beside six CPU
  hogs, 0 of 12 with NPROC=16, 2026-12-05). With 2 devices and twice their number (4 threads) a
  study's evaluation still aborted the same way once, so the pool is four times the devices.
  A real accelerator ignores it; a value you set wins.

Rules: a flag of the same name already in ``XLA_FLAGS`` wins (yours); ``ANP_XLA_CPU_DEFAULTS=0``
turns the defaults off (inherited by subprocesses); they are only applied for the jaxlib minor
versions they were measured with (`TESTED_JAXLIB`), since an unknown flag aborts XLA.
"""

import os
from typing import MutableMapping, Optional, Tuple

CPU_DEFAULTS: Tuple[str, ...] = ('--xla_cpu_experimental_ynn_fusion_type=individual_dot',
                                 '--xla_cpu_collective_call_terminate_timeout_seconds=300',
                                 '--xla_cpu_collective_call_warn_stuck_timeout_seconds=60')
OPT_OUT = 'ANP_XLA_CPU_DEFAULTS'
TESTED_JAXLIB = ((0, 10),)  # (major, minor) releases whose XLA knows every flag above.


def _jaxlib_minor() -> Optional[Tuple[int, int]]:
  from importlib import metadata
  try:
    major, minor = metadata.version('jaxlib').split('.')[:2]
    return int(major), int(minor)
  except (metadata.PackageNotFoundError, ValueError):
    return None


def _names(flags: str):
  return {f.split('=', 1)[0] for f in flags.split()}


def apply_cpu_defaults(environ: MutableMapping[str, str] = os.environ,
                       jaxlib: Optional[Tuple[int, int]] = None) -> str:
  """Adds the `CPU_DEFAULTS` not already named in XLA_FLAGS; returns the resulting XLA_FLAGS."""
  current = environ.get('XLA_FLAGS', '')
  if environ.get(OPT_OUT, '1').strip().lower() in ('0', 'false', 'no', 'off'):
    return current
  if (jaxlib or _jaxlib_minor()) not in TESTED_JAXLIB:
    return current
  present = _names(current)
  added = [f for f in CPU_DEFAULTS if f.split('=', 1)[0] not in present]
  if added:
    current = ' '.join([current] + added).strip()
    environ['XLA_FLAGS'] = current
  devices = simulated_device_count(current)
  if devices > 1 and not environ.get(POOL_SIZE_VARIABLE):
    environ[POOL_SIZE_VARIABLE] = str(4 * max(devices, os.cpu_count() or 1))
  return current


POOL_SIZE_VARIABLE = 'NPROC'  # Read by XLA's DefaultThreadPoolSize() (xla/pjrt/utils.cc).


def simulated_device_count(flags: str) -> int:
  """The CPU device count ``--xla_force_host_platform_device_count`` asks for in `flags` (1
  where it is absent)."""
  count = 1
  for flag in flags.split():
    name, _, value = flag.partition('=')
    if name == DEVICE_COUNT_FLAG and value.isdigit():
      count = int(value)
  return count


def disable_cpu_defaults(environ: MutableMapping[str, str] = os.environ) -> str:
  """Removes the `CPU_DEFAULTS` (exact flag=value) from XLA_FLAGS and sets the opt-out, so that
  subprocesses calling `anp_jax.runtime.configure` do not add them back. Returns the resulting XLA_FLAGS."""
  environ[OPT_OUT] = '0'
  kept = [f for f in environ.get('XLA_FLAGS', '').split() if f not in CPU_DEFAULTS]
  environ['XLA_FLAGS'] = ' '.join(kept)
  return environ['XLA_FLAGS']


DEVICE_COUNT_FLAG = '--xla_force_host_platform_device_count'


def with_device_count(flags: str, count: int) -> str:
  """``flags`` (an XLA_FLAGS value) asking for ``count`` simulated host (CPU) devices, replacing
  any count it named. For a child process's environment: XLA reads it once, when JAX starts."""
  kept = [f for f in flags.split() if not f.startswith(DEVICE_COUNT_FLAG)]
  return ' '.join(kept + [f'{DEVICE_COUNT_FLAG}={count}'])
