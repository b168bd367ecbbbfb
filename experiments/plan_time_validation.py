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
import subprocess
import time
from typing import Dict, List, Optional, Sequence

from absl import app, flags
from ml_collections import config_flags

from anp_jax import cli, distributed, runtime, xla_flags
from anp_jax.research import planner
from anp_jax.research import perfmodel as pm
from anp_jax.research.plan_time import (FINAL, Calibration, Layout, aggregate, config_overrides,
                                       layouts, measure, predict, reference_batch, run_config,
                                       score, summarise)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# This machine's links: the alpha-beta fits of experiments/perfmodel_validation.py (psum between
# simulated devices, and between processes over 127.0.0.1).
LINKS = os.path.join(HERE, 'results', 'perfmodel_validation', 'results.json')


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
  # The factor predictor, as the committed time validation was run (before issue 46's registered
  # rule made the constant B_crit the planner's default): its report reads B_noise and k.
  model = planner.load_pilot(pilot_dirs, metric, target, predictor='factor')
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
