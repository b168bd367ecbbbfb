"""The batch-size sweep (anp_jax/research/sweep.py) and its report: B_simple and steps to target
of a run from its logs, each grid point's run config (scaling rule, warmup, accumulation), the
report's fit and the learning-rate selection, bad input, and the sweep end to end on the tiny
preset (2 batch sizes, a few steps each), including skipping finished runs, resuming an
interrupted one and the report.
"""

import csv
import json
import math
import os
import shutil
import time

import numpy as np
import pytest

from anp_jax import optim, reporting
from anp_jax.setup import resolve_setup
from anp_jax import noise_scale
from anp_jax.research import runner, study_results, sweep
from anp_jax.research.study import RunKey, Study
from conftest import TINY_SYNTHETIC, run_experiment

from anp_jax.research import sweep_report as report

# ----------------------------------------------------------------------------------------------
# (a) A run's B_simple, from the noise-scale estimates it logged.


def _noise_record(step, g2, trace):
  return {'step': step, noise_scale.G2_FIELD: g2, noise_scale.TRACE_FIELD: trace}


def test_stopped_run_gets_b_simple_up_to_its_crossing_and_late_from_the_steps_it_trained(
    tmp_path):
  """Issue 32 item 4: B_simple in the window the steps to target are spent in (every logged step
  up to the interpolated crossing, here 25), the late window (the second half of what the run
  trained: --stop_at_target ends a 100-step budget at step 30, so steps 16-30, not > 50) beside
  it. Before, only the late window existed and was published as "B_simple"."""
  run = tmp_path / 'run'
  run.mkdir()
  info = {'name': 'b00032', 'batch': 32, 'rule': 'linear', 'warmup': 'on', 'seed': 0,
          'lr_mult': 1.0, 'base_lr': 0.1, 'lr': 0.1, 'warmup_epochs': 0.0, 'epochs': 10.0,
          'devices': 8, 'per_device_batch': 4, 'accum_steps': 1, 'steps_per_epoch': 10,
          'total_steps': 100}
  (run / 'sweep_run.json').write_text(json.dumps(info))
  lines = [_noise_record(s, 1.0 if s <= 15 else 2.0, 50.0) for s in range(2, 31, 2)]
  lines += [{'step': 20, 'eval/anp_top1': 0.2}, {'step': 30, 'eval/anp_top1': 0.4}]
  (run / 'metrics.jsonl').write_text(''.join(json.dumps(l) + '\n' for l in lines))
  (run / 'final_metrics.json').write_text(json.dumps({'step': 30, 'eval/anp_top1': 0.4}))
  row = sweep.summarize_run(str(run), 0.3)
  assert row['steps_to_target'] == pytest.approx(25.0)  # 20 + (0.3 - 0.2) / 0.2 * 10.
  # Up to 25: steps 2-14 (|G|² 1, 7 records) and 16-24 (|G|² 2, 5 records).
  assert row['b_simple'] == pytest.approx(50.0 / (17.0 / 12.0))
  assert row['b_simple_late'] == pytest.approx(25.0)  # Steps 16..30 only: 50 / 2.
  assert row['b_simple_window'] == 'to_target'
  # A run that never reached the target has no window up to a crossing; the late one stays.
  missed = sweep.summarize_run(str(run), 0.5)
  assert missed['b_simple'] is None and missed['b_simple_late'] == pytest.approx(25.0)


# ----------------------------------------------------------------------------------------------
# (b) Scaling rules and warmup for the sweep's batch sizes.


def _run_config(base, batch, rule, warmup, seed, lr_mult):
  """The config the runner trains for one grid point of the sweep (no accumulation)."""
  fields = sweep.point_fields(base, batch, rule, warmup, accum=1)
  point = sweep.point_name(batch, rule, warmup)
  study = Study(kind=sweep.KIND, points=((point, fields),), target_value=0.25)
  key = RunKey(f'{point}-lrx{lr_mult:g}-s{seed}', point, fields, lr_mult, seed)
  return runner.make_run_config(base, study, key, stop_at_target=False)


