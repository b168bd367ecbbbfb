"""Simulated asynchronous SGD: tau=0 is sync, tau=k uses k-steps-old parameters (checked against a
hand-rolled loop), staleness sequences, exact resume, memory report and bad input."""

import os

import jax
import numpy as np
import optax
import pytest

from anp_jax import trainer
from anp_jax.executors import asynchronous
from anp_jax.steps import head_metrics
from conftest import assert_leaves_close, assert_resume_is_exact, leaves, tiny_config


def _async(data_dir, **kw):
  kw = dict(dict(method='async', noise_scale=False, log_every_steps=1), **kw)
  return tiny_config(data_dir, **kw)


@pytest.mark.slow(45)  # With the session's sync_baseline when this file computes it.
def test_tau_zero_equals_sync_bit_for_bit(data_dir, tmp_path, sync_baseline):
  a = trainer.train_and_evaluate(_async(data_dir, num_train_steps=5), str(tmp_path / 'async'))
  s = sync_baseline
  assert_leaves_close(leaves((a.state.params, a.state.batch_stats, a.state.opt_state)),
                      leaves((s.state.params, s.state.batch_stats, s.state.opt_state)))
  assert a.final_eval['eval/loss'] == s.final_eval['eval/loss']


def _reference_async(config, steps, schedules, aware):
  """Asynchronous SGD by hand on one device: g_t = grad at the params of step t - tau_t.

  One (params, batch_stats) per staleness sequence of `schedules`, all from one build, one
  compiled update and the same first `steps` batches (each sequence costs no compilation)."""
  run = trainer.build(config)
  state = jax.device_get(run.init_state())
  batches = run.train_batches()
  cpu = jax.devices()[0]
  batches = [jax.device_put(jax.tree.map(np.asarray, next(batches)), cpu) for _ in range(steps)]

  def loss(p, bs, batch):
    logits, mutated = run.model.apply({'params': p, 'batch_stats': bs}, batch['image'],
                                      train=True, mutable=['batch_stats'])
    return head_metrics(logits, batch, config)[0], mutated['batch_stats']

  @jax.jit
  def update(params, stale, stats, opt, batch, scale):
    grads, stats = jax.grad(loss, has_aux=True)(stale, stats, batch)
    updates, opt = run.tx.update(grads, opt, params)
    updates = jax.tree.map(lambda u: u * scale, updates)  # Staleness-aware: the step / tau.
    return optax.apply_updates(params, updates), stats, opt

  results = []
  for taus in schedules:
    params, stats, opt = state.params, state.batch_stats, state.opt_state
    snapshots = []
    for t in range(steps):
      snapshots.append(params)
      tau = min(taus[t], t, config.async_sgd.max_tau)
      scale = 1.0 / max(tau, 1) if aware else 1.0
      params, stats, opt = update(params, snapshots[t - tau], stats, opt, batches[t], scale)
    results.append((params, stats))
  return results


@pytest.mark.slow(30)  # 50 s for aware=False (compiles the shared programs), 15 s for True.
@pytest.mark.parametrize('aware', [False, True])
def test_constant_tau_uses_k_steps_old_parameters(data_dir, tmp_path, aware):
  steps, tau = 5, 2
  # Constant rate, max_tau = 3: with aware=False the programs of the two tests below.
  config = _async(data_dir, num_train_steps=steps, schedule='constant', **{
      'async_sgd.tau': tau, 'async_sgd.max_tau': 3, 'async_sgd.staleness_aware_lr': aware})
  got = trainer.train_and_evaluate(config, str(tmp_path / 'async')).state
  (ref_params, ref_stats), (fresh, _) = _reference_async(config, steps,
                                                         [[tau] * steps, [0] * steps], aware)
  # One device vs eight (per-device means, then pmean): float summation order only.
  assert_leaves_close(leaves((got.params, got.batch_stats)), leaves((ref_params, ref_stats)),
                      rtol=1e-4, atol=1e-5)
  # The test can fail: fresh gradients (tau = 0) end far outside that tolerance.
  diff = max(float(np.max(np.abs(x - y))) for x, y in zip(leaves(got.params), leaves(fresh),
                                                                     strict=True))
  assert diff > 1e-3


