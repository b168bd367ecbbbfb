"""The full training loop (`trainer.train_and_evaluate`) as a contender: its steady-state rate
from the time stamps of its own metrics.jsonl, in a workdir that holds no earlier run."""

import contextlib
import os
import tempfile
import time
from typing import Any, Dict, Optional

from anp_jax import metrics_io


def _loop_rate(workdir: str, batch_size: int) -> Dict[str, float]:
  """Steady-state images/s of a finished run from its metrics.jsonl time stamps."""
  rows = [r for r in metrics_io.read_metrics(workdir, kind='train') if 'train/loss' in r]
  if len(rows) < 2:
    raise ValueError('The training loop logged fewer than two train lines; raise --steps or '
                     'lower --config.log_every_steps.')
  first, last = rows[0], rows[-1]
  steps = last['step'] - first['step']
  seconds = last['time'] - first['time']
  return {'images_per_s': steps * batch_size / seconds, 'step_time_median_s': seconds / steps,
          'timed_steps': int(steps), 'first_timed_step': int(first['step']),
          'loop_reported_images_per_s': float(last.get('train/images_per_s', float('nan')))}


# What a training run leaves in its workdir (`trainer`, `checkpointing`).
RUN_FILES = ('metrics.jsonl', 'final_metrics.json', 'checkpoints', 'checkpoints_best')


def check_loop_workdir(workdir: Optional[str]):
  """Raises `errors.ConfigError` (exit 2) if `workdir` already holds a training run.

  The trainer resumes whatever run it finds there: with the same settings it trains nothing and
  the rate would be the old run's, read from its metrics.jsonl; with more steps the timed window
  would span both invocations. A benchmark measures this invocation, so it needs a fresh one.
  """
  from anp_jax import errors
  if workdir is None:
    return
  found = [f for f in RUN_FILES if os.path.exists(os.path.join(workdir, f))]
  if found:
    raise errors.ConfigError(
        f'The loop workdir {workdir} already holds a training run ({", ".join(found)}): the '
        'trainer would resume it instead of timing a new one. Pass an empty or new --workdir '
        '(or none: a temporary directory), or delete that run.')


def measure_loop(config, steps: int, workdir: Optional[str] = None) -> Dict[str, Any]:
  """Runs `trainer.train_and_evaluate` and reads its steady-state rate from metrics.jsonl.

  The config's logging cadence L = ``log_every_steps`` is kept (a metric fetch syncs host and
  device, so the cadence is part of what the loop costs): the run lasts L + ceil(steps / L) * L
  steps and the timed window runs from the first log line (step L: compilation and warm-up are
  before it) to the last. Evaluation runs only at the end (after the window); the config's
  checkpoint cadence is kept.

  `workdir` (default: a temporary directory, deleted afterwards) keeps the loop's files for
  inspection. It must not hold a run already (`check_loop_workdir` raises a ValueError before
  anything is trained): the trainer would resume that run, and a rerun of the benchmark into the
  same directory would report the earlier run's rate without training a step. Refused rather
  than timed in a fresh subdirectory, so the files are always where the user pointed.
  """
  from anp_jax import trainer
  check_loop_workdir(workdir)
  c = config.copy_and_resolve_references()
  every = max(1, int(c.log_every_steps))
  c.num_train_steps = every * (1 + max(1, -(-steps // every)))
  c.eval_every_epochs = 0.0
  c.progress_bar = False
  with contextlib.ExitStack() as stack:
    if workdir is None:
      workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix='anp_bench_'))
    t0 = time.perf_counter()
    trainer.train_and_evaluate(c, workdir)
    wall = time.perf_counter() - t0
    out = _loop_rate(workdir, c.batch_size)
  out['wall_s'] = wall
  out['log_every_steps'] = every
  return out
