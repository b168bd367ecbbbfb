"""The trainer's log, ``workdir/metrics.jsonl``, read back without JAX.

One JSON object per line, ``{'step': int, 'time': float, '<kind>/<name>': float, ...}``, appended
by `anp_jax.metrics.MetricWriter` (on process 0). This module is the one reader of that file; it
imports only the standard library, so the planner (`anp_jax.research.planner`), the sweep reports
and any script read logs without importing JAX, TensorFlow or clu. `target_crossing` is where a
run's evaluations reach a target: the one definition of "steps to target" for the sweep
(`anp_jax.research.sweep`) and the planner's pilot alike.
"""

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from anp_jax.configs import default as default_config

METRICS_FILE = 'metrics.jsonl'


def record_kind(record: Mapping[str, Any]) -> str:
  """``'train'`` for a training record (any ``train/`` key), else ``'eval'``: an evaluation
  record holds every evaluator's ``<prefix>/...`` metrics (config.evals), whatever the prefixes."""
  return 'train' if any(k.startswith('train/') for k in record) else 'eval'


def read_metrics(workdir: str, kind: Optional[str] = None) -> List[Dict[str, Any]]:
  """The records of ``workdir/metrics.jsonl``, one per (step, kind), sorted by step (train
  before eval at the same step); only those of `kind` (``'train'`` / ``'eval'``) if given.

  A run resumed from a checkpoint logs the steps after that checkpoint again (the writer
  appends; resume is exact), so the later record replaces the earlier one. A line cut short by a
  kill is skipped. No file: no records.
  """
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  latest = {}
  with open(path) as f:
    for line in filter(None, map(str.strip, f)):
      try:
        record = json.loads(line)
      except ValueError:
        continue
      latest[(int(record['step']), record_kind(record) == 'eval')] = record
  return [latest[key] for key in sorted(latest)
          if kind is None or record_kind(latest[key]) == kind]


def target_crossing(evals: Sequence[Mapping[str, Any]], target: float,
                    metric: str = default_config.DEFAULT_TARGET_METRIC
                    ) -> Optional[Dict[str, Any]]:
  """Where a run's evaluations first reach `target`: {'step', 'eval_step', 'interpolated'}.

  Evaluations are points, every few thousand examples; the first one at or above the target
  over-states the steps by up to one evaluation interval (±17 % at the small batches of the cpu
  preset), which biases the B_crit fit. So the crossing is interpolated linearly in (step,
  accuracy) between the last evaluation below the target and the first at or above it:
  ``step = s0 + (target - a0) / (a1 - a0) * (s1 - s0)``. When already the first evaluation
  reaches the target there is nothing to interpolate from: its step is returned (an upper bound;
  ``interpolated`` False). None if the target is never reached. `evals` in step order; records
  without `metric` (e.g. the train records of `read_metrics`) are skipped. `metric`: the run's
  config.target_metric (the default is that field's default).
  """
  previous = None
  for record in evals:
    if metric not in record:
      continue
    step, value = float(record['step']), float(record[metric])
    if value >= target:
      if previous is None or previous[0] >= step:
        return {'step': step, 'eval_step': int(record['step']), 'interpolated': False}
      s0, a0 = previous
      crossing = s0 + (target - a0) / (value - a0) * (step - s0)
      return {'step': crossing, 'eval_step': int(record['step']), 'interpolated': True}
    previous = (step, value)
  return None
