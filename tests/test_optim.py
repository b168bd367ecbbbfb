"""Learning-rate scaling rules, warmup and decay schedules, weight-decay masks, optimizers (LARS
and LAMB also against a step-by-step numpy transcription of their definitions)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
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


def test_step_boundary_at_the_end_of_warmup_decays_right_after_it():
  # Warmup 5 steps to peak 1, factor 0.1 at step 5 (the first step after the ramp): the ramp is
  # untouched. Before: the boundary counted as 'inside warmup' and scaled the whole ramp,
  # [0.02, 0.04, 0.06, 0.08, 0.1, 0.1, ...].
  c = _cfg(batch_size=256, base_batch_size=256, base_lr=1.0, lr_scaling='none', warmup_epochs=5,
           schedule='step', step_epochs=(5, 8), step_factor=0.1)
  s = optim.create_lr_schedule(c, steps_per_epoch=1, total_steps=10)
  assert [float(s(i)) for i in range(10)] == pytest.approx(
      [0.2, 0.4, 0.6, 0.8, 1.0, 0.1, 0.1, 0.1, 0.01, 0.01])
  # A boundary strictly inside the warmup (step 4, the ramp's last step) still sets the rate the
  # ramp rises to: the ramp stays monotone and ends where the step schedule is at its last step.
  c.step_epochs = (4, 8)
  s = optim.create_lr_schedule(c, steps_per_epoch=1, total_steps=10)
  assert [float(s(i)) for i in range(10)] == pytest.approx(
      [0.02, 0.04, 0.06, 0.08, 0.1, 0.1, 0.1, 0.1, 0.01, 0.01])


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


def _two_steps(name, grads=(1.0, 1.0), **kw):
  """Updates of the first two steps of optimizer `name` on params w (2x2, decayed) and b (2,)
  from ones, lr 0.1, weight decay 0.01, momentum 0.9, with the given per-step gradients."""
  c = _cfg(**dict(dict(optimizer=name, schedule='constant', warmup_epochs=0, base_lr=0.1,
                       batch_size=256, base_batch_size=256, weight_decay=0.01, momentum=0.9),
                  **kw))
  tx = optim.create_optimizer(c, optim.create_lr_schedule(c, 1, 1))
  params = {'w': jnp.ones((2, 2)), 'b': jnp.ones(2)}
  state = tx.init(params)
  out = []
  for g in grads:
    updates, state = tx.update({'w': jnp.full((2, 2), g), 'b': jnp.full(2, g)}, state, params)
    out.append({k: np.asarray(v) for k, v in updates.items()})
    params = {k: params[k] + updates[k] for k in params}
  return out


def test_sgd_and_nesterov_momentum_match_their_formulas_and_differ():
  """Plain: v = g + mu v, u = -lr v. Nesterov: u = -lr (g + mu v_new). Decay on w only."""
  lr, mu, wd = 0.1, 0.9, 0.01
  sgd, nest = _two_steps('sgd', grads=(1.0, 0.5)), _two_steps('nesterov', grads=(1.0, 0.5))
  g1w, g1b = 1.0 + wd * 1.0, 1.0
  np.testing.assert_allclose(sgd[0]['w'], -lr * g1w, rtol=1e-6)
  np.testing.assert_allclose(sgd[0]['b'], -lr * g1b, rtol=1e-6)
  np.testing.assert_allclose(nest[0]['w'], -lr * (1 + mu) * g1w, rtol=1e-6)
  w1 = 1.0 + sgd[0]['w'][0, 0]  # The parameter after step 1 (plain SGD).
  v2 = 0.5 + wd * w1 + mu * g1w
  np.testing.assert_allclose(sgd[1]['w'], -lr * v2, rtol=1e-6)
  w1n = 1.0 + nest[0]['w'][0, 0]
  v2n = 0.5 + wd * w1n + mu * g1w
  np.testing.assert_allclose(nest[1]['w'], -lr * (0.5 + wd * w1n + mu * v2n), rtol=1e-6)
  np.testing.assert_allclose(nest[1]['b'], -lr * (0.5 + mu * (0.5 + mu * 1.0)), rtol=1e-6)


def test_adamw_decays_kernels_only():
  """First AdamW step: the Adam direction is g / |g| = 1 everywhere; decoupled weight decay
  (lr * wd * p) is added for the 2-D kernel w, not for the bias b (the decay mask)."""
  (first, _) = _two_steps('adamw')
  np.testing.assert_allclose(first['w'], -0.1 * (1.0 + 0.01 * 1.0), rtol=1e-5)
  np.testing.assert_allclose(first['b'], -0.1 * 1.0, rtol=1e-5)


def test_lars_and_lamb_scale_by_the_trust_ratio():
  """LARS: the decayed kernel's step is lr * trust_coefficient * |w| / |g + wd w| times its
  direction; LAMB: the kernel's step has norm lr * |w| (trust ratio |w| / |adam direction|)."""
  lars, _ = _two_steps('lars', lars_trust_coefficient=0.001)
  np.testing.assert_allclose(lars['w'], -0.1 * 0.001 * 1.0, rtol=1e-5)
  lamb, _ = _two_steps('lamb')
  assert float(np.linalg.norm(lamb['w'])) == pytest.approx(0.1 * 2.0, rel=1e-5)
  np.testing.assert_allclose(lamb['w'], lamb['w'][0, 0])


