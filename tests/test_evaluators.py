"""Evaluation through one seam (issue 33, item 2): config.evals lists the evaluations, each runs
through the `anp_jax.evaluators` interface at every evaluation step, a new kind is one class
registered from anywhere (here: this file), and target / best-checkpoint metrics may name any
evaluator's metric."""

import json
import os

import jax
import numpy as np
import pytest

from anp_jax import evaluators, setup, trainer
from anp_jax.errors import ConfigError
from conftest import tiny_config


@evaluators.register('test_param_norm')
class ParamNorm(evaluators.Evaluator):
  """A kind the library does not have: the L2 norm of the parameters (no data read)."""
  OPTIONS = {'scale': 1.0}

  @classmethod
  def metrics(cls, config, options):
    return {'l2': evaluators.Goal('min')}

  def evaluate(self, state):
    params = self.run.executor.unreplicate(state).params
    total = sum(float(np.sum(np.square(np.asarray(x, np.float64))))
                for x in jax.tree.leaves(params))
    return {f'{self.prefix}/l2': self.options['scale'] * total ** 0.5}

  @classmethod
  def summary(cls, prefix, metrics):
    return f'|params| {metrics[f"{prefix}/l2"]:.3f}'


def _config(data_dir, **overrides):
  config = tiny_config(data_dir, num_train_steps=4, eval_every_epochs=0.25, **overrides)
  # Three evaluations: the default on 'validation', the same kind on the training split, and
  # the kind registered above.
  config.evals.trainset = dict(kind='classification', split='train')
  config.evals.norm = dict(kind='test_param_norm', scale=2.0)
  return config


