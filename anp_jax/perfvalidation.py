"""Validation of the performance model (`anp_jax.research.perfmodel`): measured vs. predicted, paper vs. model.

Two experiments (driven by ``experiments/perfmodel_validation.py``):

1. **This machine** (`run_cpu_validation`). Real `anp_jax.trainer` steps (`trainer.build(config)`,
   then `Run.train_step` on an in-memory synthetic batch, timed after warm-up, median of several
   steps) for several global batch sizes, on 1, 2, 4 simulated XLA CPU devices (one subprocess
   per device count, since ``--xla_force_host_platform_device_count`` must be set before JAX
   starts) and on 2 real processes on 127.0.0.1 (`jax.distributed` + gloo, one device each).
   Each subprocess also times a ``psum`` micro-benchmark over its devices at several sizes; an
   alpha-beta fit of those gives the interconnect (simulated devices: "intra-node"; loopback
   gloo between processes: "inter-node"). The model then predicts every measured point from
   (a) the workload of the same Flax model (XLA cost analysis), (b) a CPU `Device` whose
   efficiency is calibrated on ONE measured point (1 device, the calibration batch), (c) the
   fitted interconnects and (d) ``Cluster.devices_per_compute_pool``: simulated devices and the
   processes share the same cores. A second variant calibrates on two points (per-image time and
   a fixed per-step overhead, both on 1 device) to show what the one-point model leaves out.
2. **Paper hardware** (`paper_comparison`): the seed paper's MinoTauro (4 K80 dies per node, FDR
   InfiniBand; `perfmodel.minotauro`) against its published figures (near-linear scaling inside
   a node; 10.3x with 16 nodes over one; 106 h on one node -> 12 h synchronous, 16 h
   mixed-asynchronous), for synchronous (ring all-reduce and TensorFlow-style parameter
   servers), asynchronous and mixed training. The errors are reported with the presets' stated
   assumptions; then ONE knob, the transport efficiency of the inter-node links (the fraction of
   FDR's 6 GB/s that TensorFlow 1.x's gRPC achieves), is fitted to the 10.3x and the errors are
   reported again, marked as a fit.

`write_report` turns the results into ``results.json``, ``report.md`` and PNG plots.
"""

import dataclasses
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from anp_jax.research import perfmodel as pm
from anp_jax import plotting, runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# This machine's cores (AMD EPYC, Zen 1, KVM guest): 2 cores x 2.0 GHz (BogoMIPS / 2) x 16 fp32
# FLOP/cycle (two 128-bit FMA pipes). Only the product with the calibrated efficiency matters.
CPU_CORES, CPU_CLOCK_HZ, CPU_FLOPS_PER_CYCLE = 2, 2.0e9, 16


@dataclasses.dataclass(frozen=True)
class MeasureSpec:
  """What one measuring subprocess does (JSON-serialisable)."""
  data_dir: str
  batches: Sequence[int]
  arch: str = 'resnet20'
  width: float = 0.5
  image_size: int = 16
  bn_group_size: int = 8
  warmup_steps: int = 2
  timed_steps: int = 5  # At least this many timed steps, and at least `min_timed_s` of them
  min_timed_s: float = 1.0  # (small batches: more steps for a stable median), at most 50.
  allreduce_bytes: Sequence[int] = (4096, 65536, 524288, 2097152)
  allreduce_repeats: int = 20
  train_per_class: int = 20
  xla_flops: bool = False  # Also count the train step's FLOPs with XLA (one extra compile).
  # Quick (CI) mode: the smallest program that still exercises every code path. XLA compiles
  # without its expensive optimisations: the step times are then not measurements.
  plumbing_only: bool = False


# Every train step compiles for ~10-20 s of CPU: all batches on 1 device (the calibration and the
# batch dependence), three of them on the multi-device configurations.
FULL = dict(batches=(32, 64, 128, 256, 512), devices=(1, 2, 4), processes=2, calibration=128,
            other_batches=(32, 128, 512),
            spec=dict(arch='resnet20', width=0.5, image_size=16, warmup_steps=2, timed_steps=5))
# Quick (CI): every code path, the fewest compilations (a train step compiles in ~10 s of CPU
# even for this model): both batches on 1 device, only the larger one elsewhere.
# The multi-device path of the measurement is the multi-process one's with one process, so quick
# mode measures 1 device and 2 processes only.
QUICK = dict(batches=(16, 32), devices=(1,), processes=2, calibration=16, other_batches=(32,),
             spec=dict(arch='resnet8', width=0.25, image_size=16, warmup_steps=1, timed_steps=2,
                       min_timed_s=0.0, allreduce_bytes=(4096, 262144), allreduce_repeats=5,
                       train_per_class=4, plumbing_only=True))


# ----------------------------------------------------------------------------------------------
# The measuring subprocess.

def measurement_config(spec: MeasureSpec):
  """The training config that is timed: the 'cpu' sweep preset's model and data, smaller."""
  from anp_jax.configs import default
  c = default.get_config()
  c.data_dir = spec.data_dir
  c.synthetic.update(dict(image_size=spec.image_size, train_per_class=spec.train_per_class,
                          eval_per_class=2))
  c.image_size = spec.image_size
  c.model.name, c.model.width = spec.arch, spec.width
  c.bn_mode, c.bn_group_size = 'ghost', spec.bn_group_size
  c.optimizer = 'nesterov'
  c.warmup_epochs = 0.0
  c.num_train_steps = 1000
  c.progress_bar = False
  c.checkpoint_every_steps = 0
  c.checkpoint_every_minutes = 0
  c.async_checkpointing = False
  if spec.plumbing_only:
    c.noise_scale = False
    c.model.adjective_head = c.model.noun_head = False
    c.optimizer = 'sgd'
  return c


