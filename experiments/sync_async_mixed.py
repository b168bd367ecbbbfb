#!/usr/bin/env python3
"""Synchronous vs simulated asynchronous vs local SGD: accuracy per epoch and per predicted hour,
each arm at its own best learning rate.

  .venv/bin/python experiments/sync_async_mixed.py --preset cpu --out DIR --stop_at_target
  .venv/bin/python experiments/sync_async_mixed.py --preset cpu --out DIR --dry_run  # + estimate
  .venv/bin/python experiments/sync_async_mixed.py --preset tiny --out /tmp/sam      # ~75 s (CI)
  .venv/bin/python experiments/sync_async_mixed.py --preset cpu --out DIR --epochs 8 \\
      --workers 4,16 --mixed 4 --nodes= --sync_every 1,8 --lr_grid 0.25,0.5,1 \\
      --lr_extensions 1 --target_top1 0.3 --config.base_lr=0.1

The ``cpu`` preset runs in two parts, each a process of its own (its arms need one and four
simulated devices: see the preset); giving any of the parts' flags (``--nodes``, ``--workers``,
``--mixed``, ``--cpu_devices``) runs that one invocation only.

Thin on purpose: the logic is `anp_jax.research.sync_async_mixed` (arms, predicted times, the
summary), a study on the runner of every study (`anp_jax.research.runner`: seeds, the per-arm
learning-rate choice, statistics; docs/experiments.md).

Every run trains with `anp_jax.trainer.train_and_evaluate` in ``DIR/runs/<name>`` on the generated
ANP dataset, with the same model, schedule, number of epochs and examples per update (the global
batch of one step):

* ``sync``: synchronous SGD (``config.method='sync'``).
* ``async-N[-aware]``: simulated asynchronous SGD with the staleness of N workers from the
  event simulation (`anp_jax.research.perfmodel.staleness_sampler`, mean N - 1, step-time CV
  0.1), history ``max_tau = 2N``; ``-aware`` divides each step by max(tau, 1) (Zhang et al. 2016). One step's
  batch plays one worker's mini-batch.
* ``mixed-nNN[-aware]``: the seed paper's mixed-asynchronous SGD on the sync arm's cluster split
  into N workers of ``--sync_devices`` / N devices (synchronous inside a worker, asynchronous
  across workers). Trained as ``async-N`` is (the staleness of N workers, mean N - 1; one step's
  batch plays one worker's synchronous mini-batch); only the predicted cluster differs.
* ``local-nK-hH``: local SGD over K nodes (a (node, device) mesh), parameters and BN statistics
  averaged every H steps (H = 1 is synchronous SGD up to float rounding).

Learning rate per arm: each arm runs at every multiplier of ``--lr_grid`` times the preset's
``base_lr`` and every seed of ``--seeds`` (runs ``<arm>[-lrx<m>][-s<seed>]``; m = 1 and seed 0
unmarked). The rate is chosen on validation: a rate with a diverged (NaN/Inf) seed is reported,
never chosen; among the others, the fewest mean examples to ``--target_top1`` over seeds that all
reached it (interpolated first crossing; same examples per update in every run), else the best
mean final top-1. Arms that miss the target at every rate are listed in the summary. With
``--lr_extensions E`` an arm whose chosen multiplier is the lowest (highest) of its grid runs
again at half (twice) it, at most E times; the summary lists the arms still at the edge. With
several seeds the summary gives means with 95 % intervals (``--ci t`` or ``bootstrap``).

Predicted wall time: each run is mapped to the seed paper's cluster (`perfmodel.minotauro`: K80
devices, 4 per node, FDR InfiniBand) training ResNet-50 on the MUSA2 ANP training split
(307,185 images) with 32 images per device/worker, and `perfmodel.predict` gives its epoch time:
``sync`` on ``--sync_devices`` devices (all-reduce), ``async-N`` on N device workers against one
parameter server (``method='async'``), ``mixed-nNN`` on N nodes of ``--sync_devices`` / N
devices (``method='mixed'``: all-reduce inside a node, one parameter server across nodes),
``local-nK-hH`` on K nodes x 4 devices
(``method='mixed', mixed_mode='local_sgd', local_steps=H``). Accuracy at epoch e is plotted at
e x epoch time. Caveat, stated in the summary too: the accuracy curves come from the small proxy
(same examples per update for every method); the times are the paper-scale predictions. The proxy
measures what staleness and infrequent averaging cost per epoch; the model what they save. The
summary says whether every arm runs on the same number of devices.

Resumable: a run with ``final_metrics.json`` is skipped; an interrupted one continues from its
checkpoints; a run directory trained with other settings is an error. Results:
``DIR/results.json`` (one record per arm at its chosen rate, first seed: settings, eval curve,
final/best top-1, predicted epoch time and cluster, chosen lr, the grid's outcomes under
``lr_grid``, examples to the target, the statistics over seeds under ``statistics``),
``DIR/grid.json`` (every run), ``DIR/points.json`` / ``points.csv`` (statistics per arm over
seeds), ``DIR/accuracy_vs_epochs.png``, ``DIR/accuracy_vs_time.png`` and ``DIR/summary.md``.

Presets are config files, ``anp_jax/configs/sync_async_mixed_<NAME>.py`` (``--preset NAME``;
get_config() the run config, get_sweep() the arms, lr grid and target): ``cpu`` — every arm
mapped to 16 K80s of 32 images (sync, async-16 with and without momentum compensation, mixed
with 4 workers of 4 devices and 8 of 2, local SGD over 4 nodes with H = 1, 4, 16), lr x 0.5, 1,
2 and 3 seeds (72 runs, in two parts that one command runs, see the preset) and up to 4
extensions per arm at the grid's edge; ``tiny`` — the tests' dataset and ResNet-8, sync +
async-4 + local-n2-h2, half an epoch each. ``--config.x=y`` overrides the preset's config (not
the fields the arms set: method, async_sgd, local_sgd, batch_size, seed).
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

from anp_jax import accelerator, runtime
from anp_jax.research import study_cli, sync_async_mixed


def main(argv=None) -> int:
  """Runs the experiment of `argv` (default: the command line); 2 on bad input."""
  argv = sys.argv[1:] if argv is None else argv
  accelerator.check_or_exit(argv=argv)  # GPUs here, but a CPU-only JAX: exit 2 with the fix.
  runtime.configure()  # XLA:CPU flags before JAX starts, TensorFlow off the GPU.
  return sync_async_mixed.main(argv, doc=__doc__)


if __name__ == '__main__':
  study_cli.run_cli(main)
