"""The noise-scale estimator's input checks (the estimator itself: tests/test_sweep.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from anp_jax import noise_scale


@pytest.mark.parametrize('kind', [int, np.int32, np.int64, float, np.float32, np.float64])
def test_degenerate_batch_sizes_are_refused_whatever_the_number_type(kind):
  """Sizes read from numpy arrays (np.int64, np.float32) are checked like Python numbers.
  (Before: numpy integers skipped the check, so b_small == b_big gave inf / None.)"""
  for small, big in ((8, 8), (16, 8), (0, 8)):
    with pytest.raises(ValueError, match='0 < b_small < b_big'):
      noise_scale.NoiseScaleTracker(kind(small), kind(big))
    with pytest.raises(ValueError, match='0 < b_small < b_big'):
      noise_scale.estimate(2.0, 1.0, kind(small), kind(big))
  sizes = np.array([4, 32])
  tracker = noise_scale.NoiseScaleTracker(sizes[0], sizes[1])
  assert tracker.update(3.0, 1.0) == pytest.approx(
      noise_scale.b_simple(3.0, 1.0, 4, 32))


def test_traced_batch_sizes_are_not_checked():
  """Inside jit the sizes may be tracers: no concrete value to check, so no check (and no error)."""
  g2, trace = jax.jit(noise_scale.estimate)(3.0, 1.0, jnp.int32(4), jnp.int32(32))
  expected = noise_scale.estimate(3.0, 1.0, 4, 32)
  assert (float(g2), float(trace)) == pytest.approx(expected, rel=1e-6)
