"""Models: ``create_model(config, meta)`` is the one door (it works in IPython too).

``create_model(config, meta)`` builds the model registered under ``config.model.name`` with heads
sized by ``meta`` (`DatasetMeta`, or `Heads` without a dataset); `spec(name)` is a model's
metadata (``min_image_size``, ``image_size``, ``family``, ``arch``), `names()` the registered
names. The ResNet family (`anp_jax.models.resnet`) registers itself on import; a new model is
one module that calls `register` (see ``docs/models.md``).
"""

from anp_jax.models.norm import BatchNorm, BatchNormSettings  # noqa: F401
from anp_jax.models.registry import (BN_MODES, DTYPE_HINTS, DTYPES, NAMES, Heads,  # noqa: F401
                                     ModelArgs, ModelSpec, create_model, dtype_error, names,
                                     norm_settings, register, spec, statistics_batch)
# Imported for its registrations (every ResNet name); `build_resnet` builds one without a config.
from anp_jax.models.resnet import ResNet, build_resnet  # noqa: F401
