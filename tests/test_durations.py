"""Durations in examples (issue 13: items 1, 4, 12, 13, 14).

An epoch is train_size examples at every batch size; the training stream crosses epoch
boundaries; schedules, cadences and steps-to-target are converted through `anp_jax.durations`;
checkpoint identity covers the batch; final_metrics.json is written atomically.
"""

import hashlib
import json
import os
import re

import numpy as np
import pytest

from anp_jax import checkpointing, durations, optim, reporting, trainer
from anp_jax.setup import resolve_setup
from anp_jax.configs import default
from anp_jax.data import pipeline
from conftest import TINY_SYNTHETIC, assert_resume_is_exact, tiny_config

from anp_jax.research import sweep
from anp_jax.research import sweep_report as report

TRAIN_SIZE = TINY_SYNTHETIC['num_pairs'] * TINY_SYNTHETIC['train_per_class']  # 256


def _digests(images):
  return [hashlib.sha1(np.ascontiguousarray(im).tobytes()).hexdigest() for im in images]


def _batches(ds, n):
  it = iter(ds.as_numpy_iterator())
  return [next(it) for _ in range(n)]


# ----------------------------------------------------------------------------------------------
# Item 1: equal epochs are equal data.


@pytest.mark.parametrize('epochs', [1.0, 2.5, 10.0])
def test_equal_epochs_see_the_same_examples_at_every_batch_size(epochs):
  """The cpu sweep preset's split (8,000 images, 2 devices): B=32 ... 1024 all see
  epochs * 8,000 examples, less than one global batch more. (Before: B=1024 saw 8.96 passes
  in a "10 epoch" run, B=32 10.00.)"""
  c = default.get_config()
  c.num_epochs, c.num_train_steps, c.bn_mode, c.eval_every_epochs = epochs, -1, 'global', 0.5
  seen = {}
  for batch in (32, 64, 128, 256, 512, 1024):
    c.batch_size = batch
    setup = resolve_setup(c, 8000, 1696, devices=2, local_devices=2, process_count=1)
    examples = setup.total_steps * batch
    assert 0 <= examples - epochs * 8000 < batch, (batch, examples)
    assert setup.steps_per_epoch * batch == pytest.approx(8000)
    assert setup.progress(setup.total_steps, 'train')['train/passes'] == pytest.approx(
        examples / 8000)
    # Evaluation every half epoch = every 4,000 examples, to the nearest step.
    assert abs(setup.eval_every_steps * batch - 4000) <= batch / 2
    seen[batch] = examples / 8000
  assert max(seen.values()) - min(seen.values()) < 1024 / 8000


def test_to_steps_rounding_and_input_checks():
  assert durations.to_steps(steps_per_epoch=8000 / 32, epochs=10, rounding='ceil') == 2500
  assert durations.to_steps(steps_per_epoch=8000 / 1024, epochs=10, rounding='ceil') == 79
  assert durations.to_steps(steps_per_epoch=8000 / 1024, epochs=10, rounding='floor') == 78
  assert durations.to_steps(steps_per_epoch=2.5, epochs=1) == 3  # Half up.
  assert durations.to_steps(steps_per_epoch=25, epochs=2.3) == 58  # 57.49999... is 57.5.
  assert durations.to_steps(steps_per_epoch=1.0, examples=100, batch_size=32,
                            rounding='ceil') == 4
  assert durations.to_steps(steps_per_epoch=10, epochs=0.01, minimum=1) == 1
  # Float noise does not add a step: 0.1 * 3 epochs of 10 steps is 3 steps, not 4.
  assert durations.to_steps(steps_per_epoch=10, epochs=0.1 * 3, rounding='ceil') == 3
  with pytest.raises(ValueError, match='exactly one'):
    durations.to_steps(steps_per_epoch=1.0, epochs=1, examples=5, batch_size=1)
  with pytest.raises(ValueError, match='rounding'):
    durations.to_steps(steps_per_epoch=1.0, epochs=1, rounding='up')
  assert durations.passes(25, 24, 256) == pytest.approx(600 / 256)


