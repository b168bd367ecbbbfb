"""Time to target, predicted and measured on this machine: the planner's time side.

  python experiments/plan_time_validation.py --out workdirs/plan_time      # quiet machine, ~1 h
  python experiments/plan_time_validation.py --out workdirs/plan_time --dry_run   # runs, bound

The planner's time to target is steps to target (statistics) x time per step (hardware). This
script checks the product end to end, on configurations that differ in processes, devices and
batch size, with the real trainer (``python -m anp_jax.main``, stopping at the target):

1. **Calibration**: one process, one device, ``--calibration_batch``, ``--calibration_steps``
   steps with every step logged and a few evaluations. As docs/performance-model.md calibrates
   a device: the step time is the batch over the run's ``train/images_per_s`` (its median;
   compilation and evaluations are excluded from the rate). The same run gives the two other
   terms of the loop: the time of one evaluation (an evaluation record's time minus that of the
   training record of its step) and the fixed start-up (dataset, initialisation, compilation:
   the run's wall time minus its steps and evaluations).
2. **Pilot**: one process, ``--pilot_devices`` devices (the noise scale needs two), batch
   ``--pilot_batch``, to the target: the planner's steps model (`planner.load_pilot`).
3. **Predictions**, for every measured configuration (processes x devices x batch): steps to
   target from the pilot (with the planner's band); the steps the loop runs (the trainer stops at
   the first evaluation at the target: the crossing rounded up to the evaluation cadence) and
   its evaluations; the step time from the performance model (the calibrated device, the
   links fitted by ``experiments/perfmodel_validation.py`` on this machine, every device and
   process sharing the same cores); whole loop = start-up + steps x step time + evaluations x
   evaluation time. Two baselines take the step time instead from the calibration alone: a
   *constant* images/s (the calibration's), and a *one-parameter* images/s proportional to the
   devices (the calibration's per device).
4. **Measurements**: each configuration trained to the target; its ``final_metrics.json``
   ``wall_time_s`` (the trainer's whole loop: build, compile, steps, evaluations, checkpoints)
   and its median ``train/images_per_s``.

The report (``report.md``, ``results.json``) gives each configuration's errors (whole loop, the
time side alone with the measured steps, and images/s) for the model and both baselines, their
mean |error|, and the measured throughput span. Runs live in ``--out``/runs/; a finished run is
reused (its config must be the one this invocation would run), an interrupted one is refused.
Timing is meaningless on a loaded machine: run it alone.
"""

import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from anp_jax import cli, distributed, runtime, xla_flags
from anp_jax.metrics_io import read_metrics, target_crossing
from anp_jax.research import eval_seam, planner
from anp_jax.research import perfmodel as pm

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# This machine's links: the alpha-beta fits of experiments/perfmodel_validation.py (psum between
# simulated devices, and between processes over 127.0.0.1).
LINKS = os.path.join(HERE, 'results', 'perfmodel_validation', 'results.json')
FINAL = 'final_metrics.json'
@dataclasses.dataclass(frozen=True)
class Layout:
  """One run: ``processes`` x ``devices`` (per process) at global batch ``batch``. ``role``:
  'calibration' (fixed steps), 'pilot' (its steps model; also measured) or 'measure'."""
  processes: int
  devices: int
  batch: int
  role: str = 'measure'

  @property
  def name(self) -> str:
    return f'{self.role}-{self.processes}x{self.devices}-b{self.batch}'

  @property
  def total_devices(self) -> int:
    return self.processes * self.devices


def layouts(batches: Sequence[int], pilot_batch: int, pilot_devices: int,
            calibration_batch: int, calibration_small_batch: int = 0,
            tiny_batch: int = 0) -> List[Layout]:
  """The calibrations, the pilot and the measured configurations: one process with one and two
  devices at the smaller batch, one process with two devices and two processes with one device
  at the larger (the pilot, one process with ``pilot_devices`` at its batch, is measured too).

  ``calibration_small_batch`` > 0 adds a second one-device calibration at that batch, run
  first: two batches give the step's fixed cost beside its cost per image. ``tiny_batch`` > 0
  adds one process with one device at that batch, where the fixed cost dominates: the
  configurations then span a wider range of throughput than devices alone give on one host.
  """
  small, large = min(batches), max(batches)
  plan = [Layout(1, 1, calibration_small_batch, 'calibration')] if calibration_small_batch else []
  plan += [Layout(1, 1, calibration_batch, 'calibration'),
           Layout(1, pilot_devices, pilot_batch, 'pilot')]
  plan += [Layout(1, 1, tiny_batch)] if tiny_batch else []
  return plan + [Layout(1, 1, small), Layout(1, 2, small), Layout(1, 2, large),
                 Layout(2, 1, large)]


