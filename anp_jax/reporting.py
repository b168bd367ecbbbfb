"""What the user sees of a run: terminal lines, the progress bar, curves and atomic JSON files.

Process 0 writes; the metric writers are in `anp_jax.metrics`, the metrics.jsonl reader in
`anp_jax.metrics_io`.
`say` is the one way the library writes a line for the user: it is logged (absl logging, every
process) and, on process 0, printed to stdout, where the progress bar (stderr) leaves room for
it. Diagnostics that the user need not read go to logging alone.

On a terminal the bar is a line redrawn in place, without a newline: whatever is written next
would continue it ("...| ETA 0m49s | W1205 12:00:01 ..."). So the bar erases itself before any
`say` line or log record (a filter on the logging handlers, `_BarLineFilter`), and is drawn again
at its next update.
"""

import contextlib
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
  """Logs `message` and, on process 0, prints it to stdout (the run's report to the user).

  Printed once: process 0 logs it at INFO at most (a WARNING would also reach the terminal
  through absl's handler, as a second copy with a ``W1205 ... file.py:123]`` prefix); the other
  processes, which print nothing, log it at `level`."""
  if jax.process_index() != 0:
    logging.log(level, message)
    return
  logging.log(min(level, logging.INFO), message)
  erase_progress_bar()
  print(message, flush=True)


_drawn_bar: Optional['ProgressBar'] = None  # The bar whose line is on the terminal, unfinished.


def erase_progress_bar() -> None:
  """Erases the progress bar's unfinished terminal line, if one is drawn, so that what is written
  next starts at the beginning of a line; the bar is drawn again at its next update."""
  global _drawn_bar
  bar, _drawn_bar = _drawn_bar, None
  if bar is not None:
    bar.erase()


class _BarLineFilter(logging.Filter):
  """On the logging handlers while a bar is drawn: erases it before a record is written."""

  def filter(self, record: logging.LogRecord) -> bool:
    erase_progress_bar()
    return True


_BAR_LINE_FILTER = _BarLineFilter()


def _filter_log_handlers() -> None:
  """Puts `_BAR_LINE_FILTER` on the handlers that write log records (the root logger's: absl's
  handler once `absl.app` runs, and absl's own before that), once each."""
  from absl import logging as absl_logging
  for handler in logging.getLogger().handlers + [absl_logging.get_absl_handler()]:
    if _BAR_LINE_FILTER not in handler.filters:
      handler.addFilter(_BAR_LINE_FILTER)


# orbax, asked for the metadata of a checkpoint's item folder (``<step>/state``, what anp_jax
# reads when it restores without a CheckpointManager), looks for the checkpoint-level metadata
# there too; that file lives one level up, and orbax warns "Metadata file does not exist" on
# every such read (twice per fine-tuning run of experiments/finetune.py). Nothing is missing.
ORBAX_ITEM_METADATA = 'Metadata file does not exist'


class _DropMessages(logging.Filter):
  """Drops the records whose message (its format string) starts with one of `starts`."""

  def __init__(self, starts):
    super().__init__()
    self.starts = tuple(starts)

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(self.starts)


@contextlib.contextmanager
def hidden_log_messages(*starts: str):
  """Within the block, drops the log records of absl logging (what orbax logs through) whose
  message starts with one of `starts`: a library's notice known to be noise in that call, and
  only there."""
  logger = logging.getLogger('absl')
  dropped = _DropMessages(starts)
  logger.addFilter(dropped)
  try:
    yield
  finally:
    logger.removeFilter(dropped)


def _fmt_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return '?'
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}h{m:02d}m' if h else f'{m}m{s:02d}s'


