"""torchvision's ResNet (v1.5) rebuilt with torchvision's module names, for the init_from tests.

PyPI's torchvision does not import beside the pinned torch 2.13.0 CPU build (the issue notes it;
torch 2.14.1 + torchvision 0.29.1 would, but is a ~5.5 GB CUDA build), so the reference is this
file, not ``torchvision.models.resnet50(weights=None)``. It follows torchvision/models/resnet.py:
``conv1``/``bn1``/``relu``/``maxpool``, ``layer1..4`` of ``BasicBlock`` (``conv1, bn1, conv2,
bn2``) or ``Bottleneck`` (``conv1..3, bn1..3``, stride on the 3x3 = v1.5), ``downsample`` =
Sequential(1x1 conv, BN), ``avgpool``, ``fc`` — so its ``state_dict()`` has exactly torchvision's
names and shapes (the test checks the parameter counts against torchvision's published ones).
The CIFAR-style stem (``cifar=True``: 3x3/1 conv, no max-pool, 16 base channels) lets tests use
the small anp_jax models with the same naming.
"""

import torch
from torch import nn

STAGES = {'resnet18': ((2, 2, 2, 2), 'basic'), 'resnet34': ((3, 4, 6, 3), 'basic'),
          'resnet50': ((3, 4, 6, 3), 'bottleneck'), 'resnet8': ((1, 1, 1), 'basic'),
          'resnet20': ((3, 3, 3), 'basic')}


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

  def __init__(self, name='resnet50', num_classes=1000, width=1.0):
    super().__init__()
    stage_sizes, kind = STAGES[name]
    block = BasicBlock if kind == 'basic' else Bottleneck
    cifar = len(stage_sizes) == 3
    base = 16 if cifar else 64
    ch = lambda c: max(1, int(round(c * width)))
    self.inplanes = ch(base)
    if cifar:
      self.conv1 = nn.Conv2d(3, self.inplanes, 3, 1, 1, bias=False)
    else:
      self.conv1 = nn.Conv2d(3, self.inplanes, 7, 2, 3, bias=False)
    self.bn1 = nn.BatchNorm2d(self.inplanes)
    self.relu = nn.ReLU(inplace=True)
    self.maxpool = nn.Identity() if cifar else nn.MaxPool2d(3, 2, 1)
    for i, n in enumerate(stage_sizes):
      setattr(self, f'layer{i + 1}', self._make_layer(block, ch(base * 2**i), n,
                                                       1 if i == 0 else 2))
    self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
    self.fc = nn.Linear(self.inplanes, num_classes)
    self.num_stages = len(stage_sizes)

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
    return self.fc(torch.flatten(self.avgpool(x), 1))


def randomized(name, num_classes=1000, width=1.0, seed=0):
  """A randomly initialised model in eval mode with non-trivial BN statistics and affine
  parameters (fresh BN would be the identity and hide a mapping error)."""
  torch.manual_seed(seed)
  net = ResNet(name, num_classes, width)
  g = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for m in net.modules():
      if isinstance(m, nn.BatchNorm2d):
        c = m.num_features
        m.weight.copy_(0.5 + torch.rand(c, generator=g))
        m.bias.copy_(0.2 * torch.randn(c, generator=g))
        m.running_mean.copy_(0.2 * torch.randn(c, generator=g))
        m.running_var.copy_(0.5 + torch.rand(c, generator=g))
        m.num_batches_tracked.fill_(100)
  return net.eval()
