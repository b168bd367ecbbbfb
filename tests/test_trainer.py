"""Training end to end on 8 simulated devices: loss falls, executors agree, accumulation is exact,
the logs count examples seen and passes."""

import contextlib
import io
import json
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from anp_jax import errors, metrics, models, steps, trainer
from anp_jax.research import sweep_report as report
from conftest import (ROOT, assert_leaves_close, direct_eval, leaves, main_cmd, subprocess_env,
                      tiny_config)


def _losses(result):
  return [h['train/loss'] for h in result.records if 'train/loss' in h]


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):
  """24 steps with evaluations: a model that learned something (shared by several tests)."""
  config = tiny_config(data_dir, num_train_steps=24, log_every_steps=4, base_lr=0.4,
                       eval_every_epochs=1.0)
  workdir = tmp_path_factory.mktemp('trained')
  return config, workdir, trainer.train_and_evaluate(config, str(workdir))


@pytest.mark.slow(30)
def test_short_run_learns_and_writes_logs(trained):
  _, workdir, result = trained
  losses = _losses(result)
  assert result.setup.devices == 8 and result.setup.per_device_batch == 4
  assert losses[-1] < 0.93 * losses[0], losses
  assert result.final_eval['eval/anp_top1'] > 2 / 8  # Twice chance for 8 ANPs.
  assert result.final_eval['eval/anp_top5'] >= result.final_eval['eval/anp_top1']
  for head in ('anp', 'adjective', 'noun'):
    assert f'eval/{head}_top1' in result.final_eval
  lines = [json.loads(l) for l in open(workdir / 'metrics.jsonl')]
  assert any('eval/anp_top1' in l for l in lines) and any('train/loss' in l for l in lines)
  assert json.load(open(workdir / 'config.json'))['model']['name'] == 'resnet8'
  assert any(f.startswith('events.out.tfevents') for f in os.listdir(workdir))
  assert (workdir / 'curves.png').stat().st_size > 1000
  assert 'train/noise_scale_b_simple' in lines[0]
  assert {'train/noise_scale_g2', 'train/noise_scale_trace'} <= set(lines[0])
  final = json.load(open(workdir / 'final_metrics.json'))
  assert final['noise_scale_measured'] is True and 'noise_scale_not_measured_because' not in final