class ProgressBar:
  """One-line progress with steps/s, images/s, ETA and the latest logged loss and top-1.

  On a terminal the line is redrawn in place (and erased before other output: see the module
  docstring); otherwise (a log file, SLURM output) a plain line is written at most every
  `LOG_EVERY_S` seconds, never cursor-control characters. The loss and top-1 are the last ones
  given (`update`'s ``extra``, at each logged step), shown until the next ones.
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
    self._extra: Dict[str, float] = {}  # The latest values given, shown on every line.
    self._width_drawn = 0  # Characters of the unfinished line on the terminal (0: none).

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
    if extra:
      self._extra = dict(extra)
    sps, ips = self.rates(step)
    eta = (self.total - step) / sps if sps > 0 else float('inf')
    frac = step / max(self.total, 1)
    filled = int(frac * self.width)
    bar = '█' * filled + '·' * (self.width - filled)
    tail = ' '.join(f'{k} {v:.4g}' for k, v in self._extra.items())
    line = (f'[{bar}] {step}/{self.total} {100 * frac:5.1f}% | {sps:.2f} step/s | '
            f'{ips:.0f} img/s | ETA {_fmt_duration(eta)} | {tail}').rstrip()
    if self.tty:
      global _drawn_bar
      if _drawn_bar is not None and _drawn_bar is not self:
        erase_progress_bar()
      _filter_log_handlers()
      line = line[:200].ljust(self._width_drawn)
      self.stream.write('\r' + line)
      self._width_drawn = len(line)
      _drawn_bar = self
    else:
      self.stream.write(line + '\n')
    self.stream.flush()

  def erase(self):
    """Blanks the unfinished line on the terminal and returns to its start (see
    `erase_progress_bar`)."""
    if self._width_drawn:
      self.stream.write('\r' + ' ' * self._width_drawn + '\r')
      self.stream.flush()
      self._width_drawn = 0

  def close(self):
    """Ends the bar's line (it stays on the terminal); the next update starts a new one."""
    global _drawn_bar
    if self.enabled and self.tty and self._width_drawn:
      self.stream.write('\n')
      self.stream.flush()
    self._width_drawn = 0
    if _drawn_bar is self:
      _drawn_bar = None


# What the accuracy panel of `plot_curves` draws of each evaluator (a classification's heads).
_ACCURACIES = (('anp_top1', 'anp top-1', '-o'), ('adjective_top1', 'adjective top-1', '--'),
               ('noun_top1', 'noun top-1', ':'), ('anp_top5', 'anp top-5', '-.'))
# Keys of an evaluation record that are the run's progress, not an evaluator's metric.
_PROGRESS = ('eval/epoch', 'eval/passes', 'eval/examples_seen')


def _evaluator_metrics(evals):
  """{prefix: [metric names]} of every evaluator in the evaluation records `evals`, in order."""
  out: Dict[str, list] = {}
  for record in evals:
    for key in record:
      prefix, sep, name = key.partition('/')
      if sep and prefix != 'train' and key not in _PROGRESS and name not in out.get(prefix, ()):
        out.setdefault(prefix, []).append(name)
  return {p: out[p] for p in sorted(out)}


def plot_curves(records, path: str) -> str:
  """The logged `records` against epochs, as one PNG: the training loss with every evaluator's
  ``loss``; every evaluator's accuracies (``<prefix>/<head>_top1``, ``<prefix>/anp_top5``, one
  colour per evaluator); and, in a third panel when there are any, the evaluators' other
  metrics (those of evaluator kinds other than classification). Every evaluator of config.evals
  is drawn, whatever its prefix."""
  plt = plotting.pyplot()

  train = [h for h in records if 'train/loss' in h]
  evals = [h for h in records if 'eval/epoch' in h]  # `Setup.progress`: every evaluation.
  by_prefix = _evaluator_metrics(evals)
  other = [f'{p}/{m}' for p, names in by_prefix.items() for m in names
           if not (m == 'loss' or m.endswith(('_loss', '_top1', '_top5')))]
  fig, axes = plt.subplots(1, 3 if other else 2, figsize=(15 if other else 10, 3.8))
  ax_loss, ax_acc = axes[:2]

  def curve(ax, key, style, **kw):
    points = [h for h in evals if key in h]
    if points:
      ax.plot([h['eval/epoch'] for h in points], [h[key] for h in points], style, **kw)

  if train:
    ax_loss.plot([h['train/epoch'] for h in train], [h['train/loss'] for h in train], '-o', ms=2,
                 label='train')
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  for i, (prefix, names) in enumerate(by_prefix.items()):
    color = colors[(i + 1) % len(colors)]  # The first colour is the training loss's.
    if 'loss' in names:
      curve(ax_loss, f'{prefix}/loss', '--', color=color, label=prefix)
    for name, label, style in _ACCURACIES:
      if name in names:
        points = [h for h in evals if f'{prefix}/{name}' in h]
        ax_acc.plot([h['eval/epoch'] for h in points],
                    [100 * h[f'{prefix}/{name}'] for h in points], style, color=color,
                    label=f'{prefix}: {label}')
  ax_loss.set(xlabel='epoch', ylabel='loss (all heads)', title='Loss')
  ax_acc.set(xlabel='epoch', ylabel='accuracy (%)', title='Evaluation accuracy', ylim=(0, 100))
  for ax in axes[:2]:
    ax.grid(alpha=0.3)
    if ax.get_lines():
      ax.legend(fontsize=8)
  if other:
    ax_other = axes[2]
    for key in other:
      curve(ax_other, key, '-o', ms=2, label=key)
    ax_other.set(xlabel='epoch', title='Other evaluation metrics')
    ax_other.grid(alpha=0.3)
    ax_other.legend(fontsize=8)
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
