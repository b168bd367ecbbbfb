"""Learning-rate scaling rules and schedules.

The global batch size is the knob: ``peak_lr = base_lr * rule(batch_size / base_batch_size)``
with rule ``linear`` (Goyal et al. 2017), ``sqrt`` (Krizhevsky 2014; Hoffer et al. 2017) or
``none``; warmup and decay are given in epochs (of train_size examples, see
`anp_jax.durations`), so a batch-size sweep changes one number.
"""

import math

import optax

from anp_jax import durations

SCALING_RULES = ('linear', 'sqrt', 'none')
SCHEDULES = ('cosine', 'step', 'constant')


def scaled_lr(config) -> float:
  ratio = config.batch_size / config.base_batch_size
  rule = config.lr_scaling
  if rule == 'linear':
    return config.base_lr * ratio
  if rule == 'sqrt':
    return config.base_lr * math.sqrt(ratio)
  if rule == 'none':
    return config.base_lr
  raise ValueError(f'config.lr_scaling={rule!r}; choose one of {SCALING_RULES}.')


def create_lr_schedule(config, steps_per_epoch: float, total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to the scaled peak, then cosine / step / constant decay.

  ``steps_per_epoch`` = train_size / batch_size (need not be an integer); warmup and the
  step-decay boundaries (``config.step_epochs``) are converted to steps by `anp_jax.durations`.
  A boundary at step b multiplies the rate by ``step_factor`` from step b on. The warmup ramp
  (steps 0 .. warmup - 1) rises linearly to the rate the step schedule has at its last step:
  a boundary strictly inside the warmup (b < warmup) is not dropped but lowers the ramp's top
  to ``peak * step_factor^k`` (k such boundaries; the ramp stays monotone); a boundary at the
  end of warmup (b = warmup) decays right after the ramp, which reaches the full peak. A run shorter
  than its warmup (e.g. a ``num_train_steps`` override) ramps to the peak over the whole run
  (warmup = min(warmup, total_steps)), so it is not a prefix of the longer run; neither is any
  run of another length under cosine decay, whose length is the run's.
  """
  peak = scaled_lr(config)
  warmup = durations.to_steps(steps_per_epoch=steps_per_epoch, epochs=config.warmup_epochs)
  warmup = min(warmup, total_steps)
  if config.schedule == 'cosine':
    decay = optax.cosine_decay_schedule(peak, max(1, total_steps - warmup))
  elif config.schedule == 'step':
    at = sorted(durations.to_steps(steps_per_epoch=steps_per_epoch, epochs=e)
                for e in config.step_epochs)
    peak *= config.step_factor ** sum(1 for b in at if b < warmup)
    boundaries = {}
    for b in at:
      if b >= warmup:  # Two epochs on the same step multiply.
        boundaries[b - warmup] = boundaries.get(b - warmup, 1.0) * config.step_factor
    decay = optax.piecewise_constant_schedule(peak, boundaries)
  elif config.schedule == 'constant':
    decay = optax.constant_schedule(peak)
  else:
    raise ValueError(f'config.schedule={config.schedule!r}; choose one of {SCHEDULES}.')
  if warmup == 0:
    return decay
  # The first step already uses a non-zero rate: lr(0) = peak / warmup.
  ramp = optax.linear_schedule(peak / warmup, peak, warmup - 1) if warmup > 1 else (
      optax.constant_schedule(peak))
  return optax.join_schedules([ramp, decay], [warmup])
