"""The training config whose steps the performance-model validation times.

`anp_jax.research.perfvalidation.measurement_config` starts from it and sets what a measurement
varies (model, width, image size, data directory, ghost-BN group): the 'cpu' sweep preset's model
and data, smaller (2 evaluation images per class), trained with Nesterov momentum without
warm-up. Only `Run.train_step` is timed, so nothing else may run or write: no progress bar and
no checkpoints (``experiments/perfmodel_validation.py``).
"""

from anp_jax.configs import default


def get_config():
  c = default.get_config()
  c.synthetic.eval_per_class = 2
  c.bn_mode = 'ghost'
  c.optimizer = 'nesterov'
  c.warmup_epochs = 0.0
  c.num_train_steps = 1000
  c.update(dict(progress_bar=False, checkpoint_every_steps=0, checkpoint_every_minutes=0,
                async_checkpointing=False))
  return c