def test_stream_crosses_epochs_and_drops_no_tail(data_dir):
  """3 devices x 5 examples: 2 epochs = ceil(512 / 15) = 35 steps. The stream's first 256
  positions are one whole epoch, the next 256 the next one, reshuffled, and the last 13 start a
  third: every example is read two or three times, nothing is dropped. (Before the stream
  crossed epochs, each epoch was cut to whole steps and lost its tail.)"""
  config = tiny_config(data_dir, augment='none')
  builder = pipeline.get_builder(config)
  pdb, shards = 5, 3
  steps = durations.to_steps(steps_per_epoch=TRAIN_SIZE / (pdb * shards), epochs=2,
                             rounding='ceil')
  assert steps == 35
  ds = pipeline.train_dataset(builder, config, per_device_batch=pdb, num_shards=shards,
                              shards=range(shards))
  seen = _digests(np.concatenate([b['image'] for b in _batches(ds, steps)]))
  assert len(seen) == steps * pdb * shards == 525
  first, second = seen[:TRAIN_SIZE], seen[TRAIN_SIZE:2 * TRAIN_SIZE]
  assert len(set(first)) == TRAIN_SIZE and sorted(second) == sorted(first)
  assert second != first  # The next epoch is reshuffled.
  counts = {h: seen.count(h) for h in set(seen)}
  assert min(counts.values()) == 2 and max(counts.values()) == 3


def test_resume_mid_batch_across_an_epoch_boundary_is_exact(data_dir):
  """8 devices x 3 = 24 examples a step: step 10 reads positions 240-263, the last 16 of epoch 0
  and the first 8 of epoch 1."""
  config = tiny_config(data_dir)
  builder = pipeline.get_builder(config)
  kw = dict(per_device_batch=3, num_shards=8, shards=range(8))
  full = _batches(pipeline.train_dataset(builder, config, **kw), 14)
  for start in (9, 10, 11):
    resumed = _batches(pipeline.train_dataset(builder, config, start_step=start, **kw),
                       14 - start)
    for a, b in zip(full[start:], resumed, strict=True):
      np.testing.assert_array_equal(a['image'], b['image'])
      np.testing.assert_array_equal(a['label_anp'], b['label_anp'])


def _per_device_config(data_dir, **kw):
  return tiny_config(data_dir, batch_size=24, bn_mode='per_device', **kw)


def test_trainer_resume_across_an_epoch_boundary_is_exact(data_dir, tmp_path, capsys):
  """B=24 on 256 examples: 10.67 steps per epoch; resuming at step 10 re-enters mid-batch."""
  assert_resume_is_exact(lambda n: _per_device_config(data_dir, num_train_steps=n,
                                                     schedule='constant'), 13, 10,
                         tmp_path, capsys)


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


# ----------------------------------------------------------------------------------------------
# Item 4: step-decay boundaries inside warmup.


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
# Item 12: steps to target.


def _evals(points):
  return [{'step': s, 'eval/anp_top1': a} for s, a in points]


def test_target_crossing_interpolates_between_evaluations():
  evals = _evals([(4, 0.10), (8, 0.30), (12, 0.50), (16, 0.45)])
  hit = sweep.target_crossing(evals, 0.2)
  assert hit == {'step': pytest.approx(6.0), 'eval_step': 8, 'interpolated': True}
  assert sweep.target_crossing(evals, 0.45)['step'] == pytest.approx(11.0)
  assert sweep.target_crossing(evals, 0.30)['step'] == pytest.approx(8.0)
  first = sweep.target_crossing(evals, 0.05)  # Already the first evaluation: an upper bound.
  assert first == {'step': 4.0, 'eval_step': 4, 'interpolated': False}
  assert sweep.target_crossing(evals, 0.6) is None


def _write_run(run_dir, batch, points, train_size=8000):
  os.makedirs(run_dir)
  info = {'name': os.path.basename(run_dir), 'batch': batch, 'rule': 'linear', 'warmup': 'on',
          'seed': 0, 'lr_mult': 1.0, 'base_lr': 0.1, 'lr': 0.1, 'warmup_epochs': 1.0,
          'epochs': 10.0, 'train_size': train_size, 'devices': 2, 'per_device_batch': batch // 2,
          'accum_steps': 1, 'steps_per_epoch': train_size / batch, 'total_steps': 100,
          'eval_every_steps': 10}
  with open(os.path.join(run_dir, 'sweep_run.json'), 'w') as f:
    json.dump(info, f)
  with open(os.path.join(run_dir, 'metrics.jsonl'), 'w') as f:
    for r in _evals(points):
      f.write(json.dumps(r) + '\n')
  reporting.write_json_atomic(os.path.join(run_dir, 'final_metrics.json'),
                              {'step': 100, 'eval/anp_top1': points[-1][1]})


