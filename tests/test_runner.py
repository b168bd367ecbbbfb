"""The study runner (anp_jax/research/runner.py and study*.py) on any study preset.

* A study is checked before any training (bad fields, names, axes, targets).
* A diverged run, or an evaluation of a non-finite state, never reaches the target.
* Emulated training (the trainer replaced by a function that writes known logs): the learning
  rate is chosen on the validation split and the figures are published on the test split; the
  grid is extended until the choice is interior; statistics count a diverged seed.
* The ghost-BN study preset's tiny variant end to end through the real command line
  (``experiments/study.py``), resumed; the cpu preset's --dry_run.
* The end of a multi-process study: process 0 writes the results and a slow report while the
  other process waits at a bounded barrier (before: it left, and JAX's 60 s shutdown barrier
  failed the job).
"""

import dataclasses
import json
import math
import os
import sys
import types

import pytest

from anp_jax import trainer
from anp_jax.research import runner, stats, study_cli, study_results
from anp_jax.research.study import LrGrid, Study, StudyError, from_preset
from conftest import ROOT, crossing_study, finish, launch, run_experiment

# ----------------------------------------------------------------------------------------------
# The study definition.


def _study(**kw):
  return Study(**{'kind': 't', 'points': (('a', {'bn_group_size': 4}),), 'target_value': 0.2,
                  **kw})


@pytest.mark.parametrize('kw,message', [
    (dict(points=()), 'has no points'),
    (dict(points=(('a/b', {}),)), 'directory names'),
    (dict(points=(('a', {}), ('a', {}))), 'must be unique'),
    (dict(points=(('a', {'seed': 1}),)), "sets \\['seed'\\]"),
    (dict(points=(('a', {'base_lr': 1.0}),)), 'own axes'),
    (dict(seeds=()), 'no seeds'),
    (dict(target_value=0.0), 'unreachable target'),
    (dict(target_value=1.5), 'unreachable target'),
    (dict(target_metric='test/anp_top1'), 'validation accuracy'),
    (dict(target_metric='eval/loss'), 'validation accuracy'),
])
def test_bad_studies_are_refused(kw, message):
  with pytest.raises(StudyError, match=message):
    _study(**kw)


@pytest.mark.parametrize('kw,message', [
    (dict(multipliers=(0.5, -1.0)), 'multipliers > 0'),
    (dict(multipliers=()), 'multipliers > 0'),
    (dict(multipliers=(float('nan'),)), 'multipliers > 0'),
    (dict(extensions=-1), '--lr_extensions must be >= 0'),
    (dict(factor=1.0), 'factor must be > 1'),
])
def test_bad_learning_rate_grids_are_refused(kw, message):
  with pytest.raises(StudyError, match=message):
    LrGrid(**kw)


def test_runs_are_points_times_rates_times_seeds_with_extensions():
  study = _study(points=(('a', {}), ('b', {})), seeds=(0, 1), lr=LrGrid((1.0, 0.5, 1.0)))
  names = [k.name for k in study.runs()]
  assert names == ['a-lrx1-s0', 'a-lrx1-s1', 'a-lrx0.5-s0', 'a-lrx0.5-s1',
                   'b-lrx1-s0', 'b-lrx1-s1', 'b-lrx0.5-s0', 'b-lrx0.5-s1']
  more = [k.name for k in study.runs({'b': [2.0]})]
  assert more[-2:] == ['b-lrx2-s0', 'b-lrx2-s1'] and len(more) == 10
  clash = _study(points=(('a', {}),), seeds=(0, 1), run_name=lambda p, m, s: p)
  with pytest.raises(StudyError, match='same directory name'):
    clash.runs()


# ----------------------------------------------------------------------------------------------
# Rows: only a finite state is a result.


def _run_dir(tmp_path, name, evals, final, total_steps=8, batch=32):
  run_dir = tmp_path / name
  run_dir.mkdir()
  record = {'name': name, 'point': 'p', 'fields': {}, 'seed': 0, 'lr_mult': 1.0, 'lr': 0.1,
            'batch': batch, 'train_size': 256, 'steps_per_epoch': 8.0,
            'total_steps': total_steps}
  (run_dir / study_results.RECORD_FILE).write_text(json.dumps(record))
  (run_dir / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in evals))
  if final is not None:
    (run_dir / study_results.FINAL_FILE).write_text(json.dumps(final))
  return str(run_dir)


