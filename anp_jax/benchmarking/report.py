"""A benchmark result as a table for people and as a JSON file."""

import json
import os
from typing import Any, Dict


REQUIRED_KEYS = ('environment', 'config', 'method', 'compile_s', 'flops_per_image_train',
                 'flops_per_image_forward', 'n_params', 'bare', 'reference', 'torch', 'ratios',
                 'memory', 'peak', 'achieved_flops_per_s', 'mfu', 'loop')


def table(result: Dict[str, Any]) -> str:
  """A human-readable table of a `run_benchmark` result."""
  c, e = result['config'], result['environment']
  lines = [f"{c['model']} {c['image_size']}px batch {c['batch_size']} {c['dtype']} "
           f"conv={c['conv_impl']} on {e['devices']} x {e['device_kind']} "
           f"({e['backend']}, {e['cpu_cores']} cores, load {e['load_average'][0]:.1f})",
           f"compile {result['compile_s']:.1f} s | {result['flops_per_image_train'] / 1e9:.3f} "
           f"GFLOP/image/train step ({result['flops_per_image_forward'] / 1e9:.3f} forward) | "
           f"peak {result['peak']['flops_per_s'] / 1e9:.1f} GFLOP/s ({result['peak']['dtype']} "
           f"{result['peak']['n']}^3 matmul) | params {result['n_params']:,}",
           f"MFU against the job peak {result['peak']['job_flops_per_s'] / 1e9:.1f} GFLOP/s: "
           f"{result['peak']['job_peak']}",
           f"{'':24s}{'images/s':>10s}{'step ms':>10s}{'p10-p90 ms':>16s}{'MFU':>8s}"]

  def row(name, r, mfu=None):
    if not r:
      return
    spread = (f"{1e3 * r['step_time_p10_s']:.0f}-{1e3 * r['step_time_p90_s']:.0f}"
              if 'step_time_p10_s' in r else '')
    m = f'{100 * mfu:.1f}%' if mfu is not None else ''
    lines.append(f"{name:24s}{r['images_per_s']:10.1f}{1e3 * r['step_time_median_s']:10.1f}"
                 f"{spread:>16s}{m:>8s}")

  row('anp_jax bare step', result['bare'], result['mfu'])
  row('anp_jax training loop', result['loop'], (result['loop'] or {}).get('mfu'))
  row('anp_jax bare, after loop', result.get('bare_after_loop'))
  row('plain jax.jit + optax', result['reference'])
  row(f"pytorch {(result['torch'] or {}).get('version', '')}", result['torch'])
  for k in ('reference_skipped', 'torch_skipped', 'loop_skipped'):
    if k in result:
      lines.append(f'{k}: {result[k]}')
  for k, v in result['ratios'].items():
    if isinstance(v, dict):
      lines.append(f"ratio {k}: {v['median']:.3f} (per-round {v['min']:.3f}-{v['max']:.3f})")
    else:
      lines.append(f'ratio {k}: {v:.3f}')
  mem = result['memory']
  lines.append('memory: ' + ', '.join(f'{k}={v / 2**20:.0f} MiB' for k, v in mem.items()
                                      if v is not None))
  return '\n'.join(lines)


def write_json(result: Dict[str, Any], path: str):
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w') as f:
    json.dump(result, f, indent=2, default=str)
