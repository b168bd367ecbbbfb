"""A model registered from this file alone (no library edit) is a valid ``config.model.name`` and
trains through every executor and method, checkpoints, resumes bit for bit and evaluates exactly:
the contract of docs/models.md."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from anp_jax import models, setup
from conftest import assert_resume_is_exact, direct_eval, leaves, tiny_config


class ToyConvNet(nn.Module):
  """Not a ResNet: one strided convolution, one BatchNorm, global pooling, the three heads."""
  heads: models.Heads
  norm: models.BatchNormSettings
  dtype: Any = jnp.float32
  features: int = 8

  @nn.compact
  def __call__(self, x, train: bool = True):
    x = nn.Conv(self.features, (3, 3), (2, 2), dtype=self.dtype, name='conv')(x.astype(self.dtype))
    x = nn.relu(self.norm.layer(train, self.dtype)(name='bn')(x))
    x = jnp.mean(x, axis=(1, 2)).astype(jnp.float32)
    logits = {'anp': nn.Dense(self.heads.num_anps, name='head_anp')(x)}
    if self.heads.num_adjectives:
      logits['adjective'] = nn.Dense(self.heads.num_adjectives, name='head_adjective')(x)
    if self.heads.num_nouns:
      logits['noun'] = nn.Dense(self.heads.num_nouns, name='head_noun')(x)
    return logits


class ToyMLP(nn.Module):
  """No BatchNorm at all (no 'batch_stats' collection): a hidden layer and the ANP head only."""
  num_anps: int

  @nn.compact
  def __call__(self, x, train: bool = True):
    x = nn.relu(nn.Dense(16, name='hidden')(x.reshape((x.shape[0], -1))))
    return {'anp': nn.Dense(self.num_anps, name='head_anp')(x)}


@models.register('toy_convnet', min_image_size=2, image_size=16, family='toy')
def toy_convnet(config, args: models.ModelArgs) -> nn.Module:
  return ToyConvNet(heads=args.heads, norm=args.norm, dtype=args.dtype,
                    features=config.model.get('toy_features', 8))


@models.register('toy_mlp', min_image_size=1)
def toy_mlp(config, args: models.ModelArgs) -> nn.Module:
  return ToyMLP(num_anps=args.heads.num_anps)


def _toy(data_dir, name='toy_convnet', **overrides):
  return tiny_config(data_dir, **{'model.name': name, 'schedule': 'constant',
                                  'checkpoint_every_steps': 2, 'log_every_steps': 1,
                                  **overrides})


def test_a_registered_model_is_a_valid_name_with_its_own_minimum_size(data_dir):
  assert 'toy_convnet' in setup.CHOICES['model.name'] and 'toy_mlp' in models.names()
  setup.validate_config(_toy(data_dir))
  with pytest.raises(ValueError, match=r'image_size=1 is too small for toy_convnet \(needs >= 2 '
                                       r'px\); .*accepts it \(toy_mlp\)'):
    setup.validate_config(_toy(data_dir, image_size=1))
  with pytest.raises(ValueError, match=r"config.model.name='toy_nope' is unknown; choose one of "
                                       r".*'toy_convnet'"):
    setup.validate_config(_toy(data_dir, **{'model.name': 'toy_nope'}))
  assert models.spec('toy_convnet').family == 'toy'


VARIANTS = {
    'jit': dict(),
    'jit_global_bn': dict(bn_mode='global'),
    'pmap': dict(executor='pmap', bn_mode='per_device'),
    'async': dict(method='async', **{'async_sgd.tau': 1, 'async_sgd.max_tau': 2}),
    'local_sgd': dict(method='local_sgd', **{'local_sgd.nodes': 2, 'local_sgd.sync_every': 2}),
}


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_a_toy_model_trains_resumes_and_evaluates_with_every_executor(data_dir, tmp_path, capsys,
                                                                      variant):
  make = lambda n: _toy(data_dir, num_train_steps=n, **VARIANTS[variant])
  whole, resumed = assert_resume_is_exact(make, 4, 2, tmp_path, capsys)
  assert set(whole.state.params) == {'conv', 'bn', 'head_anp', 'head_adjective', 'head_noun'}
  config = make(4)
  model = models.create_model(config, models.Heads(8, 4, 4))
  fresh = model.init(jax.random.key(config.seed), jnp.zeros((1, 16, 16, 3)), train=False)
  for collection in ('params', 'batch_stats'):  # It trained: parameters and statistics moved.
    for new, old in zip(leaves(getattr(whole.state, collection)), leaves(fresh[collection]),
                        strict=True):
      assert new.shape == old.shape and not np.array_equal(new, old)
  final = whole.final_eval
  assert np.isfinite(final['eval/loss']) and 0.0 <= final['eval/anp_top1'] <= 1.0
  assert final.keys() >= {'eval/adjective_top1', 'eval/noun_top1'}
  if variant in ('jit', 'jit_global_bn', 'pmap'):  # Exact evaluation: every example once.
    direct = direct_eval(make(4), whole.state.params, whole.state.batch_stats)
    for key in ('eval/anp_top1', 'eval/adjective_top1', 'eval/noun_top1'):
      assert final[key] == direct[key], key
    np.testing.assert_allclose(final['eval/loss'], direct['eval/loss'], rtol=1e-5)


def test_a_model_without_batchnorm_trains_and_resumes(data_dir, tmp_path, capsys):
  make = lambda n: _toy(data_dir, 'toy_mlp', num_train_steps=n)
  whole, _ = assert_resume_is_exact(make, 4, 2, tmp_path, capsys)
  assert not jax.tree.leaves(whole.state.batch_stats)
  assert set(whole.final_eval) >= {'eval/anp_top1', 'eval/loss'}
  assert 'eval/noun_top1' not in whole.final_eval  # The model has the ANP head only.


def test_freeze_reaches_a_registered_model_through_its_norm_settings(data_dir, tmp_path):
  # config.freeze freezes the toy model's BatchNorm (built with args.norm.layer) as it does a
  # ResNet's: the same output in train and eval mode, parameters and statistics unchanged.
  from anp_jax import trainer
  config = _toy(data_dir, freeze='conv/.*|bn/.*', num_train_steps=2, checkpoint_every_steps=0)
  model = models.create_model(config, models.Heads(8, 4, 4))
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 16, 16, 3)), jnp.float32)
  variables = model.init(jax.random.key(0), x, train=False)
  train, _ = model.apply(variables, x, train=True, mutable=['batch_stats'])
  for head, logits in model.apply(variables, x, train=False).items():
    np.testing.assert_array_equal(train[head], logits, err_msg=head)
  result = trainer.train_and_evaluate(config, str(tmp_path))
  fresh = model.init(jax.random.key(config.seed), jnp.zeros((1, 16, 16, 3)), train=False)
  for collection in ('params', 'batch_stats'):
    for name in ('conv', 'bn'):
      for got, want in zip(leaves(getattr(result.state, collection).get(name, {})),
                           leaves(fresh[collection].get(name, {})), strict=True):
        np.testing.assert_array_equal(got, want, err_msg=f'{collection}/{name}')
  assert not np.array_equal(result.state.params['head_anp']['kernel'],
                            fresh['params']['head_anp']['kernel'])
