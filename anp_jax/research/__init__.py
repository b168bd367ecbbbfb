"""Research tools on top of the core: the performance model (`perfmodel`), the time-to-accuracy
planner (`planner`), the studies (the batch-size sweep, sync/async/mixed) and the performance
model's validation. The core (`anp_jax` outside this package) never imports it."""
