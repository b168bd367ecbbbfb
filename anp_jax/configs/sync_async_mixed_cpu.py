"""The sync/async/mixed experiment's ``cpu`` preset (10 runs, ~15-20 min on 2 cores).

  .venv/bin/python experiments/sync_async_mixed.py --preset cpu --out workdirs/sam

The proxy of the batch-size sweep's cpu preset (ResNet-20 width 0.5 at 16 px, 8,000 train / 1,696
eval images, 32 ANPs, nesterov, base lr 0.2 per 256, 1 warmup epoch, cosine) on 4 simulated CPU
devices, batch 128 (ghost BN over 16), 4 epochs, evaluation every half epoch; runs: sync, async
N = 4, 8, 16 with and without staleness-aware lr, local SGD over 4 nodes with H = 1, 4, 16 (10
runs), one learning rate. The 10 runs took 18.5 min on the 2-core machine (≈ 400 img/s with
evaluation and the async/local-SGD overheads: the `--dry_run` estimate's throughput).
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
  return dict(workers=(4, 8, 16), nodes=(4,), sync_every=(1, 4, 16), aware=(False, True),
              cpu_devices=4, lr_grid=(1.0,), target_top1=0.25, images_per_s=400.0,
              overhead_s=20.0)
