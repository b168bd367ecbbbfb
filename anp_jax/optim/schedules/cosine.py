"""Cosine decay (Loshchilov and Hutter 2017, without restarts): ``config.schedule='cosine'``."""

from anp_jax.optim.schedules import ScheduleArgs, register_schedule


@register_schedule('cosine', decays=True)
def cosine(args: ScheduleArgs):
  """Half a cosine from the peak to 0 over the steps after the warmup."""
  import optax  # Here, not at the top: the planner reads `decays` without JAX.
  return optax.cosine_decay_schedule(args.peak, args.decay_steps)