@pytest.fixture(scope='module')
def three_evals(data_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp('three_evals')
  config = _config(data_dir, keep_best_metric='trainset/loss', checkpoint_every_steps=2)
  return config, workdir, trainer.train_and_evaluate(config, str(workdir))


def test_every_evaluator_is_logged_in_one_record_at_every_evaluation(three_evals):
  config, workdir, result = three_evals
  records = [json.loads(l) for l in open(workdir / 'metrics.jsonl')]
  evals = [r for r in records if 'eval/anp_top1' in r]
  assert [r['step'] for r in evals] == [2, 4]
  for record in evals:
    assert {'eval/loss', 'trainset/anp_top1', 'trainset/loss', 'norm/l2',
            'eval/epoch'} <= set(record)
    assert not any(k.startswith('train/') for k in record)
  # The kind from this file saw the run's state: twice the parameters' norm at the end.
  params = result.state.params
  norm = sum(float(np.sum(np.square(np.asarray(x, np.float64))))
             for x in jax.tree.leaves(params)) ** 0.5
  assert result.final_eval['norm/l2'] == pytest.approx(2 * norm, rel=1e-6)
  assert json.load(open(workdir / 'final_metrics.json'))['trainset/anp_top1'] == (
      result.final_eval['trainset/anp_top1'])


def test_run_evaluate_is_the_default_classification_evaluation_or_a_given_split(three_evals):
  """Named as the trainer logs the split: the prefix of config.evals' evaluator of that split,
  else the split's own name (was: ``eval/`` for every split, so that a test-split result read as
  the validation one)."""
  config, _, result = three_evals
  run = trainer.build(config)
  assert run.evaluate(result.state) == {k: v for k, v in result.final_eval.items()
                                       if k.startswith('eval/') and 'epoch' not in k
                                       and 'passes' not in k and 'examples_seen' not in k}
  on_train = run.evaluate(result.state, split='train')  # config.evals.trainset's split.
  assert on_train == {k: v for k, v in result.final_eval.items() if k.startswith('trainset/')}
  assert on_train['trainset/anp_top1'] != result.final_eval['eval/anp_top1']
  on_test = run.evaluate(result.state, split='test')  # No evaluator of config.evals reads it.
  assert sorted(on_test) == sorted(k.replace('eval/', 'test/') for k in run.evaluate(result.state))
  assert run.evaluate(result.state, split='validation') == run.evaluate(result.state)


def test_run_evaluate_names_the_training_split_apart_from_the_training_metrics(data_dir):
  """'train/...' are the training metrics (config.evals refuses the prefix): the training split
  evaluated, without an evaluator of its own, is 'trainset/...'."""
  run = trainer.build(tiny_config(data_dir))
  record = run.evaluate(run.init_state(), split='train')
  assert 'trainset/anp_top1' in record and not any(k.startswith(('train/', 'eval/'))
                                                   for k in record)


def test_the_best_checkpoint_may_follow_any_evaluators_metric(three_evals):
  _, workdir, _ = three_evals
  records = [json.loads(l) for l in open(workdir / 'metrics.jsonl')]
  losses = {r['step']: r['trainset/loss'] for r in records if 'trainset/loss' in r}
  best = [int(n) for n in os.listdir(workdir / 'checkpoints_best') if n.isdigit()]
  assert best == [min(losses, key=losses.get)]  # Lower is better for a loss.


def test_the_target_may_be_any_evaluators_accuracy(data_dir, tmp_path, capsys):
  # Top-5 of 8 ANPs on the training split is far above 5 % at the first evaluation.
  config = _config(data_dir, target_metric='trainset/anp_top5', target_value=0.05,
                   stop_at_target=True)
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert int(jax.device_get(result.state.step)) == 2
  final = json.load(open(tmp_path / 'final_metrics.json'))
  assert final['stopped_at_target'] is True and final['trainset/anp_top5'] >= 0.05
  out = capsys.readouterr().out
  assert 'trainset/anp_top5 = ' in out and 'trainset: ANP top-1' in out
  assert 'norm: |params|' in out


@pytest.mark.parametrize('change,message', [
    (lambda c: c.evals.update({'x': dict(kind='nope')}), r"Unknown evaluator kind 'nope'; the "
     r"kinds are \[.*'classification'"),
    (lambda c: c.evals.update({'train': dict(kind='classification')}), "other than 'train'"),
    (lambda c: c.evals.update({'x': dict(kind='classification', splt='test')}),
     r"config.evals.x sets \['splt'\], which its kind does not use; the options of "
     r"'classification' are \['split'\]"),
    (lambda c: c.evals.update({'x': dict(split='test')}), 'config.evals.x has no kind'),
    (lambda c: c.evals.update({'x': dict(kind='classification', split='')}),
     r"config.evals.x.split=''"),
    (lambda c: setattr(c, 'evals', {}), 'config.evals is empty'),
    (lambda c: setattr(c, 'keep_best_metric', 'norm/l3'),
     r"keep_best_metric: 'norm/l3' is not a metric of config.evals; they are \['norm/l2'\]"),
    (lambda c: setattr(c, 'target_metric', 'norm/l2'), 'lower-is-better'),
])
def test_bad_evaluation_configs_fail_before_anything_runs(change, message):
  config = tiny_config('/nonexistent')
  config.evals.norm = dict(kind='test_param_norm')
  change(config)
  with pytest.raises(ConfigError, match=message):
    setup.validate_config(config)


def test_a_split_the_dataset_lacks_fails_before_the_workdir_is_written(data_dir, tmp_path):
  config = tiny_config(data_dir)
  config.evals.test = dict(kind='classification', split='tset')
  with pytest.raises(ConfigError, match=r"config.evals.test.split='tset': the dataset "
                     r"synthetic_anp has no such split; it has \['test', 'train', 'validation'\]"):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def test_summary_puts_eval_first_unlabelled():
  config = tiny_config('/nonexistent')
  config.evals.norm = dict(kind='test_param_norm')
  metrics = {'eval/anp_top1': 0.5, 'eval/anp_top5': 0.75, 'eval/loss': 1.25, 'norm/l2': 3.0}
  assert evaluators.summary(config, metrics) == (
      'ANP top-1 50.00% top-5 75.00% | loss 1.250; norm: |params| 3.000')


# ----------------------------------------------------------------------------------------------
# Issue 43, item 1: the classification evaluation on predictions.

PREVIOUS_STEP_VARIANTS = {'jit': {}, 'pmap': {'executor': 'pmap', 'bn_mode': 'per_device'},
                          'async': {'method': 'async', 'async_sgd.tau': 1,
                                    'async_sgd.max_tau': 2}}


@pytest.mark.parametrize('variant', sorted(PREVIOUS_STEP_VARIANTS))
def test_classification_is_bit_for_bit_the_evaluation_step_it_replaced(data_dir, variant):
  """The classification evaluator's sums (its metric code through `Executor.map_eval`) are, bit
  for bit, those of the per-device step the executors compiled for evaluation before
  (`steps.per_device_eval_step` without ``fn``, jitted over the mesh or pmapped), batch by batch,
  and its metrics are those sums divided once. (Checked once on every executor, local SGD and the
  device input backends included, against the previous version: every logged metric equal.)"""
  import functools
  from anp_jax import steps
  from anp_jax.data import pipeline
  from anp_jax.executors import common
  from anp_jax.metrics import summarize
  config = tiny_config(data_dir, **PREVIOUS_STEP_VARIANTS[variant])
  run = trainer.build(config)
  state = run.init_state()
  state, _ = run.train_step(state, next(run.train_batches()), 0)  # Not the initial parameters.
  evaluator = run.evaluators['eval']
  previous_fn = functools.partial(steps.per_device_eval_step, model=run.model, config=config)
  previous = (jax.pmap(previous_fn, axis_name=common.AXIS) if variant == 'pmap' else
              common.MeshHelper(run.mesh).jit_eval_step(previous_fn))
  ds = pipeline.eval_dataset(run.builder, config, split='validation',
                             per_process_batch=run.setup.eval_per_process_batch)
  total = None
  for batch in pipeline.global_batches(ds, to_device=run.executor.to_device):
    new, old = (run.executor.fetch(f(state, batch)) for f in (evaluator._step, previous))
    assert sorted(new) == sorted(old)
    for key in old:
      assert np.asarray(new[key]).tobytes() == np.asarray(old[key]).tobytes(), key
    total = old if total is None else {k: total[k] + old[k] for k in old}
  assert evaluator.evaluate(state) == summarize(total, 'eval')