def test_sweep_rows_use_interpolated_steps_and_passes(tmp_path):
  run = str(tmp_path / 'b512')
  _write_run(run, 512, [(10, 0.1), (20, 0.2), (30, 0.4)])
  row = sweep.summarize_run(run, 0.3)
  assert row['steps_to_target'] == pytest.approx(25.0)
  assert row['eval_step_reaching_target'] == 30
  assert row['examples_to_target'] == pytest.approx(25 * 512)
  assert row['epochs_to_target'] == pytest.approx(25 * 512 / 8000)  # Passes, not steps / 15.


def test_aggregate_names_seeds_that_never_reach_the_target():
  def row(batch, seed, steps):
    return {'batch': batch, 'rule': 'linear', 'warmup': 'on', 'seed': seed, 'status': 'finished',
            'steps_to_target': steps, 'examples_to_target': None if steps is None else
            steps * batch, 'final_top1': 0.3, 'best_top1': 0.3, 'b_simple': None, 'lr': 0.1,
            'total_steps': 100, 'best_lr': True}
  rows = [row(32, 0, 80.0), row(32, 1, 90.0), row(64, 0, 40.0), row(64, 1, None),
          row(128, 0, None), row(128, 1, None), row(256, 0, 12.0), row(256, 1, 14.0)]
  entries = {e['batch']: e for e in report.aggregate(rows)[('linear', 'on')]}
  assert entries[32]['steps'] == pytest.approx(85.0) and entries[32]['not_reached'] == 0
  # One of two seeds never reached it: no mean over the survivor, and the count is reported.
  assert entries[64]['steps'] is None and entries[64]['not_reached'] == 1
  # Its steps are censored: at least the mean with the miss at its budget (100 steps).
  assert entries[64]['steps_summary']['lower_bound'] == pytest.approx(70.0)
  assert entries[64]['reached'] == 1
  assert entries[128]['steps'] is None and entries[128]['not_reached'] == 2
  fit = report.fit_arms(report.aggregate(rows))[('linear', 'on')]
  assert fit['points'] == 2  # B=32 and B=256 only.


# ----------------------------------------------------------------------------------------------
# Item 13: checkpoint identity and final_metrics.json.


def test_resume_with_another_batch_size_is_refused_by_name(data_dir, tmp_path):
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=2), str(tmp_path))
  with pytest.raises(ValueError, match=r'batch_size: checkpoint 32 vs config 64'):
    trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=4, batch_size=64),
                             str(tmp_path))


@pytest.mark.parametrize('field,value', [('batch_size', 64), ('grad_accum_steps', 2),
                                         ('bn_mode', 'global'), ('model.dtype', 'bfloat16')])
def test_checkpoint_identity_covers_the_batch_and_numerics(tmp_path, field, value):
  saved = tiny_config(tmp_path)
  meta = {'identity': checkpointing.identity(saved)}
  current = tiny_config(tmp_path, **{field: value})
  ckpt = checkpointing.Checkpointer(str(tmp_path), current)
  try:
    with pytest.raises(ValueError, match=re.escape(f'{field}: checkpoint')):
      ckpt._check_identity(meta, 7)
    ckpt._check_identity({'identity': checkpointing.identity(current)}, 7)  # Same: accepted.
    # Checkpoints written before these fields were recorded are not refused for lacking them
    # (the fields existed: their value is unknown, none is in the added-fields registry).
    assert field not in default.ADDED_FIELDS
    old = {k: v for k, v in checkpointing.identity(current).items() if k != field}
    ckpt._check_identity({'identity': old}, 7)
  finally:
    ckpt.close()


def test_write_json_atomic_never_leaves_a_partial_file(tmp_path):
  path = str(tmp_path / 'final_metrics.json')
  reporting.write_json_atomic(path, {'step': 3})
  with pytest.raises(TypeError):
    reporting.write_json_atomic(path, {'step': object()})  # Fails mid-serialisation.
  with open(path) as f:
    assert json.load(f) == {'step': 3}  # The previous complete file is intact.
  assert os.listdir(tmp_path) == ['final_metrics.json']  # No temporary left behind.
