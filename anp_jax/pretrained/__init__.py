"""Fine-tuning from pretrained weights: ``config.init_from`` and ``config.init_exclude``.

``config.init_from`` (empty: train from scratch) names a local file or directory; nothing is
downloaded. `load` reads it (`anp_jax.pretrained.sources`: an anp_jax run, or a torchvision-style
ResNet state dict as .safetensors / .pth, named by `anp_jax.pretrained.torchvision_names`),
matches it to the model and checks it on the host before anything compiles
(`anp_jax.pretrained.loading`); `place` writes it into a fresh state of any executor. The
trainer calls them only for a fresh run: a checkpoint in the workdir wins (resume), and
``init_from`` is part of the checkpoint identity.

The other fine-tuning knobs, ``config.freeze`` and ``config.backbone_lr_multiplier``, partition
the optimizer: `anp_jax.optim.partition`.
``.venv/bin/python -m anp_jax.pretrained --source=FILE --model=resnet50``
checks a file against a model (`anp_jax.pretrained.__main__`).
"""

from anp_jax.errors import InitFromError  # noqa: F401
from anp_jax.pretrained.loading import LoadedWeights, load, place, validate  # noqa: F401
from anp_jax.pretrained.sources import (read_anp_jax, read_safetensors,  # noqa: F401
                                        read_source, read_torch, source_kind)
from anp_jax.pretrained.torchvision_names import (from_torch_layout,  # noqa: F401
                                                  guess_torchvision_arch, resnet_names,
                                                  to_torch_layout, to_torchvision,
                                                  torchvision_name)
