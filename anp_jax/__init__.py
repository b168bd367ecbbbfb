"""anp_jax: data-parallel ResNet training for Adjective-Noun Pair recognition (JAX/Flax).

Entry points call `anp_jax.runtime.configure()` first (XLA:CPU flags, TensorFlow off the GPU);
see that module. The one thing importing anp_jax does is below.
"""

import os as _os

# TensorFlow (the input pipeline only) prints a oneDNN notice, preceded by absl's "All log
# messages before absl::InitializeLog()", on import unless both are set before it is imported;
# TF_CPP_MIN_LOG_LEVEL alone does not silence it. It is imported by several modules (the input
# pipeline, clu's writers), so the defaults are set here, before any of them. oneDNN speeds up
# TF's matmuls/convolutions, which the input pipeline does not run. A value you set yourself wins.
_os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
_os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
