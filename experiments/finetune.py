"""Pre-train a small ResNet on one generated ANP task, fine-tune it on another vs from scratch.

  python experiments/finetune.py --out experiments/results/finetune_cpu --workdir /tmp/ft  # CPU
  python experiments/finetune.py --preset tiny --out /tmp/ft                        # seconds

The logic (configs, the three runs, steps-to-target, the report) is `anp_jax.transfer`; see its
docstring. Writes OUT/curves.png, OUT/summary.md and OUT/results.json; training runs and the
generated datasets go to WORKDIR/runs and WORKDIR/tfds (--workdir, default OUT; --data_dir).
"""

import shlex
import sys
import time

from absl import app, flags

from anp_jax import cli, runtime, transfer

FLAGS = flags.FLAGS
flags.DEFINE_string('out', None, 'Directory for curves.png, summary.md and results.json.',
                    required=True)
flags.DEFINE_enum('preset', 'cpu', sorted(transfer.PRESETS), 'Model, data and budget preset.')
flags.DEFINE_string('workdir', None, 'Training runs and data (default: --out).')
flags.DEFINE_string('data_dir', None, 'Where the generated datasets go (default: WORKDIR/tfds).')
flags.DEFINE_string('freeze', '', 'config.freeze of the fine-tuning run.')
flags.DEFINE_float('backbone_lr_multiplier', 1.0, 'config.backbone_lr_multiplier of the '
                   'fine-tuning run.')


def main(argv):
  runtime.configure()  # XLA:CPU flags before JAX starts, TensorFlow off the GPU.
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  t = time.time()
  summary = transfer.run(FLAGS.workdir or FLAGS.out, FLAGS.preset, FLAGS.data_dir, FLAGS.freeze,
                         FLAGS.backbone_lr_multiplier)
  # The three runs' training time (each from its final_metrics.json: a rerun that only
  # re-evaluates finished runs reports what they took, not its own seconds).
  summary['wall_s'] = sum(r['wall_s'] for r in summary['runs'].values())
  summary['invocation_wall_s'] = time.time() - t
  command = 'python experiments/finetune.py ' + ' '.join(shlex.quote(a) for a in sys.argv[1:])
  command += f'   # {summary["wall_s"] / 60:.1f} min of training'
  for path in transfer.write_report(summary, FLAGS.out, command):
    print('wrote', path)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
