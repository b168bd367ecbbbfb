#!/usr/bin/env python3
"""Seeds at once against separate runs: the training step's time, measured side by side.

  .venv/bin/python experiments/seeds_at_once.py --preset plan_validation:a \
      --per_device_batches 16,256 --seeds 3 --steps 10,2 --repeats 3

For each per-device batch: the study preset's config at that batch on ``--devices`` simulated
CPU devices (on CPU; a GPU job uses its devices), ``--seeds`` seeds, each seed's own first
training batches read beforehand (the input pipeline is not measured). Two arms, interleaved
(separate, grouped, grouped, separate, ...: a drift of the machine's load falls on both), each
compiled and run once before it is timed:

* **separate**: the seeds' steps one after the other, each its run's own compiled step (the
  sync jit executor), as the study runner trains them without grouping;
* **grouped**: one step of the seed group (`anp_jax.seed_group.group_program`: the per-device
  step under `jax.vmap` over the seeds inside the executor's `shard_map`).

Each arm runs ``--steps`` steps of every seed; its wall time and this process's CPU time
(user + system) are recorded. Writes ``results.json`` (every measurement, the medians, the ratios
grouped / separate, the load average before and after) and ``README.md`` into ``--out``; the
study runner's ``--seeds_at_once auto`` reads ``results.json`` (`runner.seeds_at_once_faster`):
it groups only at a per-device batch whose nearest measurement found the grouped step faster in
both CPU and wall time. ``--merge`` keeps the other platforms' measurements of an existing file.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

ROOT = _venv.ROOT
DEFAULT_OUT = os.path.join(ROOT, 'experiments', 'results', 'seeds_at_once')


def parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--preset', default='plan_validation:a', help='A study preset (its config).')
  p.add_argument('--per_device_batches', default='16,256')
  p.add_argument('--steps', default='10,2', help='Timed steps per seed and arm, one per batch '
                 '(or one for all).')
  p.add_argument('--seeds', type=int, default=3)
  p.add_argument('--devices', type=int, default=2, help='Simulated CPU devices.')
  p.add_argument('--repeats', type=int, default=3, help='Measurements per arm (interleaved).')
  p.add_argument('--data_dir', default=None, help='config.data_dir (default: the preset\'s).')
  p.add_argument('--out', default=DEFAULT_OUT)
  p.add_argument('--merge', action='store_true', help='Keep other platforms\' measurements.')
  return p.parse_args(argv)


def _cpu_s() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def measure(args, per_device_batch: int, steps: int):
  import jax
  import numpy as np
  import tensorflow_datasets as tfds
  from anp_jax import seed_group, trainer
  from anp_jax.data import pipeline
  from anp_jax.research import study_cli

  base, _ = study_cli.load_preset('study', args.preset)
  base.batch_size = per_device_batch * jax.device_count()
  if args.data_dir:
    base.data_dir = args.data_dir
  configs = []
  for seed in range(args.seeds):
    c = base.copy_and_resolve_references()
    c.seed = seed
    configs.append(c)
  runs = [trainer.build(c) for c in configs]
  run = runs[0]
  setup = run.setup
  host = []  # Per seed: its first `steps` host batches.
  for r in runs:
    stream = iter(tfds.as_numpy(pipeline.train_dataset(
        r.builder, r.config, per_device_batch=setup.per_device_batch, num_shards=setup.devices,
        shards=pipeline.local_shards(r.mesh))))
    host.append([next(stream) for _ in range(steps)])
  separate_batches = [[r.executor.to_device(b) for b in bs] for r, bs in zip(runs, host)]
  prog = seed_group.group_program(run)
  grouped_batches = [prog.to_device({k: np.stack([bs[i][k] for bs in host]) for k in host[0][0]})
                     for i in range(steps)]
  states = [r.init_state() for r in runs]
  group_state = prog.init(list(range(args.seeds)))

  def separate():
    for i in range(steps):
      for k, r in enumerate(runs):
        states[k], sums = r.executor.train_step(states[k], separate_batches[k][i])
    jax.block_until_ready(states)

  def grouped():
    nonlocal group_state
    for i in range(steps):
      group_state, sums = prog.step(group_state, grouped_batches[i])
    jax.block_until_ready(group_state)

  arms = {'separate': separate, 'grouped': grouped}
  compile_s = {}
  for name, fn in arms.items():  # Compiled (and run once) before the timing.
    t = time.time()
    fn()
    compile_s[name] = time.time() - t
  times = {name: [] for name in arms}
  for rep in range(args.repeats):
    for name in (('separate', 'grouped') if rep % 2 == 0 else ('grouped', 'separate')):
      wall, cpu = time.time(), _cpu_s()
      arms[name]()
      times[name].append({'wall_s': time.time() - wall, 'cpu_s': _cpu_s() - cpu})
      print(f'  {per_device_batch}/device {name}: {times[name][-1]["wall_s"]:.2f} s wall, '
            f'{times[name][-1]["cpu_s"]:.2f} s CPU', flush=True)
  med = {name: {k: statistics.median(t[k] for t in ts) for k in ('wall_s', 'cpu_s')}
         for name, ts in times.items()}
  return {'per_device_batch': per_device_batch, 'seeds': args.seeds, 'steps': steps,
          'devices': setup.devices, 'batch_size': setup.batch_size,
          'first_run_s': compile_s, 'measurements': times, 'median': med,
          'wall_ratio': med['grouped']['wall_s'] / med['separate']['wall_s'],
          'cpu_ratio': med['grouped']['cpu_s'] / med['separate']['cpu_s']}


def markdown(result) -> str:
  lines = [f'# Seeds at once: `{result["preset"]}`, {result["platform"]}', '',
           f'`{result["command"]}`', '',
           f'{result["host"]}; {result["date"]}; load average before {result["load_before"]}, '
           f'after {result["load_after"]}. Medians of {result["repeats"]} interleaved '
           'measurements per arm; seconds for the timed steps of every seed.', '',
           '| per-device batch | seeds x steps | separate wall (s) | grouped wall (s) | '
           'wall grouped / separate | separate CPU (s) | grouped CPU (s) | '
           'CPU grouped / separate |', '|---:|---:|---:|---:|---:|---:|---:|---:|']
  for m in result['platforms'][result['platform']]:
    s, g = m['median']['separate'], m['median']['grouped']
    lines.append(f'| {m["per_device_batch"]} | {m["seeds"]} x {m["steps"]} | {s["wall_s"]:.2f} | '
                 f'{g["wall_s"]:.2f} | {m["wall_ratio"]:.2f} | {s["cpu_s"]:.2f} | '
                 f'{g["cpu_s"]:.2f} | {m["cpu_ratio"]:.2f} |')
  return '\n'.join(lines) + '\n'


def main(argv=None) -> int:
  args = parse(sys.argv[1:] if argv is None else argv)
  if args.devices > 0 and 'xla_force_host_platform_device_count' not in os.environ.get(
      'XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_'
                               f'device_count={args.devices}').strip()
  import jax
  batches = [int(b) for b in args.per_device_batches.split(',')]
  steps = [int(s) for s in args.steps.split(',')]
  steps = steps * len(batches) if len(steps) == 1 else steps
  if len(steps) != len(batches):
    raise SystemExit('--steps: one value, or one per --per_device_batches entry.')
  load_before = [round(x, 2) for x in os.getloadavg()]
  from anp_jax.errors import ConfigError
  try:
    measured = [measure(args, b, s) for b, s in zip(batches, steps)]
  except ConfigError as e:  # E.g. a per-device batch the preset's ghost BN group does not divide.
    print(f'ERROR: {e}', file=sys.stderr)
    return 2
  backend = jax.default_backend()
  path = os.path.join(args.out, 'results.json')
  platforms = {}
  if args.merge and os.path.exists(path):
    platforms = json.load(open(path)).get('platforms', {})
  platforms[backend] = measured
  result = {'preset': args.preset, 'platform': backend, 'repeats': args.repeats,
            'command': ' '.join(['experiments/seeds_at_once.py'] + (
                sys.argv[1:] if argv is None else list(argv))),
            'host': f'{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}), '
                    f'{jax.device_count()} {backend} device(s)',
            'date': time.strftime('%Y-%m-%d %H:%M'), 'load_before': load_before,
            'load_after': [round(x, 2) for x in os.getloadavg()], 'platforms': platforms}
  from anp_jax.research import study_results
  text = markdown(result)
  study_results.write_measurement(args.out, os.path.basename(path), result, text)
  print(text)
  print(f'Wrote {path} and README.md')
  return 0


if __name__ == '__main__':
  sys.exit(main())
