"""The batch-size sweep's ``tiny`` preset, for tests (about a minute on 2 cores, mostly start-up
and compilation): ResNet-8 width 0.5 at 16 px on 256 generated images (the tests' dataset),
batches 32, 64 (accumulation above 4 per device), one arm, 0.75 epochs.

  .venv/bin/python experiments/batch_size_sweep.py --preset tiny --out /tmp/bs_tiny
"""

from anp_jax.configs import default


def get_config():
  c = default.get_config()
  # The same generated dataset as tests/conftest.py's tiny_config (8 ANPs, 16 px).
  c.synthetic.update(dict(num_adjectives=4, num_nouns=4, num_pairs=8, image_size=16,
                          train_per_class=32, eval_per_class=13, label_noise=0.0, seed=0))
  c.image_size = 16
  c.model.name, c.model.width = 'resnet8', 0.5
  c.base_lr, c.base_batch_size = 0.1, 32
  c.eval_batch_size = 32
  c.bn_mode, c.bn_group_size = 'ghost', 4
  c.warmup_epochs = 0.25
  c.eval_every_epochs = 0.5
  c.progress_bar = False
  c.checkpoint_every_minutes = 0
  c.async_checkpointing = False
  c.num_epochs = 0.75
  return c


def get_sweep():
  return dict(batch_sizes=(32, 64), arms=(('linear', True),), target_top1=0.2,
              max_per_device_batch=4, checkpoint_every_epochs=0.25, cpu_devices=8,
              images_per_s=2000.0, overhead_s=10.0)
