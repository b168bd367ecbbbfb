#!/usr/bin/env python3
"""Time to target, predicted and measured on this machine: the planner's time side.

  .venv/bin/python experiments/plan_time_validation.py --out workdirs/plan_time  # quiet, ~16 min
  .venv/bin/python experiments/plan_time_validation.py --out workdirs/plan_time --dry_run

The planner's time to target is steps to target (statistics) x time per step (hardware). This
script checks the product end to end, on configurations that differ in processes, devices and
batch size, with the real trainer (``.venv/bin/python -m anp_jax.main``, stopping at the target):

1. **Calibration**: one process, one device, one run at each of ``--calibration_batches``
   (spanning the measured batches: the step time of a CPU is not linear in the batch),
   ``--calibration_steps`` steps with a training record and an evaluation at each third. As
   docs/performance-model.md calibrates a device: the step time is the batch over the run's
   steady images/s (`steady_rate`: over its later half, from the trainer's
   ``train/images_per_s``, which excludes compilation and evaluations). The runs give the two
   other terms of the loop (medians over the runs): the time of one evaluation (an evaluation
   record's time minus that of the training record of its step) and the fixed start-up
   (dataset, initialisation, compilation, the slower first steps: the run's wall time minus its
   steps and evaluations). With ``--startup_processes`` (default 2), one more run of that many
   single-device processes at the reference batch gives a multi-process job's start-up.
2. **Pilot**: one process, ``--pilot_devices`` devices (the noise scale needs two), batch
   ``--pilot_batch``, ``--seeds`` seeds, to the target: the planner's steps model
   (`planner.load_pilot` over the seeds).
3. **Predictions**, for every measured configuration (processes x devices x batch): steps to
   target from the pilot (with the planner's band); the steps the loop runs (the trainer stops at
   the first evaluation at the target: the crossing rounded up to the evaluation cadence) and
   its evaluations; the step time from the performance model (the calibrated device's step time
   interpolated at the batch its compute pool runs, the links fitted by
   ``experiments/perfmodel_validation.py`` on this machine, every device and process sharing
   the same cores); whole loop = start-up + steps x step time + evaluations x evaluation time.
   Two baselines take the step time instead from one calibration (the batch nearest the
   pilot's): a *constant* images/s, and a *one-parameter* images/s proportional to the devices.
4. **Measurements**: each configuration trained to the target with ``--seeds`` seeds; each run's
   ``final_metrics.json`` ``wall_time_s`` (the trainer's whole loop: build, compile, steps,
   evaluations, checkpoints) and its steady images/s; their means (the whole loop with a
   95 % Student-t interval) are what the predictions are scored against.

The report (``report.md``, ``results.json``) gives each configuration's errors (whole loop, the
time side alone with the measured steps, and images/s) for the model and both baselines, their
mean |error| over the out-of-sample configurations (the pilot's steps are in sample), the
measured throughput span and the noise floor. Runs live in ``--out``/runs/; a finished run is
reused (its config must be the one this invocation would run), an interrupted one is refused.
Timing is meaningless on a loaded machine: run it alone.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

import dataclasses
import json
import math
import statistics
import subprocess
import time
from typing import Dict, List, Optional, Sequence, Tuple

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from anp_jax import cli, distributed, runtime, xla_flags
from anp_jax.metrics_io import read_metrics, target_crossing
from anp_jax.research import eval_seam, planner, stats
from anp_jax.research import perfmodel as pm

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# This machine's links: the alpha-beta fits of experiments/perfmodel_validation.py (psum between
# simulated devices, and between processes over 127.0.0.1).
LINKS = os.path.join(HERE, 'results', 'perfmodel_validation', 'results.json')
FINAL = 'final_metrics.json'
@dataclasses.dataclass(frozen=True)
class Layout:
  """One run: ``processes`` x ``devices`` (per process) at global batch ``batch``, with the
  trainer's ``seed``. ``role``: 'calibration' (fixed steps), 'pilot' (its steps model; also
  measured) or 'measure'. The seeds of one configuration share its `configuration` key."""
  processes: int
  devices: int
  batch: int
  role: str = 'measure'
  seed: int = 0

  @property
  def configuration(self) -> str:
    return f'{self.role}-{self.processes}x{self.devices}-b{self.batch}'

  @property
  def name(self) -> str:
    return self.configuration + ('' if self.role == 'calibration' else f'-s{self.seed}')

  @property
  def total_devices(self) -> int:
    return self.processes * self.devices


# The measured layouts at each batch: one process with one and with two devices, two processes.
SHAPES = ((1, 1), (1, 2), (2, 1))


def reference_batch(calibration_batches: Sequence[int], pilot_batch: int) -> int:
  """The calibration batch nearest the pilot's (in ratio; the smaller on a tie): the baselines'
  rate, and the batch of the multi-process start-up calibration."""
  return min(calibration_batches, key=lambda b: (abs(math.log(b / pilot_batch)), b))


def layouts(batches: Sequence[int], pilot_batch: int, pilot_devices: int,
            calibration_batches: Sequence[int], seeds: int,
            startup_processes: int = 0) -> List[Layout]:
  """The calibrations (one process, one device, one run at each of ``calibration_batches``; with
  ``startup_processes`` > 1, one run of that many single-device processes at the reference
  batch for their start-up), the pilot (one process with ``pilot_devices`` at ``pilot_batch``,
  ``seeds`` seeds) and the measured configurations: every shape of `SHAPES` at every one of
  ``batches``, ``seeds`` seeds each.

  Several calibration batches give the step time's curve over the batch (interpolated between
  them); several seeds give each configuration's measured mean with an interval. A measured
  configuration may not be the pilot's (its steps are in sample) nor a calibration's.
  """
  if seeds < 1:
    raise ValueError(f'--seeds must be at least 1, got {seeds}.')
  if not calibration_batches:
    raise ValueError('Give at least one --calibration_batches value.')
  plan = [Layout(1, 1, b, 'calibration') for b in sorted(set(calibration_batches))]
  if startup_processes > 1:
    plan.append(Layout(startup_processes, 1, reference_batch(calibration_batches, pilot_batch),
                       'calibration'))
  plan += [Layout(1, pilot_devices, pilot_batch, 'pilot', s) for s in range(seeds)]
  for b in batches:
    for processes, devices in SHAPES:
      if (processes, devices) == (1, 1) and b in calibration_batches:
        raise ValueError(f'Batch {b} is also a calibration batch: its one-device configuration '
                         'would be predicted from itself. Measure other batches.')
      if (processes, devices, b) == (1, pilot_devices, pilot_batch):
        raise ValueError(f'Batch {b} on 1 x {devices} device(s) is the pilot\'s configuration: '
                         'its steps are in sample. Measure other batches.')
      plan += [Layout(processes, devices, b, 'measure', s) for s in range(seeds)]
  return plan


def run_config(base, layout: Layout, metric: str, target: float, calibration_steps: int):
  """The config of a layout's run: the base config, its batch, its seed, its target (stopping
  there, but for the calibration), and for the calibration (the base's seed) a fixed length
  with three evaluations and a training record at each of their steps (logged at the evaluation
  cadence, so each evaluation follows a training record of its own step, whose time is where
  the evaluation starts; logging every step would add a host synchronisation to every step and
  slow the rate it measures)."""
  config = ml_collections.ConfigDict(base.to_dict())
  config.batch_size, config.progress_bar = layout.batch, False
  if layout.role == 'calibration':
    train_size = planner.pilot_train_size(None, base, [])
    if calibration_steps % 3:
      raise ValueError(f'--calibration_steps must be a multiple of 3 (three evaluations), got '
                       f'{calibration_steps}.')
    config.num_train_steps = calibration_steps
    config.log_every_steps = calibration_steps // 3
    config.eval_every_epochs = calibration_steps / 3 * layout.batch / train_size
  else:
    config.seed = layout.seed
  eval_seam.set_target(config, metric, target, stop=layout.role != 'calibration')
  return config


def config_overrides(base, config) -> Dict[str, object]:
  """The fields in which ``config`` differs from ``base`` (a run's ``--config.x=y``)."""
  before, after = planner.flat_config(base), planner.flat_config(config)
  return {k: v for k, v in after.items() if before.get(k) != v}


def launch(command: Sequence[str], layout: Layout, log_path: str, timeout_s: float) -> float:
  """Runs ``command`` (the trainer's command line) as ``layout.processes`` processes of
  ``layout.devices`` simulated devices each on 127.0.0.1; returns the wall seconds from the
  launch to the last exit. Logs: ``log_path``.proc<i>.log."""
  base_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
                  XLA_FLAGS=xla_flags.with_device_count(os.environ.get('XLA_FLAGS', ''),
                                                        layout.devices))
  for key in ('ANP_COORDINATOR_ADDRESS', 'ANP_NUM_PROCESSES', 'ANP_PROCESS_ID'):
    base_env.pop(key, None)
  # Held while the job runs: no other local job's coordinator is given this port.
  reservation = distributed.reserve_port() if layout.processes > 1 else None
  procs, logs = [], []
  start = time.time()
  try:
    for pid in range(layout.processes):
      env = dict(base_env)
      if reservation is not None:
        env.update(ANP_COORDINATOR_ADDRESS=f'127.0.0.1:{reservation.getsockname()[1]}',
                   ANP_NUM_PROCESSES=str(layout.processes), ANP_PROCESS_ID=str(pid))
      logs.append(open(f'{log_path}.proc{pid}.log', 'w'))
      procs.append(subprocess.Popen(list(command), env=env, stdout=logs[-1],
                                    stderr=subprocess.STDOUT, cwd=ROOT))
    deadline = start + timeout_s
    while any(p.poll() is None for p in procs):
      if time.time() > deadline:
        raise RuntimeError(f'{layout.name} did not finish within {timeout_s:.0f} s (waiting for '
                           f'its {layout.processes} process(es)); see {log_path}.proc0.log. '
                           'Raise --timeout.')
      time.sleep(0.5)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
    for f in logs:
      f.close()
    if reservation is not None:
      reservation.close()
  failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode]
  if failed:
    with open(f'{log_path}.proc{failed[0][0]}.log') as f:
      tail = f.read()[-3000:]
    raise RuntimeError(f'{layout.name}: process {failed[0][0]} exited with {failed[0][1]}:\n'
                       f'{tail}')
  return time.time() - start


