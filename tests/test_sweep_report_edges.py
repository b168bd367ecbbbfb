"""Edges of the batch-size sweep report (anp_jax/research/sweep_report.py) on hand-made rows.

A batch size where no learning-rate multiplier produced a choice (all diverged or unfinished)
stays in the report, the report describes B_simple as it is computed, a batch whose seeds missed
the target is named and not averaged over its survivors, and the report is written (naming the
runs that missed) when no run reaches the target. No training: the rows are what
`sweep.collect_results` would return.
"""

import json

import pytest

from anp_jax import noise_scale
from anp_jax.research import sweep
from anp_jax.research import sweep_report as report
from conftest import run_experiment


def _row(batch, mult, status, steps=None, top1=None, seed=0, b_simple=None, late=None):
  return {'name': f'b{batch:05d}-linear-warmup-lrx{mult:g}-s{seed}', 'batch': batch,
          'rule': 'linear', 'warmup': 'on', 'seed': seed, 'lr_mult': mult, 'lr': 0.1 * mult,
          'base_lr': 0.1, 'warmup_epochs': 1.0, 'epochs': 1.0, 'devices': 1,
          'per_device_batch': batch, 'accum_steps': 1, 'steps_per_epoch': 10,
          'total_steps': 100, 'status': status, 'final_step': 100, 'final_top1': top1,
          'final_top5': top1, 'best_top1': top1, 'target_top1': 0.25, 'steps_to_target': steps,
          'examples_to_target': None if steps is None else steps * batch,
          'epochs_to_target': None, 'wall_time_s': 1.0, 'b_simple': b_simple, 'best_lr': True,
          'error': None, 'b_simple_late': late, 'b_simple_window': 'to_target'}


def _searched_rows():
  """--lr_search 1,2: B=32 has a best rate; every multiplier of B=1024 diverged; B=2048 has one
  diverged and one unfinished (interrupted) multiplier."""
  return [_row(32, 1, 'finished', 50, 0.5), _row(32, 2, 'finished', 40, 0.5),
          _row(1024, 1, 'diverged'), _row(1024, 2, 'diverged'),
          _row(2048, 1, 'diverged'), _row(2048, 2, 'incomplete')]


def test_batch_with_no_chosen_lr_stays_in_the_report_with_its_counts(tmp_path):
  rows = sweep.select_best_lr(_searched_rows())
  assert {(r['batch'], r['lr_mult']) for r in rows if r['best_lr']} == {(32, 2)}
  entries = {e['batch']: e for e in report.aggregate(rows)[('linear', 'on')]}
  # Every batch size of the sweep is in the table, as with a single multiplier.
  assert sorted(entries) == [32, 1024, 2048]
  assert (entries[1024]['n'], entries[1024]['diverged'], entries[1024]['unfinished']) == (0, 2, 0)
  assert (entries[2048]['n'], entries[2048]['diverged'], entries[2048]['unfinished']) == (0, 1, 1)
  assert entries[1024]['top1'] is None and entries[1024]['steps'] is None
  assert entries[1024]['lr'] is None  # No rate was chosen: no "peak lr" to show.
  assert entries[32]['lr'] == pytest.approx(0.2) and entries[32]['unfinished'] == 0
  # Without a choice nothing enters the fit.
  assert report.fit_arms(report.aggregate(rows))[('linear', 'on')]['points'] == 1

  (tmp_path / 'results.json').write_text(json.dumps(rows))
  text = open(report.make_report(str(tmp_path))).read()
  table = [line for line in text.splitlines() if line.startswith('| linear rule, warmup |')]
  cells = {int(line.split('|')[2]): line for line in table[:3]}
  assert sorted(cells) == [32, 1024, 2048]
  assert '| 2 runs: 2 diverged |' in cells[1024] and '| 1024 | — |' in cells[1024]
  assert '| 2 runs: 1 diverged, 1 unfinished |' in cells[2048]
  # ... and named under the steps figure with the runs that did not reach the target.
  missed = text.split('did not reach', 1)[1].split('##', 1)[0]
  assert '1024 (no result: 2 diverged)' in missed
  assert '2048 (no result: 1 diverged, 1 unfinished)' in missed


