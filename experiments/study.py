#!/usr/bin/env python3
"""Any study preset: its runs trained resumably, the learning rate chosen per point, statistics
over seeds, results and a report.

  .venv/bin/python experiments/study.py --preset ghost_bn --out workdirs/ghost_bn
  .venv/bin/python experiments/study.py --preset ghost_bn --out DIR --dry_run  # runs + estimate
  .venv/bin/python experiments/study.py --preset ghost_bn --out DIR --seeds 0,1,2,3 \\
      --lr_grid 0.5,1 --lr_extensions 1 --ci bootstrap --config.num_epochs=8
  .venv/bin/python experiments/study.py --preset ghost_bn:tiny --out /tmp/gbn   # a variant

A preset is one file, ``anp_jax/configs/study_<NAME>.py``: ``get_config()`` the run config every
point starts from (with ``target_metric`` / ``target_value``), ``get_sweep()`` the points
(``(name, {config field: value})`` pairs over any fields), seeds, learning-rate grid and time
estimate. ``--config.x=y`` overrides the preset's config; ``--seeds``, ``--lr_grid`` and
``--lr_extensions`` its axes. Results in DIR: ``results.json`` / ``results.csv`` (a row per run),
``points.json`` / ``points.csv`` (statistics per point over seeds), ``report.md`` (and
``points.png``). Rerun the same command to continue an interrupted study (exit 75 on
preemption); see docs/experiments.md. Thin on purpose: the command line is
`anp_jax.research.study_cli`, the runner `anp_jax.research.runner`.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

from anp_jax import accelerator, runtime
from anp_jax.research import study_cli


def main(argv=None) -> int:
  """Runs the study of `argv` (default: the command line); 2 on bad input."""
  argv = sys.argv[1:] if argv is None else argv
  accelerator.check_or_exit(argv=argv)  # GPUs here, but a CPU-only JAX: exit 2 with the fix.
  runtime.configure()  # XLA:CPU flags before JAX starts, TensorFlow off the GPU.
  return study_cli.main(argv, doc=__doc__)


if __name__ == '__main__':
  study_cli.run_cli(main)