def test_grad_clip_norm_clips_the_global_norm_before_the_optimizer():
  lr = 0.1
  # Global norm of the gradient: sqrt(6 * 3^2) = 7.35 > 1: scaled to norm 1 first.
  clipped, = _two_steps('sgd', grads=(3.0,), grad_clip_norm=1.0, weight_decay=0.0)
  np.testing.assert_allclose(clipped['w'], -lr * 3.0 / np.sqrt(54.0), rtol=1e-6)
  np.testing.assert_allclose(clipped['b'], -lr * 3.0 / np.sqrt(54.0), rtol=1e-6)
  # Below the threshold (or 0 = off): unchanged.
  for clip in (100.0, 0.0):
    plain, = _two_steps('sgd', grads=(3.0,), grad_clip_norm=clip, weight_decay=0.0)
    np.testing.assert_allclose(plain['w'], -lr * 3.0, rtol=1e-6)


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


def test_step_boundaries_inside_warmup_apply_to_the_peak():
  c = default.get_config()
  c.batch_size = c.base_batch_size = 256
  c.base_lr, c.lr_scaling, c.schedule = 1.0, 'linear', 'step'
  c.warmup_epochs, c.step_epochs, c.step_factor = 2.5, (2, 3), 0.1
  s = optim.create_lr_schedule(c, steps_per_epoch=10, total_steps=60)
  assert float(s(24)) == pytest.approx(0.1)  # The ramp ends at the rate of epoch 2.5.
  assert float(s(25)) == pytest.approx(0.1)  # Before: 1.0 (the epoch-2 boundary was dropped).
  assert float(s(29)) == pytest.approx(0.1)
  assert float(s(30)) == pytest.approx(0.01)  # Before: 0.1.
  assert float(s(59)) == pytest.approx(0.01)
  ramp = [float(s(i)) for i in range(25)]
  assert np.all(np.diff(ramp) > 0) and ramp[0] == pytest.approx(0.1 / 25)
  # Without warmup the same boundaries give the plain step schedule.
  c.warmup_epochs = 0
  s = optim.create_lr_schedule(c, steps_per_epoch=10, total_steps=60)
  assert [float(s(i)) for i in (19, 20, 29, 30)] == pytest.approx([1.0, 0.1, 0.1, 0.01])


# ----------------------------------------------------------------------------------------------
# LARS and LAMB against a numpy transcription of their definitions.


def _opt_config(name):
  from anp_jax.configs import default
  c = default.get_config()
  c.update(dict(optimizer=name, weight_decay=0.01, momentum=0.9, lars_trust_coefficient=0.02,
                batch_size=256, base_batch_size=256, base_lr=0.5, lr_scaling='none',
                schedule='constant', warmup_epochs=2.0, adam_b1=0.9, adam_b2=0.99))
  return c


def _param_tree(rng):
  """A conv kernel (decayed, trust-ratio'd), a BN scale and a zero BN bias (both excluded)."""
  return {'conv': {'kernel': rng.normal(0, 0.3, (3, 3, 2, 4)).astype(np.float32)},
          'bn': {'scale': (1.0 + rng.normal(0, 0.1, 4)).astype(np.float32),
                 'bias': np.zeros(4, np.float32)}}


def _run_optax(name, params, grads_seq):
  c = _opt_config(name)
  # 2 warmup epochs of 1 step: lr(0) = peak / 2, lr(1) = peak.
  tx = optim.create_optimizer(c, optim.create_lr_schedule(c, steps_per_epoch=1, total_steps=10))
  p = jax.tree.map(jnp.asarray, params)
  state = tx.init(p)
  out = []
  for g in grads_seq:
    updates, state = tx.update(jax.tree.map(jnp.asarray, g), state, p)
    p = jax.tree.map(lambda a, u: a + u, p, updates)
    out.append(jax.tree.map(np.asarray, p))
  return out


def _norm(x):
  return float(np.sqrt(np.sum(np.square(x, dtype=np.float64))))


def _flat(tree):
  return {f'{a}/{b}': v for a, sub in tree.items() for b, v in sub.items()}


def _unflat(flat):
  out = {}
  for key, v in flat.items():
    a, b = key.split('/')
    out.setdefault(a, {})[b] = v
  return out


