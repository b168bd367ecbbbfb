"""experiments/plan_time_validation.py with a simulated trainer, for tests/test_planner_time.py.

  python tests/plan_time_simulated.py ARGS   # exactly as experiments/plan_time_validation.py ARGS

The script's own command line and everything it does around the runs (its plan, the launches,
`measure` on each run, the calibration, the pilot's steps model, the predictions, the scores, the
report, a rerun's reuse) are the real ones. Only `launch` is replaced: instead of starting
``python -m anp_jax.main`` it writes the files the trainer writes (config.json, metrics.jsonl,
final_metrics.json, one log per process) in milliseconds, for the run's own config (its batch,
seed, target, stop at the target or not, evaluation and log cadences). The simulated run trains
at a step time that depends on its layout, reaches the target later for a higher seed, stops at
the first evaluation at or past the target when its config says so, and logs the noise scale's
EMAs on more than one device (as the trainer). A real trainer's files are checked by
test_planner_time.py's end-to-end test, which launches it.
"""

import json
import os
import runpy

from absl import app

from anp_jax import cli, noise_scale
from anp_jax import setup as run_setup
from anp_jax.research import eval_seam, planner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The script's module, run as a module of this process (its flags defined, its main not run):
# its functions read `launch` and `run_config` from this namespace.
SCRIPT = runpy.run_path(os.path.join(ROOT, 'experiments', 'plan_time_validation.py'),
                        run_name='plan_time_validation')['main'].__globals__
CONFIGS = {}  # Layout name -> the config run_validation made for it.
_run_config = SCRIPT['run_config']


def _recording_run_config(base, layout, metric, target, calibration_steps):
  config = _run_config(base, layout, metric, target, calibration_steps)
  CONFIGS[layout.name] = config
  return config


def simulated_launch(command, layout, log_path, timeout_s):
  """What the script's `launch` leaves behind for ``layout``'s run, without training: returns its
  simulated wall seconds."""
  del timeout_s
  workdir = next(a.split('=', 1)[1] for a in command if a.startswith('--workdir='))
  config = CONFIGS[layout.name]
  train_size = planner.pilot_train_size(None, config, [])
  sizes = run_setup.resolve_setup(config, train_size, train_size,
                                  devices=layout.total_devices, local_devices=layout.devices,
                                  process_count=layout.processes)
  batch, total, every = int(config.batch_size), sizes.total_steps, sizes.eval_every_steps
  metric, target = config.target_metric, config.target_value
  # Seconds per step: a fixed cost and a cost per image of the pool, plus the collective.
  step_s = 0.002 + 1e-4 * batch + 0.001 * (layout.total_devices - 1) + 0.002 * (
      layout.processes - 1)
  eval_s, fixed_s = 0.3, 4.0 + 3.0 * (layout.processes - 1)
  reach = 256 * (1 + 0.25 * int(config.seed))  # Examples to the target: later for a higher seed.
  top1 = lambda step: 0.01 + (target - 0.01) * step * batch / reach
  os.makedirs(workdir)
  clock, records, stopped, step = 1e9 + fixed_s, [], False, 0
  while step < total and not stopped:
    step += 1
    clock += step_s
    if step % config.log_every_steps == 0 or step == total:
      r = {'step': step, 'time': clock, 'train/loss': 2.0 - step / total,
           'train/images_per_s': batch / step_s}
      if layout.total_devices > 1:  # The trainer's noise-scale EMAs: two batch sizes.
        r.update({noise_scale.G2_FIELD: 1.0, noise_scale.TRACE_FIELD: 100.0 + config.seed})
      records.append(r)
    if step % every == 0 or step == total:
      clock += eval_s
      records.append({'step': step, 'time': clock, metric: top1(step), 'eval/loss': 3.0})
      stopped = eval_seam.stops_at_target(config) and top1(step) >= target
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
  wall = clock - 1e9
  with open(os.path.join(workdir, SCRIPT['FINAL']), 'w') as f:
    json.dump({'step': step, 'wall_time_s': wall, 'stopped_at_target': stopped,
               metric: top1(step)}, f)
  for pid in range(layout.processes):
    with open(f'{log_path}.proc{pid}.log', 'w') as f:
      f.write(f'simulated: {" ".join(command)}\n')
  return wall


if __name__ == '__main__':
  SCRIPT.update(run_config=_recording_run_config, launch=simulated_launch)
  app.run(SCRIPT['main'], flags_parser=cli.absl_flags_parser('config', SCRIPT['DEFAULT_CONFIG']))
