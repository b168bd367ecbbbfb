"""anp_jax: data-parallel ResNet training for Adjective-Noun Pair recognition (JAX/Flax)."""

from anp_jax import xla_flags as _xla_flags

# XLA:CPU defaults (convolutions through Eigen, not YNNPACK): see anp_jax/xla_flags.py. Effective
# whenever anp_jax is imported before JAX starts its backend; ANP_XLA_CPU_DEFAULTS=0 turns it off.
_xla_flags.apply_cpu_defaults()
