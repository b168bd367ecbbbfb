"""Report of a batch-size sweep: `python experiments/report.py DIR` writes DIR/report.md + PNGs.

DIR is the ``--out`` directory of `experiments/batch_size_sweep.py` (which also writes the report
at the end). The reading, fits and plots are `anp_jax.research.sweep_report`; exit 2 when DIR
holds no sweep results.
"""

import sys

from absl import app

from anp_jax import cli
from anp_jax.research import sweep_report


def main(argv) -> int:
  if len(argv) != 2:
    raise app.UsageError('Give the --out directory of a batch-size sweep: '
                         'python experiments/report.py DIR', exitcode=2)
  try:
    path = sweep_report.make_report(argv[1])
  except (FileNotFoundError, ValueError) as e:
    print(f'ERROR: {e}', file=sys.stderr)
    return 2
  print(f'Wrote {path}')
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