def test_a_diverged_run_or_a_non_finite_evaluation_never_reaches_the_target(tmp_path):
  evals = [{'step': 2, 'eval/anp_top1': 0.1, 'eval/loss': 2.0},
           {'step': 4, 'eval/anp_top1': 0.3, 'eval/loss': 1.5}]
  # Reached at step 4 (interpolated 3.0), then the loss became NaN: the run diverged.
  row = study_results.summarize_run(
      _run_dir(tmp_path, 'diverged', evals, {'diverged': True, 'step': 6, 'error': 'nan'}),
      'eval/anp_top1', 0.2)
  assert (row['status'], row['outcome'], row['steps_to_target']) == ('diverged', 'diverged', None)
  assert row['eval/anp_top1'] is None and row['error'] == 'nan'
  # An evaluation of a NaN state scores chance accuracy (here 0.5 > the target): not read.
  nan_evals = [{'step': 2, 'eval/anp_top1': 0.1, 'eval/loss': 2.0},
               {'step': 4, 'eval/anp_top1': 0.5, 'eval/loss': float('nan')}]
  row = study_results.summarize_run(
      _run_dir(tmp_path, 'nan_eval', nan_evals, {'step': 8, 'eval/anp_top1': 0.1}),
      'eval/anp_top1', 0.2)
  assert (row['outcome'], row['steps_to_target'], row['best/eval/anp_top1']) == (
      'missed', None, 0.1)
  # The same crossing on a finite state is reached; an unfinished run has no result yet.
  row = study_results.summarize_run(
      _run_dir(tmp_path, 'ok', evals, {'step': 8, 'eval/anp_top1': 0.3}), 'eval/anp_top1', 0.2)
  assert (row['outcome'], row['steps_to_target'], row['examples_to_target']) == (
      'reached', 3.0, 96.0)
  assert row['budget_fraction_at_target'] == pytest.approx(3 / 8) and not row['late_crossing']
  row = study_results.summarize_run(_run_dir(tmp_path, 'running', evals, None),
                                    'eval/anp_top1', 0.2)
  assert (row['status'], row['outcome'], row['steps_to_target']) == (
      'incomplete', 'unfinished', None)


# ----------------------------------------------------------------------------------------------
# Emulated training: choice on validation, publication on test, extension, statistics.


def _emulate(monkeypatch, curve):
  """Replaces the trainer: run `name` logs evaluations at steps 1..4 on both splits from
  `curve(point, lr_mult, seed, split)` -> final accuracy (None: the run diverges at step 2)."""
  trained = []

  def emulated(config, workdir):
    record = json.load(open(os.path.join(workdir, study_results.RECORD_FILE)))
    point, mult, seed = record['point'], record['lr_mult'], record['seed']
    trained.append(record['name'])
    final = {s: curve(point, mult, seed, s) for s in ('eval', 'test')}
    if final['eval'] is None:
      from anp_jax import errors
      raise errors.NonFiniteLossError('loss is nan at step 2')
    lines = []
    for step in (1, 2, 3, 4):
      rec = {'step': step}
      for split, top1 in final.items():
        rec.update({f'{split}/anp_top1': top1 * step / 4, f'{split}/loss': 1.0})
      lines.append(json.dumps(rec) + '\n')
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      f.writelines(lines)
    result = {f'{s}/anp_top1': v for s, v in final.items()}
    with open(os.path.join(workdir, study_results.FINAL_FILE), 'w') as f:
      json.dump({'step': 4, 'wall_time_s': 1.0, **result}, f)
    return types.SimpleNamespace(wall_time_s=1.0, final_eval=result)

  monkeypatch.setattr(trainer, 'train_and_evaluate', emulated)
  return trained


def _argv(out, data_dir, *extra):
  return ['--preset', 'ghost_bn:tiny', '--out', str(out), f'--config.data_dir={data_dir}',
          '--no_report', *extra]