def steady_rate(train: Sequence[Dict]) -> Optional[float]:
  """Images/s over the later half of a run, from its training records' ``train/images_per_s``.

  The trainer logs the average since its first step (the clock restarts after step 1, whose
  compilation it leaves out, and evaluations are excluded), so the k-th record's training time
  is (k - 1) x batch / rate, and the rate between two records follows from theirs. The first
  tens of steps run slower than the rest (the input pipeline and the thread pools warming up):
  an average over a short run reads that warm-up as step time. The window: from the first
  record at or past half the last record's step to the last (the last two records if that
  holds one; the one rate if there is one)."""
  points = [(r['step'], r['train/images_per_s']) for r in train
            if r['step'] > 1 and r.get('train/images_per_s', 0) > 0]
  if not points:
    return None
  if len(points) == 1:
    return points[0][1]
  window = [p for p in points if p[0] >= points[-1][0] / 2]
  (ki, ri), (kj, rj) = window[0] if len(window) > 1 else points[-2], points[-1]
  per_image = (kj - 1) / rj - (ki - 1) / ri  # Seconds per image of the batch, between them.
  return (kj - ki) / per_image if per_image > 0 else rj


def measure(workdir: str, metric: str, target: float) -> Dict:
  """A finished run's measurements: the whole loop's wall time (``final_metrics.json``), its
  steps and evaluations, the crossing, images/s (`steady_rate`; its whole-run average beside
  it) and the median time of an evaluation (after a training record of its own step)."""
  with open(os.path.join(workdir, FINAL)) as f:
    final = json.load(f)
  records = read_metrics(workdir)
  train = [r for r in records if 'train/images_per_s' in r]
  evals = [r for r in records if metric in r]
  crossing = target_crossing(records, target, metric)
  # The logged rate is the run's average since its first step (compilation and evaluations
  # excluded): the last one covers the whole run.
  train_time = {r['step']: r['time'] for r in train}
  eval_s = [e['time'] - train_time[e['step']] for e in evals if e['step'] in train_time]
  return {'wall_s': float(final['wall_time_s']), 'steps': int(final['step']),
          'stopped_at_target': bool(final.get('stopped_at_target')),
          'crossing': crossing['step'] if crossing else None, 'evals': len(evals),
          'images_per_s': steady_rate(train),
          'mean_images_per_s': train[-1]['train/images_per_s'] if train else None,
          'eval_s': statistics.median(eval_s) if eval_s else None}


