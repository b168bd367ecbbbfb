"""The sync/async/mixed experiment's ``cpu`` preset: every arm on a 16-device cluster, each at its
own best learning rate.

  .venv/bin/python experiments/sync_async_mixed.py --preset cpu --out workdirs/sam

The proxy of the batch-size sweep's cpu preset (ResNet-20 width 0.5 at 16 px, 8,000 train / 1,696
eval images, 32 ANPs, nesterov, base lr 0.2 per 256, 1 warmup epoch, cosine) on 4 simulated CPU
devices, batch 128 (ghost BN over 16), 4 epochs, evaluation every half epoch. Arms: sync, async
N = 16 with and without staleness-aware lr, local SGD over 4 nodes with H = 1, 4, 16 — all on the
same predicted cluster size (16 K80s: sync on 4x4, async-16 16 workers on 4x4, local SGD 4 nodes
x 4), where earlier versions also ran async N = 4 and 8 on smaller clusters. Each arm at base lr x
0.5, 1 and 2 (18 runs); the chosen rate is the fewest examples to 25 % ANP top-1.

Time: the 10-run single-lr version took 18.5 min on the 2-core machine (≈ 400 img/s including
evaluation and the async/local-SGD overheads), so 18 runs x 4 epochs x 8,000 images at 400 img/s
+ evaluations + 20 s set-up per run ≈ 33 min (`--dry_run` prints it).
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
