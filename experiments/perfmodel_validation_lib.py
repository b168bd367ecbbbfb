"""The performance-model validation experiment on this machine: its jobs, their launch, the report.

`experiments/perfmodel_validation.py` is the command line. What is computed (the measurement in
each subprocess, the fits, the predictions, the seed paper's cluster) is library code with tests:
`anp_jax.research.perfvalidation`. What lives here is what belongs to this machine and this
experiment:

* `THIS_MACHINE`, the CPU whose peak the measured efficiency is calibrated against;
* the `FULL` and `QUICK` job lists (batches, device counts, the model that is timed);
* `measure_all`: one subprocess (``python -m anp_jax.research.perfvalidation``) per simulated
  device count and one multi-process job on 127.0.0.1 (`jax.distributed` + gloo, one device
  each), with progress, a time budget and ``--reuse`` of earlier measurements;
* `run_validation` (both experiments end to end) and `write_report`: ``results.json``,
  ``report.md`` and PNG plots.
"""

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from anp_jax import distributed, plotting, xla_flags
from anp_jax.research import perfvalidation as pv
from anp_jax.research.perfvalidation import MeasureSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# This machine's cores (AMD EPYC, Zen 1, KVM guest): 2 cores x 2.0 GHz (BogoMIPS / 2) x 16 fp32
# FLOP/cycle (two 128-bit FMA pipes). Only the product with the calibrated efficiency matters.
THIS_MACHINE = pv.CpuPeak(cores=2, clock_hz=2.0e9, flops_per_cycle=16)

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
# Launching measurements.

HEARTBEAT_S = 10.0  # Seconds of silence after which a running measurement says it still runs.


def _launch(spec: MeasureSpec, out_json: str, devices_per_process: int, processes: int,
            log_prefix: str, timeout_s: float, progress=None) -> dict:
  """Runs the measurement in ``processes`` subprocesses; returns process 0's result.

  ``progress`` (a print-like function) gets process 0's new ``batch ...`` lines as they come,
  and a line every `HEARTBEAT_S` seconds while nothing new was printed.
  """
  flags = xla_flags.with_device_count('', devices_per_process)
  if spec.plumbing_only:
    flags += ' --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'
  base = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
              TF_CPP_MIN_LOG_LEVEL='2', JAX_PLATFORMS='cpu', CUDA_VISIBLE_DEVICES='',
              XLA_FLAGS=flags)
  for key in ('ANP_COORDINATOR_ADDRESS', 'ANP_NUM_PROCESSES', 'ANP_PROCESS_ID'):
    base.pop(key, None)
  # Held until the job ends, so that no other local job's coordinator is given the same port.
  reservation = distributed.reserve_port() if processes > 1 else None
  port = reservation.getsockname()[1] if reservation else None
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
          [sys.executable, '-m', 'anp_jax.research.perfvalidation', json.dumps(dataclasses.asdict(spec)),
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
      p.wait()
    raise RuntimeError(f'The measurement ({processes} process(es) x {devices_per_process} '
                       f'device(s)) did not finish within {timeout_s:.0f} s; see {logs[0]}. '
                       'Use fewer/smaller batches or raise --timeout.') from None
  finally:
    if reservation:
      reservation.close()
  for p, log in zip(procs, logs):
    if p.returncode != 0:
      tail = open(log).read()[-3000:]
      raise RuntimeError(f'A measuring process exited with {p.returncode} ({log}):\n{tail}')
  with open(out_json) as f:
    return json.load(f)


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
    # The 1-device job always runs: without it there is nothing to calibrate on.
    if budget_s is not None and key != '1dev' and time.time() - start > budget_s:
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
# Report.

def _gbps(bandwidth: float) -> str:
  if bandwidth >= pv.UNRESOLVED_BANDWIDTH:
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
            f'* **Device**: {THIS_MACHINE.cores} cores x {THIS_MACHINE.clock_hz / 1e9:.1f} GHz x '
            f'{THIS_MACHINE.flops_per_cycle} FLOP/cycle = {c["peak_flops"] / 1e9:.0f} GFLOP/s peak; '
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
            f'{THIS_MACHINE.cores} cores: `Cluster.devices_per_compute_pool` = all devices of the job.',
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
  # Ranges, before any measuring job starts (each would otherwise fail only after one ran).
  if not timeout_s > 0:
    raise ValueError(f'--timeout={timeout_s} must be > 0 (seconds per measuring job).')
  if budget_s is not None and not budget_s > 0:
    raise ValueError(f'--budget={budget_s} must be > 0 seconds (or left out: no budget); the '
                     '1-device measurement always runs.')
  if processes < 0:
    raise ValueError(f'--processes={processes} must be >= 0 (0 or 1: no loopback job).')
  if num_ps < 1:
    raise ValueError(f'--num_ps={num_ps} must be >= 1.')
  if calibration_batch < 1:
    raise ValueError(f'--calibration_batch={calibration_batch} must be >= 1.')
  if not out_dir:
    raise ValueError('--out is empty: give the output directory.')
  out_dir = os.path.expanduser(out_dir)
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise ValueError(f'--out={out_dir} is a file, not a directory: give an output directory.')
  if 'cpu' in parts:
    if 1 not in devices:
      raise ValueError('The device counts must include 1 (the calibration runs on one device).')
    if calibration_batch not in batches:
      raise ValueError(f'The calibration batch {calibration_batch} must be one of the measured '
                       f'batches {list(batches)}.')
    if len(batches) < 2:
      raise ValueError('Measure at least two batch sizes (one calibrates, the others test).')
  os.makedirs(out_dir, exist_ok=True)  # Now, not after the measurements (OSError: exit 2).
  results = {'mode': 'quick (plumbing only: step times are NOT measurements)' if quick else
             'full',
             'generated': time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()),
             'load_before': _uptime()}
  if 'cpu' in parts:
    measured = measure_all(out_dir, batches, devices, processes, preset['spec'], timeout_s, log,
                           other_batches=other_batches, reuse=reuse, budget_s=budget_s)
    results['measured'] = measured
    results['cpu'] = pv.predict_points(measured, calibration_batch, THIS_MACHINE)
  if 'paper' in parts:
    log("paper: simulating the seed paper's cluster (presets, then the one-knob fit)...")
    results['paper'] = pv.paper_comparison(sim_updates=2_000 if quick else 20_000, num_ps=num_ps,
                                        fit_method=fit_method)
  results['load_after'] = _uptime()
  results['files'] = write_report(results, out_dir)
  return results