@dataclasses.dataclass(frozen=True)
class Calibration:
  """What the one-device calibration runs measured (seconds): ``points``, the step time at each
  calibration batch (increasing batches), as a SPRINT-style model measures a device's compute at
  the batches it will run; the time of one evaluation and the fixed start-up (medians over the
  runs); ``reference_batch``, the calibration batch whose images/s the baselines take. The step
  time is each run's steady rate (`steady_rate`): the slower first steps fall into the start-up.
  ``multi_fixed_s``: the start-up of a job of ``multi_processes`` single-device processes (a
  calibration run of its own: they also initialise the distributed runtime), used for every
  multi-process layout; None: the one-process start-up stands for all."""
  points: Tuple[Tuple[int, float], ...]
  eval_s: float
  fixed_s: float
  reference_batch: int
  multi_fixed_s: Optional[float] = None
  multi_processes: int = 0

  @staticmethod
  def _step_and_fixed(m: Dict, batch: int, what: str) -> Tuple[float, float]:
    """A calibration run's step time at ``batch`` and its start-up (wall - steps - evals)."""
    if not m['images_per_s'] or m['eval_s'] is None:
      raise ValueError(f'The calibration run {what} logged no training rate or no evaluation '
                       'after a training record of its step: nothing to calibrate on.')
    step = batch / m['images_per_s']
    return step, max(m['wall_s'] - m['steps'] * step - m['evals'] * m['eval_s'], 0.0)

  @classmethod
  def from_runs(cls, runs: Dict[int, Dict], reference_batch: int, multi: Optional[Dict] = None,
                multi_processes: int = 0) -> 'Calibration':
    """``runs``: each calibration batch's `measure` record; ``multi``: that of the
    ``multi_processes``-process start-up calibration at ``reference_batch`` (or None)."""
    if reference_batch not in runs:
      raise ValueError(f'The reference batch {reference_batch} is not a calibration batch '
                       f'({sorted(runs)}).')
    points, evals, fixed = [], [], []
    for batch, m in sorted(runs.items()):
      step, start = cls._step_and_fixed(m, batch, f'at batch {batch}')
      points.append((batch, step))
      evals.append(m['eval_s'])
      fixed.append(start)
    multi_fixed = None
    if multi is not None:
      multi_fixed = cls._step_and_fixed(multi, reference_batch,
                                        f'of {multi_processes} processes')[1]
    return cls(tuple(points), statistics.median(evals), statistics.median(fixed),
               reference_batch, multi_fixed, multi_processes if multi is not None else 0)

  def fixed_for(self, processes: int) -> float:
    """The start-up of a job of ``processes`` processes."""
    return self.multi_fixed_s if processes > 1 and self.multi_fixed_s is not None else self.fixed_s

  def step_at(self, batch: float) -> float:
    """The step time at ``batch``: linear between the two calibration batches around it. Beyond
    the calibrated range, the end segment's line (a fixed cost per step plus a cost per image),
    or, where that line's fixed cost would be negative, the end's time scaled with the batch;
    one calibration batch scales with the batch."""
    pts = self.points
    if len(pts) == 1:
      return pts[0][1] * batch / pts[0][0]
    i = 1
    while i < len(pts) - 1 and batch > pts[i][0]:
      i += 1
    (b0, t0), (b1, t1) = pts[i - 1], pts[i]
    slope = (t1 - t0) / (b1 - b0)
    if self.in_range(batch) or t0 - b0 * slope >= 0:
      return t0 + (batch - b0) * slope
    end_b, end_t = pts[0] if batch < pts[0][0] else pts[-1]
    return end_t * batch / end_b

  def in_range(self, batch: float) -> bool:
    return self.points[0][0] <= batch <= self.points[-1][0]

  @property
  def images_per_s(self) -> float:
    """At the reference batch: the baselines' rate."""
    return self.reference_batch / dict(self.points)[self.reference_batch]