def test_the_rate_is_chosen_on_validation_and_figures_are_published_on_test(
    data_dir, tmp_path, monkeypatch):
  """Validation prefers x2 at point g0002 (test would prefer x0.5): x2 is chosen and the
  published accuracy is x2's test accuracy. At 'global', seed 1 diverges at x2 and x0.5 misses
  the target with seed 1: x1 is chosen, and x2's diverged seed is not averaged away."""
  def curve(point, mult, seed, split):
    if point == 'global' and mult == 2 and seed == 1:
      return None
    good = {'eval': 2.0, 'test': 0.5}[split] if point == 'g0002' else 1.0
    top1 = 0.4 - 0.1 * abs(math.log2(mult / good)) + 0.01 * seed
    return top1 if not (point == 'global' and mult == 0.5 and seed == 1) else 0.1
  trained = _emulate(monkeypatch, curve)
  out = tmp_path / 'study'
  assert study_cli.main(_argv(out, data_dir, '--lr_grid', '0.5,1,2', '--seeds', '0,1')) == 0
  assert len(trained) == 12
  points = {p['point']: p for p in json.load(open(out / 'points.json'))}
  g = points['g0002']
  assert (g['lr_mult'], g['lr_chosen'], g['lr_edge'], g['published_split']) == (
      2.0, True, 'high', 'test')
  top1 = g['final']['test/anp_top1']
  assert top1['kind'] == 'complete' and top1['n'] == 2
  assert top1['mean'] == pytest.approx(0.4 - 0.2 + 0.005)  # x2 on test: 2 octaves off 0.5.
  assert g['steps_to_target']['kind'] == 'complete' and g['test_steps_to_target']
  glob = points['global']
  assert (glob['lr_mult'], glob['lr_edge']) == (1.0, None)
  rows = json.load(open(out / 'results.json'))
  x2 = [r for r in rows if r['point'] == 'global' and r['lr_mult'] == 2.0]
  assert sorted(r['outcome'] for r in x2) == ['diverged', 'reached']
  assert glob['runs'] == 6 and glob['runs_diverged'] == 1
  csv_head = open(out / 'points.csv').readline()
  assert 'test/anp_top1_mean' in csv_head and 'steps_to_target_low' in csv_head
  # The report says how the figures were made.
  text = open(runner.study_report.make_report(str(out))).read()
  assert 'Student-t' in text and 'highest tried' in text
  assert '| g0002 |' in text and 'No test split' not in text


def test_an_edge_choice_extends_the_grid_until_interior_with_every_seed(
    data_dir, tmp_path, monkeypatch, capsys):
  """The best rate is x4 (validation top-1 falls off by octave): x1, x2 -> x4 -> x8, interior
  at x4 after two extensions; a rerun trains nothing and finds the same extensions."""
  trained = _emulate(monkeypatch, lambda p, m, s, split: 0.3 - 0.05 * abs(math.log2(m / 4)))
  out = tmp_path / 'study'
  argv = _argv(out, data_dir, '--lr_grid', '1,2', '--lr_extensions', '3', '--seeds', '0,1',
               '--config.target_value=0.9')
  assert study_cli.main(argv) == 0
  assert [n for n in trained if n.startswith('g0002')] == [
      'g0002-lrx1-s0', 'g0002-lrx1-s1', 'g0002-lrx2-s0', 'g0002-lrx2-s1', 'g0002-lrx4-s0',
      'g0002-lrx4-s1', 'g0002-lrx8-s0', 'g0002-lrx8-s1']
  points = {p['point']: p for p in json.load(open(out / 'points.json'))}
  assert points['g0002']['lr_mult'] == 4.0 and points['g0002']['lr_edge'] is None
  assert points['g0002']['lr_tried'] == [1.0, 2.0, 4.0, 8.0]
  # Nobody reached 0.9: steps are censored at the budget, the choice is the best final top-1.
  assert points['g0002']['steps_to_target']['kind'] == 'censored'
  assert 'best mean final metric' in points['g0002']['lr_reason']
  trained.clear()
  capsys.readouterr()
  assert study_cli.main(argv) == 0
  # The rates tried earlier are read with the grid's: x4 is interior at once, nothing trains.
  assert trained == [] and capsys.readouterr().out.count('finished earlier, skipped') == 8
  again = {p['point']: p for p in json.load(open(out / 'points.json'))}
  assert again['g0002']['lr_mult'] == 4.0 and again['g0002']['lr_tried'] == [1.0, 2.0, 4.0, 8.0]


