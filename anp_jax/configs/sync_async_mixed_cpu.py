"""The sync/async/mixed experiment's ``cpu`` preset: every arm on a 16-device cluster, each at its
own best learning rate.

  .venv/bin/python experiments/sync_async_mixed.py --preset cpu --out workdirs/sam

The proxy of the batch-size sweep's cpu preset (ResNet-20 width 0.5 at 16 px, 8,000 train / 1,696
eval images, 32 ANPs, nesterov, base lr 0.2 per 256, 1 warmup epoch, cosine) on 4 simulated CPU
devices, batch 128 (ghost BN over 16), 4 epochs, evaluation every half epoch. Arms, all on the
same predicted cluster size (16 K80s): sync (4x4), async N = 16 device workers with and without
staleness-aware lr, the seed paper's mixed-asynchronous method with N = 4 workers of 4 devices and
N = 8 workers of 2 (staleness of N workers: mean 3 and 7), local SGD over 4 nodes x 4 with H = 1,
4, 16. Each arm at base lr x 0.5, 1 and 2 (24 runs); the chosen rate is the fewest examples to
25 % ANP top-1 (else the best final top-1); an arm whose chosen rate is at the edge of its grid
runs again a factor 2 beyond it, at most twice (``lr_extensions``).

Measured (experiments/results/sync_async_mixed_cpu/, 31 runs: 7 extensions): every chosen rate
ended interior; sync 34.2 % final top-1 (x1), local SGD H = 1 / 4 / 16 33.8 / 35.8 / 30.7 %,
mixed N = 4 / 8 19.8 % (x0.5) / 17.1 % (x1), async-16 16.6 % (x0.25), staleness-aware 14.5 %
(x4); no asynchronous arm reached 25 %.

Time: 24 runs x 4 epochs x 8,000 images at ~400 img/s (measured on the 2-core machine, including
evaluation and the async/local-SGD overheads) + evaluations + 20 s set-up per run ≈ 44 min
(`--dry_run` prints it), and ≈ 1.8 min per extension run (7 here: ≈ 57 min in all).
"""

from anp_jax.configs import sweep_cpu


def experiment_config(c, batch_size: int, num_epochs: float, eval_every_epochs: float):
  """A batch-size sweep preset's config turned into this experiment's (every arm sets method)."""
  c.batch_size = batch_size
  c.num_epochs = num_epochs
  c.eval_every_epochs = eval_every_epochs
  c.checkpoint_every_minutes = 0
  c.progress_bar = False
  return c


def get_config():
  return experiment_config(sweep_cpu.get_config(), 128, 4.0, 0.5)


def get_sweep():
  return dict(workers=(16,), nodes=(4,), sync_every=(1, 4, 16), aware=(False, True),
              mixed=(4, 8), mixed_aware=(False,), cpu_devices=4, lr_grid=(0.5, 1.0, 2.0),
              lr_extensions=2, target_top1=0.25, images_per_s=400.0, overhead_s=20.0)
