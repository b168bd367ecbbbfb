"""A constant rate after the warmup: ``config.schedule='constant'``."""

from anp_jax.optim.schedules import ScheduleArgs, register_schedule


@register_schedule('constant', decays=False)
def constant(args: ScheduleArgs):
  """The peak, from the end of the warmup to the end of the run."""
  import optax  # Here, not at the top: the planner reads `decays` without JAX.
  return optax.constant_schedule(args.peak)