def test_a_point_whose_seeds_diverged_at_its_only_rate_is_reported_with_them(
    data_dir, tmp_path, monkeypatch):
  """The issue's B=1024 at one rate: one seed reaches the target, two diverge. Not 'steps N,
  1 seed': the steps are censored, the final accuracy has no mean, the counts say why."""
  _emulate(monkeypatch, lambda p, m, s, split: (0.4 if s == 0 else None) if p == 'global'
           else 0.4)
  out = tmp_path / 'study'
  assert study_cli.main(_argv(out, data_dir, '--seeds', '0,1,2')) == 0
  glob = {p['point']: p for p in json.load(open(out / 'points.json'))}['global']
  assert (glob['seeds'], glob['reached'], glob['diverged']) == (3, 1, 2)
  assert glob['lr_chosen'] is False and glob['lr_mult'] == 1.0  # Its only rate, not a choice.
  assert glob['steps_to_target']['kind'] == 'censored' and glob['steps_to_target']['mean'] is None
  assert glob['final']['test/anp_top1']['kind'] == 'diverged'
  text = open(runner.study_report.make_report(str(out))).read()
  assert '(1/3 reached, 2 diverged)' in text and 'No rate without a diverged seed: global' in text


def test_a_tuned_field_is_chosen_with_the_rate_on_validation(data_dir, tmp_path, monkeypatch):
  """warmup_epochs tuned with the rate (Shallue et al. tune warmup per batch size too): every
  (warmup, rate) pair runs; the pair with the best validation wins (here warmup 0.25 at x2 for
  g0002, warmup 0 at x1 for global); the grid extension applies to every warmup value."""
  best = {'g0002': (0.25, 2.0), 'global': (0.0, 1.0)}

  def curve(point, mult, seed, split):
    warm, good = best[point]
    record_warmup = curve.warmup[-1]
    return 0.4 - 0.05 * abs(math.log2(mult / good)) - 0.1 * abs(record_warmup - warm)

  trained = _emulate(monkeypatch, curve)
  real_emulated = trainer.train_and_evaluate
  curve.warmup = []

  def with_warmup(config, workdir):
    curve.warmup.append(float(config.warmup_epochs))
    return real_emulated(config, workdir)
  monkeypatch.setattr(trainer, 'train_and_evaluate', with_warmup)
  base, sweep = study_cli.load_preset('study', 'ghost_bn:tiny')
  base.data_dir = str(data_dir)
  study = from_preset('ghost_bn', dict(sweep, lr_grid=(1.0, 2.0), lr_extensions=1,
                                       tune={'warmup_epochs': (0.0, 0.25)}), base)
  assert [k.name for k in study.runs()][:4] == [
      'g0002-warmup_epochs0-lrx1-s0', 'g0002-warmup_epochs0-lrx1-s1',
      'g0002-warmup_epochs0-lrx2-s0', 'g0002-warmup_epochs0-lrx2-s1']
  out = tmp_path / 'study'
  runner.run_study(study, base, runner.Options(out=str(out), report=False))
  # Round 1: 2 points x 2 warmups x 2 rates x 2 seeds; g0002's x2 is an edge: x4 for both
  # warmups (4 more runs); global's x1 is an edge too: x0.5 (4 more).
  assert len(trained) == 16 + 8
  points = {p['point']: p for p in json.load(open(out / 'points.json'))}
  assert (points['g0002']['tune'], points['g0002']['lr_mult']) == ({'warmup_epochs': 0.25}, 2.0)
  assert (points['global']['tune'], points['global']['lr_mult']) == ({'warmup_epochs': 0.0}, 1.0)
  assert points['g0002']['lr_edge'] is None and points['g0002']['lr_tried'] == [1.0, 2.0, 4.0]
  rows = json.load(open(out / 'results.json'))
  chosen = [r for r in rows if r['point'] == 'g0002' and r['tune'] == {'warmup_epochs': 0.25}
            and r['lr_mult'] == 2.0]
  assert [r['seed'] for r in chosen] == [0, 1] and points['g0002']['seeds'] == 2
  assert chosen[0]['fields'] == {'bn_mode': 'ghost', 'bn_group_size': 2, 'warmup_epochs': 0.25}
  assert sorted(set(curve.warmup)) == [0.0, 0.25]  # What the trainer's configs said.
  with pytest.raises(StudyError, match='either compared'):
    from_preset('x', dict(sweep, tune={'bn_mode': ('ghost',)}), base)


