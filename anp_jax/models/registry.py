"""The one door to every model: a registry of names, and `create_model(config, meta)`.

A model family registers each of its names with a factory and the metadata its callers need
(`ModelSpec`: the smallest image it accepts, the size it is designed for, its family and
family-specific structure, the config options it reads). `create_model` resolves what the
config says about every model (heads, compute dtype, BatchNorm semantics and the frozen layers,
the model's own options) into `ModelArgs` and calls the factory of ``config.model.name``;
`anp_jax.setup.validate_config` checks ``config.model.name``, the minimum image size and the
options against the same registry (`anp_jax.registry.MODELS`). Every module of
``anp_jax/models/`` is imported the first time a name is looked up, so a new model is one file
that calls `register` (see ``docs/models.md``), and nothing else changes.
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp

from anp_jax import param_names, registry
from anp_jax.errors import ConfigError
from anp_jax.models.norm import BatchNormSettings
from anp_jax.registry import Option

# Compute dtypes. float16 is deliberately absent: its 5-bit exponent makes small gradients
# underflow to zero unless the loss is scaled (dynamic loss scaling), which this trainer does not
# implement; bfloat16 has float32's exponent range and needs none.
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
# Why a dtype someone may expect is refused (appended to the error message).
DTYPE_HINTS = {'float16': "float16 would need loss scaling to keep small gradients from "
                          "underflowing, which this trainer does not implement; use 'bfloat16' "
                          "(float32's exponent range, no loss scaling needed)."}
BN_MODES = ('global', 'per_device', 'ghost')


@dataclasses.dataclass(frozen=True)
class Heads:
  """Classes of the three heads; 0 turns a head off. For callers without a dataset
  (``create_model(config, Heads(553))``); the pipeline's `DatasetMeta` has the same fields."""
  num_anps: int
  num_adjectives: int = 0
  num_nouns: int = 0


@dataclasses.dataclass(frozen=True)
class ModelArgs:
  """What `create_model` resolved from the config for every model, passed to a factory.

  Attributes:
    heads: class counts of the heads to build (``config.model.adjective_head`` /
      ``noun_head`` already applied: 0 means no such head).
    dtype: compute dtype (``config.model.dtype``); parameters and BN statistics stay float32.
    norm: the BatchNorm semantics (``config.bn_mode``, ``bn_momentum``, the layers
      ``config.freeze`` freezes): build every BatchNorm with ``norm.layer(train, dtype)``.
    options: the values of the options the model declared (`register`), by name:
      ``config.model.<name>``, or the declared default for a config recorded without it.
  """
  heads: Heads
  dtype: Any
  norm: BatchNormSettings
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


# factory(config, args) -> an uninitialised flax module (see docs/models.md for the contract).
Factory = Callable[[Any, ModelArgs], nn.Module]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A registered model: its factory and what callers need to know without building it.

  Attributes:
    name: the ``config.model.name`` that selects it.
    factory: ``factory(config, args: ModelArgs) -> nn.Module``.
    min_image_size: the smallest input side it accepts (its total downsampling); checked by
      `anp_jax.setup.validate_config`.
    image_size: the input side it is designed for (224 for ImageNet ResNets, 32 for CIFAR
      ones): what tools that pick a size for a model use.
    family: the family of models it belongs to (e.g. 'resnet'); tools that only understand one
      family (torchvision weight names) check it.
    arch: family-specific structure (for ResNets a `resnet.ResNetArch`), None if none.
    description: one line for listings.
    options: the fields of ``config.model`` it reads, by name (`anp_jax.registry.Option`).
  """
  name: str
  factory: Factory
  min_image_size: int
  image_size: int
  family: str = ''
  arch: Any = None
  description: str = ''
  options: Mapping[str, Option] = dataclasses.field(default_factory=dict)


MODELS = registry.MODELS


def register(name: str, *, min_image_size: int, image_size: Optional[int] = None,
             family: str = '', arch: Any = None, description: str = '',
             options: Optional[Mapping[str, Any]] = None,
             replace: bool = False) -> Callable[[Factory], Factory]:
  """Registers a model factory under ``name``; used as a decorator::

    @models.register('toy_cnn', min_image_size=4, image_size=32,
                     options={'features': models.Option(16, 'integer >= 1', 'channels')})
    def toy_cnn(config, args: models.ModelArgs) -> nn.Module:
      return ToyCNN(heads=args.heads, features=args.options['features'], norm=args.norm,
                    dtype=args.dtype)

  (or called: ``register(name, min_image_size=4)(factory)``). The factory is returned
  unchanged. ``options`` are the fields of ``config.model`` the model reads (an `Option`, or a
  plain default): every config gets them (``--config.model.features=8`` works with no config
  file), validation checks their ranges, and the factory reads them in ``args.options``; two
  models may share an option declared alike. A name registered twice is an error (two models
  would answer to one config), unless ``replace=True``.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f'register: the model name must be a non-empty string, got {name!r}.')
  if not (isinstance(min_image_size, int) and min_image_size >= 1):
    raise ValueError(f'register({name!r}): min_image_size={min_image_size!r} must be an '
                     'integer >= 1.')
  size = min_image_size if image_size is None else image_size
  if not (isinstance(size, int) and size >= min_image_size):
    raise ValueError(f'register({name!r}): image_size={image_size!r} must be an integer >= '
                     f'min_image_size={min_image_size}.')

  def add(factory: Factory) -> Factory:
    if not callable(factory):
      raise ValueError(f'register({name!r}): the factory {factory!r} is not callable.')
    declared = {k: registry.as_option(v) for k, v in dict(options or {}).items()}
    MODELS.register(name, ModelSpec(name=name, factory=factory, min_image_size=min_image_size,
                                    image_size=size, family=family, arch=arch,
                                    description=description, options=declared),
                    options=declared, replace=replace)
    return factory
  return add


