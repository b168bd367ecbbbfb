"""Pre-train a small ResNet on one generated ANP task, fine-tune it on another vs from scratch.

  python experiments/finetune.py --out experiments/results/finetune_cpu --workdir /tmp/ft \
      --seeds 0,1,2                                                           # CPU, ~15 min
  python experiments/finetune.py --preset tiny --out /tmp/ft                # seconds

The runs (configs, the three runs of a seed) are `anp_jax.transfer`, the statistics over seeds
and the report `anp_jax.research.study_finetune`; see their docstrings. Writes OUT/curves.png,
OUT/summary.md and OUT/results.json; training runs and the generated datasets go to
WORKDIR/runs and WORKDIR/tfds (--workdir, default OUT; --data_dir). Rerunning continues: finished
runs are not retrained, an interrupted one resumes.
"""

import os
import shlex
import sys
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


def main(argv):
  runtime.configure()  # XLA:CPU flags before JAX starts, TensorFlow off the GPU.
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
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
