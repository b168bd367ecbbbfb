"""anp_jax/setup.py: the run's derived set-up (`resolve_setup`): an epoch is train_size examples
at every batch size, in total steps, steps per epoch, passes and evaluation cadence."""

import pytest

from anp_jax.setup import resolve_setup
from anp_jax.configs import default


@pytest.mark.parametrize('epochs', [1.0, 2.5, 10.0])
def test_equal_epochs_see_the_same_examples_at_every_batch_size(epochs):
  """The cpu sweep preset's split (8,000 images, 2 devices): B=32 ... 1024 all see
  epochs * 8,000 examples, less than one global batch more. (Before: B=1024 saw 8.96 passes
  in a "10 epoch" run, B=32 10.00.)"""
  c = default.get_config()
  c.num_epochs, c.num_train_steps, c.bn_mode, c.eval_every_epochs = epochs, -1, 'global', 0.5
  seen = {}
  for batch in (32, 64, 128, 256, 512, 1024):
    c.batch_size = batch
    setup = resolve_setup(c, 8000, 1696, devices=2, local_devices=2, process_count=1)
    examples = setup.total_steps * batch
    assert 0 <= examples - epochs * 8000 < batch, (batch, examples)
    assert setup.steps_per_epoch * batch == pytest.approx(8000)
    assert setup.progress(setup.total_steps, 'train')['train/passes'] == pytest.approx(
        examples / 8000)
    # Evaluation every half epoch = every 4,000 examples, to the nearest step.
    assert abs(setup.eval_every_steps * batch - 4000) <= batch / 2
    seen[batch] = examples / 8000
  assert max(seen.values()) - min(seen.values()) < 1024 / 8000
