#!/usr/bin/env python3
"""Report of a study directory: `.venv/bin/python experiments/report.py DIR` writes DIR/report.md
and figures.

DIR is the ``--out`` directory of a study, which also wrote its report at the end; rerun this to
regenerate it (e.g. after a new ``--target_top1``'s results). A batch-size sweep
(`experiments/batch_size_sweep.py`; also a directory without ``experiment.json``) gets
`anp_jax.research.sweep_report`'s report (fits, Goyal and Shallue figures); a study preset's
directory (`experiments/study.py`) `anp_jax.research.study_report`'s; a sync/async/mixed
directory its ``summary.md`` again (`sync_async_mixed.rewrite_summary`, as its last invocation
resolved it). After a fresh-seed confirmation (``--confirm_seeds``, into DIR/confirmation) this
puts its figures beside the selection's. Exit 2 when DIR holds no results of any.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

from absl import app

from anp_jax import cli
from anp_jax.research import study_report, study_results, sweep_report


def main(argv) -> int:
  if len(argv) != 2:
    raise app.UsageError('Give the --out directory of a study: '
                         '.venv/bin/python experiments/report.py DIR',
                         exitcode=2)
  kind = study_results.out_dir_kind(argv[1])
  try:
    if kind == 'sync_async_mixed':
      from anp_jax.research import sync_async_mixed
      path = sync_async_mixed.rewrite_summary(argv[1])
    else:
      make = sweep_report if kind in (None, 'batch_size_sweep') else study_report
      path = make.make_report(argv[1])
  except (FileNotFoundError, ValueError) as e:
    print(f'ERROR: {e}', file=sys.stderr)
    return 2
  print(f'Wrote {path}')
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
