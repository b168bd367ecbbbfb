"""The project's one PyTorch ResNet: `anp_jax.models.ResNet` rebuilt in PyTorch with torchvision's
module names; the fine-tuning tests' reference and experiments/benchmark.py's contender.

* `torchvision_resnet(name, num_classes, width, aux_heads)`: torchvision's ResNet v1.5 layout
  (``conv1``/``bn1``/``relu``/``maxpool``, ``layer1..4`` of ``BasicBlock`` (``conv1, bn1, conv2,
  bn2``) or ``Bottleneck`` (``conv1..3, bn1..3``, stride on the 3x3), ``downsample`` =
  Sequential(1x1 conv, BN), ``avgpool``, ``fc``) for every registered anp_jax ResNet: block
  counts, block kind and stem come from the registry (``models.spec(name).arch``), so its
  ``state_dict()`` has torchvision's names and shapes (tests check torchvision's published
  parameter counts), and the CIFAR stem (3x3/1 conv, no max-pool, 16 base channels) gives the
  small models the same naming. ``fc`` is the ANP head; ``aux_heads`` adds ``fc_adjective`` /
  ``fc_noun`` (not torchvision's). ``forward`` returns the logits dict of the Flax model. PyPI's
  torchvision does not import beside the pinned torch 2.13.0 CPU build, hence the rebuild.
* `randomized`: a random instance with non-trivial BatchNorm statistics, in eval mode.
* `torch_available`, `build_torch_model`, `build_torch_step`: the benchmark's contender, trained
  on the same synthetic batch by SGD with momentum on CPU in float32, channels-last.
  `anp_jax.benchmarking.run_benchmark(config, torch_reference=this module)` times it.

It lives with the experiments, not in the library: anp_jax does not depend on PyTorch, and this
module imports without it (the classes are built on first use).
"""

import functools
import os
from typing import Dict, Optional

from anp_jax import models
from anp_jax.benchmarking import head_sizes, synthetic_batch
from anp_jax.models.resnet import BASE_CHANNELS, channels

AUX_HEADS = ('adjective', 'noun')


def torch_available() -> Optional[str]:
  """torch's version, or None when it is not installed (the benchmark then says so)."""
  try:
    import torch
  except ImportError:
    return None
  return torch.__version__


@functools.lru_cache(maxsize=None)
def _modules():
  """The torch.nn classes, built on first use (this module imports without PyTorch)."""
  import torch
  from torch import nn

  class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
      super().__init__()
      self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
      self.bn1 = nn.BatchNorm2d(planes)
      self.relu = nn.ReLU(inplace=True)
      self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
      self.bn2 = nn.BatchNorm2d(planes)
      self.downsample = downsample

    def forward(self, x):
      identity = x if self.downsample is None else self.downsample(x)
      out = self.relu(self.bn1(self.conv1(x)))
      out = self.bn2(self.conv2(out))
      return self.relu(out + identity)

  class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
      super().__init__()
      self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
      self.bn1 = nn.BatchNorm2d(planes)
      self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
      self.bn2 = nn.BatchNorm2d(planes)
      self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
      self.bn3 = nn.BatchNorm2d(planes * 4)
      self.relu = nn.ReLU(inplace=True)
      self.downsample = downsample

    def forward(self, x):
      identity = x if self.downsample is None else self.downsample(x)
      out = self.relu(self.bn1(self.conv1(x)))
      out = self.relu(self.bn2(self.conv2(out)))
      out = self.bn3(self.conv3(out))
      return self.relu(out + identity)

  class ResNet(nn.Module):
    """BatchNorm as torch's default: eps 1e-5, momentum 0.1 (= flax's decay 0.9)."""

    def __init__(self, name, num_classes, width, aux_heads):
      super().__init__()
      arch = models.spec(name).arch  # A registered ResNet's structure.
      block = BasicBlock if arch.block == 'basic' else Bottleneck
      cifar = arch.stem == 'cifar'
      base = BASE_CHANNELS[arch.stem]
      self.inplanes = channels(base, width)
      if cifar:
        self.conv1 = nn.Conv2d(3, self.inplanes, 3, 1, 1, bias=False)
      else:
        self.conv1 = nn.Conv2d(3, self.inplanes, 7, 2, 3, bias=False)
      self.bn1 = nn.BatchNorm2d(self.inplanes)
      self.relu = nn.ReLU(inplace=True)
      self.maxpool = nn.Identity() if cifar else nn.MaxPool2d(3, 2, 1)
      for i, n in enumerate(arch.stage_sizes):
        setattr(self, f'layer{i + 1}', self._make_layer(block, channels(base * 2**i, width), n,
                                                         1 if i == 0 else 2))
      self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
      self.fc = nn.Linear(self.inplanes, num_classes)
      self.aux_heads = {h: n for h, n in (aux_heads or {}).items() if n}
      for head, n in self.aux_heads.items():
        setattr(self, f'fc_{head}', nn.Linear(self.inplanes, n))
      self.num_stages = len(arch.stage_sizes)

    def _make_layer(self, block, planes, blocks, stride):
      downsample = None
      if stride != 1 or self.inplanes != planes * block.expansion:
        downsample = nn.Sequential(
            nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
            nn.BatchNorm2d(planes * block.expansion))
      layers = [block(self.inplanes, planes, stride, downsample)]
      self.inplanes = planes * block.expansion
      layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
      return nn.Sequential(*layers)

    def forward(self, x):
      x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
      for i in range(self.num_stages):
        x = getattr(self, f'layer{i + 1}')(x)
      x = torch.flatten(self.avgpool(x), 1)
      return {'anp': self.fc(x), **{h: getattr(self, f'fc_{h}')(x) for h in self.aux_heads}}

  return ResNet


