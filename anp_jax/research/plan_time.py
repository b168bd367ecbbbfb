"""The planner's time side measured: the computations behind
``experiments/plan_time_validation.py`` (which launches the runs and writes the report).

The layouts it trains (`Layout`, `layouts`), a run's config (`run_config`) and measurements
(`measure`, `steady_rate`), the one-device calibration (`Calibration`), the predicted step times
of the performance model and of two baselines (`step_times`), the predicted whole loop
(`predict`), its errors (`score`) and their summaries over seeds (`aggregate`) and over
configurations (`summarise`). No JAX: reports and tests read these without it.
"""

import dataclasses
import json
import math
import os
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

import ml_collections

from anp_jax.metrics_io import read_metrics, target_crossing
from anp_jax.research import eval_seam, planner, stats
from anp_jax.research import perfmodel as pm

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