def run_config(base, layout: Layout, metric: str, target: float, calibration_steps: int):
  """The config of a layout's run: the base config, its batch, its target (stopping there, but
  for the calibration), and for the calibration a fixed length with three evaluations and a
  training record at each of their steps (logged at the evaluation cadence, so each evaluation
  follows a training record of its own step, whose time is where the evaluation starts; logging
  every step would add a host synchronisation to every step and slow the rate it measures)."""
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


def measure(workdir: str, metric: str, target: float) -> Dict:
  """A finished run's measurements: the whole loop's wall time (``final_metrics.json``), its
  steps and evaluations, the crossing, images/s (its last logged rate: the run's average) and the
  median time of an evaluation (after a training record of its own step)."""
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
          'images_per_s': train[-1]['train/images_per_s'] if train else None,
          'eval_s': statistics.median(eval_s) if eval_s else None}


@dataclasses.dataclass(frozen=True)
class Calibration:
  """What the one-device calibration runs measured (seconds): the step time at ``batch``, the
  time of one evaluation and the fixed start-up (from the run at ``batch``), and the step's fixed
  cost ``overhead_s`` (0 without a second run; with one at ``small_batch`` taking
  ``small_step_s``, the intercept of the line through both: step = overhead + batch x cost per
  image)."""
  batch: int
  step_s: float
  eval_s: float
  fixed_s: float
  overhead_s: float = 0.0
  small_batch: int = 0
  small_step_s: float = 0.0

  @classmethod
  def from_run(cls, m: Dict, batch: int, small: Optional[Dict] = None,
               small_batch: int = 0) -> 'Calibration':
    for run in (m, small) if small else (m,):
      if not run['images_per_s'] or run['eval_s'] is None:
        raise ValueError('A calibration run logged no training rate or no evaluation after a '
                         'training record of its step: nothing to calibrate on.')
    step_s = batch / m['images_per_s']
    fixed = m['wall_s'] - m['steps'] * step_s - m['evals'] * m['eval_s']
    if not small:
      return cls(batch, step_s, m['eval_s'], max(fixed, 0.0))
    if small_batch >= batch:
      raise ValueError(f'The small calibration batch ({small_batch}) must be below the '
                       f'calibration batch ({batch}).')
    small_step = small_batch / small['images_per_s']
    per_image = (step_s - small_step) / (batch - small_batch)
    # A line through two noisy points: the fixed cost stays within [0, the small step].
    overhead = min(max(small_step - small_batch * per_image, 0.0), small_step)
    return cls(batch, step_s, m['eval_s'], max(fixed, 0.0), overhead, small_batch, small_step)

  @property
  def images_per_s(self) -> float:
    return self.batch / self.step_s


def step_times(cal: Calibration, workload: pm.Workload, links: pm.Interconnect,
               layout: Layout) -> Dict[str, float]:
  """Predicted seconds per step of ``layout``: the performance model, and the two baselines."""
  device = pm.Device(name='this machine (calibrated)', step_time_s=cal.step_s,
                     measured_batch=cal.batch, step_overhead_s=min(cal.overhead_s,
                                                                   0.999 * cal.step_s))
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
  return {'steps': central, 'steps_band': (low, high), 'loop_steps': steps, 'evals': n_evals,
          'eval_every': setup.eval_every_steps, 'total_steps': setup.total_steps,
          'step_s': per_step,
          'loop_s': {k: cal.fixed_s + steps * t + n_evals * cal.eval_s
                     for k, t in per_step.items()}}


def score(predicted: Dict, measured: Dict, cal: Calibration, batch: int) -> Dict:
  """Relative errors (prediction / measurement − 1): whole loop; the time side alone (the
  measured steps and evaluations with each predicted step time); images/s."""
  out = {}
  for kind, t in predicted['step_s'].items():
    time_side = cal.fixed_s + measured['steps'] * t + measured['evals'] * cal.eval_s
    out[kind] = {'loop': predicted['loop_s'][kind] / measured['wall_s'] - 1,
                 'time_side': time_side / measured['wall_s'] - 1,
                 'images_per_s': (batch / t) / measured['images_per_s'] - 1
                 if measured['images_per_s'] else None}
  return out


