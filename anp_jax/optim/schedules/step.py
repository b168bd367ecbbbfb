"""Step decay (He et al. 2016; Goyal et al. 2017): ``config.schedule='step'``, the rate times
``config.step_factor`` at each of ``config.step_epochs``.

A boundary at step b multiplies the rate by ``step_factor`` from step b on (two epochs on the
same step multiply). The warmup ramp rises linearly to the rate the step schedule has at its
last step: a boundary strictly inside the warmup (b < warmup) is not dropped but lowers the
ramp's top to ``peak * step_factor^k`` (k such boundaries; the ramp stays monotone); a boundary
at the end of warmup (b = warmup) decays right after the ramp, which reaches the full peak.
"""

from anp_jax.optim.schedules import Decay, ScheduleArgs, register_schedule
from anp_jax.registry import Option


@register_schedule('step', decays=True, options={
    'step_epochs': Option((30, 60, 80), 'each >= 0', 'the epochs of the step decays'),
    'step_factor': Option(0.1, '(0, 1]', 'the decay factor at each of step_epochs')})
def step(args: ScheduleArgs):
  """The peak times `step_factor` at each of `step_epochs` (boundaries in epochs)."""
  import optax  # Here, not at the top: the planner reads `decays` without JAX.
  factor = args.options['step_factor']
  warmup = args.warmup_steps
  at = sorted(args.epochs_to_steps(e) for e in args.options['step_epochs'])
  top = args.peak * factor ** sum(1 for b in at if b < warmup)
  boundaries = {}
  for b in at:
    if b >= warmup:  # Two epochs on the same step multiply.
      boundaries[b - warmup] = boundaries.get(b - warmup, 1.0) * factor
  return Decay(optax.piecewise_constant_schedule(top, boundaries), top)
