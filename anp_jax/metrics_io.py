"""The trainer's log, ``workdir/metrics.jsonl``, read back without JAX.

One JSON object per line, ``{'step': int, 'time': float, '<kind>/<name>': float, ...}``, appended
by `anp_jax.metrics.MetricWriter` (on process 0). This module is the one reader of that file; it
imports only the standard library, so the planner (`anp_jax.research.plan`), the sweep reports
and any script read logs without importing JAX, TensorFlow or clu.
"""

import json
import os
from typing import Any, Dict, List, Mapping, Optional

METRICS_FILE = 'metrics.jsonl'


def record_kind(record: Mapping[str, Any]) -> str:
  """``'eval'`` for an evaluation record (any ``eval/`` key), else ``'train'``."""
  return 'eval' if any(k.startswith('eval/') for k in record) else 'train'


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
