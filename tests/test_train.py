"""Training end to end on 8 simulated devices: loss falls, executors agree, accumulation is exact."""

import json
import os

import jax
import numpy as np
import pytest

from anp_jax import train
from conftest import tiny_config


def _losses(result):
  return [h['train/loss'] for h in result.history if 'train/loss' in h]


def test_short_run_learns_and_writes_logs(data_dir, tmp_path):
  config = tiny_config(data_dir, num_train_steps=24, log_every_steps=4, base_lr=0.4,
                       eval_every_epochs=1.0)
  result = train.train_and_evaluate(config, str(tmp_path))
  losses = _losses(result)
  assert result.setup.devices == 8 and result.setup.per_device_batch == 4
  assert losses[-1] < 0.93 * losses[0], losses
  assert result.final_eval['eval/anp_top1'] > 2 / 8  # Twice chance for 8 ANPs.
  assert result.final_eval['eval/anp_top5'] >= result.final_eval['eval/anp_top1']
  for head in ('anp', 'adjective', 'noun'):
    assert f'eval/{head}_top1' in result.final_eval
  lines = [json.loads(l) for l in open(tmp_path / 'metrics.jsonl')]
  assert any('eval/anp_top1' in l for l in lines) and any('train/loss' in l for l in lines)
  assert json.load(open(tmp_path / 'config.json'))['model']['name'] == 'resnet8'
  assert any(f.startswith('events.out.tfevents') for f in os.listdir(tmp_path))
  assert (tmp_path / 'curves.png').stat().st_size > 1000
  assert 'train/noise_scale_b_simple' in lines[0]
  assert {'train/noise_scale_g2', 'train/noise_scale_trace'} <= set(lines[0])


def test_global_bn_over_devices_skips_the_noise_scale_with_a_warning(data_dir, tmp_path, capsys):
  """bn_mode='global' on 8 devices: a device's gradient is not a b_small-example gradient."""
  config = tiny_config(data_dir, bn_mode='global', num_train_steps=2, log_every_steps=1)
  train.train_and_evaluate(config, str(tmp_path))
  assert "WARNING: B_simple is not measured: bn_mode='global'" in capsys.readouterr().out
  lines = [json.loads(l) for l in open(tmp_path / 'metrics.jsonl')]
  assert any('train/loss' in l for l in lines)
  assert not any(k.startswith('train/noise_scale') for l in lines for k in l)


def test_jit_and_pmap_executors_give_the_same_trajectory(data_dir, tmp_path):
  runs = {}
  for executor in ('jit', 'pmap'):
    config = tiny_config(data_dir, executor=executor, bn_mode='global', num_train_steps=4,
                         log_every_steps=1)
    runs[executor] = train.train_and_evaluate(config, str(tmp_path / executor))
  np.testing.assert_allclose(_losses(runs['jit']), _losses(runs['pmap']), rtol=2e-5)
  pj = jax.tree.leaves(runs['jit'].state.params)
  pp = jax.tree.leaves(runs['pmap'].state.params)
  for a, b in zip(pj, pp):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_gradient_accumulation_equals_one_large_batch(data_dir, tmp_path):
  """k micro-batches of b == one batch of k*b, with ghost BN holding the statistics batch."""
  results = []
  for accum in (1, 4):
    config = tiny_config(data_dir, grad_accum_steps=accum, bn_mode='ghost',
                         num_train_steps=3, log_every_steps=1, noise_scale=False)
    config.bn_group_size = 1
    results.append(train.train_and_evaluate(config, str(tmp_path / f'k{accum}')))
  np.testing.assert_allclose(_losses(results[0]), _losses(results[1]), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(results[0].state), jax.tree.leaves(results[1].state)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_accumulation_is_not_trivially_equal_without_ghost_bn(data_dir, tmp_path):
  """Sanity check of the test above: per-device BN over micro-batches does change the result."""
  results = []
  for accum in (1, 4):
    config = tiny_config(data_dir, grad_accum_steps=accum, bn_mode='per_device',
                         num_train_steps=2, log_every_steps=1)
    results.append(train.train_and_evaluate(config, str(tmp_path / f'k{accum}')))
  assert abs(_losses(results[0])[-1] - _losses(results[1])[-1]) > 1e-6


@pytest.mark.parametrize('overrides,message', [
    (dict(batch_size=36), 'not divisible by the 8 devices'),
    (dict(**{'model.name': 'resnet51'}), 'is unknown'),
    (dict(dataset='imagenet'), 'is unknown'),
    (dict(image_size=16, **{'model.name': 'resnet50'}), 'too small'),
    (dict(num_train_steps=0), 'Nothing to train'),
    (dict(num_train_steps=-1, num_epochs=-2.0), 'Nothing to train'),
    (dict(grad_accum_steps=3), 'grad_accum_steps'),
    (dict(bn_group_size=3), 'bn_group_size'),
    (dict(eval_batch_size=12), 'eval_batch_size'),
    (dict(batch_size=0), 'must be > 0'),
    (dict(executor='tpu'), 'executor'),
    (dict(stop_at_metric='eval/anp_top1', stop_at_value=1.5, eval_every_epochs=1.0),
     'unreachable target'),
    (dict(stop_at_metric='train/loss', stop_at_value=0.5, eval_every_epochs=1.0),
     'evaluation accuracy'),
    (dict(stop_at_metric='eval/anp_top1', stop_at_value=0.5), 'periodic evaluation'),
])
def test_bad_config_fails_before_compilation(data_dir, tmp_path, overrides, message):
  config = tiny_config(data_dir, **overrides)
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(config, str(tmp_path))
  assert not os.path.exists(tmp_path / 'checkpoints')


def test_nan_loss_stops_with_a_clear_message(data_dir, tmp_path):
  config = tiny_config(data_dir, base_lr=1e30, num_train_steps=6, log_every_steps=2)
  with pytest.raises(train.NonFiniteLossError, match='loss is (nan|inf)'):
    train.train_and_evaluate(config, str(tmp_path))


def test_stop_at_target_ends_at_the_first_evaluation_reaching_it_and_stays_stopped(
    data_dir, tmp_path):
  # Top-5 of 8 ANPs is far above 5 % from the start: the first evaluation (step 2) stops the run.
  config = tiny_config(data_dir, num_train_steps=16, eval_every_epochs=0.25,
                       stop_at_metric='eval/anp_top5', stop_at_value=0.05)
  result = train.train_and_evaluate(config, str(tmp_path))
  final = json.load(open(tmp_path / 'final_metrics.json'))
  assert final['step'] == 2 and final['stopped_at_target'] is True
  assert result.final_eval['eval/anp_top5'] >= 0.05
  assert int(jax.device_get(result.state.step)) == 2
  # Resuming the stopped run neither trains on nor loses the stopping point.
  again = train.train_and_evaluate(config, str(tmp_path))
  assert int(jax.device_get(again.state.step)) == 2
  assert json.load(open(tmp_path / 'final_metrics.json'))['stopped_at_target'] is True
  # Without the target the same config trains its whole budget.
  full = train.train_and_evaluate(tiny_config(data_dir, num_train_steps=16, eval_every_epochs=0.25),
                                  str(tmp_path / 'full'))
  assert int(jax.device_get(full.state.step)) == 16
