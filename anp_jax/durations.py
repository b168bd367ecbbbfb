"""Durations: epochs and examples → optimizer steps, in one place (like big_vision's utils.steps).

An epoch is ``train_size`` *examples*, whatever the batch size: a run of N epochs takes
``ceil(N * train_size / batch_size)`` steps and sees ``N * train_size`` examples (plus less than
one global batch), so runs with different batch sizes get the same data budget. The training
stream crosses epoch boundaries instead of dropping each epoch's tail (see
`anp_jax.data.pipeline.train_dataset`), so the steps per epoch, ``train_size / batch_size``, is in
general not an integer.

Every duration the trainer derives from the config (total steps, warmup, step-decay boundaries,
evaluation and checkpoint cadence) goes through `to_steps`; progress is reported back as
`examples_seen` and `passes` (= examples seen / train_size).
"""

import math
from typing import Optional

ROUNDINGS = ('ceil', 'round', 'floor')
_EPS = 1e-9  # 10 * (8000 / 32) must stay 2500 steps, not 2501, whatever the float rounding.


def to_steps(*, steps_per_epoch: float, epochs: Optional[float] = None,
             examples: Optional[float] = None, batch_size: Optional[int] = None,
             rounding: str = 'round', minimum: int = 0) -> int:
  """Steps for a duration given in `epochs` or in `examples` (exactly one of them).

  ``steps_per_epoch`` = train_size / batch_size (a float). `examples` needs `batch_size`.
  `rounding`: ``ceil`` for budgets (never less data than asked), ``round`` for cadences and
  schedule points, ``floor``. The result is at least `minimum`.
  """
  if (epochs is None) == (examples is None):
    raise ValueError('Give a duration in exactly one of epochs or examples.')
  if rounding not in ROUNDINGS:
    raise ValueError(f'rounding={rounding!r}; choose one of {ROUNDINGS}.')
  if examples is not None:
    if not batch_size:
      raise ValueError('A duration in examples needs the batch size.')
    raw = examples / batch_size
  else:
    raw = epochs * steps_per_epoch
  if rounding == 'ceil':
    n = math.ceil(raw - _EPS)
  elif rounding == 'floor':
    n = math.floor(raw + _EPS)
  else:
    # Half up, not Python's half-to-even; _EPS: 2.3 x 25 = 57.49999... means 57.5.
    n = int(math.floor(raw + 0.5 + _EPS))
  return max(int(minimum), int(n))


def examples_seen(step: int, batch_size: int) -> int:
  """Training examples consumed after `step` optimizer steps of global batch `batch_size`."""
  return int(step) * int(batch_size)


def passes(step: int, batch_size: int, train_size: int) -> float:
  """Passes over the training split after `step` steps: examples seen / train_size."""
  return examples_seen(step, batch_size) / train_size
