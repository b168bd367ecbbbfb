"""Exact classification evaluation of one split: ``{'kind': 'classification', 'split': ...}``.

A `PredictionEvaluator`: per device, the metric *sums* over the unmasked examples of
`anp_jax.steps.head_metrics` (the same function the training step logs with); over the split,
added on the devices and divided once (`anp_jax.metrics.summarize`). Metrics per head of the
model: ``<head>_top1``, ``<head>_top5``, ``<head>_loss``, and ``loss`` (the weighted multi-task
loss), e.g. ``eval/anp_top1``. The per-device program is the one the executors compiled for
evaluation before evaluators got predictions, so the metrics are bit for bit those
(tests/test_evaluators.py).
"""

from typing import Any, Dict, Mapping

from anp_jax import steps
from anp_jax.evaluators import Goal, PredictionEvaluator, register
from anp_jax.metrics import HEADS, summarize

ACCURACY = Goal('max', 1.0)
LOSS = Goal('min', 0.0)


def heads(config):
  """The model's heads (the ANP head always; the others unless switched off)."""
  return [h for h in HEADS if h == 'anp' or config.model.get(f'{h}_head', True)]


@register('classification')
class Classification(PredictionEvaluator):
  OPTIONS = {'split': 'validation'}

  @classmethod
  def metrics(cls, config, options: Mapping[str, Any]) -> Dict[str, Goal]:
    out = {'loss': LOSS}
    for head in heads(config):
      out.update({f'{head}_top1': ACCURACY, f'{head}_top5': ACCURACY, f'{head}_loss': LOSS})
    return out

  def sums(self, outputs, batch):
    return steps.head_metrics(outputs, batch, self.run.config, mask=batch['mask'])[1]

  def finish(self, sums) -> Dict[str, float]:
    return summarize(sums)

  @classmethod
  def summary(cls, prefix: str, metrics: Mapping[str, float]) -> str:
    if f'{prefix}/anp_top1' not in metrics:
      return ''
    pct = lambda name: f'{100 * metrics[f"{prefix}/{name}"]:.2f}%'
    parts = [f'ANP top-1 {pct("anp_top1")} top-5 {pct("anp_top5")}']
    parts += [f'{head} top-1 {pct(f"{head}_top1")}' for head in HEADS[1:]
              if f'{prefix}/{head}_top1' in metrics]
    return ', '.join(parts) + f' | loss {metrics[f"{prefix}/loss"]:.3f}'