def _best_time(fn, repeats: int) -> float:
  """The fastest of `repeats` calls: interference (other processes, a descheduled thread) only
  ever adds time, and a 4 KB all-reduce that loses a scheduler quantum looks 5x slower."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def measure_in_this_process(spec: MeasureSpec) -> dict:
  """Times train steps and all-reduces with this process's JAX devices (call in a subprocess).

  Every process of a multi-process job must call it (the steps are collective); the times of
  process 0 are the job's.
  """
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  from anp_jax import executors, models, trainer

  config = measurement_config(spec)
  ndev, nproc = jax.device_count(), jax.process_count()
  rng = np.random.default_rng(jax.process_index())
  steps, workload, state = [], None, None
  for b in spec.batches:
    config.batch_size = int(b)
    config.eval_batch_size = ndev * 2
    run = trainer.build(config)
    if workload is None and nproc == 1:  # The FLOP count needs no second process.
      model = models.create_model(config, run.meta.num_anps, run.meta.num_adjectives,
                                  run.meta.num_nouns)
      w = pm.workload_from_flax(model, spec.image_size, name=f'{spec.arch}_w{spec.width:g}',
                                dataset_size=run.meta.train_size)
      workload = dict(name=w.name, flops_per_image_fwd=w.flops_per_image_fwd,
                      param_bytes=w.param_bytes, dataset_size=w.dataset_size)
    local = b // nproc
    batch = {'image': rng.standard_normal((local, spec.image_size, spec.image_size, 3),
                                          dtype=np.float32),
             'label_anp': rng.integers(0, run.meta.num_anps, local, dtype=np.int32),
             'label_adjective': rng.integers(0, run.meta.num_adjectives, local, dtype=np.int32),
             'label_noun': rng.integers(0, run.meta.num_nouns, local, dtype=np.int32),
             'mask': np.ones(local, np.float32)}
    dev_batch = run.executor.to_device(batch)
    # The state does not depend on the batch size: initialise (and compile that) once.
    state = run.init_state() if state is None else state
    row = {'global_batch': int(b), 'per_device_batch': int(b) // ndev}
    if spec.xla_flops and ndev == 1:
      cost = run.executor.train_step.lower(state, dev_batch).compile().cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
      row['xla_train_flops_per_image'] = float(cost.get('flops', float('nan'))) / b
    t0 = time.perf_counter()
    for _ in range(spec.warmup_steps):
      state, sums = run.train_step(state, dev_batch)
      jax.block_until_ready((state, sums))
    row['warmup_s'] = time.perf_counter() - t0
    times = []
    while len(times) < spec.timed_steps or (sum(times) < spec.min_timed_s and len(times) < 50):
      t0 = time.perf_counter()
      state, sums = run.train_step(state, dev_batch)
      jax.block_until_ready((state, sums))
      times.append(time.perf_counter() - t0)
    row['step_times_s'] = times
    row['step_time_s'] = statistics.median(times)
    row['images_per_s'] = b / row['step_time_s']
    print(f'batch {b}: {row["step_time_s"] * 1e3:.1f} ms per step, {row["images_per_s"]:.1f} img/s',
          flush=True)  # Relayed by the parent as progress.
    steps.append(row)
    del dev_batch, run

  allreduce = []
  if ndev > 1:
    mesh = executors.make_mesh()
    sharding = NamedSharding(mesh, P(executors.AXIS))
    for nbytes in spec.allreduce_bytes:
      n = max(1, int(nbytes) // 4)
      local = np.ones((jax.local_device_count(), n), np.float32)
      x = jax.make_array_from_process_local_data(sharding, local)
      f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, executors.AXIS), mesh=mesh,
                                in_specs=P(executors.AXIS), out_specs=P(executors.AXIS)))
      jax.block_until_ready(f(x))
      jax.block_until_ready(f(x))
      t = _best_time(lambda: jax.block_until_ready(f(x)), spec.allreduce_repeats)
      allreduce.append({'bytes': n * 4, 'time_s': t})
  return {'spec': dataclasses.asdict(spec), 'devices': ndev, 'processes': nproc,
          'local_devices': jax.local_device_count(),
          'workload': workload, 'steps': steps, 'allreduce': allreduce,
          'jax_version': jax.__version__}


def _worker_main():
  """Entry point of a measuring subprocess: ``python -m anp_jax.perfvalidation SPEC_JSON OUT``."""
  from anp_jax import distributed
  distributed.initialize()  # Before any other JAX call; no-op without ANP_* variables.
  spec = MeasureSpec(**json.loads(sys.argv[1]))
  result = measure_in_this_process(spec)
  import jax
  if jax.process_index() == 0:
    with open(sys.argv[2], 'w') as f:
      json.dump(result, f)
  distributed.barrier('perfvalidation_end')


# ----------------------------------------------------------------------------------------------
# Launching measurements.

def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


HEARTBEAT_S = 10.0  # Seconds of silence after which a running measurement says it still runs.


def _launch(spec: MeasureSpec, out_json: str, devices_per_process: int, processes: int,
            log_prefix: str, timeout_s: float, progress=None) -> dict:
  """Runs the measurement in ``processes`` subprocesses; returns process 0's result.

  ``progress`` (a print-like function) gets process 0's new ``batch ...`` lines as they come,
  and a line every `HEARTBEAT_S` seconds while nothing new was printed.
  """
  flags = f'--xla_force_host_platform_device_count={devices_per_process}'
  if spec.plumbing_only:
    flags += ' --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'
  base = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
              TF_CPP_MIN_LOG_LEVEL='2', JAX_PLATFORMS='cpu', CUDA_VISIBLE_DEVICES='',
              XLA_FLAGS=flags)
  for key in ('ANP_COORDINATOR_ADDRESS', 'ANP_NUM_PROCESSES', 'ANP_PROCESS_ID'):
    base.pop(key, None)
  port = _free_port() if processes > 1 else None
  procs, logs = [], []
  for pid in range(processes):
    env = dict(base)
    if processes > 1:
      env.update(ANP_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', ANP_NUM_PROCESSES=str(processes),
                 ANP_PROCESS_ID=str(pid), ANP_INIT_TIMEOUT='60', ANP_HEARTBEAT_TIMEOUT='30')
    log = f'{log_prefix}.proc{pid}.log'
    logs.append(log)
    with open(log, 'w') as f:
      procs.append(subprocess.Popen(
          [sys.executable, '-m', 'anp_jax.perfvalidation', json.dumps(dataclasses.asdict(spec)),
           out_json], env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT))
  start = time.time()
  deadline = start + timeout_s
  seen, last_news = 0, start
  try:
    while any(p.poll() is None for p in procs):
      if time.time() > deadline:
        raise subprocess.TimeoutExpired(procs[0].args, timeout_s)
      time.sleep(0.5)
      if progress is None:
        continue
      lines = [l for l in open(logs[0]).read().splitlines() if l.startswith('batch ')]
      for line in lines[seen:]:
        progress(f'  {os.path.basename(log_prefix)}: {line}')
        last_news = time.time()
      seen = len(lines)
      if time.time() - last_news >= HEARTBEAT_S:
        progress(f'  {os.path.basename(log_prefix)}: running for {time.time() - start:.0f} s '
                 '(compiling / timing)')
        last_news = time.time()
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    raise RuntimeError(f'The measurement ({processes} process(es) x {devices_per_process} '
                       f'device(s)) did not finish within {timeout_s:.0f} s; see {logs[0]}. '
                       'Use fewer/smaller batches or raise --timeout.') from None
  for p, log in zip(procs, logs):
    if p.returncode != 0:
      tail = open(log).read()[-3000:]
      raise RuntimeError(f'A measuring process exited with {p.returncode} ({log}):\n{tail}')
  with open(out_json) as f:
    return json.load(f)


def fit_alpha_beta(points: Sequence[dict], n: int) -> Dict[str, float]:
  """Least-squares ring all-reduce fit: time = 2(n-1)/n * bytes / bandwidth + 2(n-1) * latency.

  Returns bandwidth (bytes/s), latency (s), the fit's mean absolute relative error and
  ``latency_only``. A negative intercept is clipped to zero latency. Times that do not grow with
  the message size (all overhead at these sizes, or noise larger than the transfer time) give no
  bandwidth: the fit is then latency only (bandwidth = inf, latency from the mean time) and says
  so, rather than a negative bandwidth or a failed experiment after all its measurements.
  """
  if n < 2 or len(points) < 2:
    raise ValueError(f'fit_alpha_beta needs >= 2 participants and >= 2 sizes, got n={n}, '
                     f'{len(points)} point(s).')
  x = np.array([2 * (n - 1) / n * p['bytes'] for p in points], float)
  y = np.array([p['time_s'] for p in points], float)
  slope, intercept = np.polyfit(x, y, 1)
  if slope <= 0:
    latency = float(np.mean(y)) / (2 * (n - 1))
    return {'bandwidth': math.inf, 'latency': latency, 'latency_only': True,
            'fit_mare': float(np.mean(np.abs(np.mean(y) - y) / y))}
  intercept = max(float(intercept), 0.0)
  pred = intercept + slope * x
  return {'bandwidth': 1.0 / float(slope), 'latency': intercept / (2 * (n - 1)),
          'latency_only': False, 'fit_mare': float(np.mean(np.abs(pred - y) / y))}


def measure_all(out_dir: str, batches: Sequence[int], devices: Sequence[int], processes: int,
                spec_kwargs: dict, timeout_s: float = 900.0, log=print,
                other_batches: Optional[Sequence[int]] = None, reuse: bool = False,
                budget_s: Optional[float] = None) -> dict:
  """All the measurements of experiment 1: one subprocess per device count, one multi-process job.

  ``batches`` are measured on 1 device, ``other_batches`` (default: the same) on the others.
  ``reuse``: keep a job's earlier ``measure_<job>.json`` when its settings are the same.
  ``budget_s``: start no further job after this many seconds (the skipped ones are listed).
  """
  other_batches = tuple(batches if other_batches is None else other_batches)
  os.makedirs(out_dir, exist_ok=True)
  data_dir = os.path.join(out_dir, 'tfds')
  spec = MeasureSpec(data_dir=data_dir, batches=tuple(batches), **spec_kwargs)
  bad = [(b, d) for d in list(devices) + ([processes] if processes > 1 else [])
         for b in (batches if d == 1 else other_batches) if b % d or (b // d) % spec.bn_group_size]
  if bad:
    raise ValueError(f'Global batches must split into whole ghost-BN groups of '
                     f'{spec.bn_group_size} on every device count; not so for (batch, devices) '
                     f'{bad}.')
  jobs = [(f'{d}dev', dataclasses.replace(spec, xla_flops=(d == 1 and not spec.plumbing_only),
                                          batches=spec.batches if d == 1 else other_batches),
           d, 1, 'simulated devices') for d in devices]
  if processes > 1:  # Right after the 1-device job: under a time budget it matters most.
    jobs.insert(1 if devices and devices[0] == 1 else 0,
                (f'{processes}proc', dataclasses.replace(spec, batches=other_batches), 1,
                 processes, 'processes (gloo, 127.0.0.1)'))
  runs, skipped, start = {}, [], time.time()
  for key, job_spec, per_process, nproc, kind in jobs:
    out_json = os.path.join(out_dir, f'measure_{key}.json')
    previous = _load_if_same(out_json, job_spec) if reuse else None
    if previous is not None:
      runs[key] = previous
      log(f'{key}: reused {out_json} (same settings)')
      continue
    if budget_s is not None and time.time() - start > budget_s:
      skipped.append(key)
      log(f'{key}: skipped, the time budget of {budget_s:.0f} s is spent')
      continue
    t0 = time.time()
    log(f'{key}: measuring batches {list(job_spec.batches)} on {per_process * nproc} '
        f'{kind}...')
    runs[key] = _launch(job_spec, out_json, per_process, nproc,
                        os.path.join(out_dir, f'measure_{key}'), timeout_s, progress=log)
    runs[key]['kind'] = kind
    with open(out_json, 'w') as f:  # With its kind and settings, for --reuse.
      json.dump(runs[key], f)
    log(f'{key}: measured in {time.time() - t0:.0f} s ({_uptime()})')
  if '1dev' not in runs:
    raise RuntimeError('The 1-device measurement is missing: nothing to calibrate on.')
  return {'spec': dataclasses.asdict(spec), 'runs': runs, 'skipped': skipped,
          'load_before': _uptime()}


def _load_if_same(path: str, spec: MeasureSpec) -> Optional[dict]:
  """A previous measurement at ``path`` if it was taken with exactly these settings."""
  try:
    with open(path) as f:
      previous = json.load(f)
  except (OSError, ValueError):
    return None
  return previous if previous.get('spec') == json.loads(json.dumps(dataclasses.asdict(spec))) \
      else None


def _uptime() -> str:
  try:
    return subprocess.run(['uptime'], capture_output=True, text=True, timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return 'unknown'


# ----------------------------------------------------------------------------------------------
# Predictions for the measured points.

def _workload(measured: dict) -> pm.Workload:
  w = next(r['workload'] for r in measured['runs'].values() if r.get('workload'))
  return pm.Workload(name=w['name'], flops_per_image_fwd=w['flops_per_image_fwd'],
                     param_bytes=w['param_bytes'], dataset_size=int(w['dataset_size']))


def calibrated_devices(measured: dict, calibration_batch: int, workload: pm.Workload):
  """The CPU `Device` calibrated on one point, and the two-point (overhead) variant."""
  one = {r['global_batch']: r for r in measured['runs']['1dev']['steps']}
  if calibration_batch not in one:
    raise ValueError(f'The calibration batch {calibration_batch} was not measured on 1 device '
                     f'(measured: {sorted(one)}).')
  t = one[calibration_batch]['step_time_s']
  peak = CPU_CORES * CPU_CLOCK_HZ * CPU_FLOPS_PER_CYCLE
  eff = calibration_batch * workload.flops_per_image_train / t / peak
  if eff > 1:
    raise ValueError(f'The calibrated efficiency {eff:.2f} exceeds 1: the assumed peak '
                     f'({peak / 1e9:.0f} GFLOP/s from CPU_CORES x CPU_CLOCK_HZ x '
                     'CPU_FLOPS_PER_CYCLE) is too low for this machine; correct those constants.')
  device = pm.Device(name=f'cpu{CPU_CORES}', peak_flops=peak, efficiency=eff)
  lo, hi = min(one), max(one)
  # Two points: t(b) = overhead + b * per_image, through the smallest and largest batch.
  per_image = (one[hi]['step_time_s'] - one[lo]['step_time_s']) / (hi - lo)
  if per_image <= 0:  # Noise: the larger batch was not slower. Fall back to the 1-point line.
    per_image = t / calibration_batch
  overhead = max(0.0, one[lo]['step_time_s'] - lo * per_image)
  two = pm.Device(name=f'cpu{CPU_CORES} (2-point)', peak_flops=peak,
                  efficiency=min(workload.flops_per_image_train / per_image / peak, 1.0),
                  step_overhead_s=overhead)
  return device, two, {'calibration_point': f'1 device, global batch {calibration_batch}',
                       'step_time_s': t, 'peak_flops': peak, 'efficiency': eff,
                       'sustained_flops': eff * peak,
                       'two_point': {'batches': [lo, hi], 'per_image_s': per_image,
                                     'overhead_s': overhead,
                                     'efficiency': two.efficiency}}


# Stands in for a bandwidth the measurements could not resolve (the model wants a finite one):
# transfers then cost their latency only.
UNRESOLVED_BANDWIDTH = 1e18


def interconnects(measured: dict) -> dict:
  """Alpha-beta fits of the psum micro-benchmarks: simulated devices and processes."""
  fits = {}
  for key, run in measured['runs'].items():
    if run['allreduce']:
      fits[key] = dict(fit_alpha_beta(run['allreduce'], run['devices']), devices=run['devices'])
  sim = [k for k in fits if k.endswith('dev')]
  procs = [k for k in fits if k.endswith('proc')]
  if not fits:  # Only 1-device points (e.g. the other jobs ran out of time): no communication.
    return {'fits': {}, 'interconnect': pm.Interconnect(UNRESOLVED_BANDWIDTH, 0.0,
                                                        UNRESOLVED_BANDWIDTH, 0.0)}
  # One interconnect for all simulated-device counts: the fit of the largest count (the other
  # counts are listed next to it in the report). Without one of the two kinds of job, the
  # other's fit stands in for it (quick mode measures no multi-device process).
  intra = fits[max(sim, key=lambda k: fits[k]['devices'])] if sim else fits[procs[0]]
  inter = fits[procs[0]] if procs else intra
  ic = pm.Interconnect(intra_node_bandwidth=min(intra['bandwidth'], UNRESOLVED_BANDWIDTH),
                       intra_node_latency=intra['latency'],
                       inter_node_bandwidth=min(inter['bandwidth'], UNRESOLVED_BANDWIDTH),
                       inter_node_latency=inter['latency'])
  return {'fits': fits, 'interconnect': ic}


def predict_points(measured: dict, calibration_batch: int) -> dict:
  """Predicted step time and images/s of every measured point; relative errors."""
  workload = _workload(measured)
  device, two_point, calib = calibrated_devices(measured, calibration_batch, workload)
  nets = interconnects(measured)
  ic = nets['interconnect']
  rows = []
  for key, run in measured['runs'].items():
    procs = run['processes']
    nodes, per_node = (procs, run['devices'] // procs) if procs > 1 else (1, run['devices'])
    for variant, dev in (('1-point', device), ('2-point', two_point)):
      cluster = pm.Cluster(nodes, per_node, dev, ic, name='this machine',
                           devices_per_compute_pool=run['devices'])
      naive = dataclasses.replace(cluster, devices_per_compute_pool=1)
      for s in run['steps']:
        b = s['per_device_batch']
        p = pm.predict(cluster, workload, b)
        q = pm.predict(naive, workload, b)
        rows.append({
            'config': key, 'kind': run['kind'], 'variant': variant, 'nodes': nodes,
            'devices_per_node': per_node, 'devices': run['devices'],
            'global_batch': s['global_batch'], 'per_device_batch': b,
            'measured_step_s': s['step_time_s'], 'predicted_step_s': p.step_time,
            'predicted_comm_s': p.comm_time,
            'measured_images_per_s': s['images_per_s'], 'predicted_images_per_s': p.images_per_s,
            'rel_error': (p.images_per_s - s['images_per_s']) / s['images_per_s'],
            'calibration_point': (variant == '1-point' and key == '1dev' and
                                  s['global_batch'] == calibration_batch),
            'no_pool_images_per_s': q.images_per_s,
            'no_pool_rel_error': (q.images_per_s - s['images_per_s']) / s['images_per_s']})

  def mare(variant, field='rel_error'):
    errs = [abs(r[field]) for r in rows if r['variant'] == variant and not r['calibration_point']
            and not (variant == '2-point' and r['config'] == '1dev'
                     and r['global_batch'] in calib['two_point']['batches'])]
    return float(np.mean(errs)) if errs else float('nan')

  xla = [s.get('xla_train_flops_per_image') for s in measured['runs']['1dev']['steps']]
  xla = [v for v in xla if v]
  return {'workload': dataclasses.asdict(workload), 'calibration': calib,
          'xla_train_flops_per_image': statistics.median(xla) if xla else None,
          'interconnect': dataclasses.asdict(ic), 'allreduce_fits': nets['fits'], 'rows': rows,
          'mare_1point': mare('1-point'), 'mare_2point': mare('2-point'),
          'mare_1point_without_pool': mare('1-point', 'no_pool_rel_error')}


# ----------------------------------------------------------------------------------------------
# Experiment 2: the seed paper's hardware.

PAPER = {'intra_node': 'near-linear (no figure given)', 'speedup_16_nodes': 10.3,
         'hours_one_node': 106.0, 'hours_sync_16': 12.0, 'hours_mixed_16': 16.0}
PAPER_PER_DEVICE_BATCH = 32  # MUSA2's batch 128 over one node's 4 K80 dies.
PAPER_NODES = (1, 2, 4, 8, 16)
FIT_METHODS = ('sync_allreduce', 'sync_ps', 'async', 'mixed')


def _paper_methods(num_ps: int) -> Dict[str, dict]:
  return {
      'sync (ring all-reduce)': dict(method='sync'),
      f'sync (TF parameter servers, {num_ps} PS)': dict(method='sync', sync_comm='ps',
                                                        num_ps=num_ps),
      f'async (device workers, {num_ps} PS)': dict(method='async', num_ps=num_ps),
      f'mixed (sync in node, async across, {num_ps} PS)': dict(method='mixed', num_ps=num_ps),
  }


def paper_comparison(sim_updates: int = 20_000, num_ps: int = 1, fit_method: str = 'mixed',
                     seed: int = 0) -> dict:
  """Model vs. the seed paper: intra-node scaling, 16-node speed-ups and times, before/after a fit.

  ``fit_method`` names the method whose 16-node speed-up is fitted to the paper's 10.3x with
  the inter-node transport efficiency (1 = the preset's 6 GB/s).
  """
  workload = pm.resnet50(dataset_size=307_406)  # MUSA2: 384,258 images, 80 % for training.
  base = pm.minotauro()
  methods = _paper_methods(num_ps)
  method_keys = list(methods)
  fit_keys = dict(zip(FIT_METHODS, method_keys))
  if fit_method not in fit_keys:
    raise ValueError(f'fit_method={fit_method!r}; choose one of {FIT_METHODS}.')
  fit_key = fit_keys[fit_method]
  if num_ps < 1:
    raise ValueError(f'num_ps must be >= 1, got {num_ps}.')

  def cluster(nodes, devices, eta):
    ic = dataclasses.replace(base.interconnect,
                             inter_node_bandwidth=eta * base.interconnect.inter_node_bandwidth)
    return dataclasses.replace(base, nodes=nodes, devices_per_node=devices, interconnect=ic)

  def run(eta):
    kw = dict(sim_updates=sim_updates, seed=seed)
    intra = [pm.predict(cluster(1, d, eta), workload, PAPER_PER_DEVICE_BATCH, **kw)
             for d in (1, 2, 4)]
    scaling = {}
    for name, m in methods.items():
      scaling[name] = [pm.predict(cluster(n, 4, eta), workload, PAPER_PER_DEVICE_BATCH,
                                  **m, **kw) for n in PAPER_NODES]
    return intra, scaling

  def speedup16(key, eta, updates):
    return pm.predict(cluster(16, 4, eta), workload, PAPER_PER_DEVICE_BATCH, **methods[key],
                      sim_updates=updates, seed=seed).speedup_vs_one_node

  def fit_eta(key, updates, iterations):
    """Bisection on log(eta) (the speed-up grows with the bandwidth); None if out of range."""
    lo, hi = 1e-3, 1.0
    if not speedup16(key, hi, updates) >= PAPER['speedup_16_nodes'] >= speedup16(key, lo,
                                                                                updates):
      return None
    for _ in range(iterations):
      mid = math.sqrt(lo * hi)
      if speedup16(key, mid, updates) < PAPER['speedup_16_nodes']:
        lo = mid
      else:
        hi = mid
    return math.sqrt(lo * hi)

  fitted = fit_eta(fit_key, sim_updates, 30)
  # What each method would need to show 10.3x (coarser for the simulated methods).
  needed = {k: (fitted if k == fit_key else fit_eta(k, max(1000, sim_updates // 4), 16))
            for k in method_keys}

  def summarise(eta):
    intra, scaling = run(eta)
    methods_out = {}
    for name, preds in scaling.items():
      p16 = preds[-1]
      s = p16.speedup_vs_one_node
      hours16 = PAPER['hours_one_node'] / s
      paper_hours = PAPER['hours_mixed_16'] if name.startswith('mixed') else (
          PAPER['hours_sync_16'] if name.startswith('sync') else None)
      out = {'speedup_vs_one_node': [p.speedup_vs_one_node for p in preds],
             'images_per_s': [p.images_per_s for p in preds],
             'step_time_s': [p.step_time for p in preds],
             'comm_time_s_16': p16.comm_time, 'efficiency_16': p16.efficiency,
             'speedup_16': s, 'error_vs_10_3': (s - PAPER['speedup_16_nodes']) /
             PAPER['speedup_16_nodes'], 'hours_16_if_same_epochs': hours16,
             'paper_hours_16': paper_hours,
             'hours_error': None if paper_hours is None else (hours16 - paper_hours) / paper_hours,
             'mean_staleness_16': p16.mean_staleness}
      if p16.analytic_images_per_s is not None:
        out['analytic_images_per_s_16'] = p16.analytic_images_per_s
        out['analytic_vs_simulated_throughput'] = (p16.analytic_images_per_s /
                                                   p16.images_per_s - 1)
        out['staleness_tv_analytic_vs_simulated'] = pm.total_variation(
            p16.analytic_staleness_distribution, p16.staleness_distribution)
      methods_out[name] = out
    one_node = intra[-1]
    return {'inter_node_efficiency': eta,
            'inter_node_bandwidth': eta * base.interconnect.inter_node_bandwidth,
            'intra_node': [{'devices': d, 'speedup_vs_one_device': p.speedup_vs_one_device,
                            'efficiency': p.efficiency, 'images_per_s': p.images_per_s}
                           for d, p in zip((1, 2, 4), intra)],
            'one_node_images_per_s': one_node.images_per_s,
            'one_node_epoch_h': one_node.epoch_time / 3600,
            'epochs_in_106h_implied': PAPER['hours_one_node'] * 3600 / one_node.epoch_time,
            'methods': methods_out}

  result = {'paper': PAPER, 'per_device_batch': PAPER_PER_DEVICE_BATCH, 'nodes': PAPER_NODES,
            'num_ps': num_ps, 'workload': dataclasses.asdict(workload),
            'device': dataclasses.asdict(base.device),
            'interconnect': dataclasses.asdict(base.interconnect),
            'fit_method': fit_key, 'eta_needed_for_10_3': needed,
            'preset': summarise(1.0), 'fitted': None}
  if fitted is not None:
    result['fitted'] = summarise(fitted)
  return result


# ----------------------------------------------------------------------------------------------
# Report.

def _gbps(bandwidth: float) -> str:
  if bandwidth >= UNRESOLVED_BANDWIDTH:
    return 'bandwidth not resolved (latency only)'
  return f'{bandwidth / 1e9:.2f} GB/s'


def _pct(x: Optional[float]) -> str:
  return '—' if x is None or (isinstance(x, float) and math.isnan(x)) else f'{100 * x:+.1f} %'


def write_report(results: dict, out_dir: str) -> Dict[str, str]:
  """results.json, report.md and the plots; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {'json': os.path.join(out_dir, 'results.json'),
           'report': os.path.join(out_dir, 'report.md')}
  with open(paths['json'], 'w') as f:
    json.dump(results, f, indent=2, default=str)
  lines = ['# Performance-model validation', '',
           f'Generated {results["generated"]} ({results["mode"]} mode). '
           f'Machine load (`uptime`): before `{results.get("load_before", "?")}`; after '
           f'`{results.get("load_after", "?")}`.', '']
  cpu = results.get('cpu')
  if cpu:
    lines += _cpu_section(cpu, results.get('measured', {}))
    paths['cpu_plot'] = _plot_cpu(cpu, os.path.join(out_dir, 'cpu_measured_vs_predicted.png'))
  paper = results.get('paper')
  if paper:
    lines += _paper_section(paper)
    paths['paper_plot'] = _plot_paper(paper, os.path.join(out_dir, 'paper_speedup.png'))
  with open(paths['report'], 'w') as f:
    f.write('\n'.join(lines) + '\n')
  return paths


def _cpu_section(cpu: dict, measured: dict) -> List[str]:
  c, w = cpu['calibration'], cpu['workload']
  ic = cpu['interconnect']
  spec = measured.get('spec', {})
  lines = ['## 1. Measured vs. predicted on this machine', '',
           f'Model: {spec.get("arch")} width {spec.get("width")} at {spec.get("image_size")} px '
           f'(synthetic_anp heads), `trainer.build` + `Run.train_step` on an in-memory batch, '
           f'{spec.get("warmup_steps")} warm-up step(s), median of {spec.get("timed_steps")}. '
           f'Workload (XLA cost analysis of the same Flax model): '
           f'{w["flops_per_image_fwd"] / 1e6:.2f} MFLOP/image forward x 3 for training, '
           f'{w["param_bytes"] / 1e3:.0f} kB of parameters.']
  if cpu.get('xla_train_flops_per_image'):
    lines[-1] += (f' XLA counts {cpu["xla_train_flops_per_image"] / 1e6:.2f} MFLOP/image for '
                  f'the whole compiled train step (factor '
                  f'{cpu["xla_train_flops_per_image"] / w["flops_per_image_fwd"]:.2f} over '
                  'forward, not 3: the calibration absorbs it).')
  lines += ['',
            f'* **Device**: {CPU_CORES} cores x {CPU_CLOCK_HZ / 1e9:.1f} GHz x '
            f'{CPU_FLOPS_PER_CYCLE} FLOP/cycle = {c["peak_flops"] / 1e9:.0f} GFLOP/s peak; '
            f'efficiency calibrated on ONE point ({c["calibration_point"]}, '
            f'{1e3 * c["step_time_s"]:.1f} ms): {100 * c["efficiency"]:.1f} % '
            f'({c["sustained_flops"] / 1e9:.2f} GFLOP/s sustained), no per-step overhead.',
            f'* **2-point variant** (a fit, for comparison): per-image time and a fixed per-step '
            f'overhead through 1-device batches {c["two_point"]["batches"]}: overhead '
            f'{1e3 * c["two_point"]["overhead_s"]:.1f} ms/step.',
            '* **Interconnect**: not measured (no multi-device job in this run).'
            if not cpu['allreduce_fits'] else
            f'* **Interconnect** from the `psum` micro-benchmark (alpha-beta ring fit): simulated '
            f'devices {_gbps(ic["intra_node_bandwidth"])}, '
            f'{1e6 * ic["intra_node_latency"]:.0f} us/hop; 2 processes over loopback gloo '
            f'{_gbps(ic["inter_node_bandwidth"])}, '
            f'{1e6 * ic["inter_node_latency"]:.0f} us/hop.',
            f'* **Not measured** (time budget): {", ".join(measured["skipped"])}.'
            if measured.get('skipped') else '* All planned jobs were measured.',
            '* **Compute pool**: the simulated devices and the processes share the same '
            f'{CPU_CORES} cores: `Cluster.devices_per_compute_pool` = all devices of the job.',
            '', '| fit | devices | bandwidth GB/s | latency us | fit error |',
            '|---|---|---|---|---|']
  for key, f in cpu['allreduce_fits'].items():
    bw = ('— (times did not grow with size: latency only)' if f.get('latency_only')
          else f'{f["bandwidth"] / 1e9:.2f}')
    lines.append(f'| {key} | {f["devices"]} | {bw} | '
                 f'{1e6 * f["latency"]:.0f} | {100 * f["fit_mare"]:.0f} % |')
  lines += ['', '| config | global batch | per device | measured ms | predicted ms (1-pt) | '
            'measured img/s | predicted img/s (1-pt) | error 1-pt | error 2-pt | '
            'error without pool |', '|---|---|---|---|---|---|---|---|---|---|']
  two = {(r['config'], r['global_batch']): r for r in cpu['rows'] if r['variant'] == '2-point'}
  for r in cpu['rows']:
    if r['variant'] != '1-point':
      continue
    mark = ' (calibration)' if r['calibration_point'] else ''
    r2 = two[(r['config'], r['global_batch'])]
    lines.append(f'| {r["config"]} | {r["global_batch"]} | {r["per_device_batch"]} | '
                 f'{1e3 * r["measured_step_s"]:.1f} | {1e3 * r["predicted_step_s"]:.1f} | '
                 f'{r["measured_images_per_s"]:.0f} | {r["predicted_images_per_s"]:.0f} | '
                 f'{_pct(r["rel_error"])}{mark} | {_pct(r2["rel_error"])} | '
                 f'{_pct(r["no_pool_rel_error"])} |')
  lines += ['', f'Mean absolute relative error of images/s over the predicted (non-calibration) '
            f'points: **1-point {100 * cpu["mare_1point"]:.1f} %**, 2-point '
            f'{100 * cpu["mare_2point"]:.1f} % (its own two calibration points excluded), and '
            f'{100 * cpu["mare_1point_without_pool"]:.1f} % for the 1-point model that ignores '
            'the shared cores (every simulated device credited with its own 2 cores).', '',
            'What this can and cannot show on 2 cores: simulated devices and local processes do '
            'not add compute, so the model\'s job here is the *cost* of data parallelism — the '
            'per-step collectives (fitted from an independent micro-benchmark), the fixed '
            'per-step overheads, and the loss of per-device efficiency at small per-device '
            'batches. It cannot show compute scaling, network contention or multi-node '
            'effects; those are experiment 2\'s subject, against published numbers.', '']
  return lines


def _paper_section(paper: dict) -> List[str]:
  ic = paper['interconnect']
  lines = ['## 2. The seed paper\'s hardware (MinoTauro, 4 K80 dies per node)', '',
           f'Assumptions: ResNet-50 at 224 px ({paper["workload"]["flops_per_image_fwd"] / 1e9:.1f}'
           f' GFLOP/image forward, {paper["workload"]["param_bytes"] / 1e6:.1f} MB fp32 '
           f'gradients); {paper["per_device_batch"]} images per K80 die (MUSA2\'s batch 128 on one '
           'node); K80 die = `perfmodel.k80()` (1.35 TFLOP/s sustained + 62 ms/step, from '
           'TensorFlow\'s published K80 benchmark); intra-node ring '
           f'{ic["intra_node_bandwidth"] / 1e9:.0f} GB/s, {1e6 * ic["intra_node_latency"]:.0f} us '
           f'(PCIe 3.0 through the boards\' switches); inter-node '
           f'{ic["inter_node_bandwidth"] / 1e9:.0f} GB/s, {1e6 * ic["inter_node_latency"]:.0f} us '
           '(FDR InfiniBand with a tuned library); no compute/communication overlap; '
           f'{paper["num_ps"]} parameter server(s) on their own links; asynchronous step-time '
           'jitter 10 %; the same number of epochs for every method (the model predicts '
           'throughput, not convergence).', '']
  for label, block in (('With the presets (no fit)', paper['preset']),
                       ('After fitting the inter-node transport efficiency (a FIT)',
                        paper['fitted'])):
    if block is None:
      lines += [f'### {label}', '', 'No efficiency in [0.001, 1] reproduces 10.3x for '
                f'{paper["fit_method"]}; not fitted.', '']
      continue
    lines += [f'### {label}', '',
              f'Inter-node bandwidth {block["inter_node_bandwidth"] / 1e9:.2f} GB/s '
              f'({100 * block["inter_node_efficiency"]:.1f} % of the preset).']
    if block is paper['fitted']:
      lines[-1] += (f' Fitted so that **{paper["fit_method"]}** gives 10.3x at 16 nodes: its '
                    'error there is 0 by construction; every other number is out of sample.')
    intra = block['intra_node']
    lines += ['', 'Intra-node (synchronous, 1 node): ' + ', '.join(
        f'{r["devices"]} GPU(s) {r["speedup_vs_one_device"]:.2f}x ({100 * r["efficiency"]:.0f} %)'
        for r in intra) + f' — paper: {paper["paper"]["intra_node"]}. One node: '
        f'{block["one_node_images_per_s"]:.0f} img/s, {block["one_node_epoch_h"]:.2f} h/epoch '
        f'(106 h would be {block["epochs_in_106h_implied"]:.0f} epochs).', '',
        '| method | speed-up 16 nodes | vs paper 10.3x | 16-node time (106 h / speed-up) | '
        'paper time | time error | mean staleness | analytic vs DES img/s | staleness TV |',
        '|---|---|---|---|---|---|---|---|---|']
    for name, m in block['methods'].items():
      paper_h = '—' if m['paper_hours_16'] is None else f'{m["paper_hours_16"]:.0f} h'
      tv = m.get('staleness_tv_analytic_vs_simulated')
      tv = '—' if tv is None else f'{tv:.3f}'
      lines.append(
          f'| {name} | {m["speedup_16"]:.2f}x | {_pct(m["error_vs_10_3"])} | '
          f'{m["hours_16_if_same_epochs"]:.1f} h | {paper_h} | {_pct(m["hours_error"])} | '
          f'{m["mean_staleness_16"]:.1f} | {_pct(m.get("analytic_vs_simulated_throughput"))} | '
          f'{tv} |')
    lines.append('')
  lines += ['Inter-node efficiency each method would need for 10.3x at 16 nodes (— : none in '
            '[0.001, 1], i.e. not even FDR at full speed, or not even 0.1 % of it): ' +
            ', '.join(f'{k}: {"—" if v is None else f"{v:.3f}"}'
                      for k, v in paper['eta_needed_for_10_3'].items()) + '.', '']
  lines += ['Reading: the paper\'s times also contain convergence effects the model does not '
            'have (asynchronous and mixed runs may need more epochs), so the time errors of the '
            'asynchronous methods bound the model from one side only. The paper does not say '
            'which method its 10.3x belongs to; every method is compared with it.', '']
  return lines


def _plot_cpu(cpu: dict, path: str) -> str:
  plt = plotting.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  rows = [r for r in cpu['rows'] if r['variant'] == '1-point']
  for i, key in enumerate(dict.fromkeys(r['config'] for r in rows)):
    rs = sorted((r for r in rows if r['config'] == key), key=lambda r: r['global_batch'])
    b = [r['global_batch'] for r in rs]
    color = f'C{i}'
    ax.plot(b, [r['measured_images_per_s'] for r in rs], 'o-', color=color,
            label=f'{key} measured')
    ax.plot(b, [r['predicted_images_per_s'] for r in rs], 's--', color=color, alpha=0.7,
            label=f'{key} predicted')
  ax.set_xscale('log', base=2)
  ax.set_xlabel('global batch')
  ax.set_ylabel('training images/s')
  ax.set_title('This machine: measured vs. predicted (1-point calibration)')
  ax.legend(fontsize=7, ncol=2)
  ax.grid(alpha=0.3)
  return plotting.save_figure(fig, path)


def _plot_paper(paper: dict, path: str) -> str:
  plt = plotting.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  nodes = paper['nodes']
  for i, (name, m) in enumerate(paper['preset']['methods'].items()):
    ax.plot(nodes, m['speedup_vs_one_node'], 'o-', color=f'C{i}', label=f'{name} (presets)')
    if paper['fitted']:
      ax.plot(nodes, paper['fitted']['methods'][name]['speedup_vs_one_node'], 'x--',
              color=f'C{i}', alpha=0.7)
  ax.plot(nodes, nodes, ':', color='grey', label='linear')
  p = paper['paper']
  ax.plot([16], [p['speedup_16_nodes']], 'k*', markersize=14, label='paper: 10.3x (throughput)')
  ax.plot([16], [p['hours_one_node'] / p['hours_sync_16']], 'kv', label='paper: 106/12 h (sync)')
  ax.plot([16], [p['hours_one_node'] / p['hours_mixed_16']], 'k^',
          label='paper: 106/16 h (mixed)')
  ax.set_xlabel('nodes (4 K80 dies each)')
  ax.set_ylabel('speed-up over one node')
  ax.set_title('MinoTauro: model (solid: presets, dashed: fitted) vs. paper')
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  return plotting.save_figure(fig, path)


def run_validation(out_dir: str, *, quick: bool = False, parts: Sequence[str] = ('cpu', 'paper'),
                   batches: Optional[Sequence[int]] = None,
                   devices: Optional[Sequence[int]] = None, processes: Optional[int] = None,
                   calibration_batch: Optional[int] = None, num_ps: int = 1,
                   fit_method: str = 'mixed', timeout_s: float = 900.0, log=print,
                   reuse: bool = False, budget_s: Optional[float] = None) -> dict:
  """Both experiments end to end; writes the outputs into ``out_dir`` and returns the results."""
  preset = QUICK if quick else FULL
  other_batches = tuple(batches or preset['other_batches'])
  batches = tuple(batches or preset['batches'])
  devices = tuple(devices or preset['devices'])
  processes = preset['processes'] if processes is None else processes
  calibration_batch = calibration_batch or preset['calibration']
  unknown = set(parts) - {'cpu', 'paper'}
  if unknown or not parts:
    raise ValueError(f'parts must be among cpu, paper; got {list(parts)}.')
  if 'cpu' in parts:
    if 1 not in devices:
      raise ValueError('The device counts must include 1 (the calibration runs on one device).')
    if calibration_batch not in batches:
      raise ValueError(f'The calibration batch {calibration_batch} must be one of the measured '
                       f'batches {list(batches)}.')
    if len(batches) < 2:
      raise ValueError('Measure at least two batch sizes (one calibrates, the others test).')
  results = {'mode': 'quick (plumbing only: step times are NOT measurements)' if quick else
             'full',
             'generated': time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()),
             'load_before': _uptime()}
  if 'cpu' in parts:
    measured = measure_all(out_dir, batches, devices, processes, preset['spec'], timeout_s, log,
                           other_batches=other_batches, reuse=reuse, budget_s=budget_s)
    results['measured'] = measured
    results['cpu'] = predict_points(measured, calibration_batch)
  if 'paper' in parts:
    log("paper: simulating the seed paper's cluster (presets, then the one-knob fit)...")
    results['paper'] = paper_comparison(sim_updates=2_000 if quick else 20_000, num_ps=num_ps,
                                        fit_method=fit_method)
  results['load_after'] = _uptime()
  results['files'] = write_report(results, out_dir)
  return results


if __name__ == '__main__':
  runtime.configure()
  _worker_main()