def test_bad_study_input_fails_before_training(data_dir, tmp_path, capsys):
  for extra, message in ((['--config.seed=3'], '--config.seed is an axis'),
                         (['--lr_grid', '0'], 'multipliers > 0'),
                         (['--config.target_value=0'], 'unreachable target'),
                         (['--preset', 'nope'], "Unknown preset 'nope'"),
                         (['--ci', 'jackknife'], 'jackknife')):
    assert study_cli.main(_argv(tmp_path / 'x', data_dir, *extra)) == 2
    assert message in capsys.readouterr().err
  assert study_cli.main(['--preset', 'ghost_bn:tiny', f'--config.data_dir={data_dir}']) == 2
  assert '--out is required' in capsys.readouterr().err
  assert not (tmp_path / 'x').exists()


def test_a_point_with_an_unknown_field_or_a_bad_size_is_named(data_dir, tmp_path):
  base, sweep = study_cli.load_preset('study', 'ghost_bn:tiny')
  base.data_dir = str(data_dir)
  for points, message in (
      ((('a', {'model.widht': 1.0}),), r"Point 'a': Unknown config field --config.model.widht; "
                                       r'did you mean --config.model.width\?'),
      ((('g3', {'bn_group_size': 3}),), r'g3: .*bn_group_size=3')):
    study = from_preset('t', dict(sweep, points=points), base)
    with pytest.raises(StudyError, match=message):
      runner.plan_runs(study, base, runner.Options(out=str(tmp_path / 'o')), devices=8)


# ----------------------------------------------------------------------------------------------
# A preset's stop_at_target (issue 42, item 7).

_STOPPING_PRESET = """
from anp_jax.configs import study_ghost_bn


def get_config(variant='tiny'):
  c = study_ghost_bn.get_config(variant)
  c.stop_at_target = True  # The preset's own setting.
  return c


def get_sweep(variant='tiny'):
  return study_ghost_bn.get_sweep(variant)
"""


@pytest.mark.parametrize('flag,stops', [((), True), (('--stop_at_target',), True),
                                        (('--nostop_at_target',), False)])
def test_a_presets_stop_at_target_holds_unless_the_flag_is_given(data_dir, tmp_path,
                                                                monkeypatch, flag, stops):
  """Before: every run's config had the flag's default (False), whatever the preset said."""
  monkeypatch.setattr(study_cli, 'CONFIGS_DIR', str(tmp_path))
  (tmp_path / 'study_stopping.py').write_text(_STOPPING_PRESET)
  study, base, opts, _ = study_cli.resolve(['--preset', 'stopping', '--out',
                                            str(tmp_path / 'o'),
                                            f'--config.data_dir={data_dir}', *flag])
  runs, _ = runner.plan_runs(study, base, opts, devices=8)
  assert runs and [r.config.stop_at_target for r in runs] == [stops] * len(runs)


@pytest.mark.parametrize('preset,flag,stops', [(False, None, False), (True, None, True),
                                               (True, False, False), (False, True, True)])
def test_a_run_config_stops_at_target_by_the_flag_else_by_the_preset(preset, flag, stops):
  from anp_jax.configs import study_ghost_bn
  base = study_ghost_bn.get_config('tiny')
  base.stop_at_target = preset
  study = from_preset('t', study_ghost_bn.get_sweep('tiny'), base)
  key = study.runs()[0]
  assert runner.make_run_config(base, study, key, flag).stop_at_target is stops


# ----------------------------------------------------------------------------------------------
# The ghost-BN preset for real.


