"""ResNet family for ANP recognition (Flax linen).

* ImageNet-style ResNet v1.5 (He et al. 2016, with the stride on the 3x3 convolution of the
  bottleneck as in the torchvision / MLPerf reference): ResNet-18/34/50/101/152 for 224 px photos.
* CIFAR-style ResNet-20/32/56 (He et al. 2016, section 4.2): 3x3 stem, three stages of
  16/32/64 x ``width`` channels, basic blocks, for small images. Where the shape changes (the
  first block of stages 2 and 3) the shortcut is a 1x1 convolution + BN projection (the paper's
  option B), not option A's parameter-free zero-padded identity: one block type for both
  families. That adds 2,752 parameters: ResNet-20 with 10 classes has 272,474 instead of the
  paper's 269,722 (0.27M); ResNet-32 466,906, ResNet-56 855,770.

Every model returns a dict of logits: ``anp`` always, ``adjective`` and ``noun`` when those heads
are enabled (``num_adjectives`` / ``num_nouns`` > 0).
"""

import dataclasses
import functools
from typing import Any, Callable, Dict, Sequence, Tuple

import flax.linen as nn
import jax.numpy as jnp

from anp_jax.models import conv
from anp_jax.models.norm import BatchNormSettings
from anp_jax.models.registry import ModelArgs, register
from anp_jax.registry import Option

ModuleDef = Any
# Explicit padding of every 3x3 convolution and of the stem's max-pool, as torchvision's
# ``padding=1``: 'SAME' pads a strided 3x3 window over an even size by (0, 1) instead, which
# shifts every strided layer by half a pixel and breaks weights converted from PyTorch.
PAD1 = ((1, 1), (1, 1))


@dataclasses.dataclass(frozen=True)
class ResNetArch:
  """The structure of one ResNet (``models.spec(name).arch`` of a registered ResNet).

  Attributes:
    stage_sizes: residual blocks per stage.
    block: 'basic' (two 3x3 convolutions) or 'bottleneck' (1x1, 3x3, 1x1 x4).
    stem: 'imagenet' (7x7/2 convolution + 3x3/2 max-pool, 64 base channels) or 'cifar' (3x3/1
      convolution, 16 base channels).
  """
  stage_sizes: Tuple[int, ...]
  block: str
  stem: str


ARCHS: Dict[str, ResNetArch] = {
    'resnet18': ResNetArch((2, 2, 2, 2), 'basic', 'imagenet'),
    'resnet34': ResNetArch((3, 4, 6, 3), 'basic', 'imagenet'),
    'resnet50': ResNetArch((3, 4, 6, 3), 'bottleneck', 'imagenet'),
    'resnet101': ResNetArch((3, 4, 23, 3), 'bottleneck', 'imagenet'),
    'resnet152': ResNetArch((3, 8, 36, 3), 'bottleneck', 'imagenet'),
    'resnet20': ResNetArch((3, 3, 3), 'basic', 'cifar'),
    'resnet32': ResNetArch((5, 5, 5), 'basic', 'cifar'),
    'resnet56': ResNetArch((9, 9, 9), 'basic', 'cifar'),
    # Not a published architecture: the smallest member, for unit tests.
    'resnet8': ResNetArch((1, 1, 1), 'basic', 'cifar'),
}

# Per stem: the total spatial downsampling (the smallest image a model accepts) and the image
# size the stem is designed for.
MIN_IMAGE_SIZE = {'imagenet': 32, 'cifar': 4}
NATIVE_IMAGE_SIZE = {'imagenet': 224, 'cifar': 32}
BASE_CHANNELS = {'imagenet': 64, 'cifar': 16}


class _Block(nn.Module):
  """Fields shared by both residual blocks (a stage builds its blocks with the same arguments)."""
  filters: int
  conv: ModuleDef
  norm: ModuleDef
  strides: Tuple[int, int] = (1, 1)
  zero_init_last_bn: bool = True
  act: Callable = nn.relu


class BasicBlock(_Block):
  """Two 3x3 convolutions with a projection shortcut when the shape changes."""

  @nn.compact
  def __call__(self, x):
    residual = x
    y = self.conv(self.filters, (3, 3), self.strides, padding=PAD1)(x)
    y = self.act(self.norm()(y))
    y = self.conv(self.filters, (3, 3), padding=PAD1)(y)
    y = self.norm(scale_init=nn.initializers.zeros if self.zero_init_last_bn
                  else nn.initializers.ones)(y)
    if residual.shape != y.shape:
      residual = self.conv(self.filters, (1, 1), self.strides, name='conv_proj')(residual)
      residual = self.norm(name='norm_proj')(residual)
    return self.act(residual + y)


class BottleneckBlock(_Block):
  """1x1 → 3x3 (strided, v1.5) → 1x1 x4, with a projection shortcut when the shape changes."""

  @nn.compact
  def __call__(self, x):
    residual = x
    y = self.act(self.norm()(self.conv(self.filters, (1, 1))(x)))
    y = self.act(self.norm()(self.conv(self.filters, (3, 3), self.strides, padding=PAD1)(y)))
    y = self.conv(self.filters * 4, (1, 1))(y)
    y = self.norm(scale_init=nn.initializers.zeros if self.zero_init_last_bn
                  else nn.initializers.ones)(y)
    if residual.shape != y.shape:
      residual = self.conv(self.filters * 4, (1, 1), self.strides, name='conv_proj')(residual)
      residual = self.norm(name='norm_proj')(residual)
    return self.act(residual + y)


