"""The gradient noise scale B_simple = tr(Σ) / |G|² (McCandlish et al. 2018, App. A).

The critical batch size — beyond which a larger batch buys few fewer steps — is predicted by the
noise scale of the per-example gradients: ``B_simple = tr(Σ) / |G|²``, with ``G`` the true
gradient and ``Σ`` the per-example covariance. Neither is observed directly, but the squared norm
of a mean over ``B`` independent examples has expectation ``|G|² + tr(Σ) / B``. Measuring it at
two batch sizes, ``b_small < b_big``, gives two linear equations and so unbiased estimates of
both terms (`estimate`). Each estimate is very noisy, so the trainer smooths the two terms with
their own exponential moving averages and reports the ratio of the averages, not the average of
the ratios (a ratio of noisy terms is biased and heavy-tailed).

In the trainer ``b_small`` is one device's micro-batch and ``b_big`` the global batch, so the
measurement costs one extra squared norm per device. The compiled train step calls
`update_ema_state` (the one implementation of the arithmetic); every log step records both
bias-corrected averages (`log_fields`: ``train/noise_scale_g2`` = |G|², ``train/noise_scale_trace``
= tr(Σ)) and their ratio. Whoever summarises a run (the sweep, `anp_jax.research.planner`) takes the ratio of
the two terms' means over a window of log steps (`window_b_simple`, `b_simple_windows`), not a
statistic of the per-step ratios, which would be biased and would have to drop the steps where
the |G|² average is not positive.

The estimate needs each device's gradient to be the gradient of ``b_small`` examples alone. With
``bn_mode='global'`` on more than one device it is not: the normalisation statistics are
all-reduced, so a device's gradient also depends on the other devices' examples. The trainer
then skips the measurement (`unmeasurable_reason`) and says so.

These functions are plain arithmetic, so they accept Python floats, numpy arrays and traced JAX
values alike, and can be used outside the trainer (e.g. on gradients saved from another run).
"""

import dataclasses
import numbers
from typing import Dict, List, Optional, Tuple

# Keys of the trainer's ``TrainState.noise_ema``.
EMA_KEYS = ('g2', 'trace', 'weight')


def _check_sizes(b_small, b_big):
  """Catch the degenerate sizes early, wherever both are concrete numbers.

  The trainer passes static Python ints, but sizes read from numpy arrays are numpy scalars
  (np.int64 is no int, np.float32 no float): `numbers.Real` covers both, so they are checked
  too. Traced JAX values (sizes under jit) are not numbers.Real and have no value to check.
  """
  if isinstance(b_small, numbers.Real) and isinstance(b_big, numbers.Real):
    if b_small <= 0 or b_big <= b_small:
      raise ValueError(f'The noise-scale estimator needs 0 < b_small < b_big, got b_small='
                       f'{b_small}, b_big={b_big}: with one device and no gradient accumulation '
                       'both batches are the same and B_simple cannot be measured.')


def estimate(g_small_sq, g_big_sq, b_small, b_big) -> Tuple:
  """Unbiased (|G|², tr(Σ)) from squared gradient norms at two batch sizes.

  Args:
    g_small_sq: |G_small|², the squared norm of a mean gradient over ``b_small`` examples (in the
      trainer: averaged over the disjoint small batches that make up the big one).
    g_big_sq: |G_big|², the squared norm of the mean gradient over ``b_big`` examples.
    b_small, b_big: the two batch sizes, ``0 < b_small < b_big``.

  Returns:
    ``(g2, trace)`` with ``g2 = (b_big |G_big|² − b_small |G_small|²) / (b_big − b_small)`` and
    ``trace = (|G_small|² − |G_big|²) / (1/b_small − 1/b_big)``. Either may be negative for one
    draw; only averages over many steps are meaningful.
  """
  _check_sizes(b_small, b_big)
  g2 = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
  trace = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
  return g2, trace


def b_simple(g_small_sq, g_big_sq, b_small, b_big):
  """B_simple = tr(Σ) / |G|² from one pair of measurements (or from already averaged ones).

  Pass means of ``g_small_sq`` and ``g_big_sq`` over many steps: the estimator is linear in
  them, so their means give unbiased terms, whose ratio is the consistent estimate.
  """
  g2, trace = estimate(g_small_sq, g_big_sq, b_small, b_big)
  return trace / g2


def init_ema_state(zero=0.0) -> Dict:
  """The empty EMA state, as in the trainer's ``TrainState.noise_ema``."""
  return {k: zero for k in EMA_KEYS}


def update_ema_state(ema: Dict, g_small_sq, g_big_sq, b_small, b_big, decay: float) -> Dict:
  """One EMA step of both terms (called inside the trainer's compiled step; usable anywhere).

  ``weight`` accumulates the EMA of the constant 1, so that ``g2 / weight`` and
  ``trace / weight`` are the bias-corrected averages; their ratio does not need it.
  """
  g2, trace = estimate(g_small_sq, g_big_sq, b_small, b_big)
  return {'g2': decay * ema['g2'] + (1 - decay) * g2,
          'trace': decay * ema['trace'] + (1 - decay) * trace,
          'weight': decay * ema['weight'] + (1 - decay)}


def b_simple_from_state(ema: Dict):
  """The logged ``train/noise_scale_b_simple``: ratio of the smoothed terms (None before any)."""
  if float(ema['weight']) <= 0 or float(ema['g2']) <= 0:
    return None
  return float(ema['trace']) / float(ema['g2'])