@pytest.mark.parametrize('rule', ['linear', 'sqrt', 'none'])
@pytest.mark.parametrize('warmup', [True, False])
def test_sweep_run_configs_scale_lr_and_warm_up(rule, warmup):
  base = sweep.preset_config('cpu')  # base_lr 0.4 per 256, 1 warmup epoch, cosine.
  base.num_epochs = 10.0
  lr = base.base_lr
  peaks = {}
  for batch in (32, 64, 128, 256, 512, 1024):
    c = _run_config(base, batch, rule, warmup, seed=3, lr_mult=1.0)
    assert (c.batch_size, c.lr_scaling, c.seed) == (batch, rule, 3)
    setup = resolve_setup(c, 8000, 1696, devices=2, local_devices=2, process_count=1)
    assert setup.steps_per_epoch == pytest.approx(8000 / batch)  # An epoch is 8,000 examples.
    schedule = optim.create_lr_schedule(c, setup.steps_per_epoch, setup.total_steps)
    expected = {'linear': lr * batch / 256, 'sqrt': lr * math.sqrt(batch / 256),
                'none': lr}[rule]
    peak = optim.scaled_lr(c)
    assert peak == pytest.approx(expected)
    peaks[batch] = peak
    w = setup.steps(1.0)  # 1 epoch of warmup, in this batch size's steps (rounded).
    if warmup:
      assert float(schedule(0)) == pytest.approx(peak / w, rel=1e-4)
      assert float(schedule(w - 1)) == pytest.approx(peak, rel=1e-4)
      ramp = [float(schedule(i)) for i in range(w)]
      assert np.all(np.diff(ramp) > 0)
    else:
      assert c.warmup_epochs == 0.0
      assert float(schedule(0)) == pytest.approx(peak, rel=1e-4)
    assert float(schedule(setup.total_steps)) == pytest.approx(0.0, abs=1e-6)  # Cosine to 0.
  ratio = {'linear': 2.0, 'sqrt': math.sqrt(2.0), 'none': 1.0}[rule]
  for b in (32, 64, 128, 256, 512):
    assert peaks[2 * b] / peaks[b] == pytest.approx(ratio)
  # An lr multiplier scales the base rate before the rule.
  c = _run_config(base, 512, rule, warmup, seed=0, lr_mult=0.5)
  assert optim.scaled_lr(c) == pytest.approx(0.5 * peaks[512])


def test_accumulation_is_chosen_to_fit_devices_and_bn_groups():
  assert sweep.choose_accum(8, max_micro=4, group=4) == 2
  assert sweep.choose_accum(512, max_micro=128, group=16) == 4
  assert sweep.choose_accum(48, max_micro=32, group=16) == 3  # 2 x 24 breaks the BN groups.
  assert sweep.choose_accum(6, max_micro=4, group=4) is None
  problems = sweep.batch_problems([32, 36, 40, 48, 64], devices=8, max_micro=4, bn_mode='ghost',
                                  bn_group=4)
  assert sorted(problems) == [36, 40, 48]
  assert 'not a multiple of the 8 devices' in problems[36]
  assert sweep.batch_problems([40], 8, 4, 'global', 4) == {}  # No BN groups to respect.


# ----------------------------------------------------------------------------------------------
# The report's fit and the learning-rate selection (no training).


def test_fit_steps_to_target_recovers_s_min_and_b_crit():
  b = np.array([16, 32, 64, 128, 256, 512, 1024], np.float64)
  s = 120.0 * (1 + 200.0 / b)
  for relative in (True, False):
    s_min, b_crit = report.fit_steps_to_target(b, s, relative=relative)
    assert s_min == pytest.approx(120.0, rel=1e-9) and b_crit == pytest.approx(200.0, rel=1e-9)
  noisy = s * np.exp(np.random.default_rng(4).normal(0, 0.03, b.shape))
  s_min, b_crit = report.fit_steps_to_target(b, noisy)
  assert s_min == pytest.approx(120.0, rel=0.1) and b_crit == pytest.approx(200.0, rel=0.15)
  with pytest.raises(ValueError, match='two distinct batch sizes'):
    report.fit_steps_to_target([64, 64], [10, 11])


def _row(batch, mult, seed, steps, top1, status='finished'):
  return {'batch': batch, 'rule': 'linear', 'warmup': 'on', 'lr_mult': mult, 'seed': seed,
          'steps_to_target': steps, 'final_top1': top1, 'status': status}


def test_best_lr_per_batch_is_fewest_steps_then_best_accuracy():
  rows = [_row(64, 0.5, 0, 100, 0.4), _row(64, 0.5, 1, 120, 0.4),   # mean 110 steps
          _row(64, 1.0, 0, 90, 0.3), _row(64, 1.0, 1, None, 0.2),   # one seed missed
          _row(64, 2.0, 0, 80, 0.5, 'diverged'), _row(64, 2.0, 1, 70, 0.5),
          _row(128, 1.0, 0, None, 0.25), _row(128, 2.0, 0, None, 0.28)]  # none reached
  best = {(r['batch'], r['lr_mult']) for r in sweep.select_best_lr(rows) if r['best_lr']}
  assert best == {(64, 0.5), (128, 2.0)}


