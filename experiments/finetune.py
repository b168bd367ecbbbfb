#!/usr/bin/env python3
"""Pre-train a small ResNet on one generated ANP task, fine-tune it on another vs from scratch.

  .venv/bin/python experiments/finetune.py --out experiments/results/finetune_cpu \
      --workdir /tmp/ft --seeds 0,1,2                   # CPU: 9 runs, ~5 min of training
  .venv/bin/python experiments/finetune.py --preset tiny --out /tmp/ft          # seconds
  .venv/bin/python experiments/finetune.py --out DIR --seeds 0,1,2 --dry_run    # runs + estimate

The runs (configs, the three runs of a seed) are `anp_jax.transfer`, the statistics over seeds
and the report `anp_jax.research.study_finetune`; see their docstrings. Writes OUT/curves.png,
OUT/summary.md and OUT/results.json; training runs and the generated datasets go to
WORKDIR/runs and WORKDIR/tfds (--workdir, default OUT; --data_dir). Rerunning continues: finished
runs are not retrained, an interrupted one resumes.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

import shlex
import time

from absl import app, flags

from anp_jax import accelerator, cli, runtime, transfer

FLAGS = flags.FLAGS
flags.DEFINE_string('out', None, 'Directory for curves.png, summary.md and results.json.',
                    required=True)
flags.DEFINE_enum('preset', 'cpu', sorted(transfer.PRESETS), 'Model, data and budget preset.')
flags.DEFINE_string('workdir', None, 'Training runs and data (default: --out).')
flags.DEFINE_string('data_dir', None, 'Where the generated datasets go (default: WORKDIR/tfds).')
flags.DEFINE_string('freeze', '', 'config.freeze of the fine-tuning run.')
flags.DEFINE_float('backbone_lr_multiplier', 1.0, 'config.backbone_lr_multiplier of the '
                   'fine-tuning run.')
flags.DEFINE_list('seeds', ['0'], 'Seeds (config.seed of the three runs of each): statistics '
                  'over them.')
flags.DEFINE_enum('ci', 't', ['t', 'bootstrap'], 'Intervals over seeds.')
flags.DEFINE_bool('dry_run', False, 'List the runs and the estimated time; train and write '
                  'nothing.')


def print_plan(plan, work_dir: str) -> None:
  """The dry run's lines: the runs, and the estimated time of those not finished."""
  todo = [r for r in plan['runs'] if not r['finished']]
  print(f'finetune --preset {FLAGS.preset}: {len(plan["runs"])} runs ({len(todo)} to train) in '
        f'{os.path.join(work_dir, "runs")}; estimated {plan["seconds"] / 60:.1f} min at '
        f'~{plan["images_per_s"]:.0f} img/s + {plan["overhead_s"]:.0f} s per run.', flush=True)
  for r in plan['runs']:
    start = f', from {r["init_from"]} (heads re-initialised)' if r['init_from'] else ''
    print(f'  {r["name"]}: task {r["task"]} ({r["anps"]} ANPs, {r["train_images"]:,} training '
          f'images), {r["steps"]} steps of {r["batch"]}{start}'
          + (' [finished]' if r['finished'] else ''), flush=True)


def main(argv):
  runtime.configure()  # XLA:CPU flags before JAX starts, TensorFlow off the GPU.
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  if not FLAGS.dry_run:
    accelerator.check_or_exit()  # GPUs here, but a CPU-only JAX: exit 2 with the fix.
  from anp_jax import errors
  expand = lambda path: os.path.expanduser(path) if path else path
  out, data_dir = expand(FLAGS.out), expand(FLAGS.data_dir)
  work_dir = expand(FLAGS.workdir) if FLAGS.workdir is not None else out
  from anp_jax.research import study_finetune
  t = time.time()
  try:
    seeds = [int(s) for s in FLAGS.seeds]
    # `check` first: a bad --freeze / --backbone_lr_multiplier / --seeds, a file as --out, or
    # another variant's runs in the same directory fail before pre-training.
    transfer.check(work_dir, FLAGS.preset, data_dir, FLAGS.freeze,
                   FLAGS.backbone_lr_multiplier, out_dir=out, seeds=seeds)
    if FLAGS.dry_run:
      print_plan(transfer.plan(work_dir, FLAGS.preset, data_dir, seeds), work_dir)
      return 0
    per_seed = [transfer.run(work_dir, FLAGS.preset, data_dir, FLAGS.freeze,
                             FLAGS.backbone_lr_multiplier, out_dir=out, seed=seed)
                for seed in seeds]
  except errors.NonFiniteLossError as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return errors.EXIT_DIVERGED
  except (ValueError, OSError) as e:  # Bad input, unwritable directory, disk full.
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return errors.EXIT_CONFIG
  # The runs' training time (each from its final_metrics.json: a rerun that only re-evaluates
  # finished runs reports what they took, not its own seconds).
  wall = sum(r['wall_s'] for s in per_seed for r in s['runs'].values())
  command = 'python experiments/finetune.py ' + ' '.join(shlex.quote(a) for a in sys.argv[1:])
  command += f'   # {wall / 60:.1f} min of training ({(time.time() - t) / 60:.1f} min this call)'
  for path in study_finetune.write_report(per_seed, out, command, FLAGS.ci):
    print('wrote', path)
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
