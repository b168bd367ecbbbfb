"""The tests' config: trains in seconds on CPU (ResNet-8 at width 0.5, 16 px, 6 steps).

The generated dataset is tiny too: 8 ANPs of 4 adjectives x 4 nouns, 32 training and 13
evaluation images per class (104 evaluation examples: not a multiple of any batch the tests use,
so the padded evaluation is exercised). Checkpoints only when asked, no progress bar.

  .venv/bin/python -m anp_jax.main --config=anp_jax/configs/tiny.py --workdir=/tmp/tiny
"""

import ml_collections

from anp_jax.configs import default

SYNTHETIC = dict(num_adjectives=4, num_nouns=4, num_pairs=8, image_size=16,
                 train_per_class=32, eval_per_class=13, label_noise=0.0, seed=0)


def get_config() -> ml_collections.ConfigDict:
  c = default.get_config()
  c.synthetic.update(SYNTHETIC)
  c.image_size = 16
  c.model.name = 'resnet8'
  c.model.width = 0.5
  c.batch_size = 32
  c.eval_batch_size = 32
  c.bn_mode = 'ghost'
  c.bn_group_size = 4
  c.num_train_steps = 6
  c.log_every_steps = 2
  c.eval_every_epochs = 0
  c.warmup_epochs = 0
  c.progress_bar = False
  c.checkpoint_every_steps = 0
  c.checkpoint_every_minutes = 0
  c.async_checkpointing = False
  return c