def names() -> Tuple[str, ...]:
  """The registered model names, sorted (every module of ``anp_jax/models/`` imported first)."""
  return MODELS.names()


# A live, sorted view of the registered names (`anp_jax.setup.CHOICES` holds it, so a model
# registered after import is a valid ``config.model.name``).
NAMES = MODELS.view()


def spec(name: str) -> ModelSpec:
  """The `ModelSpec` registered under ``name``; ConfigError listing the names (and how to add
  one) if none is."""
  if name not in MODELS:
    raise ConfigError(f'Unknown model {name!r}; choose one of {names()} ({MODELS.how}).')
  return MODELS.get(name)


def dtype_error(dtype) -> str:
  """The message for an unsupported ``config.model.dtype``."""
  hint = DTYPE_HINTS.get(dtype, '') if isinstance(dtype, str) else ''
  return (f'config.model.dtype={dtype!r} is unknown; choose one of {tuple(DTYPES)}.'
          + (f' {hint}' if hint else ''))


def norm_settings(config, axis_name: Optional[str] = None) -> BatchNormSettings:
  """Every BatchNorm's semantics for ``config`` inside a per-device step over ``axis_name``:
  the statistics batch (``config.bn_mode``), the momentum and the layers ``config.freeze``
  freezes."""
  mode = config.bn_mode
  if mode == 'global':
    group_size, bn_axis = None, axis_name
  elif mode == 'per_device':
    group_size, bn_axis = None, None
  elif mode == 'ghost':
    group_size, bn_axis = config.bn_group_size, None
  else:
    raise ValueError(f'config.bn_mode={mode!r} is unknown; choose one of {BN_MODES}.')
  freeze = config.get('freeze', '') or ''
  param_names.compile_patterns('freeze', freeze)  # A bad regex fails here, not at trace time.
  return BatchNormSettings(group_size=group_size, axis_name=bn_axis, momentum=config.bn_momentum,
                           freeze=freeze)


def statistics_batch(config, micro_batch: int, axis_devices: int) -> int:
  """The examples each BatchNorm of a training step normalises over, as `norm_settings` sets
  it up: ``config.bn_group_size`` ('ghost'), a device's micro-batch `micro_batch` ('per_device':
  the per-device batch / grad_accum_steps, so it follows the device count), or the micro-batches
  of the `axis_devices` devices whose statistics 'global' averages (the step's all-reduce: every
  device, a node's under local SGD). Part of a checkpoint's identity (`anp_jax.trainer`): a
  resume that changed it would continue another computation."""
  mode = config.bn_mode
  if mode == 'ghost':
    return int(config.bn_group_size)
  if mode == 'per_device':
    return int(micro_batch)
  if mode == 'global':
    return int(micro_batch) * int(axis_devices)
  raise ValueError(f'config.bn_mode={mode!r} is unknown; choose one of {BN_MODES}.')


def create_model(config, meta, axis_name: Optional[str] = None) -> nn.Module:
  """The model named by ``config.model.name``, with heads sized by ``meta``.

  ``meta`` is anything with ``num_anps``, ``num_adjectives`` and ``num_nouns`` (the pipeline's
  `DatasetMeta`, or `Heads`); ``config.model.adjective_head`` / ``noun_head`` turn those heads
  off. ``axis_name`` is the mesh/pmap axis over which 'global' BatchNorm averages its
  statistics; leave it None to call the model outside a per-device step (IPython), where the
  batch of the call is the statistics batch.
  """
  m = config.model
  if m.dtype not in DTYPES:
    raise ValueError(dtype_error(m.dtype))
  model_spec = spec(m.name)
  heads = Heads(num_anps=int(meta.num_anps),
                num_adjectives=int(getattr(meta, 'num_adjectives', 0)) if m.adjective_head else 0,
                num_nouns=int(getattr(meta, 'num_nouns', 0)) if m.noun_head else 0)
  args = ModelArgs(heads=heads, dtype=DTYPES[m.dtype], norm=norm_settings(config, axis_name),
                   options=registry.option_values(m, model_spec.options))
  return model_spec.factory(config, args)
