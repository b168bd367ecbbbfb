"""Local SGD over a (node, device) mesh: H=1 is sync, nodes drift apart between averages and agree
right after, evaluation of the averaged model, exact resume, multi-process = one process, bad
input."""

import os

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from anp_jax import noise_scale, trainer
from conftest import (assert_leaves_close, assert_resume_is_exact, leaves, run_workers,
                      tiny_config)


def _local(data_dir, **kw):
  kw = dict(dict(method='local_sgd', noise_scale=False, log_every_steps=1,
                 **{'local_sgd.nodes': 2}), **kw)
  return tiny_config(data_dir, **kw)


@pytest.mark.parametrize('nodes', [4])  # 2 nodes: the resume and 2-process tests.
def test_sync_every_step_equals_synchronous_training(data_dir, tmp_path, nodes, sync_baseline):
  """H=1 with momentum SGD (nesterov, weight decay, ghost BN): the same model as sync.

  The node averages of p - lr * m_n equal sync's update because the optimizer is linear in the
  gradient (momentum buffers average too); the gradient mean is taken in two levels (devices,
  then nodes) instead of one, so results agree to float rounding: rtol 1e-5 on 5 steps.
  """
  sync = sync_baseline
  local = trainer.train_and_evaluate(_local(data_dir, num_train_steps=5,
                                          **{'local_sgd.nodes': nodes}), str(tmp_path / 'local'))
  assert_leaves_close(leaves((local.state.params, local.state.batch_stats)),
                      leaves((sync.state.params, sync.state.batch_stats)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose([h['train/loss'] for h in local.records if 'train/loss' in h],
                             [h['train/loss'] for h in sync.records if 'train/loss' in h],
                             rtol=1e-5)
  assert local.final_eval['eval/anp_top1'] == pytest.approx(sync.final_eval['eval/anp_top1'])


def test_nodes_agree_after_each_average_and_differ_between(data_dir, sync_baseline):
  """Averages every 2 steps of 5 (at steps 2 and 4): the two nodes' parameters are equal right
  after each and differ at every other step. The reference for "differs from synchronous SGD"
  is the session's 5-step sync run (`sync_baseline`: the same config but the method), not a
  sync run of its own."""
  every, steps = 2, 5
  config = _local(data_dir, num_train_steps=steps, **{'local_sgd.sync_every': every})
  run = trainer.build(config)
  state = run.init_state()
  batches = run.train_batches()
  spread = []
  for step in range(steps):
    state, _ = run.train_step(state, next(batches), step)
    per_node = leaves(state.params)
    assert per_node[0].shape[0] == 2
    spread.append(max(float(np.max(np.abs(x[0] - x[1]))) for x in per_node))
  for step, s in enumerate(spread, 1):
    if step % every == 0:
      assert s == 0.0, (step, spread)
    else:
      assert s > 1e-6, (step, spread)
  # The averaged model differs from synchronous SGD's.
  sync_config = tiny_config(data_dir, noise_scale=False, log_every_steps=1, num_train_steps=steps)
  assert sync_baseline.setup.total_steps == steps
  averaged = run.executor.unreplicate(state)
  diff = max(float(np.max(np.abs(x - y))) for x, y in
             zip(leaves(averaged.params), leaves(sync_baseline.state.params), strict=True))
  assert diff > 1e-4, diff  # 4e-3 when written.
  # Evaluation scores the node-averaged model: the same numbers as the sync executor gives it.
  sync = trainer.build(sync_config)
  sync_copy = jax.device_put(jax.device_get(averaged), NamedSharding(sync.mesh, P()))
  np.testing.assert_allclose(run.evaluate(state)['eval/loss'],
                             sync.evaluate(sync_copy)['eval/loss'], rtol=1e-5)


def test_average_opt_state_averages_momentum(data_dir):
  config = _local(data_dir, num_train_steps=2, **{'local_sgd.sync_every': 2,
                                                  'local_sgd.average_opt_state': True})
  run = trainer.build(config)
  state = run.init_state()
  batches = run.train_batches()
  for step in range(2):
    state, _ = run.train_step(state, next(batches), step)
    trace = [x for x in leaves(state.opt_state) if x.dtype == np.float32]
    spread = max(float(np.max(np.abs(x[0] - x[1]))) for x in trace)
    assert (spread == 0.0) == (step == 1), (step, spread)


# The config of the resume test and of the 2-process test (one uninterrupted run serves both):
# averages every 2 steps, checkpoints every 3 (between averages), a constant learning rate (a
# run of fewer steps is a prefix of a longer one), BatchNorm over each node's devices.
RESUMABLE = {'local_sgd.sync_every': 2, 'checkpoint_every_steps': 3, 'schedule': 'constant',
             'bn_mode': 'global'}
WHOLE_STEPS = 6


@pytest.fixture(scope='module')
def whole(data_dir, tmp_path_factory):
  """`RESUMABLE` trained for `WHOLE_STEPS` steps without interruption, in one process of 8
  devices with 2 nodes."""
  return trainer.train_and_evaluate(_local(data_dir, num_train_steps=WHOLE_STEPS, **RESUMABLE),
                                    str(tmp_path_factory.mktemp('local_whole')))


def test_resume_between_averages_is_exact_and_topology_is_checked(data_dir, tmp_path, capsys,
                                                                   whole):
  _, resumed = assert_resume_is_exact(lambda n: _local(data_dir, num_train_steps=n, **RESUMABLE),
                                      WHOLE_STEPS, 3, tmp_path, capsys, whole=whole)
  with pytest.raises(ValueError, match=r'local_sgd\.nodes: checkpoint 2 vs config 4'):
    trainer.train_and_evaluate(_local(data_dir, num_train_steps=9, **dict(RESUMABLE, **{
        'local_sgd.nodes': 4})), str(tmp_path / 'split'))
  # load_checkpoint (IPython) returns the node average.
  _, variables, _ = trainer.load_checkpoint(str(tmp_path / 'split'))
  assert_leaves_close(leaves(variables['params']), leaves(resumed.state.params), rtol=1e-6,
                      atol=1e-7)


@pytest.mark.slow(60)
def test_two_processes_equal_one_process_leaf_by_leaf(data_dir, tmp_path, whole):
  """Two processes of 4 devices (a node each, nodes=0) = one process of 8 with nodes=2 (the
  `whole` run): the node-averaged parameters and BN statistics agree leaf by leaf (a sum would
  not see swapped replicas or leaves), and so do the logged losses and the evaluation."""
  outs = run_workers(_local(data_dir, num_train_steps=WHOLE_STEPS, **dict(RESUMABLE, **{
      'local_sgd.nodes': 0})), 2, tmp_path)
  assert [o['process_count'] for o in outs] == [2, 2]
  losses = [h['train/loss'] for h in whole.records if 'train/loss' in h]
  assert len(losses) == WHOLE_STEPS
  for o in outs:
    np.testing.assert_allclose(o['losses'], losses, rtol=1e-5)
    assert_leaves_close(o['leaves'], leaves((whole.state.params, whole.state.batch_stats)),
                        rtol=1e-5, atol=1e-6)
    assert o['final_eval']['eval/loss'] == pytest.approx(whole.final_eval['eval/loss'],
                                                          rel=1e-5)
  assert 'local SGD: 2 node(s) x 4 device(s)' in open(tmp_path / 'proc0.log').read()


@pytest.mark.parametrize('overrides,message', [
    ({'local_sgd.nodes': 3}, 'does not divide the 8 devices'),
    ({'local_sgd.nodes': -1}, 'local_sgd.nodes=-1 is out of range: use an integer >= 0'),
    ({'local_sgd.sync_every': 0}, 'sync_every=0 is out of range: use an integer >= 1'),
    ({'executor': 'pmap'}, "'jit' executor only"),
])
def test_bad_local_sgd_config_fails_before_compilation(data_dir, tmp_path, overrides, message):
  config = _local(data_dir, **overrides)
  with pytest.raises(ValueError, match=message):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert not os.path.exists(tmp_path / 'checkpoints')


def test_noise_scale_warning_judges_a_nodes_devices(data_dir, tmp_path, capsys):
  """One device per node: global BN normalises over that device's own micro-batch, so B_simple
  is measured (and logged); the start-up line must not say it is not (it judged all 8)."""
  config = tiny_config(data_dir, method='local_sgd', bn_mode='global', grad_accum_steps=2,
                       noise_scale=True, num_train_steps=2, log_every_steps=1,
                       **{'local_sgd.nodes': 8})
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert 'B_simple is not measured' not in capsys.readouterr().out
  # Measured: both EMA terms are logged (their ratio only while the |G|^2 term is positive,
  # which two steps of a tiny model need not give).
  assert any(noise_scale.G2_FIELD in r and noise_scale.TRACE_FIELD in r for r in result.records)
