"""Exact classification evaluation of one split: ``{'kind': 'classification', 'split': ...}``.

Every example of the split counted once: each process reads its shard
(`anp_jax.data.pipeline.eval_dataset`), padded to the same number of batches on every process
with masked examples; the compiled per-device step (`anp_jax.steps.per_device_eval_step`)
returns metric *sums* over the unmasked examples, added over batches and divided once
(`anp_jax.metrics.summarize`). Metrics per head of the model: ``<head>_top1``, ``<head>_top5``,
``<head>_loss``, and ``loss`` (the weighted multi-task loss), e.g. ``eval/anp_top1``.
"""

from typing import Any, Dict, Mapping

import jax
import jax.numpy as jnp

from anp_jax.data import pipeline
from anp_jax.errors import ConfigError
from anp_jax.evaluators import Evaluator, Goal, register
from anp_jax.metrics import HEADS, summarize

ACCURACY = Goal('max', 1.0)
LOSS = Goal('min', 0.0)


def heads(config):
  """The model's heads (the ANP head always; the others unless switched off)."""
  return [h for h in HEADS if h == 'anp' or config.model.get(f'{h}_head', True)]


@register('classification')
class Classification(Evaluator):
  OPTIONS = {'split': 'validation'}

  @classmethod
  def check_options(cls, config, prefix: str, options: Mapping[str, Any]) -> None:
    if not isinstance(options['split'], str) or not options['split']:
      raise ConfigError(f'config.evals.{prefix}.split={options["split"]!r}: name a split of the '
                        "dataset, e.g. 'validation'.")

  @classmethod
  def metrics(cls, config, options: Mapping[str, Any]) -> Dict[str, Goal]:
    out = {'loss': LOSS}
    for head in heads(config):
      out.update({f'{head}_top1': ACCURACY, f'{head}_top5': ACCURACY, f'{head}_loss': LOSS})
    return out

  def __init__(self, prefix: str, options: Mapping[str, Any], run):
    super().__init__(prefix, options, run)
    self.split = options['split']
    splits = run.builder.info.splits
    if self.split not in splits:
      raise ConfigError(f'config.evals.{prefix}.split={self.split!r}: the dataset '
                        f'{run.builder.name} has no such split; it has {sorted(splits)}.')
    size = splits[self.split].num_examples
    if size < run.setup.process_count:
      raise ConfigError(f'config.evals.{prefix}: the split {self.split!r} has {size} examples, '
                        f'fewer than the {run.setup.process_count} processes.')
    self.num_batches = pipeline.num_eval_batches(size, run.setup.process_count,
                                                 run.setup.eval_per_process_batch)

  def evaluate(self, state) -> Dict[str, float]:
    run = self.run
    ds = pipeline.eval_dataset(run.builder, run.config, split=self.split,
                               per_process_batch=run.setup.eval_per_process_batch)
    total, n = None, 0
    for batch in pipeline.global_batches(ds, to_device=run.executor.to_device):
      sums = run.executor.eval_step(state, batch)
      total = sums if total is None else jax.tree.map(jnp.add, total, sums)
      n += 1
    if n != self.num_batches:  # Every process must run the same number of collectives.
      raise RuntimeError(f'Evaluation of {self.split!r} produced {n} batches, expected '
                         f'{self.num_batches}.')
    return summarize(run.executor.fetch(total), self.prefix)

  @classmethod
  def summary(cls, prefix: str, metrics: Mapping[str, float]) -> str:
    if f'{prefix}/anp_top1' not in metrics:
      return ''
    pct = lambda name: f'{100 * metrics[f"{prefix}/{name}"]:.2f}%'
    parts = [f'ANP top-1 {pct("anp_top1")} top-5 {pct("anp_top5")}']
    parts += [f'{head} top-1 {pct(f"{head}_top1")}' for head in HEADS[1:]
              if f'{prefix}/{head}_top1' in metrics]
    return ', '.join(parts) + f' | loss {metrics[f"{prefix}/loss"]:.3f}'