def torchvision_resnet(name: str = 'resnet50', num_classes: int = 1000, width: float = 1.0,
                       aux_heads: Optional[Dict[str, int]] = None):
  """Registered anp_jax ResNet `name` in PyTorch with torchvision's names (see the module
  docstring); ``num_classes`` sizes ``fc``, ``aux_heads`` ({'adjective': n, 'noun': m}, 0: none)
  the extra heads."""
  return _modules()(name, num_classes, width, aux_heads)


def randomized(name, num_classes=1000, width=1.0, seed=0):
  """A randomly initialised model in eval mode with non-trivial BN statistics and affine
  parameters (fresh BN would be the identity and hide a mapping error)."""
  import torch
  torch.manual_seed(seed)
  net = torchvision_resnet(name, num_classes, width)
  g = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for m in net.modules():
      if isinstance(m, torch.nn.BatchNorm2d):
        c = m.num_features
        m.weight.copy_(0.5 + torch.rand(c, generator=g))
        m.bias.copy_(0.2 * torch.randn(c, generator=g))
        m.running_mean.copy_(0.2 * torch.randn(c, generator=g))
        m.running_var.copy_(0.5 + torch.rand(c, generator=g))
        m.num_batches_tracked.fill_(100)
  return net.eval()


def build_torch_model(name: str, heads: Dict[str, int], width: float = 1.0):
  """The PyTorch twin of ``models.create_model`` for ResNet `name` with heads ``{'anp': n,
  'adjective': a, 'noun': b}`` (0: no such head)."""
  return torchvision_resnet(name, heads['anp'], width,
                            {h: heads.get(h, 0) for h in AUX_HEADS})


def build_torch_step(config, seed: int = 0):
  """PyTorch CPU training step of `config.model` (float32, channels-last). Returns (run, params)."""
  import torch
  import torch.nn.functional as F
  if config.model.dtype != 'float32':
    raise ValueError('The PyTorch CPU comparison runs in float32; set --config.model.dtype='
                     'float32.')
  torch.manual_seed(seed)
  # As many threads as this process may use (taskset / cgroup affinity), like XLA's thread pool.
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  sizes = head_sizes(config)
  m = config.model
  heads = {'anp': sizes['anp'],
           'adjective': sizes['adjective'] if m.get('adjective_head', True) else 0,
           'noun': sizes['noun'] if m.get('noun_head', True) else 0}
  net = build_torch_model(m.name, heads, m.width).to(memory_format=torch.channels_last)
  net.train()
  opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=config.momentum)
  host = synthetic_batch(config, config.batch_size, sizes, seed)
  x = torch.from_numpy(host['image']).permute(0, 3, 1, 2).contiguous(
      memory_format=torch.channels_last)
  labels = {h: torch.from_numpy(host[f'label_{h}']).long() for h in heads if heads[h]}
  weights = dict(config.loss_weights)

  def run(n):
    for _ in range(n):
      opt.zero_grad(set_to_none=True)
      logits = net(x)
      loss = sum(weights[h] * F.cross_entropy(logits[h], labels[h]) for h in logits)
      loss.backward()
      opt.step()

  return run, sum(p.numel() for p in net.parameters()), torch.get_num_threads()