def test_searched_rate_with_one_diverged_seed_counts_its_finished_seed():
  rows = sweep.select_best_lr([_row(64, 1, 'finished', 50, 0.5, seed=0),
                               _row(64, 1, 'diverged', seed=1),
                               _row(64, 2, 'diverged', seed=0), _row(64, 2, 'diverged', seed=1)])
  assert not any(r['best_lr'] for r in rows)
  (entry,) = report.aggregate(rows)[('linear', 'on')]
  assert (entry['n'], entry['runs'], entry['diverged'], entry['unfinished']) == (0, 4, 3, 0)
  assert entry['top1'] is None  # No accuracy of a rate that was not chosen.
  assert report._run_counts(entry) == '3 diverged, 1 finished'


def test_single_multiplier_diverged_batch_is_reported_as_before():
  rows = sweep.select_best_lr([_row(32, 1, 'finished', 50, 0.5), _row(1024, 1, 'diverged')])
  entries = {e['batch']: e for e in report.aggregate(rows)[('linear', 'on')]}
  assert sorted(entries) == [32, 1024]
  assert (entries[1024]['n'], entries[1024]['diverged']) == (0, 1)
  assert entries[1024]['lr'] == pytest.approx(0.1)  # Its only rate is its rate.


def test_report_describes_b_simple_as_summarize_run_computes_it(tmp_path):
  # The method: per run, mean tr(Σ) / mean |G|² over the window, not a median of per-step
  # ratios; here the two differ (ratios 1, 1, 10: median 1; means 1 / 0.7).
  records = [{'step': s, noise_scale.G2_FIELD: g2, noise_scale.TRACE_FIELD: tr}
             for s, g2, tr in ((2, 1.0, 1.0), (4, 1.0, 1.0), (6, 0.1, 1.0))]
  assert noise_scale.window_b_simple(records) == pytest.approx(3.0 / 2.1)
  rows = [_row(32, 1, 'finished', 50, 0.5, b_simple=2.0, late=5.0),
          _row(64, 1, 'finished', 30, 0.5, b_simple=4.0, late=10.0, seed=0),
          _row(64, 1, 'finished', 30, 0.5, b_simple=8.0, late=20.0, seed=1)]
  rows[2]['name'] = 'b00064-linear-warmup-lrx1-s1'
  (tmp_path / 'results.json').write_text(json.dumps(rows))
  text = ' '.join(open(report.make_report(str(tmp_path))).read().split())
  assert 'median logged noise scale' not in text
  assert ('ratio of the means of its logged tr(Σ) and |G|² estimates over a window of its '
          'steps') in text
  assert "up to the run's crossing of the target" in text and 'late' in text
  # Table: mean over seeds with its t-interval (B=64: 6.0 [mean ± 12.706 · 2.83 / √2]) and the
  # late window beside it; fit table: medians over batch sizes (of 2 and 6: 4; of 5 and 15: 10).
  assert '| linear rule, warmup | 64 |' in text and '| 6.0 [-19.4, 31.4] | 15.0 [' in text
  fit = report.fit_arms(report.aggregate(rows))[('linear', 'on')]
  assert (fit['b_simple_median'], fit['b_simple_late_median']) == (4.0, 10.0)


def test_rows_written_before_two_windows_are_read_as_the_late_window():
  """A results file from before issue 32 item 4 has one B_simple, over the late window: it is
  not shown as the window up to the target."""
  rows = [_row(32, 1, 'finished', 50, 0.5, b_simple=2.0), _row(64, 1, 'finished', 30, 0.5,
                                                              b_simple=4.0)]
  for r in rows:
    del r['b_simple_late'], r['b_simple_window']
  entries = report.aggregate(rows)[('linear', 'on')]
  assert [e['b_simple'] for e in entries] == [None, None]
  assert [e['b_simple_late'] for e in entries] == [2.0, 4.0]
  assert {e['b_simple_window'] for e in entries} == {'late'}


