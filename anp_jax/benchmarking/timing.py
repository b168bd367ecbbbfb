"""Timing primitives: contenders timed in alternating windows, ratios per round.

Contenders that are compared are timed in alternating windows (A, B, C, A, B, C, ...) and every
ratio is the median of per-round ratios, so a machine whose load changes during the run (the
2-core reference machine is shared) biases neither side.
"""

import dataclasses
import time
from typing import Any, Callable, Dict, List, Sequence

import numpy as np


@dataclasses.dataclass
class Timing:
  """Per-window step times of one contender (seconds per step), and what a step processes."""
  images_per_step: int
  step_times: List[float] = dataclasses.field(default_factory=list)

  def summary(self) -> Dict[str, float]:
    t = np.asarray(self.step_times, np.float64)
    if t.size == 0:
      return {}
    med = float(np.median(t))
    return {'images_per_s': self.images_per_step / med, 'step_time_median_s': med,
            'step_time_min_s': float(t.min()), 'step_time_max_s': float(t.max()),
            'step_time_p10_s': float(np.percentile(t, 10)),
            'step_time_p90_s': float(np.percentile(t, 90)),
            'step_time_rel_spread': float((np.percentile(t, 90) - np.percentile(t, 10)) / med),
            'windows': int(t.size)}


class Contender:
  """Something that trains: `run(n)` performs n steps and returns when they are finished."""

  def __init__(self, name: str, images_per_step: int, run: Callable[[int], None]):
    self.name, self.run = name, run
    self.timing = Timing(images_per_step)

  def window(self, steps: int):
    t0 = time.perf_counter()
    self.run(steps)
    self.timing.step_times.append((time.perf_counter() - t0) / steps)


def silent(message: str):
  del message


def interleave(contenders: Sequence[Contender], windows: int, steps_per_window: int,
               warmup_steps: int, progress: Callable[[str], None] = silent) -> Dict[str, Any]:
  """Warms every contender up, then times them in alternating windows; ratios per round.

  `progress` gets a line after each warm-up and each round (the rates of that round).
  """
  for c in contenders:
    if warmup_steps:
      t0 = time.perf_counter()
      c.run(warmup_steps)
      progress(f'{c.name}: {warmup_steps} warm-up step(s) in {time.perf_counter() - t0:.1f} s')
  for w in range(windows):
    for c in contenders:
      c.window(steps_per_window)
    progress(f'window {w + 1}/{windows}: ' + ', '.join(
        f'{c.name} {c.timing.images_per_step / max(c.timing.step_times[-1], 1e-12):.1f} img/s'
        for c in contenders))
  out = {c.name: c.timing.summary() for c in contenders}
  ratios = {}
  for i, a in enumerate(contenders):
    for b in contenders[i + 1:]:
      # a's throughput / b's throughput = b's step time / a's step time, round by round.
      per_round = np.asarray(b.timing.step_times) / np.asarray(a.timing.step_times)
      ratios[f'{a.name}/{b.name}'] = {'median': float(np.median(per_round)),
                                      'min': float(per_round.min()),
                                      'max': float(per_round.max())}
  return {'results': out, 'ratios': ratios}
