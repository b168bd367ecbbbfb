"""anp_jax/durations.py: durations in epochs or examples converted to optimizer steps (`to_steps`:
rounding, minimum, input checks) and passes over the training split."""

import pytest

from anp_jax import durations


def test_to_steps_rounding_and_input_checks():
  assert durations.to_steps(steps_per_epoch=8000 / 32, epochs=10, rounding='ceil') == 2500
  assert durations.to_steps(steps_per_epoch=8000 / 1024, epochs=10, rounding='ceil') == 79
  assert durations.to_steps(steps_per_epoch=8000 / 1024, epochs=10, rounding='floor') == 78
  assert durations.to_steps(steps_per_epoch=2.5, epochs=1) == 3  # Half up.
  assert durations.to_steps(steps_per_epoch=25, epochs=2.3) == 58  # 57.49999... is 57.5.
  assert durations.to_steps(steps_per_epoch=1.0, examples=100, batch_size=32,
                            rounding='ceil') == 4
  assert durations.to_steps(steps_per_epoch=10, epochs=0.01, minimum=1) == 1
  # Float noise does not add a step: 0.1 * 3 epochs of 10 steps is 3 steps, not 4.
  assert durations.to_steps(steps_per_epoch=10, epochs=0.1 * 3, rounding='ceil') == 3
  with pytest.raises(ValueError, match='exactly one'):
    durations.to_steps(steps_per_epoch=1.0, epochs=1, examples=5, batch_size=1)
  with pytest.raises(ValueError, match='rounding'):
    durations.to_steps(steps_per_epoch=1.0, epochs=1, rounding='up')
  assert durations.passes(25, 24, 256) == pytest.approx(600 / 256)