def _fit_rows(s_min, b_crit, noise, seeds=3, batches=(32, 64, 128, 256, 512), b_simple=150.0):
  """Seeds of S = S_min (1 + B_crit / B), each scaled by exp(noise · z) (fixed draws)."""
  import numpy as np
  rng = np.random.default_rng(1)
  rows = []
  for b in batches:
    for s in range(seeds):
      steps = s_min * (1 + b_crit / b) * float(np.exp(noise * rng.standard_normal()))
      r = _row(b, 1, 'finished', steps, 0.5, seed=s,
               b_simple=b_simple * float(np.exp(noise * rng.standard_normal())))
      r['name'] = f'b{b:05d}-linear-warmup-lrx1-s{s}'
      rows.append(r)
  return rows


def test_b_crit_and_b_simple_get_bootstrap_intervals_over_seeds():
  """Issue 32 item 4: B_crit, B_simple and their ratio each with a 95 % interval over seeds.
  Without noise the interval is the point; with noise it covers the true B_crit and is wider
  the noisier the seeds; data in the perfect-scaling regime (S ∝ 1/B) cannot bound B_crit."""
  exact = report.fit_arms(report.aggregate(_fit_rows(50.0, 200.0, 0.0)))[('linear', 'on')]
  assert exact['b_crit'] == pytest.approx(200.0)
  assert exact['ci']['b_crit']['low'] == pytest.approx(200.0)
  assert exact['ci']['b_crit']['high'] == pytest.approx(200.0)
  assert exact['ratio'] == pytest.approx(200.0 / 150.0)
  widths = []
  for noise in (0.05, 0.2):
    fit = report.fit_arms(report.aggregate(_fit_rows(50.0, 200.0, noise)))[('linear', 'on')]
    ci = fit['ci']
    assert ci['b_crit']['low'] <= fit['b_crit'] <= ci['b_crit']['high']
    assert ci['b_crit']['low'] < 200.0 < ci['b_crit']['high']
    assert ci['b_simple']['low'] <= fit['b_simple_median'] <= ci['b_simple']['high']
    assert ci['ratio']['low'] < fit['ratio'] < ci['ratio']['high']
    widths.append(ci['b_crit']['high'] - ci['b_crit']['low'])
  assert widths[1] > 2 * widths[0]
  perfect = report.fit_arms(report.aggregate([
      dict(r, steps_to_target=6400.0 / r['batch'], examples_to_target=6400.0)
      for r in _fit_rows(1.0, 1.0, 0.0)]))[('linear', 'on')]
  assert perfect['ci']['unbounded'] == 1.0 and perfect['ci']['b_crit']['high'] == float('inf')


def test_a_batch_whose_seeds_diverged_is_not_fitted_from_its_survivor():
  """Issue 32: with one lr multiplier, B=1024 with seeds {reached at 40, diverged, diverged} was
  fitted as "steps 40, 1 seed" (the survivor's mean); its diverged seeds count: no mean, out of
  the fit, and the counts say why."""
  rows = [_row(b, 1, 'finished', steps, 0.5, seed=s)
          for b, steps in ((32, 100.0), (64, 60.0)) for s in (0, 1, 2)]
  rows += [_row(1024, 1, 'finished', 40.0, 0.3, seed=0), _row(1024, 1, 'diverged', seed=1),
           _row(1024, 1, 'diverged', seed=2)]
  for r in rows:
    r['name'] = f'b{r["batch"]:05d}-linear-warmup-lrx1-s{r["seed"]}'
  rows = sweep.select_best_lr(rows)
  entries = {e['batch']: e for e in report.aggregate(rows)[('linear', 'on')]}
  assert entries[1024]['steps'] is None
  assert entries[1024]['top1'] is None
  assert report.fit_arms(report.aggregate(rows))[('linear', 'on')]['points'] == 2


# ----------------------------------------------------------------------------------------------
# The report when no run reaches the target: written, the runs that missed it named.


def _missed_target_row(batch, steps_to_target, top1=0.1):
  return {'name': f'b{batch:05d}-linear-warmup-lrx1-s0', 'batch': batch, 'rule': 'linear',
          'warmup': 'on', 'seed': 0, 'lr_mult': 1.0, 'base_lr': 0.2, 'lr': 0.1 * batch / 128,
          'warmup_epochs': 1.0, 'epochs': 1.0, 'devices': 2, 'per_device_batch': batch // 2,
          'accum_steps': 1, 'steps_per_epoch': 10, 'total_steps': 10, 'status': 'finished',
          'final_step': 10, 'final_top1': top1, 'final_top5': 0.3, 'best_top1': top1,
          'target_top1': 0.25, 'steps_to_target': steps_to_target,
          'examples_to_target': None if steps_to_target is None else steps_to_target * batch,
          'epochs_to_target': None, 'wall_time_s': 1.0, 'b_simple': None, 'best_lr': True,
          'error': None}


