"""What a run logs and how it is written (read back by `anp_jax.metrics_io`).

* **Names.** The model's heads (`HEADS`) and the batch field of each head's labels (`LABEL_OF`):
  every logged metric is ``train/<head>_<metric>`` or ``eval/<head>_<metric>`` (plus ``loss``).
* **Summaries.** The steps return metric *sums* (``count`` examples, summed losses and hits), so
  that they add exactly over devices, micro-batches, logged steps and evaluation batches;
  `summarize` divides once at the end. A key starting with ``_`` is already a value (e.g. the
  gradient norm), not a sum, and is logged without the underscore.
* **Writers.** `MetricWriter`: TensorBoard event files (``tf.summary`` scalars, as clu's writer
  wrote them; clu itself is not used: its writer imports Keras through TensorBoard's hparams
  plugin: with it, a training process's imports took 0.7 s more CPU) and one JSON line per write in
  ``workdir/metrics.jsonl``, on process 0 only.
* **Reader.** `anp_jax.metrics_io.read_metrics(workdir)` (no JAX there, so that the planner and
  the reports read logs without it): the records of ``metrics.jsonl`` as the trainer meant them.
"""

import json
import os
import time
from typing import Any, Dict, Mapping, Optional

import jax

from anp_jax.metrics_io import METRICS_FILE

HEADS = ('anp', 'adjective', 'noun')
LABEL_OF = {'anp': 'label_anp', 'adjective': 'label_adjective', 'noun': 'label_noun'}


def summarize(sums: Dict[str, Any], prefix: str = '') -> Dict[str, float]:
  """Metric sums → means (``loss``, ``anp_top1``, ...), with ``prefix/`` (none for '')."""
  sums = {k: float(v) for k, v in sums.items()}
  count = max(sums.pop('count'), 1.0)
  name = (lambda k: f'{prefix}/{k}') if prefix else (lambda k: k)
  out = {name(k): v / count for k, v in sums.items() if not k.startswith('_')}
  for k, v in sums.items():
    if k.startswith('_'):  # Already a value, not a sum (e.g. the noise scale).
      out[name(k[1:])] = v
  return out


class MetricWriter:
  """TensorBoard event files + ``metrics.jsonl`` in the workdir, on process 0 only."""

  def __init__(self, workdir: str, enabled: Optional[bool] = None):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self._tb = self._jsonl = None
    if self.enabled:
      from anp_jax.tf_import import tf  # Only where events are written.
      self._summary = tf.summary
      self._tb = tf.summary.create_file_writer(workdir)
      self._jsonl = open(os.path.join(workdir, METRICS_FILE), 'a')

  def write(self, step: int, metrics: Mapping[str, float]):
    if not self.enabled:
      return
    scalars = {k: float(v) for k, v in metrics.items()}
    with self._tb.as_default():
      for name, value in scalars.items():
        self._summary.scalar(name, value, step=int(step))
    self._jsonl.write(json.dumps({'step': int(step), 'time': time.time(), **scalars}) + '\n')
    self._jsonl.flush()

  def close(self):
    if self.enabled:
      self._tb.flush()
      self._tb.close()
      self._jsonl.close()