def summarise(rows: Sequence[Dict]) -> Dict:
  """Mean |error| per predictor and error kind, over the out-of-calibration configurations; the
  measured throughput span."""
  kinds = ('model', 'constant', 'one_parameter')
  out = {k: {e: statistics.mean(abs(r['errors'][k][e]) for r in rows
                                if r['errors'][k][e] is not None)
             for e in ('loop', 'time_side', 'images_per_s')} for k in kinds} if rows else {}
  rates = [r['measured']['images_per_s'] for r in rows if r['measured']['images_per_s']]
  out['throughput_span'] = max(rates) / min(rates) if rates else None
  return out


def _pct(x: Optional[float]) -> str:
  return '—' if x is None else f'{100 * x:+.1f} %'


def write_report(out: str, results: Dict) -> str:
  cal, rows, summary = results['calibration'], results['rows'], results['summary']
  lines = [
      '# Time to target: predicted vs measured on this machine', '',
      f'Generated by `python experiments/plan_time_validation.py` ({results["command"]}). Target: '
      f'{results["metric"]} >= {results["target"]:g}. Load average before / after: '
      f'{results["load_before"]} / {results["load_after"]} (timings from a loaded machine '
      'mean nothing).'
      + (f' Runs reused from an earlier invocation, timed then (this invocation\'s load '
         f'averages are not theirs): {", ".join(results["reused"])}.'
         if results.get('reused') else ''), '',
      f'Calibration (1 process, 1 device, batch {cal["batch"]}): {1e3 * cal["step_s"]:.1f} ms per '
      f'step ({cal["batch"] / cal["step_s"]:.0f} images/s), {cal["eval_s"]:.2f} s per '
      f'evaluation, {cal["fixed_s"]:.1f} s start-up'
      + (f'; at batch {cal["small_batch"]} {1e3 * cal["small_step_s"]:.1f} ms per step, so a '
         f'fixed cost of {1e3 * cal["overhead_s"]:.1f} ms per step (the model\'s step '
         'overhead; the baselines ignore it)' if cal.get('small_batch') else
         '; one batch, so no fixed cost per step') +
      f'. Steps model: {results["steps_model"]}.', '',
      '| configuration | batch | steps predicted (90 % band) | crossing measured | loop steps '
      'pred / meas | images/s model / const / 1-param / measured | whole loop predicted model / '
      'const / 1-param | measured | error model / const / 1-param |',
      '|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    p, m, e = r['predicted'], r['measured'], r['errors']
    ips = ' / '.join(f'{r["batch"] / p["step_s"][k]:.0f}' for k in ('model', 'constant',
                                                                     'one_parameter'))
    loop = ' / '.join(f'{p["loop_s"][k]:.0f} s' for k in ('model', 'constant', 'one_parameter'))
    err = ' / '.join(_pct(e[k]['loop']) for k in ('model', 'constant', 'one_parameter'))
    crossing = '—' if m['crossing'] is None else f'{m["crossing"]:.0f}'
    name = r['name'] + (' (steps in sample)' if r['role'] == 'pilot' else '')
    lines.append(f'| {name} | {r["batch"]} | {p["steps"]:.0f} ({p["steps_band"][0]:.0f}–'
                 f'{p["steps_band"][1]:.0f}) | {crossing} | {p["loop_steps"]} / {m["steps"]} | '
                 f'{ips} / {m["images_per_s"]:.0f} | {loop} | {m["wall_s"]:.0f} s | {err} |')
  lines += ['', '| mean absolute error | whole loop | time side alone (measured steps) | images/s |',
            '|---|---|---|---|']
  for k, label in (('model', 'performance model'), ('constant', 'constant images/s'),
                   ('one_parameter', 'images/s ∝ devices')):
    s = summary[k]
    lines.append(f'| {label} | {100 * s["loop"]:.1f} % | {100 * s["time_side"]:.1f} % | '
                 f'{100 * s["images_per_s"]:.1f} % |')
  span = summary['throughput_span']
  lines += ['', f'Measured throughput span: {span:.2f}x ('
            + ('at least' if span >= 4 else '**below**') + ' the 4x the comparison needs).',
            f'Targets: every whole-loop error <= 20 %: '
            f'{"met" if all(abs(r["errors"]["model"]["loop"]) <= 0.2 for r in rows) else "not met"}'
            f'; the model\'s mean |error| (images/s) at most half the constant baseline\'s: '
            f'{"met" if summary["model"]["images_per_s"] <= summary["constant"]["images_per_s"] / 2 else "not met"}.',
            '', 'The pilot\'s own configuration is listed with its steps in sample (predicted '
            'exactly by construction); its time is predicted from the calibration like the '
            'others. What the model leaves out shows in the errors: a start-up that differs with '
            'the processes (the calibration\'s is used for every run), how much of the host\'s '
            'cores one simulated device uses (the model puts every device of the host on one '
            'shared pool, calibrated with one device), and the input pipeline'
            + ('.' if cal.get('small_batch') else '; and a fixed cost per step (one '
               'calibration batch scales the step time linearly in the batch).')]
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
                   calibration_batch: int, calibration_steps: int, links_path: str,
                   timeout_s: float, dry_run: bool = False, log=print,
                   calibration_small_batch: int = 0, tiny_batch: int = 0) -> Optional[Dict]:
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
  plan = layouts(batches, pilot_batch, pilot_devices, calibration_batch,
                 calibration_small_batch, tiny_batch)
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
  cals = [l for l in plan if l.role == 'calibration']
  cal_layout = cals[-1]
  pilot_layout = next(l for l in plan if l.role == 'pilot')
  small_layout = cals[0] if len(cals) > 1 else None
  cal = Calibration.from_run(measured[cal_layout], cal_layout.batch,
                             measured[small_layout] if small_layout else None,
                             small_layout.batch if small_layout else 0)
  pilot_dir = os.path.join(runs_dir, pilot_layout.name)
  model = planner.load_pilot(pilot_dir, metric, target)
  workload = planner.workload_for('pilot', train_size, pilot_dir)
  rows = []
  for l in plan:
    if l.role == 'calibration':
      continue
    p = predict(l, model, cal, workload, links, runs[l][2])
    m = measured[l]
    rows.append({'name': l.name, 'processes': l.processes, 'devices': l.devices,
                 'batch': l.batch, 'role': l.role, 'predicted': p, 'measured': m,
                 'errors': score(p, m, cal, l.batch)})
  results = {'command': ' '.join(f'--config.{k}={v}' for k, v in overrides.items()) or
                        'the config file unchanged',
             'config_file': config_file, 'metric': metric, 'target': target,
             'calibration': dataclasses.asdict(cal), 'calibration_run': measured[cal_layout],
             'calibration_small_run': measured[small_layout] if small_layout else None,
             'steps_model': f'S(B) = {model.s_min:.4g} (1 + {model.b_crit:.4g} / B) from '
                            f'{pilot_layout.name} (B_noise {model.b_noise:.4g}, B_crit = '
                            f'{model.b_crit_factor:.4g} x B_noise)',
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
cli.define_positive_ints('batches', [32, 512], 'The smaller and the larger measured batch.')
flags.DEFINE_integer('pilot_batch', 128, 'The pilot\'s global batch.')
flags.DEFINE_integer('pilot_devices', 2, 'The pilot\'s devices (the noise scale needs two).')
flags.DEFINE_integer('calibration_batch', 128, 'The one-device calibration run\'s batch.')
flags.DEFINE_integer('calibration_steps', 90, 'The calibration runs\' steps (a multiple of 3: '
                     'three evaluations).')
flags.DEFINE_integer('calibration_small_batch', 64, 'A second one-device calibration at this '
                     'batch gives the fixed cost per step (0: none); no measured configuration '
                     'shares a calibration batch.')
flags.DEFINE_integer('tiny_batch', 16, 'Also measure one process, one device at this batch, '
                     'where the fixed cost per step weighs most (0: not; the cpu preset\'s ghost '
                     'BatchNorm groups of 16 need at least 16 per device).')
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
                   pilot_devices=FLAGS.pilot_devices, calibration_batch=FLAGS.calibration_batch,
                   calibration_steps=FLAGS.calibration_steps, links_path=FLAGS.links,
                   timeout_s=FLAGS.timeout, dry_run=FLAGS.dry_run,
                   calibration_small_batch=FLAGS.calibration_small_batch,
                   tiny_batch=FLAGS.tiny_batch)
  except (ValueError, OSError, RuntimeError) as e:
    print(f'ERROR: {e}', file=sys.stderr)
    return cli.EXIT_USAGE
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser('config', DEFAULT_CONFIG))
