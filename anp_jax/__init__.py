"""anp_jax: data-parallel ResNet training for Adjective-Noun Pair recognition (JAX/Flax)."""

import os as _os

from anp_jax import xla_flags as _xla_flags

# TensorFlow (the input pipeline only) prints a oneDNN notice, preceded by absl's "All log
# messages before absl::InitializeLog()", on import unless both are set before it is imported;
# TF_CPP_MIN_LOG_LEVEL alone does not silence it. oneDNN speeds up TF's matmuls/convolutions,
# which the input pipeline does not run. A value you set yourself wins.
_os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
_os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')

# XLA:CPU defaults (convolutions through Eigen, not YNNPACK): see anp_jax/xla_flags.py. Effective
# whenever anp_jax is imported before JAX starts its backend; ANP_XLA_CPU_DEFAULTS=0 turns it off.
_xla_flags.apply_cpu_defaults()