@pytest.mark.slow(150)
def test_ghost_bn_study_tiny_variant_end_to_end_through_the_command_line(data_dir, tmp_path,
                                                                        capsys):
  out = tmp_path / 'gbn'
  args = ('--preset', 'ghost_bn:tiny', '--out', str(out), f'--config.data_dir={data_dir}')
  r = run_experiment('study.py', *args)
  assert r.returncode == 0, r.stderr[-3000:]
  rows = json.load(open(out / 'results.json'))
  assert sorted(r['name'] for r in rows) == ['g0002-lrx1-s0', 'g0002-lrx1-s1',
                                              'global-lrx1-s0', 'global-lrx1-s1']
  for row in rows:
    assert row['status'] == 'finished' and 0.0 <= row['eval/anp_top1'] <= 1.0
    assert row['outcome'] in ('reached', 'missed') and row['total_steps'] == 4
    config = json.load(open(out / 'runs' / row['name'] / 'config.json'))
    assert config['seed'] == row['seed'] and config['bn_mode'] == row['fields']['bn_mode']
  points = json.load(open(out / 'points.json'))
  assert [p['point'] for p in points] == ['g0002', 'global']
  for p in points:
    assert p['seeds'] == 2 and p['reached'] + p['missed'] == 2
    top1 = p['final'][f'{"test" if p["published_split"] == "test" else "eval"}/anp_top1']
    values = [r[f'{"test" if p["published_split"] == "test" else "eval"}/anp_top1']
              for r in rows if r['point'] == p['point']]
    assert top1['mean'] == pytest.approx(sum(values) / 2)
    half = stats.t_quantile(0.975, 1) * top1['sd'] / math.sqrt(2)
    assert (top1['low'], top1['high']) == pytest.approx((top1['mean'] - half,
                                                          top1['mean'] + half))
  report = (out / 'report.md').read_text()
  assert 'Ghost BN group size' in report and 'Student-t' in report and '| g0002 |' in report
  assert json.load(open(out / 'experiment.json')) == {'kind': 'ghost_bn'}
  assert (out / 'points.png').stat().st_size > 1000
  # The report again from the results alone; rerun: nothing trained; another study kind refuses
  # the directory.
  os.remove(out / 'report.md')
  r = run_experiment('report.py', str(out))
  assert r.returncode == 0 and (out / 'report.md').read_text() == report, r.stderr[-2000:]
  r = run_experiment('study.py', *args)
  assert r.returncode == 0 and r.stdout.count('finished earlier, skipped') == 4, r.stdout
  from anp_jax.research import sync_async_mixed  # Its command, in this process.
  capsys.readouterr()
  assert sync_async_mixed.main(['--preset', 'tiny', '--out', str(out), '--dry_run',
                                f'--config.data_dir={data_dir}']) == 2
  assert 'holds the results of ghost bn' in capsys.readouterr().err


def test_ghost_bn_cpu_preset_dry_run_prints_the_runs_and_the_cost(data_dir, tmp_path):
  out = tmp_path / 'gbn'
  r = run_experiment('study.py', '--preset', 'ghost_bn', '--out', str(out), '--dry_run',
                     f'--config.data_dir={data_dir}', devices=2)
  assert r.returncode == 0, r.stderr[-3000:]
  assert ('27 runs (0 finished earlier) = 3 points x 3 seed(s) x lr multipliers [0.5, 1, 2], '
          '2 device(s)' in r.stdout)
  assert 'up to 9 more runs' in r.stdout and 'estimated' in r.stdout
  assert 'g0016-lrx0.5-s0: lr 0.2828, 94 steps' in r.stdout  # sqrt rule: 0.4 x sqrt(2) x 0.5.
  assert 'global-lrx2-s2: lr 1.131, 94 steps' in r.stdout
  assert not out.exists()


# ----------------------------------------------------------------------------------------------
# Several processes: the end of a study.

# experiments/batch_size_sweep.py with a report that takes `seconds` (argv[1]) longer.
SLOW_REPORT = '''
import runpy, sys, time
from anp_jax.research import sweep_report
make_report, seconds = sweep_report.make_report, float(sys.argv[1])
def slow_report(out):
  print('report: sleeping', flush=True)
  time.sleep(seconds)
  return make_report(out)
sweep_report.make_report = slow_report
script = sys.argv[2]
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name='__main__')
'''


@pytest.mark.slow(120)
def test_a_slow_report_at_the_end_of_a_multiprocess_sweep_does_not_fail_the_job(
    data_dir, tmp_path):
  """2 processes x 4 devices; the report takes 12 s longer, over twice the shutdown barrier's
  time-out (ANP_SHUTDOWN_TIMEOUT=5). Before: process 1 left after training and JAX's shutdown
  barrier gave up while process 0 was still writing the report."""
  out = tmp_path / 'sweep'
  cmd = [sys.executable, '-c', SLOW_REPORT, '12', os.path.join(ROOT, 'experiments',
                                                               'batch_size_sweep.py'),
         '--preset', 'tiny', '--out', str(out), '--batch_sizes', '32', '--target_top1', '0.05',
         f'--config.data_dir={data_dir}']
  procs = launch(cmd, 2, 4, tmp_path, ANP_SHUTDOWN_TIMEOUT=5)
  logs = finish(procs, tmp_path, timeout=400)
  assert [p.returncode for p in procs] == [0, 0], [log[-3000:] for log in logs]
  assert 'report: sleeping' in logs[0] and 'Report: ' in logs[0]
  assert 'waiting (at most 240 s, ANP_BARRIER_TIMEOUT) for process 0 to write the results and ' \
         'the report' in logs[1]
  assert (out / 'report.md').exists() and len(json.load(open(out / 'results.json'))) == 1