def test_lars_matches_hand_computation():
  rng = np.random.default_rng(2)
  params = _param_tree(rng)
  grads = [jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32), params)
           for _ in range(2)]
  got = _run_optax('lars', params, grads)
  wd, mom, tc, lrs = 0.01, 0.9, 0.02, (0.25, 0.5)
  p = {k: v.astype(np.float64) for k, v in _flat(params).items()}
  trace = {k: np.zeros_like(v) for k, v in p.items()}
  for step, g_tree in enumerate(grads):
    g = {k: v.astype(np.float64) for k, v in _flat(g_tree).items()}
    for k in p:
      decayed = k.endswith('kernel')  # The mask: only >= 2-D parameters.
      u = g[k] + wd * p[k] if decayed else g[k]
      if decayed:  # Trust ratio tc·|p|/|u| only where masked in (also 1 if a norm is 0).
        pn, un = _norm(p[k]), _norm(u)
        u = u * (tc * pn / un if pn > 0 and un > 0 else 1.0)
      u = -lrs[step] * u
      trace[k] = u + mom * trace[k]  # optax.trace after the learning rate (heavy ball).
      p[k] = p[k] + trace[k]
    for k, v in _flat(got[step]).items():
      np.testing.assert_allclose(v, p[k], rtol=2e-5, atol=1e-7, err_msg=f'step {step} {k}')


def test_lamb_matches_hand_computation():
  rng = np.random.default_rng(3)
  params = _param_tree(rng)
  grads = [jax.tree.map(lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32), params)
           for _ in range(2)]
  got = _run_optax('lamb', params, grads)
  wd, b1, b2, eps, lrs = 0.01, 0.9, 0.99, 1e-6, (0.25, 0.5)
  p = {k: v.astype(np.float64) for k, v in _flat(params).items()}
  mu = {k: np.zeros_like(v) for k, v in p.items()}
  nu = {k: np.zeros_like(v) for k, v in p.items()}
  for step, g_tree in enumerate(grads):
    t = step + 1
    g = {k: v.astype(np.float64) for k, v in _flat(g_tree).items()}
    for k in p:
      mu[k] = b1 * mu[k] + (1 - b1) * g[k]
      nu[k] = b2 * nu[k] + (1 - b2) * g[k] ** 2
      u = (mu[k] / (1 - b1 ** t)) / (np.sqrt(nu[k] / (1 - b2 ** t)) + eps)
      if k.endswith('kernel'):
        u = u + wd * p[k]
      # Trust ratio on kernels only (as LARS): BatchNorm scales/offsets and biases take lr * u.
      pn, un = _norm(p[k]), _norm(u)
      ratio = pn / un if p[k].ndim >= 2 and pn > 0 and un > 0 else 1.0
      p[k] = p[k] - lrs[step] * ratio * u
    for k, v in _flat(got[step]).items():
      np.testing.assert_allclose(v, p[k], rtol=2e-5, atol=1e-7, err_msg=f'step {step} {k}')
  # The zero-initialised bias moved by exactly lr·|adam step| on the first step (no ratio).
  assert np.all(np.abs(_flat(got[0])['bn/bias']) > 0)


def test_any_optax_optimizer_by_name_with_its_keyword_arguments():
  """optimizer='optax' (issue 43, item 2): optax.<optax_name>(schedule, **optax_kwargs), weight
  decay passed to a function that takes it (lion: decoupled, on the decay mask), else added to
  the gradient on the mask (rmsprop)."""
  from anp_jax.errors import ConfigError
  params = {'w': jnp.ones((2, 2)), 'b': jnp.ones(2)}
  grads = {'w': jnp.full((2, 2), 0.5), 'b': jnp.full(2, -0.25)}

  def first_update(**kw):
    c = _cfg(**dict(dict(optimizer='optax', schedule='constant', warmup_epochs=0, base_lr=0.1,
                         batch_size=256, base_batch_size=256, weight_decay=0.01), **kw))
    tx = optim.create_optimizer(c, optim.create_lr_schedule(c, 1, 1))
    return tx.update(grads, tx.init(params), params)[0]

  got = first_update(optax_name='lion', optax_kwargs="{'b1': 0.5}")
  ref = optax.lion(0.1, b1=0.5, weight_decay=0.01, mask=optim.decay_mask)
  want = ref.update(grads, ref.init(params), params)[0]
  for k in params:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-6)
  assert float(got['w'][0, 0]) == pytest.approx(-0.1 * (1 + 0.01))  # sign(g) + wd w, x lr.
  assert float(got['b'][0]) == pytest.approx(0.1)  # No decay on the bias.
  rms = first_update(optax_name='rmsprop')
  ref = optax.chain(optax.add_decayed_weights(0.01, mask=optim.decay_mask), optax.rmsprop(0.1))
  want = ref.update(grads, ref.init(params), params)[0]
  for k in params:
    np.testing.assert_allclose(rms[k], want[k], rtol=1e-6)
  with pytest.raises(ConfigError, match=r"config.optax_name='lino' is not an optax function"):
    first_update(optax_name='lino')
  with pytest.raises(ConfigError, match=r"config.optax_kwargs='b1=0.5': write a Python dict"):
    first_update(optax_name='lion', optax_kwargs='b1=0.5')
