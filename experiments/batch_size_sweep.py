#!/usr/bin/env python3
"""Synchronous batch size vs accuracy: a resumable sweep over global batch sizes.

  .venv/bin/python experiments/batch_size_sweep.py --preset cpu --out workdirs/bs_sweep
  .venv/bin/python experiments/batch_size_sweep.py --preset cpu --out DIR \\
      --batch_sizes 64,256,1024 --rules linear,none --warmup on,off --seeds 0,1 --epochs 6 \\
      --target_top1 0.3
  .venv/bin/python experiments/batch_size_sweep.py --preset cpu --out DIR --lr_search 0.5,1,2 \\
      --lr_extensions 2 --seeds 0,1,2                                       # Shallue
  .venv/bin/python experiments/batch_size_sweep.py --preset paper --out /scratch/bs \\
      --config.data_dir=/d/anp
  .venv/bin/python experiments/batch_size_sweep.py --preset cpu --out DIR --dry_run  # + estimate
  .venv/bin/python experiments/report.py DIR                          # (also run at the end)

Thin on purpose: the sweep is `anp_jax.research.sweep`, a study on the runner of every study
(`anp_jax.research.runner`, docs/experiments.md).

The grid is global batch sizes × (scaling rule, warmup) arms × seeds × learning-rate multipliers,
each trained for the same number of epochs with `anp_jax.trainer.train_and_evaluate` in
``DIR/runs/<name>``. Without ``--rules``/``--warmup`` a preset's own arms are used (``paper``:
linear rule + warmup, linear without warmup, no scaling + warmup — Goyal et al.'s comparison;
``cpu``: one arm, the square-root rule with warmup, which only centres the rate grid tuned per
batch size — Shallue et al.'s protocol); with either, the full product of the two lists.
``--lr_search`` multiplies the preset's ``base_lr`` (before the scaling rule); per batch size
the rate is chosen on the
validation split (Shallue et al. 2018: compare batch sizes each at its own best learning rate,
not at one fixed rule): a rate with a diverged seed is never chosen; among the others, the fewest
mean steps to the target over seeds that all reached it, else the best mean final top-1 (its
rows have ``best_lr``). With ``--lr_extensions E`` a choice at the edge of the rates tried runs
again x2 beyond it, at most E times per batch size, until it is interior.

* ``--stop_at_target`` ends each run at its first evaluation reaching ``--target_top1`` (the
  epoch budget becomes a cap): time-to-accuracy without training past the target.
* **Gradient accumulation** is chosen per batch: when the per-device batch exceeds
  ``--max_per_device_batch``, ``config.grad_accum_steps`` is the smallest count of micro-batches
  that fits and keeps every micro-batch a whole number of ghost-BN groups (with ghost BN this is
  exactly one large batch, see tests/test_trainer.py). ``--max_per_device_batch 0`` disables it.
* **Validation before any training**: unknown rules / warmup values, an empty grid, a target
  outside (0, 1], batch sizes that do not split over devices × micro-batches × BN groups (all bad
  ones are listed) or do not fit the dataset, a run directory in DIR trained with other settings,
  and other runs in DIR (other batch sizes, seeds, ...) trained with settings that differ from
  this invocation's outside the swept fields (`runner.check_other_runs`: every run there is
  fitted together, so one DIR holds one sweep; extending it with new batch sizes, seeds, lr
  multipliers or warmup arms under the same settings works).
* **Resumable**: a run with ``final_metrics.json`` is skipped; an interrupted one continues from
  its checkpoints (saved every ``--checkpoint_every_epochs``). A run whose loss becomes NaN/Inf is
  recorded as diverged (its ``final_metrics.json`` says so) and not retried. Preemption (SIGTERM)
  exits with code 75 like the trainer, so a requeued job picks up where it stopped; a signal that
  arrives after a run's last step (its final evaluation, between runs) stops the sweep before the
  next run (`anp_jax.preemption` keeps the flag for the whole process).
* **Results**: ``DIR/results.csv`` and ``DIR/results.json``, one row per run found under
  ``DIR/runs`` (so sweeps split over several jobs into one DIR add up): batch, rule, warmup,
  seed, lr (peak), final / best top-1, top-5, steps / examples / epochs to the target (the
  first crossing, interpolated linearly between the two evaluations around it, see
  `anp_jax.research.sweep.target_crossing`; epochs = examples / train_size; None if never), the
  step of the first evaluation reaching it, wall time (all the run's segments),
  and B_simple (mean logged tr(Σ) over mean logged |G|² in the second half of the steps the run
  trained, see `anp_jax.noise_scale.window_b_simple`), then the runner's columns
  (point, outcome: reached / missed / diverged / unfinished, the test split's figures when the
  runs evaluated one). A diverged run never reached the target. ``DIR/points.json`` /
  ``points.csv``: per batch size and arm, statistics over seeds at its chosen rate (means with
  95 % Student-t intervals, ``--ci bootstrap`` for a percentile bootstrap; steps to the target
  censored when a seed missed or diverged: counted, never dropped). Rows are recomputed from the
  run directories on every invocation, so a new ``--target_top1`` needs no retraining. Then
  ``experiments/report.py`` writes DIR/report.md.

Presets are config files, ``anp_jax/configs/sweep_<NAME>.py`` (``--preset NAME``): get_config()
is the run config every grid point starts from, get_sweep() the grid, budget and time-estimate
throughput. ``tiny`` (the tests' dataset, two runs), ``cpu`` (Shallue et al.'s protocol on a
2-core machine; ``cpu:goyal`` the fixed-budget comparison; its docstring gives the measured
cost) and ``paper`` (ResNet-50 at 224 px with Goyal et al.'s recipe, for a GPU cluster; its
estimate needs the prepared photos; multi-process jobs are set up from SLURM / ANP_* variables,
as in main.py). ``--dry_run`` prints the runs and the estimated time, here for each preset as
it stands (every run training its whole budget, so an upper bound with ``--stop_at_target``):
{dry_run_estimates}

Any ``--config.<field>=<value>`` overrides the preset's config (e.g. ``--config.model.width=1``,
``--config.synthetic.label_noise=0.1``); the swept fields (batch_size, lr_scaling, seed) are set
by the sweep flags instead. ``--epochs E`` is ``--config.num_epochs=E``.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

from anp_jax import accelerator, runtime
from anp_jax.research import study_cli, sweep, sweep_report


def main(argv=None) -> int:
  """Runs the sweep of `argv` (default: the command line); 2 on bad input."""
  argv = sys.argv[1:] if argv is None else argv
  accelerator.check_or_exit(argv=argv)  # GPUs here, but a CPU-only JAX: exit 2 with the fix.
  runtime.configure()  # XLA:CPU flags before JAX starts, TensorFlow off the GPU.
  return sweep.main(argv, make_report=sweep_report.make_report, doc=__doc__)


if __name__ == '__main__':
  study_cli.run_cli(main)
