"""Learning-rate scaling rules, warmup and decay schedules, weight-decay masks, optimizers."""

import jax.numpy as jnp
import numpy as np
import pytest

from anp_jax import optim
from anp_jax.configs import default


def _cfg(**kw):
  c = default.get_config()
  c.update(kw)
  return c


@pytest.mark.parametrize('rule,expected', [('linear', 0.4), ('sqrt', 0.2 * 2 ** 0.5),
                                           ('none', 0.2)])
def test_scaling_rules(rule, expected):
  assert optim.scaled_lr(_cfg(batch_size=512, base_lr=0.2, lr_scaling=rule,
                              base_batch_size=256)) == pytest.approx(expected)


def test_goyal_linear_rule_at_8k():
  c = _cfg(batch_size=8192, base_lr=0.1, lr_scaling='linear', base_batch_size=256)
  assert optim.scaled_lr(c) == pytest.approx(3.2)


def test_warmup_then_cosine():
  c = _cfg(batch_size=256, base_lr=0.1, warmup_epochs=2, schedule='cosine')
  s = optim.create_lr_schedule(c, steps_per_epoch=10, total_steps=100)
  assert float(s(0)) == pytest.approx(0.1 / 20)
  assert float(s(9)) == pytest.approx(0.05, rel=0.06)
  assert float(s(19)) == pytest.approx(0.1)
  assert float(s(20)) == pytest.approx(0.1)
  assert float(s(60)) == pytest.approx(0.05, rel=1e-3)  # Half-way through the cosine.
  assert float(s(100)) == pytest.approx(0.0, abs=1e-7)
  values = [float(s(i)) for i in range(20)]
  assert np.all(np.diff(values) > 0)


def test_step_decay_boundaries_in_epochs():
  c = _cfg(batch_size=256, base_lr=0.1, warmup_epochs=0, schedule='step', step_epochs=(3, 6),
           step_factor=0.1)
  s = optim.create_lr_schedule(c, steps_per_epoch=10, total_steps=90)
  assert [float(s(i)) for i in (0, 29, 30, 59, 60)] == pytest.approx(
      [0.1, 0.1, 0.01, 0.01, 0.001])


def test_weight_decay_skips_batchnorm_and_biases():
  params = {'conv': {'kernel': jnp.ones((3, 3, 2, 2))}, 'bn': {'scale': jnp.ones(2),
                                                               'bias': jnp.ones(2)},
            'dense': {'kernel': jnp.ones((2, 2)), 'bias': jnp.ones(2)}}
  mask = optim.decay_mask(params)
  assert mask == {'conv': {'kernel': True}, 'bn': {'scale': False, 'bias': False},
                  'dense': {'kernel': True, 'bias': False}}
  c = _cfg(optimizer='sgd', momentum=0.0, weight_decay=0.5, schedule='constant',
           warmup_epochs=0, base_lr=1.0, batch_size=256)
  tx = optim.create_optimizer(c, optim.create_lr_schedule(c, 1, 1))
  zero = {k: {n: jnp.zeros_like(v) for n, v in d.items()} for k, d in params.items()}
  updates, _ = tx.update(zero, tx.init(params), params)
  assert float(updates['conv']['kernel'][0, 0, 0, 0]) == pytest.approx(-0.5)
  assert float(updates['bn']['scale'][0]) == 0.0
  assert float(updates['dense']['bias'][0]) == 0.0


@pytest.mark.parametrize('name', optim.OPTIMIZERS)
def test_every_optimizer_builds_and_steps(name):
  c = _cfg(optimizer=name, schedule='constant', warmup_epochs=0)
  tx = optim.create_optimizer(c, optim.create_lr_schedule(c, 1, 1))
  params = {'w': jnp.ones((2, 2)), 'b': jnp.ones(2)}
  updates, _ = tx.update({'w': jnp.ones((2, 2)), 'b': jnp.ones(2)}, tx.init(params), params)
  assert np.all(np.isfinite(np.asarray(updates['w'])))
  assert float(jnp.abs(updates['w']).sum()) > 0


def test_unknown_names_rejected():
  with pytest.raises(ValueError, match='lr_scaling'):
    optim.scaled_lr(_cfg(lr_scaling='cubic'))
  with pytest.raises(ValueError, match='optimizer'):
    optim.create_optimizer(_cfg(optimizer='rmsprop'), lambda s: 0.1)


def test_lamb_trust_ratio_skips_batchnorm_and_biases():
  # One LAMB step by hand (You et al. 2020): Adam direction, + weight decay on kernels, then the
  # layer-wise trust ratio |w| / |u| on kernels only; BN scales/offsets and biases (1-D) take
  # the plain Adam step, as in reference LAMB and this project's LARS.
  lr, wd, eps = 0.5, 0.1, 1e-6
  c = _cfg(optimizer='lamb', schedule='constant', warmup_epochs=0, base_lr=lr,
           batch_size=256, base_batch_size=256, weight_decay=wd)
  tx = optim.create_optimizer(c, optim.create_lr_schedule(c, 1, 1))
  params = {'kernel': jnp.array([[1.0, -2.0], [0.5, 3.0]]), 'bias': jnp.array([3.0, 4.0])}
  grads = {'kernel': jnp.array([[0.2, 0.1], [-0.4, 0.3]]), 'bias': jnp.array([1.0, -2.0])}
  updates, _ = tx.update(grads, tx.init(params), params)
  expected = {}
  for name in params:
    w, g = np.asarray(params[name]), np.asarray(grads[name])
    u = g / (np.abs(g) + eps)  # First Adam step: bias-corrected m / sqrt(v) = g / |g|.
    if w.ndim > 1:
      u = u + wd * w
      u = u * np.linalg.norm(w) / np.linalg.norm(u)
    expected[name] = -lr * u
  for name in params:
    np.testing.assert_allclose(np.asarray(updates[name]), expected[name], rtol=1e-5)
  # The test can fail: a trust ratio on the bias would rescale its step by |b| / |u| = 3.5.
  assert np.linalg.norm(np.asarray(params['bias'])) / np.linalg.norm(expected['bias'] / lr) > 3
