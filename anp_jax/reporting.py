"""What the user sees of a run: terminal lines, the progress bar, curves and atomic JSON files.

Process 0 writes; the metric writers are in `anp_jax.metrics`, the metrics.jsonl reader in
`anp_jax.metrics_io`.
`say` is the one way the library writes a line for the user: it is logged (absl logging, every
process) and, on process 0, printed to stdout, where the progress bar (stderr) leaves room for
it. Diagnostics that the user need not read go to logging alone.
"""

import json
import logging
import math
import os
import sys
import time
from typing import Dict, Optional

import jax

from anp_jax import plotting


def say(message: str, level: int = logging.INFO) -> None:
  """Logs `message` and, on process 0, prints it to stdout (the run's report to the user)."""
  logging.log(level, message)
  if jax.process_index() == 0:
    print(message, flush=True)


def _fmt_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return '?'
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}h{m:02d}m' if h else f'{m}m{s:02d}s'


class ProgressBar:
  """One-line progress with steps/s, images/s and ETA.

  On a terminal the line is redrawn in place; otherwise (a log file, SLURM output) a plain line is
  written at most every `LOG_EVERY_S` seconds, never cursor-control characters.
  """
  LOG_EVERY_S = 5.0

  def __init__(self, total_steps: int, images_per_step: int, start_step: int = 0,
               enabled: bool = True, stream=None, width: int = 24):
    self.total, self.images_per_step = total_steps, images_per_step
    self.enabled = enabled and jax.process_index() == 0
    self.stream = stream or sys.stderr
    self.tty = getattr(self.stream, 'isatty', lambda: False)()
    self.width = width
    self._t0, self._s0 = time.time(), start_step
    self._last_print = 0.0

  def reset_clock(self, step: int):
    """Restart the rate measurement (after compilation, so it reports steady-state speed)."""
    self._t0, self._s0 = time.time(), step

  def exclude(self, seconds: float):
    """Leaves `seconds` of non-training work (an evaluation) out of the training rates."""
    self._t0 += seconds

  def rates(self, step: int):
    elapsed = max(time.time() - self._t0, 1e-9)
    steps_per_s = (step - self._s0) / elapsed
    return steps_per_s, steps_per_s * self.images_per_step

  def update(self, step: int, extra: Optional[Dict[str, float]] = None, force: bool = False):
    if not self.enabled:
      return
    now = time.time()
    if not force and self.tty and now - self._last_print < 0.2:
      return
    if not force and not self.tty and now - self._last_print < self.LOG_EVERY_S:
      return
    self._last_print = now
    sps, ips = self.rates(step)
    eta = (self.total - step) / sps if sps > 0 else float('inf')
    frac = step / max(self.total, 1)
    filled = int(frac * self.width)
    bar = '█' * filled + '·' * (self.width - filled)
    tail = ' '.join(f'{k} {v:.4g}' for k, v in (extra or {}).items())
    line = (f'[{bar}] {step}/{self.total} {100 * frac:5.1f}% | {sps:.2f} step/s | '
            f'{ips:.0f} img/s | ETA {_fmt_duration(eta)} | {tail}')
    if self.tty:
      self.stream.write('\r' + line[:200].ljust(120))
    else:
      self.stream.write(line + '\n')
    self.stream.flush()

  def close(self):
    if self.enabled and self.tty:
      self.stream.write('\n')
      self.stream.flush()


def plot_curves(records, path: str) -> str:
  """Training loss and evaluation top-1 / top-5 against epochs (from the logged `records`), as
  one PNG."""
  plt = plotting.pyplot()

  train = [h for h in records if 'train/loss' in h]
  evals = [h for h in records if 'eval/anp_top1' in h]
  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.8))
  if train:
    ax_loss.plot([h['train/epoch'] for h in train], [h['train/loss'] for h in train], '-o', ms=2)
  ax_loss.set(xlabel='epoch', ylabel='training loss (all heads)', title='Training loss')
  ax_loss.grid(alpha=0.3)
  for head, style in (('anp', '-o'), ('adjective', '--'), ('noun', ':')):
    key = f'eval/{head}_top1'
    if evals and key in evals[0]:
      ax_acc.plot([h['eval/epoch'] for h in evals], [100 * h[key] for h in evals], style,
                  label=f'{head} top-1')
  if evals:
    ax_acc.plot([h['eval/epoch'] for h in evals], [100 * h['eval/anp_top5'] for h in evals],
                '-.', label='anp top-5')
  ax_acc.set(xlabel='epoch', ylabel='accuracy (%)', title='Evaluation', ylim=(0, 100))
  ax_acc.grid(alpha=0.3)
  ax_acc.legend(fontsize=8)
  return plotting.save_figure(fig, path)


def write_json_atomic(path: str, obj) -> None:
  """Writes `obj` as JSON to `path` via a temporary file and `os.replace`: readers see the old
  file or the complete new one, never a partial write (a crash leaves at most a .tmp file)."""
  tmp = f'{path}.tmp{os.getpid()}'
  try:
    with open(tmp, 'w') as f:
      json.dump(obj, f, indent=2)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
