"""Multi-device scaling on one machine: the bare step as 1 process x 1 device, 1 x 2 simulated
devices and 2 processes x 1 device over 127.0.0.1, same global batch (``benchmark.py
--scaling``)."""

import json
import os
import sys
from typing import Any, Dict, List, Sequence

from anp_jax import distributed, xla_flags


# (name, processes, devices per process); the global batch stays the same.
SCALING_LAYOUTS = (('1proc_x_1dev', 1, 1), ('1proc_x_2dev', 1, 2), ('2proc_x_1dev', 2, 1))


# Flags of experiments/benchmark.py that `scaling_runs` sets for each child itself: a flag with
# a value (its space-separated value goes too), and booleans (--x, --nox, --x=v; no value).
SCALING_OWN_FLAGS = ('out',)
SCALING_OWN_BOOLS = ('scaling',)


def scaling_child_args(args: Sequence[str]) -> List[str]:
  """The parent's command-line arguments without those `scaling_runs` sets per child.

  Every spelling absl accepts is removed: ``--out=PATH``, ``--out PATH`` (the value too: left
  behind it would be a stray positional argument and the child would exit with "Unexpected
  arguments"), ``-out``, and ``--scaling`` / ``--noscaling`` / ``--scaling=true``. Anything else
  (``--config.x=y``, ``--outline``) is passed on as it was.
  """
  out, skip, flags_end = [], False, False
  for arg in args:
    if skip:
      skip = False
      continue
    flags_end = flags_end or arg == '--'  # After '--' everything is positional: kept as is.
    name, has_value = arg, False
    if arg.startswith('-') and not flags_end:
      name, has_value = arg.lstrip('-').split('=', 1)[0], '=' in arg
    if name in SCALING_OWN_FLAGS:
      skip = not has_value
      continue
    if name in SCALING_OWN_BOOLS or (name.startswith('no') and name[2:] in SCALING_OWN_BOOLS):
      continue
    out.append(arg)
  return out


def scaling_runs(script: str, args: Sequence[str], out_dir: str,
                 timeout_s: float = 1800) -> Dict[str, Any]:
  """Runs `script` (experiments/benchmark.py) once per `SCALING_LAYOUTS` entry; same global batch.

  `args`: the parent's command line (``sys.argv[1:]``); its ``--out`` and ``--scaling`` in any
  form are dropped (`scaling_child_args`) and each child gets its own. Each run times only the
  bare step (no loop, reference or torch). Returns per layout images/s, step times and speed-up
  / efficiency relative to one process with one device.
  """
  import subprocess
  os.makedirs(out_dir, exist_ok=True)
  args = scaling_child_args(args)
  rows = {}
  for name, procs, local in SCALING_LAYOUTS:
    children = []
    # Held while the run lasts: no other local job's coordinator gets this port.
    reservation = distributed.reserve_port() if procs > 1 else None
    port = reservation.getsockname()[1] if reservation else None
    for pid in range(procs):
      env = dict(os.environ)
      env['XLA_FLAGS'] = xla_flags.with_device_count(env.get('XLA_FLAGS', ''), local)
      for k in ('ANP_COORDINATOR_ADDRESS', 'ANP_NUM_PROCESSES', 'ANP_PROCESS_ID'):
        env.pop(k, None)
      if procs > 1:
        env.update(ANP_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', ANP_NUM_PROCESSES=str(procs),
                   ANP_PROCESS_ID=str(pid))
      cmd = [sys.executable, script, *args, '--noloop', '--noreference', '--notorch',
             '--noscaling', f'--out={os.path.join(out_dir, name + ".json")}']
      children.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True))
    try:
      outputs = [c.communicate(timeout=timeout_s)[0] for c in children]
    finally:
      for c in children:
        if c.poll() is None:
          c.kill()
          c.wait()
      if reservation:
        reservation.close()
    if any(c.returncode for c in children):
      raise RuntimeError(f'Scaling run {name} failed:\n' + '\n'.join(o[-3000:] for o in outputs))
    with open(os.path.join(out_dir, name + '.json')) as f:
      r = json.load(f)
    rows[name] = {'processes': procs, 'devices': procs * local, **r['bare'],
                  'compile_s': r['compile_s'], 'load_average': r['environment']['load_average']}
  base = rows[SCALING_LAYOUTS[0][0]]['images_per_s']
  for row in rows.values():
    row['speedup'] = row['images_per_s'] / base
    row['efficiency'] = row['speedup'] / row['devices']
  return rows
