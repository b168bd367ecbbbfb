"""Calibration of one head's confidence: ``{'kind': 'calibration', 'split': ..., 'bins': 15,
'head': 'anp'}``.

The expected calibration error (Naeini et al. 2015; Guo et al. 2017): the examples binned by
their top-1 confidence (the largest softmax probability) into ``bins`` equal-width bins of
[0, 1]; ``ece`` = sum over the bins of |accuracy - mean confidence| weighted by the bin's share
of the examples, ``mce`` the largest of those gaps. 0 is perfect calibration. Exact over the
split, as every `PredictionEvaluator`: per bin, the example count, the summed confidence and the
hits are added over every example and divided once.
"""

from typing import Any, Dict, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from anp_jax.errors import ConfigError
from anp_jax.evaluators import Goal, Option, PredictionEvaluator, register
from anp_jax.evaluators.classification import heads
from anp_jax.metrics import HEADS, LABEL_OF


@register('calibration')
class Calibration(PredictionEvaluator):
  OPTIONS = {'split': 'validation',
             'bins': Option(15, 'integer >= 1', 'equal-width confidence bins of [0, 1]'),
             'head': Option('anp', choices=HEADS, doc='the head whose confidence is measured')}

  @classmethod
  def check_options(cls, config, prefix: str, options: Mapping[str, Any]) -> None:
    super().check_options(config, prefix, options)
    if options['head'] not in heads(config):
      raise ConfigError(f'config.evals.{prefix}.head={options["head"]!r}: the model has no such '
                        f'head (switched off); use one of {heads(config)}.')

  @classmethod
  def metrics(cls, config, options: Mapping[str, Any]) -> Dict[str, Goal]:
    return {'ece': Goal('min', 0.0), 'mce': Goal('min', 0.0)}

  def sums(self, outputs, batch):
    head, bins = self.options['head'], self.options['bins']
    logits = outputs[head].astype(jnp.float32)
    confidence = jnp.max(jax.nn.softmax(logits), axis=-1)
    hit = (jnp.argmax(logits, axis=-1) == batch[LABEL_OF[head]]).astype(jnp.float32)
    index = jnp.minimum((confidence * bins).astype(jnp.int32), bins - 1)
    in_bin = jax.nn.one_hot(index, bins) * batch['mask'][:, None]  # Padding: in no bin.
    return {'count': jnp.sum(in_bin, 0), 'confidence': jnp.sum(in_bin * confidence[:, None], 0),
            'hits': jnp.sum(in_bin * hit[:, None], 0)}

  def finish(self, sums) -> Dict[str, float]:
    count = np.asarray(sums['count'], np.float64)
    gap = np.abs(np.asarray(sums['hits'], np.float64) - np.asarray(sums['confidence'],
                                                                   np.float64))
    filled = count > 0
    return {'ece': float(gap.sum() / max(count.sum(), 1.0)),
            'mce': float(np.max(gap[filled] / count[filled])) if filled.any() else 0.0}

  @classmethod
  def summary(cls, prefix: str, metrics: Mapping[str, float]) -> str:
    return f'ECE {metrics[f"{prefix}/ece"]:.4f}'