def test_staleness_distributions():
  c = tiny_config('/nonexistent', method='async')
  a = c.async_sgd
  n = 20000
  a.staleness, a.tau = 'constant', 3
  assert set(asynchronous.staleness_sequence(c, 50)) == {3}
  a.staleness, a.max_tau = 'uniform', 6
  u = asynchronous.staleness_sequence(c, n)
  assert set(u) == set(range(7)) and abs(u.mean() - 3.0) < 0.1
  a.staleness, a.tau, a.max_tau = 'geometric', 2, 20
  g = asynchronous.staleness_sequence(c, n)
  assert g.min() == 0 and abs(g.mean() - 2.0) < 0.1
  assert abs(np.mean(g == 0) - 1 / 3) < 0.02  # P(0) = p = 1 / (1 + mean).
  a.staleness = 'simulated'
  for workers in (4, 8):
    a.workers, a.max_tau = workers, 4 * workers
    s = asynchronous.staleness_sequence(c, 4000)
    assert abs(s.mean() - (workers - 1)) < 0.1 and s.std() > 0
  # Deterministic per seed, prefixes agree (resume), other seeds differ.
  for kind in ('uniform', 'geometric', 'simulated'):
    a.staleness, a.seed = kind, 0
    long = asynchronous.staleness_sequence(c, 300)
    np.testing.assert_array_equal(asynchronous.staleness_sequence(c, 120), long[:120])
    a.seed = 1
    assert not np.array_equal(asynchronous.staleness_sequence(c, 300), long)
  clipped = asynchronous.clip_staleness(np.array([5, 5, 5, 5, 9, 0]), max_tau=4)
  np.testing.assert_array_equal(clipped, [0, 1, 2, 3, 4, 0])


def test_draws_beyond_the_history_are_reported(data_dir, tmp_path, capsys):
  # The config of test_constant_tau_uses_k_steps_old_parameters[False] but geometric staleness
  # (the same compiled programs: tau is an argument of the step).
  config = _async(data_dir, num_train_steps=5, schedule='constant', **{
      'async_sgd.staleness': 'geometric', 'async_sgd.tau': 2, 'async_sgd.max_tau': 3})
  taus = asynchronous.staleness_sequence(config, 200)  # P(tau > 3) = (2/3)^4 = 0.2 per draw.
  line = asynchronous.describe_staleness(config, taus)
  assert 'exceeded max_tau' in line and 'raise config.async_sgd.max_tau' in line
  trainer.train_and_evaluate(config, str(tmp_path))
  out = capsys.readouterr().out
  assert 'parameter history 4 x' in out and 'MiB per device' in out


def test_momentum_compensation(data_dir):
  config = _async(data_dir, **{'async_sgd.staleness': 'simulated', 'async_sgd.workers': 4,
                               'async_sgd.momentum': 'compensate'})
  run = trainer.build(config)
  assert 'momentum 0.15 (compensate)' in run.executor.describe  # 0.9 - (1 - 1/4)
  assert asynchronous.compensated_momentum(0.9, 16) == 0.0


@pytest.mark.slow(11)
def test_resume_mid_run_is_exact(data_dir, tmp_path, capsys):
  kw = {'async_sgd.staleness': 'uniform', 'async_sgd.max_tau': 3, 'schedule': 'constant',
        'checkpoint_every_steps': 3}
  assert_resume_is_exact(lambda n: _async(data_dir, num_train_steps=n, **kw), 7, 3, tmp_path,
                         capsys)


def test_sync_checkpoint_is_not_resumed_as_async(data_dir, tmp_path):
  # The sync_baseline fixture's config (its compiled programs), checkpointed.
  trainer.train_and_evaluate(tiny_config(data_dir, noise_scale=False, log_every_steps=1,
                                         num_train_steps=5, checkpoint_every_steps=5),
                             str(tmp_path))
  with pytest.raises(ValueError, match="method: checkpoint 'sync' vs config 'async'"):
    trainer.train_and_evaluate(_async(data_dir, num_train_steps=4), str(tmp_path))


@pytest.mark.parametrize('overrides,message', [
    ({'method': 'asynchronous'}, 'config.method'),
    ({'async_sgd.staleness': 'poisson'}, 'staleness'),
    ({'async_sgd.tau': 9, 'async_sgd.max_tau': 8}, 'larger than the kept parameter history'),
    ({'async_sgd.tau': -1}, r'async_sgd.tau=-1 is out of range: use a number >= 0'),
    ({'async_sgd.max_tau': -1}, 'async_sgd.max_tau=-1 is out of range: use an integer >= 0'),
    ({'async_sgd.staleness': 'geometric', 'async_sgd.tau': 5, 'async_sgd.max_tau': 4},
     'larger than the kept'),
    ({'async_sgd.staleness': 'simulated', 'async_sgd.workers': 16, 'async_sgd.max_tau': 8},
     'mean staleness of 15'),
    ({'async_sgd.staleness': 'simulated', 'async_sgd.workers': 0}, 'workers=0 is out of range'),
    ({'executor': 'pmap'}, "'jit' executor only"),
    ({'async_sgd.momentum': 'compensate', 'optimizer': 'adamw'}, 'has none'),
    ({'async_sgd.momentum': 'nesterov'}, 'async_sgd.momentum'),
])
def test_bad_async_config_fails_before_compilation(data_dir, tmp_path, overrides, message):
  config = _async(data_dir, **overrides)
  with pytest.raises(ValueError, match=message):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert not os.path.exists(tmp_path / 'checkpoints')
