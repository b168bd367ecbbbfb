"""Pre-train a small ResNet on one generated ANP task, fine-tune it on another vs from scratch.

  python experiments/finetune.py --out experiments/results/finetune_cpu --workdir /tmp/ft  # CPU
  python experiments/finetune.py --preset tiny --out /tmp/ft                        # seconds

The logic (configs, the three runs, steps-to-target, the report) is `anp_jax.transfer`; see its
docstring. Writes OUT/curves.png, OUT/summary.md and OUT/results.json; training runs and the
generated datasets go to WORKDIR/runs and WORKDIR/tfds (--workdir, default OUT; --data_dir).
"""

import argparse
import os
import shlex
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from anp_jax import runtime, transfer  # noqa: E402


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', required=True)
  parser.add_argument('--preset', default='cpu', choices=sorted(transfer.PRESETS))
  parser.add_argument('--workdir', default=None, help='training runs and data (default: OUT)')
  parser.add_argument('--data_dir', default=None)
  parser.add_argument('--freeze', default='', help='config.freeze of the fine-tuning run')
  parser.add_argument('--backbone_lr_multiplier', type=float, default=1.0)
  args = parser.parse_args(argv)
  t = time.time()
  summary = transfer.run(args.workdir or args.out, args.preset, args.data_dir, args.freeze,
                         args.backbone_lr_multiplier)
  summary['wall_s'] = time.time() - t
  command = 'python experiments/finetune.py ' + ' '.join(
      shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
  command += f'   # {summary["wall_s"] / 60:.1f} min wall'
  for path in transfer.write_report(summary, args.out, command):
    print('wrote', path)


if __name__ == '__main__':
  runtime.configure()
  main()
