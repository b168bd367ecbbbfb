"""What the machine offers and what a run used: peak FLOP/s (a timed matmul), the job's peak for
MFU, device and host memory, and the software and load a benchmark ran with."""

import contextlib
import os
import platform
import resource
import time
from typing import Any, Dict, Optional, Tuple


def measure_peak_flops(dtype: str = 'float32', n: Optional[int] = None, repeats: int = 5,
                       device=None) -> Dict[str, Any]:
  """The machine's achievable FLOP/s: best of `repeats` timed n x n x n matmuls in `dtype`.

  The best (not the median) is the "peak": MFU is reported against what this machine can do at
  its best moment, which on a loaded machine makes MFU conservative.
  """
  import jax
  import jax.numpy as jnp
  from anp_jax import models
  device = device or jax.local_devices()[0]
  if n is None:
    n = 2048 if device.platform == 'cpu' else 8192
  dt = models.DTYPES[dtype]
  key = jax.random.key(0)
  a = jax.device_put(jax.random.normal(key, (n, n), jnp.float32).astype(dt), device)
  b = jax.device_put(jax.random.normal(jax.random.fold_in(key, 1), (n, n),
                                       jnp.float32).astype(dt), device)
  mm = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=dt))
  mm(a, b).block_until_ready()
  inner = 1 if device.platform == 'cpu' else 10
  best = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(inner):
      out = mm(a, b)
    out.block_until_ready()
    best = min(best, (time.perf_counter() - t0) / inner)
  return {'dtype': dtype, 'n': n, 'seconds': best, 'flops_per_s': 2.0 * n ** 3 / best,
          'device': str(device.device_kind)}


def job_peak_flops(device_peak: float, platform: str, devices: int,
                   processes: int) -> Tuple[float, int, str]:
  """The whole job's peak FLOP/s from `measure_peak_flops` on one device: (peak, multiplier, why).

  An accelerator computes on its own: the job's peak is one device's times the devices. On CPU
  the devices of a process (``--xla_force_host_platform_device_count``) are simulated: they share
  the host's cores, and the matmul on one of them already runs on all of them (XLA:CPU's thread
  pool), so multiplying by the simulated devices would state MFU that many times too low for the
  same work. There the peak is the host's, counted once per process (each process is taken to
  be its own host; processes sharing one host, as `scaling_runs`' layouts do, overstate it).
  """
  if platform == 'cpu':
    return (device_peak * processes, processes,
            f'the host\'s ({processes} process(es) x one matmul on all cores; simulated CPU '
            'devices share them)')
  return device_peak * devices, devices, f'one device\'s x {devices} devices'


def memory_report(compiled=None) -> Dict[str, Any]:
  """Peak device memory (when the backend reports it), XLA's buffer plan, host peak RSS."""
  import jax
  out: Dict[str, Any] = {}
  stats = None
  with contextlib.suppress(Exception):
    stats = jax.local_devices()[0].memory_stats()
  out['device_peak_bytes'] = int(stats['peak_bytes_in_use']) if stats and (
      'peak_bytes_in_use' in stats) else None
  if compiled is not None:
    with contextlib.suppress(Exception):
      m = compiled.memory_analysis()
      out['xla_temp_bytes'] = int(m.temp_size_in_bytes)
      out['xla_argument_bytes'] = int(m.argument_size_in_bytes)
      out['xla_output_bytes'] = int(m.output_size_in_bytes)
      out['xla_alias_bytes'] = int(m.alias_size_in_bytes)
  # ru_maxrss is in KiB on Linux.
  out['host_peak_rss_bytes'] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
  return out


def environment(torch_version: Optional[str] = None) -> Dict[str, Any]:
  """The software, devices and load this benchmark ran with (``torch_version``: None if absent)."""
  import jax
  import jaxlib
  d = jax.local_devices()[0]
  return {'jax': jax.__version__, 'jaxlib': jaxlib.__version__, 'backend': d.platform,
          'device_kind': d.device_kind, 'devices': jax.device_count(),
          'local_devices': jax.local_device_count(), 'processes': jax.process_count(),
          'cpu_cores': len(os.sched_getaffinity(0)), 'xla_flags': os.environ.get('XLA_FLAGS', ''),
          'python': platform.python_version(), 'host': platform.node(),
          'load_average': os.getloadavg(), 'torch': torch_version,
          'time_utc': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}
