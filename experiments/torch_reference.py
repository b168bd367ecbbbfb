"""The PyTorch contender of experiments/benchmark.py: `anp_jax.models.ResNet` rebuilt in PyTorch.

Same blocks, strides (v1.5), widths and heads as the Flax model (the benchmark checks that the
parameter counts are equal), trained on the same synthetic batch by SGD with momentum on CPU in
float32, channels-last. It lives with the experiments, not in the library: anp_jax does not
depend on PyTorch. `anp_jax.benchmarking.run_benchmark(config, torch_reference=this module)`
times it next to anp_jax's step.
"""

import os
from typing import Dict, Optional

from anp_jax.benchmarking import head_sizes, synthetic_batch
from anp_jax import models
from anp_jax.models.resnet import BASE_CHANNELS, _ch


def torch_available() -> Optional[str]:
  """torch's version, or None when it is not installed (the benchmark then says so)."""
  try:
    import torch
  except ImportError:
    return None
  return torch.__version__


def build_torch_model(name: str, heads: Dict[str, int], width: float = 1.0):
  """`anp_jax.models.ResNet` in PyTorch: same blocks, strides (v1.5), widths, heads."""
  import torch
  from torch import nn
  arch = models.spec(name).arch  # A registered ResNet's structure.
  stage_sizes, block_kind, stem = arch.stage_sizes, arch.block, arch.stem

  def bn(c):
    # PyTorch momentum is the weight of the new statistics: flax 0.9 decay = torch 0.1.
    return nn.BatchNorm2d(c, eps=1e-5, momentum=0.1)

  class Basic(nn.Module):
    expansion = 1

    def __init__(self, cin, f, stride):
      super().__init__()
      self.c1, self.b1 = nn.Conv2d(cin, f, 3, stride, 1, bias=False), bn(f)
      self.c2, self.b2 = nn.Conv2d(f, f, 3, 1, 1, bias=False), bn(f)
      self.proj = (nn.Sequential(nn.Conv2d(cin, f, 1, stride, bias=False), bn(f))
                   if stride != 1 or cin != f else None)

    def forward(self, x):
      r = x if self.proj is None else self.proj(x)
      y = torch.relu(self.b1(self.c1(x)))
      return torch.relu(r + self.b2(self.c2(y)))

  class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, f, stride):
      super().__init__()
      self.c1, self.b1 = nn.Conv2d(cin, f, 1, bias=False), bn(f)
      self.c2, self.b2 = nn.Conv2d(f, f, 3, stride, 1, bias=False), bn(f)
      self.c3, self.b3 = nn.Conv2d(f, 4 * f, 1, bias=False), bn(4 * f)
      self.proj = (nn.Sequential(nn.Conv2d(cin, 4 * f, 1, stride, bias=False), bn(4 * f))
                   if stride != 1 or cin != 4 * f else None)

    def forward(self, x):
      r = x if self.proj is None else self.proj(x)
      y = torch.relu(self.b1(self.c1(x)))
      y = torch.relu(self.b2(self.c2(y)))
      return torch.relu(r + self.b3(self.c3(y)))

  block = Basic if block_kind == 'basic' else Bottleneck

  class Net(nn.Module):

    def __init__(self):
      super().__init__()
      base = BASE_CHANNELS[stem]
      if stem == 'imagenet':
        self.stem = nn.Sequential(nn.Conv2d(3, _ch(base, width), 7, 2, 3, bias=False),
                                  bn(_ch(base, width)), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
      else:
        self.stem = nn.Sequential(nn.Conv2d(3, _ch(base, width), 3, 1, 1, bias=False),
                                  bn(_ch(base, width)), nn.ReLU())
      layers, cin = [], _ch(base, width)
      for i, n in enumerate(stage_sizes):
        for j in range(n):
          f = _ch(base * 2 ** i, width)
          layers.append(block(cin, f, 2 if i > 0 and j == 0 else 1))
          cin = f * block.expansion
      self.blocks = nn.Sequential(*layers)
      self.heads = nn.ModuleDict({h: nn.Linear(cin, n) for h, n in heads.items() if n})

    def forward(self, x):
      x = self.blocks(self.stem(x)).mean(dim=(2, 3))
      return {h: head(x) for h, head in self.heads.items()}

  return Net()


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