class ResNet(nn.Module):
  """A ResNet with an ANP head and optional adjective / noun heads.

  Attributes:
    stage_sizes: blocks per stage.
    block: 'basic' or 'bottleneck'.
    stem: 'imagenet' (7x7/2 conv + 3x3/2 max-pool) or 'cifar' (3x3/1 conv).
    num_anps: classes of the ANP head.
    num_adjectives, num_nouns: classes of the auxiliary heads; 0 disables a head.
    width: channel multiplier (1.0 = the published widths).
    dtype: compute dtype (parameters and BN statistics stay float32).
    zero_init_last_bn: initialise the last BN scale of every block to zero (Goyal et al. 2017).
    bn: the semantics of every BatchNorm (statistics batch, cross-device axis, momentum).
    conv_impl: optional replacement for nn.Conv (same signature); see models/conv.py.
  """
  stage_sizes: Sequence[int]
  block: str
  stem: str
  num_anps: int
  num_adjectives: int = 0
  num_nouns: int = 0
  width: float = 1.0
  dtype: Any = jnp.float32
  zero_init_last_bn: bool = True
  bn: BatchNormSettings = BatchNormSettings()
  conv_impl: Any = None

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv_cls = self.conv_impl or nn.Conv
    conv = functools.partial(conv_cls, use_bias=False, dtype=self.dtype,
                             kernel_init=nn.initializers.variance_scaling(
                                 2.0, 'fan_out', 'normal'))
    norm = self.bn.layer(train, self.dtype)
    block_cls = {'basic': BasicBlock, 'bottleneck': BottleneckBlock}[self.block]
    x = x.astype(self.dtype)

    base = BASE_CHANNELS[self.stem]
    if self.stem == 'imagenet':
      x = conv(channels(base, self.width), (7, 7), (2, 2), padding=[(3, 3), (3, 3)],
               name='conv_init')(x)
      x = nn.relu(norm(name='bn_init')(x))
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=PAD1)
    else:
      x = conv(channels(base, self.width), (3, 3), padding=PAD1, name='conv_init')(x)
      x = nn.relu(norm(name='bn_init')(x))

    for i, block_count in enumerate(self.stage_sizes):
      for j in range(block_count):
        strides = (2, 2) if i > 0 and j == 0 else (1, 1)
        x = block_cls(channels(base * 2**i, self.width), conv=conv, norm=norm, strides=strides,
                      zero_init_last_bn=self.zero_init_last_bn)(x)

    x = jnp.mean(x, axis=(1, 2)).astype(jnp.float32)  # Heads run in float32.
    logits = {'anp': nn.Dense(self.num_anps, name='head_anp')(x)}
    if self.num_adjectives:
      logits['adjective'] = nn.Dense(self.num_adjectives, name='head_adjective')(x)
    if self.num_nouns:
      logits['noun'] = nn.Dense(self.num_nouns, name='head_noun')(x)
    return logits


def channels(base: int, width: float) -> int:
  """Channels of a layer of `base` channels at width multiplier `width` (at least 1)."""
  return max(1, int(round(base * width)))


def build_resnet(name: str, **kwargs) -> ResNet:
  """`build_resnet('resnet50', num_anps=553)` -> an uninitialised `ResNet` module, without a
  config (tests of the family itself; everything else calls `models.create_model`)."""
  if name not in ARCHS:
    raise ValueError(f'Unknown model {name!r}; choose one of {sorted(ARCHS)}.')
  arch = ARCHS[name]
  return ResNet(stage_sizes=arch.stage_sizes, block=arch.block, stem=arch.stem, **kwargs)


# The options of every ResNet (``config.model.<name>``); ``config.model.width`` is every model's.
OPTIONS = {
    'zero_init_last_bn': Option(True, doc='the last BatchNorm scale of every block starts at '
                                'zero (Goyal et al. 2017)'),
    'conv_impl': Option('xla', choices=conv.IMPLS, doc='how convolutions are lowered '
                        '(anp_jax/models/conv.py)'),
}


def _factory(name: str):
  """The registered factory of ResNet `name`: heads, dtype and BatchNorm from `ModelArgs`,
  ``config.model.width`` from the config, ``zero_init_last_bn`` and ``conv_impl`` from its
  options."""

  def build(config, args: ModelArgs) -> ResNet:
    impl = args.options['conv_impl']
    conv_impl = None if impl == 'xla' else conv.get_conv_impl(impl)
    return build_resnet(name, num_anps=args.heads.num_anps,
                        num_adjectives=args.heads.num_adjectives,
                        num_nouns=args.heads.num_nouns, width=config.model.width,
                        dtype=args.dtype, zero_init_last_bn=args.options['zero_init_last_bn'],
                        bn=args.norm, conv_impl=conv_impl)
  build.__qualname__ = f'{name}_factory'
  return build


for _name, _arch in ARCHS.items():
  register(_name, min_image_size=MIN_IMAGE_SIZE[_arch.stem],
           image_size=NATIVE_IMAGE_SIZE[_arch.stem], family='resnet', arch=_arch,
           description=f'ResNet, {_arch.block} blocks {_arch.stage_sizes}, {_arch.stem} stem',
           options=OPTIONS)(_factory(_name))
