"""Models: ``create_model(config, meta)`` is the one door (it works in IPython too).

``create_model(config, meta)`` builds the model registered under ``config.model.name`` with heads
sized by ``meta`` (`DatasetMeta`, or `Heads` without a dataset); `spec(name)` is a model's
metadata (``min_image_size``, ``image_size``, ``family``, ``arch``, ``options``), `names()` the
registered names. Every module of this package is imported the first time a name is looked up
(`anp_jax.registry.MODELS`): the ResNet family (`anp_jax.models.resnet`) registers itself there,
and a new model is one module here that calls `register` (see ``docs/models.md``).
"""

from anp_jax.models.norm import BatchNorm, BatchNormSettings  # noqa: F401
from anp_jax.models.registry import (BN_MODES, DTYPE_HINTS, DTYPES, NAMES, Heads,  # noqa: F401
                                     ModelArgs, ModelSpec, create_model, dtype_error, names,
                                     norm_settings, register, spec, statistics_batch)
from anp_jax.registry import Option  # noqa: F401
# Imported for its registrations (every ResNet name); `build_resnet` builds one without a config.
from anp_jax.models.resnet import ResNet, build_resnet  # noqa: F401
