"""TensorFlow for the input pipeline, without the Keras it imports eagerly.

``from anp_jax.tf_import import tf``. anp_jax uses TensorFlow for tf.data and TFDS only. ``import
tensorflow`` (2.21, with Keras 3 installed) also imports ``keras.src.optimizers`` "so that any
function/method that needs to happen at load time will trigger" (TensorFlow's ``__init__``), which
pulls in all of ``keras.src``, ``matplotlib.pyplot`` and Keras' JAX backend: 0.6 s of CPU in a 3.7 s
import, paid by every training process, study and test worker (measured on a 2-core VM,
2026-12-06). TensorFlow treats that import as optional (an ImportError is passed over), so it is
skipped here; ``tf.keras`` and a later ``import keras`` work as usual (the module is importable
again once TensorFlow is).

Every anp_jax module that uses TensorFlow imports it through this module, so whichever comes first
(`anp_jax.runtime.configure`, the input pipeline) imports it this way.
"""

import sys

# TensorFlow's eager, optional import (tensorflow/__init__.py: "Do an eager load for Keras' code").
_EAGER_KERAS = 'keras.src.optimizers'


def import_tensorflow():
  """The tensorflow module, imported without its eager Keras import if it is not imported yet."""
  if 'tensorflow' in sys.modules or _EAGER_KERAS in sys.modules:
    import tensorflow
    return tensorflow
  sys.modules[_EAGER_KERAS] = None  # `import` raises ImportError, which TensorFlow passes over.
  try:
    import tensorflow
  finally:
    if sys.modules.get(_EAGER_KERAS, False) is None:
      del sys.modules[_EAGER_KERAS]
  return tensorflow


tf = import_tensorflow()
