"""Cheaper evaluations, the same numbers (issue 44, item 2): each batch's sums are added to the
split's running total inside the evaluation program (`EvalStep.add`), and a split's decoded
batches are kept in memory between evaluations (`pipeline.eval_batches`). Both must give, bit
for bit, what the previous evaluation gave: every batch's sums computed by one program, added
on the devices one leaf at a time (``jax.tree.map(jnp.add, ...)``), over the batches that
`pipeline.eval_dataset` yields."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from anp_jax import trainer
from anp_jax.data import pipeline
from conftest import tiny_config


def _previous_evaluate(evaluator, state):
  """The evaluation as it was before issue 44 (the loop of `PredictionEvaluator.evaluate`)."""
  run = evaluator.run
  ds = pipeline.eval_dataset(run.builder, run.config, split=evaluator.split,
                             per_process_batch=run.setup.eval_per_process_batch)
  total = None
  for batch in pipeline.global_batches(ds, to_device=run.executor.to_device):
    sums = evaluator._step(state, batch)  # pylint: disable=protected-access
    total = sums if total is None else jax.tree.map(jnp.add, total, sums)
  return {f'{evaluator.prefix}/{k}': float(v)
          for k, v in evaluator.finish(run.executor.fetch(total)).items()}


@pytest.mark.slow(20)
@pytest.mark.parametrize('overrides', [
    {},  # The jit executor (mesh, shard_map).
    {'executor': 'pmap'},
    {'method': 'async', 'noise_scale': False},
    {'method': 'local_sgd', 'noise_scale': False},
], ids=['jit', 'pmap', 'async', 'local_sgd'])
def test_both_splits_evaluate_exactly_as_before(data_dir, overrides):
  pipeline._eval_cache.clear()  # pylint: disable=protected-access
  config = tiny_config(data_dir, num_train_steps=3, **overrides)
  config.evals.test = dict(kind='classification', split='test')
  run = trainer.build(config)
  state = run.init_state()
  batches = run.train_batches()
  for step in range(3):  # A trained state: logits that differ between examples.
    state, _ = run.train_step(state, next(batches), step)
  assert sorted(run.evaluators) == ['eval', 'test']
  for prefix in ('eval', 'test'):
    evaluator = run.evaluators[prefix]
    assert evaluator.num_batches > 1  # Several batches: the accumulation is exercised.
    want = _previous_evaluate(evaluator, state)
    first = evaluator.evaluate(state)  # Decodes the split, keeps its batches.
    again = evaluator.evaluate(state)  # From the batches kept in memory.
    assert first == want, prefix
    assert again == want, prefix
  # One compiled evaluation serves both splits (same kind, same options, same shapes).
  assert run.evaluators['eval']._step is run.evaluators['test']._step  # pylint: disable=protected-access


def test_the_kept_batches_are_the_pipelines(data_dir, monkeypatch):
  pipeline._eval_cache.clear()  # pylint: disable=protected-access
  config = tiny_config(data_dir)
  builder = pipeline.get_builder(config)
  kw = dict(per_process_batch=8, split='validation')
  want = list(pipeline.global_batches(pipeline.eval_dataset(builder, config, **kw), dict))
  for _ in range(2):  # Decoded, then served from memory.
    got = list(pipeline.eval_batches(builder, config, to_device=lambda b: dict(b), **kw))
    assert len(got) == len(want) > 1
    for g, w in zip(got, want):
      assert g.keys() == w.keys()
      for key in w:
        np.testing.assert_array_equal(g[key], w[key])
  assert len(pipeline._eval_cache) == 1  # pylint: disable=protected-access
  # Another image size is another entry, never the kept one.
  config.image_size = config.image_size // 2
  small = next(pipeline.eval_batches(builder, config, to_device=lambda b: b, **kw))
  assert small['image'].shape[1] == config.image_size
  assert len(pipeline._eval_cache) == 2  # pylint: disable=protected-access
  # Without config.cache nothing is kept.
  pipeline._eval_cache.clear()  # pylint: disable=protected-access
  config.cache = False
  list(pipeline.eval_batches(builder, config, to_device=lambda b: b, **kw))
  assert not pipeline._eval_cache  # pylint: disable=protected-access
  # Nor with the switch off.
  config.cache = True
  monkeypatch.setenv(pipeline.EVAL_CACHE_SWITCH, '0')
  list(pipeline.eval_batches(builder, config, to_device=lambda b: b, **kw))
  assert not pipeline._eval_cache  # pylint: disable=protected-access
  monkeypatch.delenv(pipeline.EVAL_CACHE_SWITCH)
  list(pipeline.eval_batches(builder, config, to_device=lambda b: b, **kw))
  assert len(pipeline._eval_cache) == 1  # pylint: disable=protected-access