def test_best_lr_tie_in_steps_goes_to_the_better_accuracy_not_the_name():
  """Two multipliers whose first evaluation already reaches the target tie on steps (that
  evaluation's step, not interpolated); run names sort as strings (lrx10 < lrx2)."""
  hi = [{'step': 100, 'eval/anp_top1': 0.30}, {'step': 200, 'eval/anp_top1': 0.62}]
  lo = [{'step': 100, 'eval/anp_top1': 0.26}, {'step': 200, 'eval/anp_top1': 0.31}]

  def row(mult, evals, seed=0):
    steps = sweep.target_crossing(evals, 0.25)['step']
    return dict(_row(32, mult, seed, steps, evals[-1]['eval/anp_top1']),
                name=f'b00032-linear-warmup-lrx{mult:g}-s{seed}')

  for evals_2, evals_10, winner in ((hi, lo, 2.0), (lo, hi, 10.0)):
    rows = sorted([row(2, evals_2), row(10, evals_10)], key=lambda r: r['name'])
    assert rows[0]['steps_to_target'] == rows[1]['steps_to_target'] == 100
    best = [r['lr_mult'] for r in sweep.select_best_lr(rows) if r['best_lr']]
    assert best == [winner]
  # A full tie (steps and accuracy): the smaller multiplier, whatever the row order.
  for order in (1, -1):
    rows = [row(2, hi), row(10, hi)][::order]
    assert [r['lr_mult'] for r in sweep.select_best_lr(rows) if r['best_lr']] == [2.0]
  # None reaches the target: best accuracy, then the smaller multiplier.
  rows = [_row(32, 10, 0, None, 0.2), _row(32, 2, 0, None, 0.2), _row(32, 4, 0, None, 0.1)]
  assert [r['lr_mult'] for r in sweep.select_best_lr(rows) if r['best_lr']] == [2]


# ----------------------------------------------------------------------------------------------
# (c) A tiny sweep end to end.


def _argv(out, data_dir, *extra):
  return ['--preset', 'tiny', '--out', str(out), '--target_top1', '0.05',
          f'--config.data_dir={data_dir}', *extra]