@pytest.mark.slow(15)
def test_one_device_without_accumulation_records_why_the_noise_scale_is_not_measured(
    data_dir, tmp_path):
  """One device, one micro-batch per step: no second batch size to compare the gradient with.
  The measurement (on by default) used to do nothing without a word; then every 1-device run
  (the CPU demo included) warned twice on its first screen about what is expected there. Now
  final_metrics.json says why, and the terminal says nothing."""
  proc = subprocess.run(main_cmd(data_dir, tmp_path, num_train_steps=2, log_every_steps=1),
                        env=subprocess_env(1), cwd=ROOT, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'B_simple' not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
  assert 'oise scale' not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
  final = json.load(open(tmp_path / 'final_metrics.json'))
  assert final['noise_scale_measured'] is False
  assert 'one device without gradient accumulation' in final['noise_scale_not_measured_because']
  lines = [json.loads(l) for l in open(tmp_path / 'metrics.jsonl')]
  assert not any(k.startswith('train/noise_scale') for l in lines for k in l)


@pytest.fixture(scope='module')
def global_bn_runs(data_dir, tmp_path_factory):
  """bn_mode='global', 4 steps, every step logged, once per executor: {executor: (workdir,
  result, what the run printed)} (shared by the two tests below)."""
  runs = {}
  for executor in ('jit', 'pmap'):
    config = tiny_config(data_dir, executor=executor, bn_mode='global', num_train_steps=4,
                         log_every_steps=1)
    workdir = tmp_path_factory.mktemp(f'global_bn_{executor}')
    with contextlib.redirect_stdout(io.StringIO()) as out:
      result = trainer.train_and_evaluate(config, str(workdir))
    runs[executor] = (workdir, result, out.getvalue())
  return runs


@pytest.mark.slow(20)  # Builds global_bn_runs.
def test_global_bn_over_devices_skips_the_noise_scale_with_a_warning(global_bn_runs):
  """bn_mode='global' on 8 devices: a device's gradient is not a b_small-example gradient."""
  workdir, _, out = global_bn_runs['jit']
  assert "WARNING: B_simple is not measured: bn_mode='global'" in out
  final = json.load(open(workdir / 'final_metrics.json'))
  assert final['noise_scale_measured'] is False
  assert "bn_mode='global'" in final['noise_scale_not_measured_because']
  lines = [json.loads(l) for l in open(workdir / 'metrics.jsonl')]
  assert any('train/loss' in l for l in lines)
  assert not any(k.startswith('train/noise_scale') for l in lines for k in l)


@pytest.mark.parametrize('eval_batch_size', [8, 32])  # 104 = 13 x 8; 32 does not divide it.
def test_evaluation_equals_a_direct_count_over_the_split(trained, eval_batch_size):
  """Exact evaluation: the trainer's batched, padded, masked and sharded evaluation gives the
  same hits (and loss) as applying the model to every example of the split at once."""
  config, _, result = trained
  config = tiny_config(config.data_dir, eval_batch_size=eval_batch_size)
  run = trainer.build(config)
  got = run.evaluate(result.state)
  direct = direct_eval(config, result.state.params, result.state.batch_stats)
  assert 0 < direct['anp_hits'] < direct['count'] == 104  # Neither all nor nothing right.
  for head in metrics.HEADS:
    assert got[f'eval/{head}_top1'] == direct[f'eval/{head}_top1'], head
  assert got['eval/loss'] == pytest.approx(direct['eval/loss'], rel=1e-5)
  if eval_batch_size == 32:  # The trainer's own final evaluation used this batch.
    assert result.final_eval['eval/anp_top1'] == direct['eval/anp_top1']
  # Another split (of another size: its own batch count; before, it was held to the eval split's).
  other = run.evaluate(result.state, split='train')
  assert 0 < other['trainset/anp_top1'] <= 1
  assert other['trainset/anp_top1'] != got['eval/anp_top1']


def test_jit_and_pmap_executors_give_the_same_trajectory(global_bn_runs):
  runs = {executor: result for executor, (_, result, _) in global_bn_runs.items()}
  np.testing.assert_allclose(_losses(runs['jit']), _losses(runs['pmap']), rtol=2e-5)
  assert_leaves_close(leaves(runs['pmap'].state.params), leaves(runs['jit'].state.params),
                      rtol=1e-4, atol=1e-5)


@pytest.mark.slow(20)
def test_gradient_accumulation_with_ghost_groups_equals_one_large_batch(data_dir, tmp_path):
  """8 examples per device in 2 micro-batches of 4 (each one ghost-BN group of 4) == one step
  on the 8 (two groups of 4): same losses, parameters, BN statistics and optimizer state."""
  results = []
  for accum in (1, 2):
    config = tiny_config(data_dir, batch_size=64, grad_accum_steps=accum, bn_mode='ghost',
                         bn_group_size=4, num_train_steps=3, log_every_steps=1,
                         noise_scale=False)
    results.append(trainer.train_and_evaluate(config, str(tmp_path / f'k{accum}')))
  assert results[1].setup.per_device_micro_batch == 4 and results[0].setup.per_device_batch == 8
  np.testing.assert_allclose(_losses(results[1]), _losses(results[0]), rtol=1e-5)
  state = lambda r: (r.state.params, r.state.batch_stats, r.state.opt_state)
  assert_leaves_close(leaves(state(results[1])), leaves(state(results[0])), rtol=1e-4,
                      atol=1e-6)


def test_accumulation_is_not_trivially_equal_without_ghost_bn(data_dir, tmp_path):
  """Sanity check of the test above: per-device BN over micro-batches does change the result."""
  results = []
  for accum in (1, 4):
    config = tiny_config(data_dir, grad_accum_steps=accum, bn_mode='per_device',
                         num_train_steps=2, log_every_steps=1)
    results.append(trainer.train_and_evaluate(config, str(tmp_path / f'k{accum}')))
  assert abs(_losses(results[0])[-1] - _losses(results[1])[-1]) > 1e-6


def test_accumulation_on_cpu_runs_no_loop(data_dir):
  """XLA:CPU runs the backward pass's convolutions inside a loop body ~7x slower per image
  (`steps.accumulation_unrolled`): a CPU run's step with 4 micro-batches is straight-line code,
  no ``while`` in the program it lowers (the scan's body was one)."""
  config = tiny_config(data_dir, batch_size=128, grad_accum_steps=4, num_train_steps=1)
  run = trainer.build(config)
  state, batch = run.init_state(), next(run.train_batches())
  text = run.executor.train_step.lower(state, batch, *run.executor.step_args(0)).as_text()
  assert run.setup.accum_steps == 4
  assert text.count('stablehlo.while') == 0


def test_unrolled_accumulation_gives_the_scan_s_step(data_dir):
  """The same micro-batches, summed in the same order: the unrolled step (CPU's default) gives
  what the `lax.scan` gave, to float tolerance (XLA computes the convolutions differently in a
  loop body), and both differ from one big batch with per-device BN (not trivially equal)."""
  config = tiny_config(data_dir, grad_accum_steps=4, bn_mode='per_device', num_train_steps=1)
  run = trainer.build(config)
  batch = jax.tree.map(lambda x: np.asarray(x)[:8], next(run.train_batches()))
  state = jax.device_get(run.init_state())

  def step(accum, unroll):
    fn = jax.jit(lambda s, b: steps.per_device_train_step(
        s, b, model=run.model, tx=run.tx, config=config, accum_steps=accum, num_devices=1,
        axis_name=None, unroll_accumulation=unroll))
    return jax.device_get(fn(state, batch))

  (scanned, scanned_sums), (unrolled, unrolled_sums) = step(4, False), step(4, True)
  assert unrolled_sums['loss'] == pytest.approx(scanned_sums['loss'], rel=1e-6)
  assert_leaves_close(leaves((unrolled.params, unrolled.batch_stats, unrolled.opt_state)),
                      leaves((scanned.params, scanned.batch_stats, scanned.opt_state)),
                      rtol=1e-5, atol=1e-7)
  big, _ = step(1, None)
  assert not np.allclose(leaves(big.batch_stats)[0], leaves(unrolled.batch_stats)[0])


@pytest.mark.parametrize('overrides,message', [
    (dict(batch_size=36), 'not divisible by the 8 devices'),
    (dict(**{'model.name': 'resnet51'}), 'is unknown'),
    (dict(dataset='imagenet'), 'is unknown'),
    (dict(image_size=16, **{'model.name': 'resnet50'}), 'too small'),
    (dict(num_train_steps=0), 'Nothing to train'),
    (dict(num_train_steps=-1, num_epochs=0.0), 'Nothing to train'),
    (dict(num_epochs=-2.0), 'num_epochs=-2.0 is out of range'),
    (dict(grad_accum_steps=3), 'grad_accum_steps'),
    (dict(bn_group_size=3), 'bn_group_size'),
    (dict(eval_batch_size=12), 'eval_batch_size'),
    (dict(batch_size=0), 'batch_size=0 is out of range: use an integer >= 1'),
    (dict(executor='tpu'), 'executor'),
    (dict(target_value=1.5, stop_at_target=True, eval_every_epochs=1.0), 'unreachable target'),
    (dict(target_metric='train/loss', target_value=0.5, eval_every_epochs=1.0),
     'not a metric of config.evals'),
    (dict(target_metric='eval/loss', target_value=0.5, eval_every_epochs=1.0),
     'lower-is-better'),
    (dict(target_value=0.5, target_metric=''), 'needs config.target_metric'),
    (dict(target_value=0.5, stop_at_target=True), 'periodic evaluation'),
    (dict(stop_at_target=True, eval_every_epochs=1.0), 'needs a target'),
])
def test_bad_config_fails_before_compilation(data_dir, tmp_path, overrides, message):
  config = tiny_config(data_dir, **overrides)
  with pytest.raises(ValueError, match=message):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert not os.path.exists(tmp_path / 'checkpoints')


def test_nan_loss_stops_with_a_clear_message(data_dir, tmp_path):
  config = tiny_config(data_dir, base_lr=1e30, num_train_steps=6, log_every_steps=2)
  with pytest.raises(errors.NonFiniteLossError, match='loss is (nan|inf)'):
    trainer.train_and_evaluate(config, str(tmp_path))


def test_stop_at_target_ends_at_the_first_evaluation_reaching_it_and_stays_stopped(
    data_dir, tmp_path):
  # Top-5 of 8 ANPs is far above 5 % from the start: the first evaluation (step 2 of 6: one
  # epoch is 8 steps) stops the run.
  config = tiny_config(data_dir, num_train_steps=6, eval_every_epochs=0.25,
                       target_metric='eval/anp_top5', target_value=0.05, stop_at_target=True)
  result = trainer.train_and_evaluate(config, str(tmp_path))
  final = json.load(open(tmp_path / 'final_metrics.json'))
  assert final['step'] == 2 and final['stopped_at_target'] is True
  assert result.final_eval['eval/anp_top5'] >= 0.05
  assert int(jax.device_get(result.state.step)) == 2
  # Resuming the stopped run neither trains on nor loses the stopping point.
  again = trainer.train_and_evaluate(config, str(tmp_path))
  assert int(jax.device_get(again.state.step)) == 2
  assert json.load(open(tmp_path / 'final_metrics.json'))['stopped_at_target'] is True
  # Without the target the same config trains its whole budget.
  full = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=6, eval_every_epochs=0.25),
                                  str(tmp_path / 'full'))
  assert int(jax.device_get(full.state.step)) == 6