# ----------------------------------------------------------------------------------------------
# --stop_at_target stops at the later of the validation and test crossings, for real.


def _crossing_study(data_dir, out, stop: bool):
  """One tiny point, one seed: its training-split evaluation crosses first, the test one later."""
  return crossing_study(data_dir, out, kind='crossing', target_value=0.5, seeds=(0,),
                        stop_at_target=stop)


@pytest.mark.slow(120)
def test_stop_at_target_waits_for_the_test_crossing_and_equals_the_uninterrupted_run(
    data_dir, tmp_path):
  """Without stopping, the run's two curves give a target the training split crosses before the
  test split: with --stop_at_target the run stops at the test crossing's evaluation (not at the
  validation one: published steps are on test) and every evaluation up to it equals the
  uninterrupted run's (the continuation is the same run). A rerun trains nothing."""
  study, base, opts = _crossing_study(data_dir, tmp_path / 'full', stop=False)
  runner.run_study(study, base, opts)
  records = [r for r in metrics_io_read(tmp_path / 'full' / 'runs' / 'g0002-lrx1-s0')
             if 'test/anp_top1' in r]
  # A target strictly between the two splits' first crossings, before the end of the run.
  target = None
  for r in records[:-1]:
    if r['test/anp_top1'] < r['eval/anp_top1']:
      target = (r['test/anp_top1'] + r['eval/anp_top1']) / 2
      later = [s for s in records if s['test/anp_top1'] >= target]
      earlier = [s for s in records if s['eval/anp_top1'] >= target]
      if later and earlier and earlier[0]['step'] < later[0]['step'] < records[-1]['step']:
        break
      target = None
  assert target is not None, [(r['step'], r['eval/anp_top1'], r['test/anp_top1'])
                              for r in records]
  stop_study, base, opts = _crossing_study(data_dir, tmp_path / 'stop', stop=True)
  stop_study = dataclasses.replace(stop_study, target_value=target)
  rows = runner.run_study(stop_study, base, opts)
  run_dir = tmp_path / 'stop' / 'runs' / 'g0002-lrx1-s0'
  stopped = [r for r in metrics_io_read(run_dir) if 'test/anp_top1' in r]
  test_cross = next(r['step'] for r in records if r['test/anp_top1'] >= target)
  assert stopped[-1]['step'] == test_cross  # Not the earlier validation crossing.
  flat = lambda rs: [v for r in rs for v in (r['step'], r['eval/anp_top1'], r['test/anp_top1'])]
  assert flat(stopped) == pytest.approx(flat(r for r in records if r['step'] <= test_cross),
                                        rel=1e-6)
  final = json.load(open(run_dir / 'final_metrics.json'))
  assert final['stopped_at_target'] and final['step'] == test_cross
  (row,) = rows
  assert row['outcome'] == 'reached' and row['test_outcome'] == 'reached'
  assert row['steps_to_target'] < row['test_steps_to_target'] <= test_cross
  recorded = row_config(run_dir)
  assert recorded.target_metric == 'test/anp_top1'  # Continued to the test crossing.
  recorded.target_metric = 'eval/anp_top1'  # As planned: nothing left to continue.
  assert runner.test_continuation(recorded, str(run_dir)) is None
  # The rerun: the continued run is recognised as this study's run and not trained again.
  again = runner.run_study(stop_study, base, opts)
  assert [r['test_steps_to_target'] for r in again] == [row['test_steps_to_target']]
  assert json.load(open(run_dir / 'final_metrics.json')) == final


def metrics_io_read(run_dir):
  from anp_jax import metrics_io
  return metrics_io.read_metrics(str(run_dir))


def row_config(run_dir):
  from anp_jax.configs import default
  return default.read_run_config(str(run_dir))


def test_a_recorded_test_target_is_the_continuation_of_the_planned_validation_target():
  assert runner.is_test_continuation('test/anp_top1', 'eval/anp_top1')
  assert not runner.is_test_continuation('eval/anp_top1', 'eval/anp_top1')
  assert not runner.is_test_continuation('test/anp_top5', 'eval/anp_top1')
  assert not runner.is_test_continuation(None, 'eval/anp_top1')