def _read_csv(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def test_tiny_preset_uses_the_test_dataset():
  # test_per_class: the config's default (0: as many as eval_per_class), not a dataset field.
  assert dict(sweep.preset_config('tiny').synthetic) == {**TINY_SYNTHETIC, 'test_per_class': 0}


@pytest.mark.slow(60)
def test_tiny_sweep_end_to_end_skip_resume_report(data_dir, tmp_path, capsys):
  out = tmp_path / 'sweep'
  t0 = time.time()
  rows = sweep.sweep(_argv(out, data_dir), make_report=report.make_report)
  first_s = time.time() - t0
  assert [(r['batch'], r['status']) for r in rows] == [(32, 'finished'), (64, 'finished')]
  by_batch = {r['batch']: r for r in rows}
  # B=64 on 8 devices is 8 per device: above the preset's 4, so 2 accumulated micro-batches.
  assert by_batch[32]['accum_steps'] == 1 and by_batch[64]['accum_steps'] == 2
  assert by_batch[32]['total_steps'] == 6 and by_batch[64]['total_steps'] == 3
  assert by_batch[32]['lr'] == pytest.approx(0.1) and by_batch[64]['lr'] == pytest.approx(0.2)
  for r in rows:
    assert 0 <= r['final_top1'] <= r['final_top5'] <= 1
    assert r['best_top1'] >= r['final_top1']
    # The target 0.05 is below chance (1/8): reached at the first evaluation.
    assert r['steps_to_target'] == r['steps_per_epoch'] // 2
    assert r['examples_to_target'] == r['steps_to_target'] * r['batch']
    assert r['wall_time_s'] > 0 and r['best_lr'] is True
  table = _read_csv(out / 'results.csv')
  assert [int(t['batch']) for t in table] == [32, 64]
  assert set(sweep.CSV_COLUMNS) <= set(table[0])
  assert json.load(open(out / 'results.json')) == rows
  for name in ('report.md', 'accuracy_vs_batch.png', 'steps_vs_batch.png', 'noise_scale_fit.png',
               'training_curves.png'):
    assert (out / name).stat().st_size > 500, name
  text = (out / 'report.md').read_text()
  assert 'B_crit' in text and 'Steps to target' in text and '| 32 |' in text
  # A stricter target is recomputed from the logs, no retraining needed.
  assert all(r['steps_to_target'] is None for r in sweep.collect_results(str(out), 1.0))
  # A target between chance and 1: the first logged evaluation at or above it, per run.
  for r in rows:
    logged = [json.loads(l) for l in open(out / 'runs' / r['name'] / 'metrics.jsonl')]
    evals = [(l['step'], l['eval/anp_top1']) for l in logged if 'eval/anp_top1' in l]
    target = max(top1 for _, top1 in evals)
    assert 0.05 < target < 1.0
    again = {x['batch']: x for x in sweep.collect_results(str(out), target)}[r['batch']]
    assert again['steps_to_target'] == next(step for step, top1 in evals if top1 >= target)
    above = [top1 for _, top1 in evals if top1 > evals[0][1]]
    if above:  # Just above the first evaluation: reached later, not at the first one.
      later = {x['batch']: x for x in sweep.collect_results(str(out), min(above))}[r['batch']]
      assert later['steps_to_target'] > evals[0][0]

  # Emulate a kill after the step-4 checkpoint of the B=32 run: no final metrics, no step 6.
  run32 = out / 'runs' / by_batch[32]['name']
  run64 = out / 'runs' / by_batch[64]['name']
  assert sorted(os.listdir(run32 / 'checkpoints')) == ['2', '4', '6']
  os.remove(run32 / 'final_metrics.json')
  shutil.rmtree(run32 / 'checkpoints' / '6')
  stamp64 = (run64 / 'metrics.jsonl').stat()
  capsys.readouterr()
  rows2 = sweep.sweep(_argv(out, data_dir))
  log = capsys.readouterr().out
  assert f'{by_batch[64]["name"]}: finished earlier, skipped' in log
  assert f'{by_batch[32]["name"]}: resuming' in log and 'Resumed from checkpoint at step 4' in log
  assert (run64 / 'metrics.jsonl').stat().st_mtime_ns == stamp64.st_mtime_ns
  again = {r['batch']: r for r in rows2}
  for key in ('final_top1', 'final_top5', 'best_top1', 'steps_to_target', 'b_simple',
              'final_step'):
    assert again[32][key] == pytest.approx(by_batch[32][key], rel=1e-6, abs=1e-9), key
  assert again[64] == by_batch[64]

  # Everything finished: a third invocation trains nothing.
  t0 = time.time()
  rows3 = sweep.sweep(_argv(out, data_dir))
  third_s = time.time() - t0
  log = capsys.readouterr().out
  assert log.count('finished earlier, skipped') == 2 and 'training' not in log
  assert 'resuming' not in log and third_s < 0.5 * first_s, (third_s, first_s)
  assert [r['final_top1'] for r in rows3] == [r['final_top1'] for r in rows2]
  r = run_experiment('report.py', str(out))
  assert r.returncode == 0, r.stderr


@pytest.mark.slow(90)
def test_a_fresh_seed_confirmation_reruns_the_chosen_rates_apart_from_the_selection(
    data_dir, tmp_path, capsys):
  """--confirm_seeds: every batch size again at the rate the sweep chose on validation, with seeds
  none of its runs used, in DIR/confirmation (the selection's results untouched); the report puts
  the confirmation's figures beside the selection's. Seeds the selection used are refused."""
  out = tmp_path / 'sweep'
  sweep.sweep(_argv(out, data_dir, '--batch_sizes', '32', '--lr_search', '0.5,1'))
  (chosen,) = json.load(open(out / 'points.json'))
  confirm = lambda *extra: _argv(out, data_dir, '--batch_sizes', '32', *extra)
  assert sweep.main(confirm('--confirm_seeds', '0')) == 2
  assert 'seeds the selection runs used' in capsys.readouterr().err
  assert sweep.main(confirm('--confirm_seeds', '5', '--seeds', '5')) == 2
  rows = sweep.sweep(confirm('--confirm_seeds', '5,6'))
  assert {r['seed'] for r in rows} == {5, 6}
  assert {r['lr_mult'] for r in rows} == {chosen['lr_mult']}
  assert {r['seed'] for r in json.load(open(out / 'confirmation' / 'results.json'))} == {5, 6}
  assert {r['seed'] for r in json.load(open(out / 'results.json'))} == {0}  # Untouched.
  r = run_experiment('report.py', str(out))
  assert r.returncode == 0, r.stderr
  text = (out / 'report.md').read_text()
  assert '## Fresh-seed confirmation' in text and 'seeds [5, 6]' in text
  assert f'| {chosen["point"]} |' in text.split('## Fresh-seed confirmation')[1]


# ----------------------------------------------------------------------------------------------
# (d) Bad input fails before any training.


@pytest.mark.parametrize('extra,message', [
    (['--batch_sizes', '32,36,40,48'], r'do not fit 8 device.*36: not a multiple.*40: per-device '
                                       r'batch 5.*48: per-device batch 6'),
    (['--batch_sizes', ','], 'grid is empty'),
    (['--seeds', ''], 'grid is empty'),
    (['--target_top1', '0'], 'unreachable target'),
    (['--target_top1', '1.5'], 'unreachable target'),
    (['--rules', 'cubic'], 'unknown scaling rule'),
    (['--warmup', 'maybe'], 'use on and/or off'),
    (['--lr_search', '1,-2'], 'must be > 0'),
    (['--epochs', '0'], 'must be > 0'),
    (['--config.batch_size=64'], 'use --batch_sizes'),
    (['--config.model.depth=3'], 'Unknown config field --config.model.depth'),
    (['--config.bn_group_size=abc'], 'expected int'),
    (['--config.grad_accum_steps=2'], 'max_per_device_batch 0'),
    (['--noconfig.no_such_field'], 'Unknown config field --config.no_such_field'),
    (['-config.no_such_field=1'], 'Unknown config field --config.no_such_field'),
])
def test_bad_sweep_input_fails_before_training(data_dir, tmp_path, extra, message):
  out = tmp_path / 'bad'
  with pytest.raises(sweep.SweepError, match=message):
    sweep.sweep(_argv(out, data_dir, *extra))
  assert not (out / 'runs').exists()


def test_bad_input_exits_2_with_a_message(data_dir, tmp_path, capsys):
  assert sweep.main(_argv(tmp_path / 'bad', data_dir, '--target_top1', '-0.1')) == 2
  err = capsys.readouterr().err
  assert err.startswith('ERROR:') and 'unreachable target' in err


@pytest.mark.parametrize('extra,key,value', [
    (['--config.checkpoint_every_steps', '7'], 'checkpoint_every_steps', 7),
    (['--noconfig.noise_scale'], 'noise_scale', False),
    (['--config.noise_scale=false'], 'noise_scale', False),
    (['--config.noise_scale', '--epochs', '1'], 'noise_scale', True),  # Bare boolean.
    (['-config.log_every_steps=3'], 'log_every_steps', 3),  # absl takes one dash too.
    (['--config.base_lr=0.3', '--config.base_lr', '0.2'], 'base_lr', 0.2),  # The last one.
])
def test_every_absl_form_of_a_config_override_is_recorded(data_dir, tmp_path, extra, key, value):
  """The overrides (the fields the sweep leaves alone, sweep.json's record) are what absl
  parsed: a ``--noconfig.x`` or one-dash form counts, a bare boolean does not take the next
  argument as its value."""
  out = tmp_path / 'sweep'
  args, config, overrides = sweep.parse_args(_argv(out, data_dir, *extra))
  assert config[key] == value
  if '--epochs' in extra:
    assert args.epochs == 1.0
  sw = sweep.resolve(args, config, overrides)
  assert sw.user_fields == {'data_dir', key}
  out.mkdir()
  runner._record_invocation(sweep.build_study(sw, 8, sweep.sweep_preset('tiny')), sw.base,
                            sweep.options(sw, args, overrides, report=False), 8)
  recorded = json.load(open(out / 'sweep.json'))['invocations'][-1]['overrides']
  assert recorded == [f'--config.data_dir={data_dir}', f'--config.{key}={value}']
  # The record gives the same config again.
  _, again, _ = sweep.parse_args(['--preset', 'tiny', '--out', str(out), *recorded])
  assert again[key] == value


def test_run_trained_with_other_settings_is_not_reused(data_dir, tmp_path):
  out = tmp_path / 'sweep'
  plans, _ = sweep.plan_runs(sweep.resolve(*sweep.parse_args(_argv(out, data_dir,
                                                                  '--batch_sizes', '32'))))
  run_dir = out / 'runs' / plans[0].name
  run_dir.mkdir(parents=True)
  other = plans[0].config
  other.num_epochs = 3.0
  (run_dir / 'config.json').write_text(other.to_json_best_effort())
  with pytest.raises(sweep.SweepError, match=r'other settings \(num_epochs: 3.0 there vs 0.75'):
    sweep.sweep(_argv(out, data_dir, '--batch_sizes', '32'))
  assert not (run_dir / 'final_metrics.json').exists()


def _fake_finished_run(out, data_dir, *extra):
  """The directory of a finished run planned from `_argv(out, data_dir, *extra)` (one grid point),
  as the sweep leaves it (sweep_run.json, config.json, final_metrics.json), without training."""
  plans, _ = sweep.plan_runs(sweep.resolve(*sweep.parse_args(_argv(out, data_dir, *extra))))
  (plan,) = plans
  run = out / 'runs' / plan.name
  run.mkdir(parents=True)
  (run / 'sweep_run.json').write_text(json.dumps(plan.record))
  (run / 'config.json').write_text(plan.config.to_json_best_effort())
  (run / 'final_metrics.json').write_text(json.dumps({'step': 6, 'eval/anp_top1': 0.3}))
  return plan.name


def test_runs_of_other_settings_are_not_mixed_into_one_sweep_directory(data_dir, tmp_path):
  """Every run under DIR/runs is fitted and reported together, whatever its batch size: adding
  runs made with another budget or base config is refused before training, naming the fields
  and the runs; new batch sizes, seeds or lr multipliers under the same settings are added."""
  out = tmp_path / 'sweep'
  first = _fake_finished_run(out, data_dir, '--batch_sizes', '32', '--epochs', '1.5',
                             '--config.model.width=1.0')
  with pytest.raises(sweep.SweepError) as e:
    sweep.sweep(_argv(out, data_dir, '--batch_sizes', '64', '--no_report'))
  assert (f'model.width: 1.0 there vs 0.5 now ({first}); num_epochs: 1.5 there vs 0.75 now '
          f'({first})') in str(e.value)
  assert 'Use another --out' in str(e.value)
  assert sorted(os.listdir(out / 'runs')) == [first]  # Nothing trained.
  # The same settings with another batch size, seed and multiplier (the swept fields): planned.
  sweep.plan_runs(sweep.resolve(*sweep.parse_args(_argv(
      out, data_dir, '--batch_sizes', '64', '--seeds', '1', '--lr_search', '2', '--epochs',
      '1.5', '--config.model.width=1.0', '--config.checkpoint_every_steps=5'))))
  # A run of the first format (no train_size) and another base lr, --stop_at_target: refused.
  other = tmp_path / 'other'
  run = _fake_finished_run(other, data_dir, '--batch_sizes', '32', '--lr_search', '2',
                           '--config.base_lr=0.2')
  info = json.loads((other / 'runs' / run / 'sweep_run.json').read_text())
  del info['train_size'], info['eval_every_steps']
  (other / 'runs' / run / 'sweep_run.json').write_text(json.dumps(info))
  parsed = sweep.parse_args(_argv(other, data_dir, '--batch_sizes', '64', '--stop_at_target'))
  with pytest.raises(sweep.SweepError, match=rf"base_lr: 0.4 there vs 0.2 now \({run}\); "
                                             rf"stop_at_target: False there vs True now"):
    sweep.plan_runs(sweep.resolve(*parsed))


def test_fields_added_to_the_config_later_count_as_their_defaults(data_dir, tmp_path):
  out = tmp_path / 'sweep'
  plans, _ = sweep.plan_runs(sweep.resolve(*sweep.parse_args(_argv(out, data_dir,
                                                                  '--batch_sizes', '32'))))
  run_dir = out / 'runs' / plans[0].name
  run_dir.mkdir(parents=True)
  older = json.loads(plans[0].config.to_json_best_effort())
  for field in ('target_metric', 'target_value', 'stop_at_target'):
    del older[field]  # A run from before those fields.
  (run_dir / 'config.json').write_text(json.dumps(older))
  runner.check_existing(str(run_dir), plans[0].config)  # Same settings: reused.
  # ... but asking now for a non-default value of such a field is a different run.
  parsed = sweep.parse_args(_argv(out, data_dir, '--batch_sizes', '32', '--stop_at_target'))
  with pytest.raises(sweep.SweepError, match=r"stop_at_target: False there vs True now"):
    sweep.plan_runs(sweep.resolve(*parsed))


def test_finished_run_of_the_first_sweep_format_is_skipped_and_read(data_dir, tmp_path, capsys):
  """The runner's formats are the first sweeps' (results of a running sweep stay usable): a
  finished run written before train_size / eval_every_steps / stop_at_* existed is found under
  its name, not retrained, and summarized into the same results columns."""
  out = tmp_path / 'sweep'
  argv = _argv(out, data_dir, '--batch_sizes', '32', '--no_report', '--target_top1', '0.2')
  plans, _ = sweep.plan_runs(sweep.resolve(*sweep.parse_args(argv)))
  name = plans[0].name
  assert name == 'b00032-linear-warmup-lrx1-s0'
  run = out / 'runs' / name
  run.mkdir(parents=True)
  older = json.loads(plans[0].config.to_json_best_effort())
  for field in ('target_metric', 'target_value', 'stop_at_target', 'evals'):
    del older[field]  # Fields added after the first sweeps.
  (run / 'config.json').write_text(json.dumps(older))
  info = dict(plans[0].record)
  del info['train_size'], info['eval_every_steps']
  (run / 'sweep_run.json').write_text(json.dumps(info, indent=2))
  records = [{'step': 3, 'eval/anp_top1': 0.1}, {'step': 6, 'eval/anp_top1': 0.3}]
  (run / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  (run / 'final_metrics.json').write_text(json.dumps(
      {'step': 6, 'eval/anp_top1': 0.3, 'eval/anp_top5': 0.6, 'wall_time_s': 12.0}))
  capsys.readouterr()
  rows = sweep.sweep(argv)
  log = capsys.readouterr().out
  assert f'{name}: finished earlier, skipped' in log and 'training' not in log
  assert not (run / 'checkpoints').exists()
  row, = rows
  assert (row['status'], row['final_top1'], row['steps_to_target']) == ('finished', 0.3, 4.5)
  assert row['epochs_to_target'] == pytest.approx(4.5 * 32 / 256)  # train_size = 8 x 32.
  with open(out / 'results.csv') as f:
    assert next(csv.reader(f)) == list(sweep.CSV_COLUMNS)
  invocation = json.load(open(out / 'sweep.json'))['invocations'][-1]
  assert sorted(invocation['args']) == sorted(
      ['preset', 'out', 'batch_sizes', 'rules', 'warmup', 'seeds', 'epochs', 'target_top1',
       'lr_search', 'lr_extensions', 'max_per_device_batch', 'checkpoint_every_epochs',
       'cpu_devices', 'stop_at_target', 'dry_run', 'no_report', 'ci', 'lr_from',
       'confirm_seeds', 'seeds_at_once'])
  assert invocation['overrides'] == [f'--config.data_dir={data_dir}']


def test_one_out_directory_holds_one_kind_of_experiment(data_dir, tmp_path, capsys):
  """The batch-size sweep and sync_async_mixed write results.json (other columns) at the same
  path: each refuses the other's directory before training (a sweep overwrote the per-arm
  results of a sync_async_mixed directory, exit 0), and an empty or file --out."""
  from anp_jax.research import sync_async_mixed as sam
  sam_dir, sweep_dir, marked = tmp_path / 'sam', tmp_path / 'sweep', tmp_path / 'marked'
  sam_dir.mkdir()
  (sam_dir / 'grid.json').write_text('[]')  # A directory of the version before the marker.
  with pytest.raises(sweep.SweepError, match=r'holds the results of sync async mixed .* use '
                     r'another --out'):
    sweep.sweep(_argv(sam_dir, data_dir, '--dry_run'))
  sweep_dir.mkdir()
  (sweep_dir / 'sweep.json').write_text('{}')
  assert sam.main(['--preset', 'tiny', '--out', str(sweep_dir), '--dry_run',
                   f'--config.data_dir={data_dir}']) == 2
  assert 'holds the results of batch size sweep' in capsys.readouterr().err
  marked.mkdir()
  runner.claim_out_dir(str(marked), 'sync_async_mixed', write=True)
  assert study_results.out_dir_kind(str(marked)) == 'sync_async_mixed'
  with pytest.raises(sweep.SweepError, match='holds the results of sync async mixed'):
    runner.claim_out_dir(str(marked), 'batch_size_sweep', write=False)
  runner.claim_out_dir(str(marked), 'sync_async_mixed', write=True)  # Its own: fine.
  (tmp_path / 'file').write_text('x')
  with pytest.raises(sweep.SweepError, match='is a file'):
    sweep.sweep(_argv(tmp_path / 'file', data_dir, '--dry_run'))
  with pytest.raises(sweep.SweepError, match='--out is empty'):  # Was the current directory.
    sweep.sweep(_argv('', data_dir, '--dry_run'))
  assert sam.main(['--preset', 'tiny', '--out=', '--dry_run', f'--config.data_dir={data_dir}']) == 2
  assert '--out is empty' in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# Steps to target in a sweep's rows: interpolated, in examples and passes.


def _evals(points):
  return [{'step': s, 'eval/anp_top1': a} for s, a in points]


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


# ----------------------------------------------------------------------------------------------
# One set of numbers: --help, the preset's docstring and --dry_run say the same time.


def test_the_generated_sizes_are_the_datasets(data_dir, tmp_path):
  """`synthetic_meta` (the sizes and names the estimates and a study's --dry_run use without
  generating the dataset, `pipeline.planned_meta`) is what the generated dataset has, and
  writes nothing where the dataset is not generated yet."""
  from anp_jax.data import pipeline
  from conftest import tiny_config
  config = tiny_config(data_dir)
  real = pipeline.dataset_meta(pipeline.get_builder(config), config)
  assert sweep.synthetic_meta(config) == real
  assert pipeline.planned_meta(tiny_config(tmp_path / 'none')) == real
  assert not (tmp_path / 'none').exists() or not any((tmp_path / 'none').rglob('*'))
  test_eval = tiny_config(tmp_path / 'none')
  test_eval.evals.eval.split = 'test'
  assert pipeline.planned_meta(test_eval).eval_size == real.split_sizes['test']


def test_help_preset_docstring_and_dry_run_give_the_same_time(tmp_path, capsys):
  """batch_size_sweep --help said "≤ 45 min" for the cpu preset, its docstring "≈ 1.5 h", and
  --dry_run "267 min + up to 178" (also with --stop_at_target); --help claimed three arms for a
  preset that runs one."""
  import runpy
  import anp_jax.configs.sweep_cpu as sweep_cpu
  cpu = sweep.dry_run_estimate('cpu')
  goyal = sweep.dry_run_estimate('cpu:goyal')
  # What --dry_run prints (the runner's own lines), for the same plan.
  args, config, overrides = sweep.parse_args(['--preset', 'cpu', '--out', str(tmp_path / 'o')])
  sw = sweep.resolve(args, config, overrides)
  study = sweep.build_study(sw, 2, sweep.sweep_preset('cpu'))
  meta = sweep.synthetic_meta(config)
  opts = sweep.options(sw, args, [], False)
  runs, _ = runner.plan_runs(study, sw.base, opts, 2, meta=meta)
  capsys.readouterr()
  runner._print_plan(study, opts, runs, meta)
  printed = capsys.readouterr().out
  assert f'{cpu["runs"]} runs (0 finished earlier)' in printed
  assert f'estimated {cpu["minutes"]:.0f} min for the rest' in printed
  assert (f'up to {cpu["extension_runs"]} more runs (~{cpu["extension_minutes"]:.0f} min)'
          in printed)
  # The preset's docstring quotes them, beside what the committed sweep measured.
  doc = ' '.join(sweep_cpu.__doc__.split())
  assert (f'estimates {cpu["minutes"]:.0f} min for the {cpu["runs"]} runs of ``cpu`` and up to '
          f'{cpu["extension_minutes"]:.0f} min for its {cpu["extension_runs"]} possible '
          f'extension runs, and {goyal["minutes"]:.0f} min for the {goyal["runs"]} runs of '
          '``cpu:goyal``') in doc, doc
  committed = json.load(open(os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                          'experiments', 'results', 'bs_sweep_cpu_shallue',
                                          'results.json')))
  extensions = len(committed) - cpu['runs']
  assert f'took {len(committed)} runs ({cpu["runs"]} + {extensions} extensions)' in doc
  # --help prints the same estimates, and the arms each preset has.
  script = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'experiments',
                        'batch_size_sweep.py')
  main = runpy.run_path(script)['main']
  assert main(['--help']) == 0
  text = capsys.readouterr().out
  assert (f'  cpu: {cpu["runs"]} runs, {cpu["minutes"]:.0f} min + up to '
          f'{cpu["extension_minutes"]:.0f} min for {cpu["extension_runs"]} extension runs') in text
  assert f'  cpu:goyal: {goyal["runs"]} runs, {goyal["minutes"]:.0f} min' in text
  assert '45 min' not in text and '{dry_run_estimates}' not in text
  assert sweep.sweep_preset('cpu').arms == (('sqrt', True),)
  assert "``cpu``: one arm, the square-root rule with warmup" in text


def test_a_stop_at_target_dry_run_says_its_estimate_is_a_bound(data_dir, tmp_path, capsys):
  sweep.sweep(_argv(tmp_path / 'o', data_dir, '--dry_run', '--stop_at_target'))
  assert 'are an upper bound' in capsys.readouterr().out
  sweep.sweep(_argv(tmp_path / 'o', data_dir, '--dry_run'))
  assert 'upper bound' not in capsys.readouterr().out