def _trainer_noise_estimates(state):
  """The trainer's bias-corrected estimates (|G|^2, tr Sigma) from its noise-scale EMAs.

  Relies on the state's ``noise_ema`` fields ``g2``, ``trace`` and ``weight`` (the EMAs of the
  two estimators and of 1: dividing by it removes the EMA's start-up bias)."""
  ema = {k: float(np.asarray(v)) for k, v in state.noise_ema.items()}
  return ema['g2'] / ema['weight'], ema['trace'] / ema['weight']


@pytest.mark.parametrize('accum', [1, 2])
def test_noise_scale_equals_an_independent_per_example_computation(data_dir, tmp_path, accum):
  """McCandlish et al. (2018, App. A) from per-example gradients of the first batch, computed
  here on the host: B_small = the per-device micro-batch (4 / accum), B_big = the global batch
  (32); |G_small|^2 averaged over the 8 devices' (micro-)batches. Per-example BatchNorm
  (groups of 1) makes each example's gradient its own. One step: the EMA holds one value."""
  config = tiny_config(data_dir, num_train_steps=1, log_every_steps=1, grad_accum_steps=accum,
                       bn_group_size=1)
  run = trainer.build(config)
  batch = jax.tree.map(np.asarray, next(run.train_batches()))  # The trainer's first batch.
  state0 = jax.device_get(run.init_state())
  model = models.create_model(config, run.meta)

  def example_loss(params, example):
    one = jax.tree.map(lambda x: x[None], example)
    logits, _ = model.apply({'params': params, 'batch_stats': state0.batch_stats}, one['image'],
                            train=True, mutable=['batch_stats'])
    return steps.head_metrics(logits, one, config)[0]

  per_example = jax.jit(jax.vmap(jax.grad(example_loss), in_axes=(None, 0)))(
      state0.params, {k: batch[k] for k in ('image', *metrics.LABEL_OF.values())})
  flat = np.concatenate([np.asarray(g).reshape(32, -1) for g in jax.tree.leaves(per_example)],
                        axis=1).astype(np.float64)
  b_small, b_big = 4 // accum, 32
  small = flat.reshape(32 // b_small, b_small, -1).mean(axis=1)  # Device-major, in order.
  small_sq = np.mean(np.sum(small ** 2, axis=1))
  big_sq = np.sum(flat.mean(axis=0) ** 2)
  g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
  trace = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
  assert trace > 0 and abs(g2) > 0  # One step's |G|^2 estimate may be negative (it is noisy).

  result = trainer.train_and_evaluate(config, str(tmp_path))
  got_g2, got_trace = _trainer_noise_estimates(result.state)
  assert got_g2 == pytest.approx(g2, rel=2e-3)
  assert got_trace == pytest.approx(trace, rel=2e-3)
  if g2 > 0:
    assert result.records[0]['train/noise_scale_b_simple'] == pytest.approx(trace / g2, rel=4e-3)
  else:  # B_simple is only logged once the |G|^2 EMA is positive.
    assert 'train/noise_scale_b_simple' not in result.records[0]
  assert result.records[0]['train/grad_norm'] == pytest.approx(np.sqrt(big_sq), rel=1e-4)


def test_label_smoothing_enters_the_loss(data_dir):
  """config.label_smoothing: the target is (1 - e) one-hot + e / classes."""
  logits = {'anp': jnp.asarray([[2.0, 0.0, -1.0, 0.5]])}
  batch = {'label_anp': jnp.asarray([1])}
  for eps in (0.0, 0.2):
    config = tiny_config(data_dir, label_smoothing=eps)
    loss, _ = steps.head_metrics(logits, batch, config)
    logp = np.asarray(jax.nn.log_softmax(logits['anp'][0]))
    target = (1 - eps) * np.eye(4)[1] + eps / 4
    assert float(loss) == pytest.approx(-np.sum(target * logp), rel=1e-6)


def _per_device_config(data_dir, **kw):
  return tiny_config(data_dir, batch_size=24, bn_mode='per_device', **kw)


def test_logs_report_examples_seen_and_passes(data_dir, tmp_path):
  config = _per_device_config(data_dir, num_train_steps=-1, num_epochs=1.5,
                              eval_every_epochs=0.5, log_every_steps=4)
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.setup.total_steps == 16  # ceil(1.5 * 256 / 24): 384 examples, 1.5 passes.
  records = report.read_metrics(str(tmp_path))
  evals = [r for r in records if 'eval/anp_top1' in r]
  trains = [r for r in records if 'train/loss' in r]
  assert [r['step'] for r in evals] == [5, 10, 15, 16]  # Every round(0.5 * 10.67) steps.
  for r in evals + trains:
    kind = 'eval' if r in evals else 'train'
    assert r[f'{kind}/examples_seen'] == 24 * r['step']
    assert r[f'{kind}/passes'] == pytest.approx(24 * r['step'] / 256)
  with open(tmp_path / 'final_metrics.json') as f:
    final = json.load(f)
  assert final['examples_seen'] == 384 and final['passes'] == pytest.approx(1.5)
  assert not [n for n in os.listdir(tmp_path) if '.tmp' in n]
