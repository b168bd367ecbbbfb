"""torchvision's ResNet naming and layout for the registered ResNets (``family='resnet'``).

torchvision / timm ResNet state dicts (v1.5 naming: ``conv1``, ``bn1``, ``layerN.M.convK``,
``layerN.M.bnK``, ``layerN.M.downsample.0/1``, ``fc``) map onto the anp_jax ResNet's variables
by `torchvision_name`: conv kernels OIHW <-> HWIO, the ``fc`` matrix transposed
(`from_torch_layout`, `to_torch_layout`), BN ``weight``/``bias`` <-> ``scale``/``bias`` and
``running_mean``/``running_var`` <-> the ``batch_stats`` collection; ``num_batches_tracked``
has no counterpart. The block counts come from the registry (`models.spec(name).arch`).
"""

import re
from typing import Dict, List, Optional, Sequence

import numpy as np

from anp_jax import models
from anp_jax.errors import InitFromError
from anp_jax.param_names import flatten

_BN_LEAF = {'scale': 'weight', 'bias': 'bias', 'mean': 'running_mean', 'var': 'running_var'}


def resnet_names() -> List[str]:
  """The registered models that torchvision's ResNet naming fits (the 'resnet' family)."""
  return [n for n in models.names() if models.spec(n).family == 'resnet']


def _resnet_arch(name: str):
  """The `resnet.ResNetArch` of registered model `name`; InitFromError if it is no ResNet."""
  spec = models.spec(name)
  if spec.family != 'resnet':
    raise InitFromError(f'config.model.name={name!r} is not a ResNet: torchvision-style weight '
                        f'files fit the ResNet family only ({", ".join(resnet_names())}); use '
                        'an anp_jax run of this model as config.init_from.')
  return spec.arch


def torchvision_name(arch: str, collection_name: str) -> Optional[str]:
  """anp_jax name (``'params/BasicBlock_3/Conv_0/kernel'``) -> torchvision's, or None (no
  counterpart: the adjective and noun heads)."""
  stage_sizes = _resnet_arch(arch).stage_sizes
  _, name = collection_name.split('/', 1)
  parts = name.split('/')
  leaf = parts[-1]
  if parts[0] == 'conv_init':
    return 'conv1.weight'
  if parts[0] == 'bn_init':
    return 'bn1.' + _BN_LEAF[leaf]
  if parts[0] == 'head_anp':
    return 'fc.' + {'kernel': 'weight', 'bias': 'bias'}[leaf]
  if parts[0].startswith('head_'):
    return None
  block = re.fullmatch(r'(?:BasicBlock|BottleneckBlock)_(\d+)', parts[0])
  if not block or len(parts) != 3:
    raise InitFromError(f'No torchvision name for the parameter {collection_name!r}.')
  k = int(block.group(1))
  stage = 0
  while k >= stage_sizes[stage]:
    k -= stage_sizes[stage]
    stage += 1
  prefix = f'layer{stage + 1}.{k}.'
  module = parts[1]
  if module == 'conv_proj':
    return prefix + 'downsample.0.weight'
  if module == 'norm_proj':
    return prefix + 'downsample.1.' + _BN_LEAF[leaf]
  index = int(module.rsplit('_', 1)[1]) + 1
  if module.startswith('Conv_'):
    return f'{prefix}conv{index}.weight'
  return f'{prefix}bn{index}.' + _BN_LEAF[leaf]


def _relayout(value: np.ndarray, conv_axes) -> np.ndarray:
  if value.ndim == 4:
    return np.transpose(value, conv_axes)
  if value.ndim == 2:
    return value.T
  return value


def from_torch_layout(value: np.ndarray) -> np.ndarray:
  """OIHW conv kernels -> HWIO; (out, in) Linear weights -> (in, out) Dense kernels."""
  return _relayout(value, (2, 3, 1, 0))


def to_torch_layout(value: np.ndarray) -> np.ndarray:
  """The inverse of `from_torch_layout`: HWIO -> OIHW, (in, out) -> (out, in)."""
  return _relayout(value, (3, 2, 0, 1))


def to_torchvision(arch: str, variables) -> Dict[str, np.ndarray]:
  """anp_jax variables -> a torchvision-named state dict (numpy), e.g. to export a fine-tuned
  backbone; `load` inverts it. The adjective/noun heads have no torchvision name and are
  dropped."""
  out = {}
  for collection in ('params', 'batch_stats'):
    for name, value in flatten(variables.get(collection, {})).items():
      tv = torchvision_name(arch, f'{collection}/{name}')
      if tv is not None:
        out[tv] = np.ascontiguousarray(to_torch_layout(np.asarray(value, np.float32)))
  return out


def guess_torchvision_arch(names: Sequence[str]) -> str:
  """'resnet50' etc. from the block counts of a torchvision state dict (for error messages)."""
  blocks: Dict[int, set] = {}
  for n in names:
    m = re.match(r'layer(\d+)\.(\d+)\.', n)
    if m:
      blocks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
  sizes = tuple(len(blocks[s]) for s in sorted(blocks))
  kind = 'bottleneck' if any('.conv3.' in n for n in names) else 'basic'
  for name in resnet_names():
    arch = models.spec(name).arch
    if tuple(arch.stage_sizes) == sizes and arch.block == kind:
      return name
  return f'an unknown ResNet ({kind} blocks per stage {sizes})'
