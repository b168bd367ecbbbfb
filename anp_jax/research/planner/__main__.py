"""Time-to-accuracy planner: which batch size, sync or async, how many nodes.

  .venv/bin/python -m anp_jax.research.planner --pilot=workdirs/pilot --target=0.25 \
      --cluster=minotauro --out=plan/
  .venv/bin/python -m anp_jax.research.planner --pilot=runs/b128-s0,runs/b128-s1,runs/b128-s2 \
      --out=plan/
  .venv/bin/python -m anp_jax.research.planner --sweep=workdirs/bs_sweep \
      --cluster=my_cluster.yaml --out=plan/

The command line only: the planner is this package (`build_plan`, `write_plan`). Prints the plan;
``--out`` also writes plan.md, plan.json and the PNGs. Bad input exits 2. Reference page:
docs/planner.md.
"""

import os
import sys

from absl import app, flags

from anp_jax import cli, runtime
from anp_jax.research import perfmodel as pm
from anp_jax.research import planner

# The repository root (this file is anp_jax/research/planner/__main__.py).
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..', '..'))

FLAGS = flags.FLAGS
flags.DEFINE_string('pilot', None, "A pilot run's workdir (metrics.jsonl with noise-scale logs), "
                    'or several seeds of one configuration, comma-separated (their spread is '
                    "the band's run-to-run part), at one batch size or at several (S_min and "
                    'B_crit are then fitted to their mean steps, without --b_crit_factor).')
flags.DEFINE_string('sweep', None, 'A finished batch_size_sweep.py directory (results.json).')
flags.DEFINE_string('metric', None, "The metric whose target is planned for (default: the "
                    "pilot's recorded target metric; with --target: eval/anp_top1). Without "
                    "--target it must be the pilot's recorded target metric.")
flags.DEFINE_float('target', None, "Target value of --metric (default: the pilot's recorded "
                   "target, or the sweep's target).")
flags.DEFINE_enum('predictor', None, planner.predictors.PREDICTORS,
                  'Pilot only: how its steps carry to other batches (default: '
                  f'{planner.predictors.DEFAULT_PREDICTOR}, chosen on pre-registered held-out '
                  'tasks, docs/planner.md; factor: B_crit = k x B_noise; pollux: B_crit = '
                  'B_noise; constant, power_law, perfect: baselines without the noise scale).')
flags.DEFINE_float('b_crit_factor', None, 'Pilot only: the factor predictor with B_crit / '
                   f'B_noise given (calibrated: {planner.B_CRIT_FACTOR:g}, with its uncertainty '
                   'in the band; 1 is B_crit = B_noise); a given value is exact.')
flags.DEFINE_string('rule', None, 'Sweep arm: scaling rule (linear, none, ...).')
flags.DEFINE_string('warmup', None, 'Sweep arm: on or off.')
flags.DEFINE_enum('use', 'fit', ('fit', 'b_simple'), 'Sweep only: the fitted B_crit, or the '
                  'measured B_simple.')
flags.DEFINE_string('cluster', 'minotauro', 'Preset or JSON/YAML cluster file.')
cli.define_positive_ints('nodes', None, 'Node counts (default 1, 2, 4, ... up to the cluster).')
cli.define_positive_ints('batches', None, 'Global batch sizes (default: the pilot batch x 1/4 '
                         "... 8, the validated range, or the batch sizes of the sweep's fit, "
                         'i.e. those where every seed reached the target; a default size that '
                         "splits over none of the node counts' devices is left out, a given one "
                         'is an error; rows beyond the validated range are flagged '
                         'extrapolated).')
flags.DEFINE_string('methods', 'sync,mixed', f'Comma-separated, of {planner.PLAN_METHODS}.')
cli.define_positive_ints('sync_periods', [4], 'H for local_sgd.')
flags.DEFINE_string('penalty_results',
                    os.path.join(ROOT, 'experiments', 'results', 'sync_async_mixed_cpu'),
                    'The mapped sync/async/mixed study directory for the asynchrony and local-SGD '
                    'penalties (examples relative to sync at the same global batch, 3 seeds, '
                    'tuned arms), or an unmapped results.json (the earlier form).')
flags.DEFINE_string('workload', 'resnet50', f'{sorted(pm.WORKLOADS)}, or "pilot" (the pilot '
                    "model's FLOPs from XLA).")
flags.DEFINE_integer('dataset_size', pm.MUSA2_TRAIN_IMAGES, 'Training images (for epoch times; '
                     "default: MUSA2's published training split).")
flags.DEFINE_integer('sprint_batch', None, "SPRINT's target global batch (default: pilot).")
flags.DEFINE_string('out', None, 'Directory for plan.md, plan.json and the PNGs.')

# `build_plan`'s arguments, each the flag of the same name.
_PLAN_FLAGS = ('pilot', 'sweep', 'metric', 'target', 'b_crit_factor', 'predictor', 'rule',
               'warmup', 'use', 'cluster', 'nodes', 'batches', 'methods', 'sync_periods', 'penalty_results',
               'workload', 'dataset_size', 'sprint_batch')


# Path flags, `~` expanded (the shell leaves it alone in ``--flag=~/x``).
_PATH_FLAGS = ('pilot', 'sweep', 'cluster', 'penalty_results')  # --out: `out` below.
# Sweep-only flags: with --pilot they would be ignored without a word.
_SWEEP_ONLY = ('use', 'rule', 'warmup')


def _check_out(out: str) -> None:
  """--out must be (or become) a directory: refused before the plan is computed and printed."""
  parent = cli.nearest_existing(out)
  if parent and not os.path.isdir(parent):
    what = 'is a file' if parent == out else f'is under {parent!r}, a file'
    raise planner.PlanError(f'--out {out!r} {what}; give a directory for plan.md, plan.json and '
                            'the PNGs.')


def main(argv) -> int:
  runtime.configure(tensorflow=False)  # XLA:CPU flags before JAX starts.
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  args = {name: FLAGS[name].value for name in _PLAN_FLAGS}
  for name in _PATH_FLAGS:
    if args[name]:
      args[name] = os.path.expanduser(args[name])
  out = os.path.expanduser(FLAGS.out) if FLAGS.out else FLAGS.out
  try:
    if FLAGS.pilot is not None:
      given = [f'--{name}' for name in _SWEEP_ONLY if FLAGS[name].present]
      if given:
        raise planner.PlanError(f'{", ".join(given)} choose(s) what to read from a --sweep; '
                                'they do not apply to --pilot: drop them.')
    if FLAGS.sweep is not None and FLAGS['b_crit_factor'].present:
      raise planner.PlanError('--b_crit_factor carries a pilot\'s B_noise to B_crit; a --sweep '
                              'fits B_crit itself: drop it.')
    if out:
      _check_out(out)
    plan = planner.build_plan(**args)
    print(planner.format_plan(plan))
    for warning in pm.input_warnings(planner.load_cluster(args['cluster'])[0], [
        (r.label(), r.update_batch / r.step_time / r.devices) for r in plan.rows],
        image_size=plan.workload.image_size if plan.workload else None):
      print(f'WARNING: {warning}', file=sys.stderr)  # Cores per device that cannot feed a step.
    if out:
      planner.write_plan(plan, out)
  except (ValueError, OSError) as e:  # PlanError is a ValueError.
    print(f'ERROR: {e}', file=sys.stderr)
    return cli.EXIT_USAGE
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