def step_times(cal: Calibration, workload: pm.Workload, links: pm.Interconnect,
               layout: Layout) -> Dict[str, float]:
  """Predicted seconds per step of ``layout``: the performance model, and the two baselines.

  The model's device is the calibrated one-device curve at the batch its compute pool runs
  (every device and process of this host shares its cores: the pool runs the global batch), plus
  the collectives over this machine's fitted links."""
  pool_batch = layout.batch
  device = pm.Device(name='this machine (calibrated)', step_time_s=cal.step_at(pool_batch),
                     measured_batch=pool_batch)
  # Simulated devices and processes on one host share its cores: one compute pool.
  cluster = pm.Cluster(layout.processes, layout.devices, device, links, name='this machine',
                       devices_per_compute_pool=layout.total_devices)
  model = pm.predict(cluster, workload, layout.batch // layout.total_devices, 'sync').step_time
  return {'model': model, 'constant': layout.batch / cal.images_per_s,
          'one_parameter': layout.batch / (cal.images_per_s * layout.total_devices)}


def loop_steps(crossing: float, eval_every: int, total: int) -> int:
  """The steps a stop-at-target run trains: to the first evaluation at or after the crossing."""
  return min(total, math.ceil(crossing / eval_every - 1e-9) * eval_every)


def evaluations(steps: int, eval_every: int, total: int) -> int:
  """Evaluations in the first ``steps`` steps (one every ``eval_every``, and one at the end)."""
  return steps // eval_every + (1 if steps == total and total % eval_every else 0)


def predict(layout: Layout, model: planner.StepsModel, cal: Calibration, workload: pm.Workload,
            links: pm.Interconnect, setup) -> Dict:
  """Steps (band), the loop's steps and evaluations, step times and whole-loop seconds."""
  central, low, high = model.steps(layout.batch)
  steps = loop_steps(central, setup.eval_every_steps, setup.total_steps)
  n_evals = evaluations(steps, setup.eval_every_steps, setup.total_steps)
  per_step = step_times(cal, workload, links, layout)
  fixed = cal.fixed_for(layout.processes)
  return {'steps': central, 'steps_band': (low, high), 'loop_steps': steps, 'evals': n_evals,
          'eval_every': setup.eval_every_steps, 'total_steps': setup.total_steps,
          'step_s': per_step,
          'fixed_s': fixed,
          'loop_s': {k: fixed + steps * t + n_evals * cal.eval_s for k, t in per_step.items()}}


def score(predicted: Dict, measured: Dict, cal: Calibration, batch: int) -> Dict:
  """Relative errors (prediction / measurement − 1): whole loop; the time side alone (the
  measured steps and evaluations with each predicted step time); images/s."""
  out = {}
  for kind, t in predicted['step_s'].items():
    time_side = predicted['fixed_s'] + measured['steps'] * t + measured['evals'] * cal.eval_s
    out[kind] = {'loop': predicted['loop_s'][kind] / measured['wall_s'] - 1,
                 'time_side': time_side / measured['wall_s'] - 1,
                 'images_per_s': (batch / t) / measured['images_per_s'] - 1
                 if measured['images_per_s'] else None}
  return out


def aggregate(runs: Sequence[Dict]) -> Dict:
  """One configuration's seeds (`measure` records): the means the predictions are scored against
  (whole loop, with its 95 % Student-t interval when there are several seeds; steps, evaluations,
  crossing, images/s) and the runs themselves."""
  wall = stats.mean_interval([m['wall_s'] for m in runs])
  crossings = [m['crossing'] for m in runs]
  rates = [m['images_per_s'] for m in runs]
  return {'runs': len(runs), 'wall_s': wall['mean'], 'wall_sd': wall['sd'],
          'wall_low': wall['low'], 'wall_high': wall['high'],
          'steps': statistics.mean(m['steps'] for m in runs),
          'evals': statistics.mean(m['evals'] for m in runs),
          'crossing': None if None in crossings else statistics.mean(crossings),
          'stopped_at_target': all(m['stopped_at_target'] for m in runs),
          'images_per_s': None if not all(rates) else statistics.mean(rates),
          'seeds': list(runs)}


def summarise(rows: Sequence[Dict]) -> Dict:
  """Mean |error| per predictor and error kind over the out-of-sample configurations (the
  pilot's, whose steps are in sample, is left out); their measured throughput span; the
  largest relative half-width of a measured whole loop's interval (the noise floor)."""
  rows = [r for r in rows if r['role'] == 'measure']
  kinds = ('model', 'constant', 'one_parameter')
  out = {k: {e: statistics.mean(abs(r['errors'][k][e]) for r in rows
                                if r['errors'][k][e] is not None)
             for e in ('loop', 'time_side', 'images_per_s')} for k in kinds} if rows else {}
  rates = [r['measured']['images_per_s'] for r in rows if r['measured']['images_per_s']]
  out['throughput_span'] = max(rates) / min(rates) if rates else None
  halves = [(r['measured']['wall_high'] - r['measured']['wall_s']) / r['measured']['wall_s']
            for r in rows if r['measured']['wall_high'] is not None]
  out['max_loop_half_width'] = max(halves) if halves else None
  out['configurations'] = len(rows)
  out['worst_loop'] = max((r['errors']['model']['loop'] for r in rows), key=abs) if rows else None
  return out


def _pct(x: Optional[float]) -> str:
  return '—' if x is None else f'{100 * x:+.1f} %'


def _interval(m: Dict) -> str:
  if m['wall_low'] is None:
    return f'{m["wall_s"]:.1f} s (1 run)'
  return f'{m["wall_s"]:.1f} s [{m["wall_low"]:.1f}, {m["wall_high"]:.1f}]'


def write_report(out: str, results: Dict) -> str:
  cal, rows, summary = results['calibration'], results['rows'], results['summary']
  points = ', '.join(f'{b}: {1e3 * t:.1f} ms ({b / t:.0f} images/s)' for b, t in cal['points'])
  kinds = ('model', 'constant', 'one_parameter')
  seeds = max(r['measured']['runs'] for r in rows)
  lines = [
      '# Time to target: predicted vs measured on this machine', '',
      f'Generated by `python experiments/plan_time_validation.py` ({results["command"]}). Target: '
      f'{results["metric"]} >= {results["target"]:g}. Load average before / after: '
      f'{results["load_before"]} / {results["load_after"]} (timings from a loaded machine '
      'mean nothing).'
      + (f' Runs reused from an earlier invocation, timed then (this invocation\'s load '
         f'averages are not theirs): {", ".join(results["reused"])}.'
         if results.get('reused') else ''), '',
      f'Calibration (1 process, 1 device, one run per batch; the step time from each run\'s '
      f'steady rate over its later half): step time at batch {points}; {cal["eval_s"]:.2f} s '
      f'per evaluation and {cal["fixed_s"]:.1f} s start-up (medians over the calibration runs; '
      'the slower first steps are part of the start-up)'
      + (f'; a job of {cal["multi_processes"]} processes: {cal["multi_fixed_s"]:.1f} s start-up '
         '(its own calibration run)' if cal.get('multi_fixed_s') is not None else '')
      + '. The model interpolates the step time between the calibration batches (linear in the '
      f'batch); the baselines take the images/s at batch {cal["reference_batch"]}. Images/s '
      'measured: each run\'s steady rate, as calibrated. Steps model: '
      f'{results["steps_model"]}.', '',
      f'Each configuration ran {seeds} seed(s); "measured" is their mean whole loop with its '
      '95 % Student-t interval, and every error is against that mean.', '',
      '| configuration | batch | steps predicted (90 % band) | crossing measured (mean) | loop '
      'steps pred / meas | images/s model / const / 1-param / measured | whole loop predicted '
      'model / const / 1-param | measured (95 % interval) | error model / const / 1-param |',
      '|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    p, m, e = r['predicted'], r['measured'], r['errors']
    ips = ' / '.join(f'{r["batch"] / p["step_s"][k]:.0f}' for k in kinds)
    loop = ' / '.join(f'{p["loop_s"][k]:.1f} s' for k in kinds)
    err = ' / '.join(_pct(e[k]['loop']) for k in kinds)
    crossing = '—' if m['crossing'] is None else f'{m["crossing"]:.0f}'
    name = r['name'] + (' (steps in sample)' if r['role'] == 'pilot' else '')
    lines.append(f'| {name} | {r["batch"]} | {p["steps"]:.0f} ({p["steps_band"][0]:.0f}–'
                 f'{p["steps_band"][1]:.0f}) | {crossing} | {p["loop_steps"]} / '
                 f'{m["steps"]:.0f} | {ips} / {m["images_per_s"]:.0f} | {loop} | '
                 f'{_interval(m)} | {err} |')
  lines += ['', f'Over the {summary["configurations"]} out-of-sample configurations (the '
            'pilot\'s left out):', '',
            '| mean absolute error | whole loop | time side alone (measured steps) | images/s |',
            '|---|---|---|---|']
  for k, label in (('model', 'performance model'), ('constant', 'constant images/s'),
                   ('one_parameter', 'images/s ∝ devices')):
    s = summary[k]
    lines.append(f'| {label} | {100 * s["loop"]:.1f} % | {100 * s["time_side"]:.1f} % | '
                 f'{100 * s["images_per_s"]:.1f} % |')
  span = summary['throughput_span']
  floor = summary.get('max_loop_half_width')
  within = all(abs(r['errors']['model']['loop']) <= 0.2 for r in rows if r['role'] == 'measure')
  half = summary['model']['images_per_s'] <= summary['constant']['images_per_s'] / 2
  lines += ['', f'Measured throughput span: {span:.2f}x ('
            + ('at least' if span >= 4 else '**below**') + ' the 4x the comparison needs).'
            + ('' if floor is None else f' Noise floor: the widest measured interval is '
               f'±{100 * floor:.1f} % of its mean.'),
            f'Targets: every out-of-sample whole-loop error <= 20 %: '
            f'{"met" if within else "not met"} (worst {_pct(summary["worst_loop"])}); the '
            f'model\'s mean |error| (images/s) at most half the constant baseline\'s: '
            f'{"met" if half else "not met"}'
            + ('' if span >= 4 else ' (and the span is too narrow for this comparison to '
               'mean much)') + '.',
            '', 'The pilot\'s own configuration is listed with its steps in sample (predicted '
            'exactly by construction); its time is predicted from the calibration like the '
            'others. What the model leaves out shows in the errors: how much of the host\'s cores '
            'simulated devices and processes use (the model puts every device of the host on one '
            'shared pool, calibrated with one device), the input pipeline, and a start-up that '
            'varies from run to run.']
  text = '\n'.join(lines) + '\n'
  with open(os.path.join(out, 'report.md'), 'w') as f:
    f.write(text)
  return text


def _load() -> str:
  try:
    return ', '.join(f'{x:.2f}' for x in os.getloadavg())
  except OSError:
    return 'unknown'


def _same_config(workdir: str, config) -> List[str]:
  """The fields in which a finished run's recorded config differs from ``config``."""
  with open(os.path.join(workdir, 'config.json')) as f:
    recorded = json.load(f)
  wanted = json.loads(config.to_json_best_effort())
  return sorted(k for k in set(recorded) | set(wanted) if recorded.get(k) != wanted.get(k))


def run_validation(config_file: str, overrides: Dict[str, object], out: str, *, metric: str,
                   target: float, batches: Sequence[int], pilot_batch: int, pilot_devices: int,
                   calibration_batches: Sequence[int], calibration_steps: int,
                   links_path: str, timeout_s: float, seeds: int = 3,
                   startup_processes: int = 2, dry_run: bool = False,
                   log=print) -> Optional[Dict]:
  """Everything above: ``config_file`` with ``overrides`` (its ``--config.x`` values) is every
  run's base. Returns the results (None for a dry run, which only prints the runs and a bound on
  their cost)."""
  from anp_jax import setup as run_setup  # The trainer's own sizes (imports JAX, not the data).
  base = cli.load_config_file(config_file)
  base.update_from_flattened_dict(dict(overrides))
  train_size = planner.pilot_train_size(None, base, [])
  if train_size is None:
    raise ValueError('The config\'s training split size is not known without reading the data '
                     '(dataset "anp"): use the generated dataset for this validation.')
  plan = layouts(batches, pilot_batch, pilot_devices, calibration_batches, seeds,
                 startup_processes)
  runs = {}
  for l in plan:
    config = run_config(base, l, metric, target, calibration_steps)
    fields = config_overrides(base, config)
    sizes = run_setup.resolve_setup(config, train_size, train_size, devices=l.total_devices,
                                    local_devices=l.devices, process_count=l.processes)
    runs[l] = (fields, config, sizes)
  bound = sum(sizes.total_steps * l.batch for l, (_, _, sizes) in runs.items())
  log(f'{len(plan)} runs in {out}/runs: ' + ', '.join(l.name for l in plan))
  log(f'At most {bound:,} training images ({bound / train_size:.0f} epochs of {train_size:,}; '
      'every run to its full budget, while a run stopped at the target trains far fewer), plus '
      'a start-up with compilation (~20 s) per run.')
  if dry_run:
    for l, (fields, _, _) in runs.items():
      log(f'  {l.name}: {l.processes} process(es) x {l.devices} device(s): '
          + ' '.join(trainer_command(config_file, overrides, fields, '<out>/runs/' + l.name)))
    return None
  with open(links_path) as f:
    links = pm.Interconnect(**json.load(f)['cpu']['interconnect'])
  runs_dir = os.path.join(out, 'runs')
  os.makedirs(runs_dir, exist_ok=True)
  load_before = _load()
  measured, reused = {}, []
  for l, (fields, config, _) in runs.items():
    workdir = os.path.join(runs_dir, l.name)
    if os.path.exists(os.path.join(workdir, FINAL)):
      differ = _same_config(workdir, config)
      if differ:
        raise ValueError(f'{workdir} holds a run of another config (fields {differ[:6]}); use '
                         'another --out.')
      log(f'{l.name}: finished before, reused')
      reused.append(l.name)
    elif os.path.exists(workdir):
      raise ValueError(f'{workdir} holds an interrupted run (no {FINAL}): its time would not be '
                       'one run\'s; remove it or use another --out.')
    else:
      log(f'{l.name}: training ...')
      launch(trainer_command(config_file, overrides, fields, workdir), l,
             os.path.join(runs_dir, l.name), timeout_s)
    measured[l] = measure(workdir, metric, target)
  cals = {l.batch: measured[l] for l in plan if l.role == 'calibration' and l.processes == 1}
  multi = [l for l in plan if l.role == 'calibration' and l.processes > 1]
  cal = Calibration.from_runs(cals, reference_batch(sorted(cals), pilot_batch),
                              measured[multi[0]] if multi else None,
                              multi[0].processes if multi else 0)
  pilots = [l for l in plan if l.role == 'pilot']
  pilot_dirs = [os.path.join(runs_dir, l.name) for l in pilots]
  model = planner.load_pilot(pilot_dirs, metric, target)
  workload = planner.workload_for('pilot', train_size, pilot_dirs[0])
  rows, groups = [], {}
  for l in plan:
    if l.role != 'calibration':
      groups.setdefault(l.configuration, []).append(l)
  for name, group in groups.items():
    l = group[0]
    p = predict(l, model, cal, workload, links, runs[l][2])
    m = aggregate([measured[x] for x in group])
    rows.append({'name': name, 'processes': l.processes, 'devices': l.devices,
                 'batch': l.batch, 'role': l.role, 'seeds': [x.seed for x in group],
                 'calibrated_batch': cal.in_range(l.batch), 'predicted': p, 'measured': m,
                 'errors': score(p, m, cal, l.batch)})
  results = {'command': ' '.join(f'--config.{k}={v}' for k, v in overrides.items()) or
                        'the config file unchanged',
             'config_file': config_file, 'metric': metric, 'target': target,
             'calibration': dataclasses.asdict(cal),
             'calibration_runs': {str(b): m for b, m in cals.items()},
             'calibration_multi_run': measured[multi[0]] if multi else None,
             'steps_model': f'S(B) = {model.s_min:.4g} (1 + {model.b_crit:.4g} / B) from '
                            f'{len(pilots)} seed(s) of {pilots[0].configuration} (B_noise '
                            f'{model.b_noise:.4g}, B_crit = {model.b_crit_factor:.4g} x B_noise)',
             'seeds': seeds,
             'links': dataclasses.asdict(links), 'rows': rows, 'summary': summarise(rows),
             'load_before': load_before, 'load_after': _load(), 'reused': reused}
  with open(os.path.join(out, 'results.json'), 'w') as f:
    json.dump(results, f, indent=2)
  log(write_report(out, results))
  return results


def trainer_command(config_file: str, overrides: Dict[str, object], fields: Dict[str, object],
                    workdir: str) -> List[str]:
  """``python -m anp_jax.main`` for one run: the config file, the invocation's overrides, the
  run's fields."""
  return ([sys.executable, '-m', 'anp_jax.main', f'--config={config_file}',
           f'--workdir={workdir}']
          + [f'--config.{k}={v}' for k, v in {**dict(overrides), **fields}.items()])


FLAGS = flags.FLAGS
DEFAULT_CONFIG = os.path.join(ROOT, 'anp_jax', 'configs', 'sweep_cpu.py')
config_flags.DEFINE_config_file('config', DEFAULT_CONFIG, 'The run config (default: the cpu '
                                'sweep preset\'s); override fields with --config.x=y.',
                                lock_config=True)
flags.DEFINE_string('out', None, 'Directory for runs/, report.md and results.json.')
flags.DEFINE_string('metric', planner.inputs.DEFAULT_METRIC, 'The target\'s metric.')
flags.DEFINE_float('target', 0.25, 'The target value (the cpu preset\'s 25 % ANP top-1).')
cli.define_positive_ints('batches', [96, 384], 'The measured batches (each on 1 process x 1 '
                         'and 2 devices and on 2 processes).')
flags.DEFINE_integer('pilot_batch', 128, 'The pilot\'s global batch.')
flags.DEFINE_integer('pilot_devices', 2, 'The pilot\'s devices (the noise scale needs two).')
cli.define_positive_ints('calibration_batches', [32, 128, 512], 'The one-device calibration '
                         'runs\' batches (spanning the measured ones: the step time is '
                         'interpolated between them).')
flags.DEFINE_integer('seeds', 3, 'Seeds of the pilot and of every measured configuration.')
flags.DEFINE_integer('startup_processes', 2, 'Also calibrate the start-up of a job of this many '
                     'single-device processes (at the reference batch; 0: the one-process '
                     'start-up stands for every job).')
flags.DEFINE_integer('calibration_steps', 90, 'The calibration runs\' steps (a multiple of 3: '
                     'three evaluations).')
flags.DEFINE_string('links', LINKS, 'results.json of experiments/perfmodel_validation.py (this '
                    'machine\'s fitted links).')
flags.DEFINE_float('timeout', 3600.0, 'Seconds per run.')
flags.DEFINE_bool('dry_run', False, 'Print the runs and the bound on their cost; train nothing.')
flags.mark_flag_as_required('out')


def main(argv) -> int:
  runtime.configure(tensorflow=False)
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  try:
    run_validation(FLAGS['config'].config_filename, dict(FLAGS['config'].override_values),
                   os.path.expanduser(FLAGS.out), metric=FLAGS.metric, target=FLAGS.target,
                   batches=FLAGS.batches, pilot_batch=FLAGS.pilot_batch,
                   pilot_devices=FLAGS.pilot_devices,
                   calibration_batches=FLAGS.calibration_batches,
                   calibration_steps=FLAGS.calibration_steps, links_path=FLAGS.links,
                   timeout_s=FLAGS.timeout, seeds=FLAGS.seeds,
                   startup_processes=FLAGS.startup_processes, dry_run=FLAGS.dry_run)
  except (ValueError, OSError, RuntimeError) as e:
    print(f'ERROR: {e}', file=sys.stderr)
    return cli.EXIT_USAGE
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser('config', DEFAULT_CONFIG))
