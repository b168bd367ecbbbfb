"""anp_jax/noise_scale.py, the gradient noise scale B_simple (McCandlish et al. 2018): the
estimator against a synthetic gradient distribution whose |G|² and tr(Σ) are known, its EMA (one
implementation for Python floats and traced values), B_simple over windows of logged records,
when it cannot be measured, and the input checks. (The trainer's measurement of it:
tests/test_trainer.py and tests/test_local_sgd.py.)"""

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


def _batch_norms_sq(rng, true_grad, chol, b_small, b_big, draws):
  """|G_small|² (mean over the disjoint small batches of one big batch) and |G_big|², per draw.

  Per-example gradients are g_i = G + L z_i with z_i ~ N(0, I), so Cov(g_i) = L Lᵀ = Σ.
  """
  d = true_grad.shape[0]
  noise = rng.standard_normal((draws, b_big, d)) @ chol.T
  per_example = true_grad + noise
  small = per_example.reshape(draws, b_big // b_small, b_small, d).mean(axis=2)
  small_sq = np.mean(np.sum(small ** 2, axis=-1), axis=1)
  big_sq = np.sum(per_example.mean(axis=1) ** 2, axis=-1)
  return small_sq, big_sq


def test_noise_scale_estimator_recovers_known_gradient_and_trace():
  rng = np.random.default_rng(0)
  d, b_small, b_big, draws = 24, 4, 32, 6000
  true_grad = rng.normal(0, 0.5, d)
  chol = np.tril(rng.normal(0, 0.4, (d, d)))  # A full (correlated) covariance.
  g2_true = float(true_grad @ true_grad)
  trace_true = float(np.sum(chol ** 2))  # tr(L Lᵀ).
  small_sq, big_sq = _batch_norms_sq(rng, true_grad, chol, b_small, b_big, draws)

  g2, trace = noise_scale.estimate(small_sq, big_sq, b_small, b_big)
  assert np.mean(g2) == pytest.approx(g2_true, rel=0.03)
  assert np.mean(trace) == pytest.approx(trace_true, rel=0.03)
  # The estimator is linear, so means of the norms give the same terms; their ratio is B_simple.
  b = noise_scale.b_simple(np.mean(small_sq), np.mean(big_sq), b_small, b_big)
  assert b == pytest.approx(trace_true / g2_true, rel=0.05)
  # Single draws are noisy (why the trainer smooths both terms): far wider than the mean's error.
  assert np.std(g2) > 0.1 * g2_true


def test_noise_scale_ema_is_one_implementation_for_floats_and_traced_values():
  """The trainer's compiled step calls `update_ema_state`; on float32 JAX values it gives the
  numbers of the Python-float tracker, and `log_fields` logs both bias-corrected terms."""
  rng = np.random.default_rng(1)
  b_small, b_big, decay = 4, 32, 0.9
  ours = noise_scale.init_ema_state()
  traced = jax.jit(lambda e, s, b: noise_scale.update_ema_state(e, s, b, b_small, b_big, decay))
  theirs = {k: jnp.zeros((), jnp.float32) for k in noise_scale.EMA_KEYS}
  tracker = noise_scale.NoiseScaleTracker(b_small, b_big, decay)
  for _ in range(6):
    big_sq = float(rng.uniform(1.0, 2.0))
    small_sq = big_sq + float(rng.uniform(0.5, 3.0))  # |G_small|² > |G_big|² on average.
    ours = noise_scale.update_ema_state(ours, small_sq, big_sq, b_small, b_big, decay)
    theirs = traced(theirs, jnp.float32(small_sq), jnp.float32(big_sq))
    tracked = tracker.update(small_sq, big_sq)
    for k in noise_scale.EMA_KEYS:
      np.testing.assert_allclose(float(theirs[k]), ours[k], rtol=1e-5)
    fields = noise_scale.log_fields(theirs)
    assert fields[noise_scale.G2_FIELD] == pytest.approx(tracker.g2.value, rel=1e-5)
    assert fields[noise_scale.TRACE_FIELD] == pytest.approx(tracker.trace.value, rel=1e-5)
    # The ratio of the raw EMAs equals the bias-corrected ratio.
    assert fields[noise_scale.B_SIMPLE_FIELD] == pytest.approx(tracked, rel=1e-5)
  assert noise_scale.b_simple_from_state(noise_scale.init_ema_state()) is None
  assert noise_scale.log_fields(noise_scale.init_ema_state()) == {}
  # A negative |G|² average is still logged (both terms), only the ratio is left out.
  negative = noise_scale.log_fields({'g2': -0.1, 'trace': 2.0, 'weight': 0.5})
  assert negative == {noise_scale.G2_FIELD: pytest.approx(-0.2),
                      noise_scale.TRACE_FIELD: pytest.approx(4.0)}
  ema = noise_scale.EMA(0.9)
  assert ema.update(5.0) == pytest.approx(5.0)  # Bias-corrected from the first update.
  assert ema.update(1.0) == pytest.approx((0.9 * 0.1 * 5 + 0.1 * 1) / (0.1 + 0.09))
  with pytest.raises(ValueError, match='b_small < b_big'):
    noise_scale.estimate(1.0, 1.0, 8, 8)


def _noise_record(step, g2, trace):
  return {'step': step, noise_scale.G2_FIELD: g2, noise_scale.TRACE_FIELD: trace}


def test_window_b_simple_is_the_ratio_of_window_means_including_non_positive_g2():
  # Per-record ratios 10, 10, (g2 <= 0: no ratio), 10 -> median of ratios 10; dropping the
  # g2 <= 0 record biases the estimate, the ratio of means keeps it: 30 / 1.5 = 20.
  records = [_noise_record(1, 1.0, 10.0), _noise_record(2, 2.0, 20.0),
             _noise_record(3, -1.0, 60.0), _noise_record(4, 4.0, 40.0),
             {'step': 4, 'eval/anp_top1': 0.5}]
  assert noise_scale.window_b_simple(records) == pytest.approx(130.0 / 6.0)
  assert noise_scale.window_b_simple(records, start_step=1, end_step=3) == pytest.approx(80.0)
  assert noise_scale.window_b_simple(records, start_step=10) is None
  assert noise_scale.window_b_simple([_noise_record(1, -1.0, 5.0)]) is None
  windows = noise_scale.b_simple_windows(records, 2)
  assert windows == [pytest.approx(10.0), pytest.approx(100.0 / 3.0)]
  assert noise_scale.b_simple_windows(records, 5) == []  # Fewer records than windows.


def test_global_bn_over_devices_makes_b_simple_unmeasurable():
  assert 'global' in noise_scale.unmeasurable_reason('global', 8)
  for bn_mode, devices in (('global', 1), ('ghost', 8), ('per_device', 8)):
    assert noise_scale.unmeasurable_reason(bn_mode, devices) == ''