@pytest.mark.parametrize('reached', [(None, None), (40, None)])
def test_report_is_written_when_runs_miss_the_target(tmp_path, reached):
  rows = [_missed_target_row(128, reached[0]), _missed_target_row(256, reached[1])]
  (tmp_path / 'results.json').write_text(json.dumps(rows))
  r = run_experiment('report.py', str(tmp_path))
  assert r.returncode == 0, r.stderr
  text = (tmp_path / 'report.md').read_text()
  assert (tmp_path / 'steps_vs_batch.png').stat().st_size > 0
  assert '| linear rule, warmup | 256 |' in text and 'never' in text
  assert 'did not reach' in text  # The missed runs are named, not silently left out.


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


def _with_test(row, test_steps, test_top1):
  """A row whose run also evaluated the held-out test split (the sweep's evals include it)."""
  return dict(row, has_test=True, outcome='reached', test_outcome='reached',
              test_steps_to_target=test_steps,
              test_examples_to_target=test_steps * row['batch'],
              **{'eval/anp_top1': row['final_top1'], 'test/anp_top1': test_top1})


def test_a_sweep_with_a_test_split_publishes_test_figures_and_chooses_on_validation(tmp_path):
  """Rates are chosen on validation (x2: 40 steps there vs 50), every published figure of the
  chosen rate comes from test (its test crossings 44 / 48 and test top-1), and the report says
  which split is which. Before: the table showed the validation steps of the chosen rate."""
  rows = [_with_test(_row(32, 1, 'finished', 50, 0.5, seed=s), 30, 0.6) for s in (0, 1, 2)]
  rows += [_with_test(_row(32, 2, 'finished', 40, 0.5, seed=s), 44 + 2 * s, 0.4 + 0.01 * s)
           for s in (0, 1, 2)]
  (entry,) = report.aggregate(rows)[('linear', 'on')]
  assert entry['lr_mult'] == 2 and entry['published_split'] == 'test'
  assert entry['steps'] == pytest.approx(46) and entry['examples'] == pytest.approx(46 * 32)
  assert entry['top1'] == pytest.approx(0.41)
  assert report.fit_arms({('linear', 'on'): [entry]})[('linear', 'on')]['points'] == 1
  (tmp_path / 'results.json').write_text(json.dumps(rows))
  text = open(report.make_report(str(tmp_path))).read()
  assert 'chosen on validation' in text and 'published figures on the test split' in text
  assert '| 46 [' in text and '| 41.00 [' in text and 'stopped at the target' not in text
  # Runs stopped at the target: their "final" top-1 is no fixed-budget accuracy, and it says so.
  (tmp_path / 'results.json').write_text(json.dumps([dict(r, final_step=60) for r in rows]))
  text = open(report.make_report(str(tmp_path))).read()
  assert '6 of 6 runs stopped at the target' in text


def test_rates_given_per_batch_size_are_not_called_a_search(tmp_path):
  """A sweep run at the rates another sweep chose (--lr_from: sweep.json's point_lr, one
  multiplier per batch) says so; before, differing multipliers read "Learning rates were
  searched"."""
  rows = [_row(32, 1, 'finished', 50, 0.5), _row(64, 2, 'finished', 30, 0.5)]
  (tmp_path / 'results.json').write_text(json.dumps(rows))
  (tmp_path / 'sweep.json').write_text(json.dumps(
      {'point_lr': {'b00032-linear-warmup': [1.0], 'b00064-linear-warmup': [2.0]}}))
  text = open(report.make_report(str(tmp_path))).read()
  assert 'not tuned here' in text and 'were searched' not in text
  (tmp_path / 'sweep.json').write_text(json.dumps({'point_lr': {}}))
  assert 'were searched' in open(report.make_report(str(tmp_path))).read()