# Names of the logged fields (in ``metrics.jsonl`` with the ``train/`` prefix).
G2_FIELD = 'train/noise_scale_g2'
TRACE_FIELD = 'train/noise_scale_trace'
B_SIMPLE_FIELD = 'train/noise_scale_b_simple'


def log_fields(ema: Dict) -> Dict[str, float]:
  """What the trainer logs from its EMA state: both bias-corrected terms, and their ratio.

  Both terms are logged at every log step, whatever their sign, so that a window mean of each
  is unbiased; the ratio is added only while the |G|² average is positive (a convenience for
  reading a log, not for summarising it). Empty before the first measurement.
  """
  weight = float(ema['weight'])
  if weight <= 0:
    return {}
  out = {G2_FIELD: float(ema['g2']) / weight, TRACE_FIELD: float(ema['trace']) / weight}
  ratio = b_simple_from_state(ema)
  if ratio is not None:
    out[B_SIMPLE_FIELD] = ratio
  return out


def unmeasurable_reason(bn_mode: str, num_devices: int) -> str:
  """Why B_simple cannot be measured in this set-up ('' if it can).

  Under global BatchNorm over several devices a device's gradient mixes in the other devices'
  examples through the all-reduced statistics, so |G_small|² is not the squared norm of a
  ``b_small``-example gradient and the estimator's premise fails. (One device, or 'per_device' /
  'ghost' BN: each micro-batch's gradient depends on its own examples only.)
  """
  if bn_mode == 'global' and num_devices > 1:
    return ("bn_mode='global' normalises over all devices' examples, so a device's gradient is "
            'not a gradient of its own micro-batch and the two-batch estimator does not apply; '
            "use bn_mode='ghost' or 'per_device' to measure it")
  return ''


def _noise_records(records, start_step: float, end_step: float):
  return [r for r in records
          if G2_FIELD in r and TRACE_FIELD in r and start_step < r['step'] <= end_step]


def window_b_simple(records, start_step: float = -float('inf'),
                    end_step: float = float('inf')) -> Optional[float]:
  """B_simple over the log records with ``start_step < step <= end_step``: mean tr(Σ) / mean |G|².

  ``records`` are ``metrics.jsonl`` lines (dicts with ``step``). None if the window has no
  noise-scale record or the mean |G|² is not positive (no measurable signal in that window).
  """
  window = _noise_records(records, start_step, end_step)
  if not window:
    return None
  g2 = sum(r[G2_FIELD] for r in window) / len(window)
  trace = sum(r[TRACE_FIELD] for r in window) / len(window)
  return trace / g2 if g2 > 0 else None


def b_simple_windows(records, num_windows: int, start_step: float = -float('inf'),
                     end_step: float = float('inf')) -> List[Optional[float]]:
  """`window_b_simple` of ``num_windows`` consecutive, equally populated sub-windows.

  Their spread is the uncertainty of B_simple that `anp_jax.research.planner` carries into its predictions
  (consecutive windows of EMAs are correlated, so the spread is a lower bound on the error of
  the whole window's estimate, but an honest one of how much it drifts during training).
  """
  if num_windows < 1:
    raise ValueError(f'num_windows must be >= 1, got {num_windows}.')
  window = _noise_records(records, start_step, end_step)
  if len(window) < num_windows:
    return []
  edges = [round(i * len(window) / num_windows) for i in range(num_windows + 1)]
  return [window_b_simple(window[a:b]) for a, b in zip(edges, edges[1:])]


@dataclasses.dataclass
class EMA:
  """A bias-corrected exponential moving average of a scalar.

  ``value`` is what has been seen so far, weighted ``(1 − decay) decay^k`` for the k-th most
  recent update and renormalised by the total weight, so the first update returns the value
  itself rather than ``(1 − decay)`` times it (Adam's bias correction).
  """
  decay: float = 0.95
  total: float = 0.0
  weight: float = 0.0

  def __post_init__(self):
    if not 0.0 <= self.decay < 1.0:
      raise ValueError(f'EMA decay must be in [0, 1), got {self.decay}.')

  def update(self, x) -> float:
    self.total = self.decay * self.total + (1 - self.decay) * float(x)
    self.weight = self.decay * self.weight + (1 - self.decay)
    return self.value

  @property
  def value(self) -> float:
    if self.weight == 0:
      raise ValueError('EMA.value before the first update.')
    return self.total / self.weight


class NoiseScaleTracker:
  """Running B_simple from a stream of (|G_small|², |G_big|²) pairs, as the trainer logs it."""

  def __init__(self, b_small: int, b_big: int, decay: float = 0.95):
    _check_sizes(b_small, b_big)
    self.b_small, self.b_big = b_small, b_big
    self.g2, self.trace = EMA(decay), EMA(decay)

  def update(self, g_small_sq, g_big_sq):
    """Adds one step's measurement; returns the current B_simple (None while |G|² ≤ 0)."""
    g2, trace = estimate(float(g_small_sq), float(g_big_sq), self.b_small, self.b_big)
    self.g2.update(g2)
    self.trace.update(trace)
    return self.b_simple

  @property
  def b_simple(self):
    return self.trace.value / self.g2.value if self.g2.value > 0 else None
