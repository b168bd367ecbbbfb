"""experiments/sync_async_mixed.py (`anp_jax.research.sync_async_mixed`) end to end (tiny
preset): results, plots, summary, skip on rerun, predicted times per method, bad input; the
per-arm learning-rate grid (choice, columns, resume, a diverged grid point, extension beyond its
edge); the mixed-asynchronous arms (staleness of N workers on the sync arm's cluster)."""

import json
import math
import os
import sys
import types

import pytest

from anp_jax.executors import asynchronous
from anp_jax.research import runner, study_results
from anp_jax.research import sync_async_mixed as sam
from anp_jax.research.study import RunKey


@pytest.mark.slow(190)
def test_tiny_preset_end_to_end_resume_and_lr_grid_with_a_diverged_point(data_dir, tmp_path,
                                                                        capsys, monkeypatch):
  """The tiny preset end to end (3 arms at x1), a rerun that trains nothing; then, in the same
  directory, 2 arms x 2 multipliers: the x1 points are the finished runs of the first part
  (only sync-lrx0.5 trains), and async-04-lrx0.5 diverges (NaN loss, emulated)."""
  from anp_jax import errors, trainer
  out = tmp_path / 'sam'
  argv = ['--preset', 'tiny', '--out', str(out), f'--config.data_dir={data_dir}']
  assert sam.main(argv) == 0
  rows = json.load(open(out / 'results.json'))
  assert [r['name'] for r in rows] == ['sync', 'async-04', 'local-n2-h02']
  for r in rows:
    assert r['curve'] and 0.0 <= r['final_top1'] <= 1.0 and not r['diverged']
    assert r['curve'][-1]['hours'] == pytest.approx(
        r['curve'][-1]['epoch'] * r['predicted_epoch_s'] / 3600)
  by_name = {r['name']: r for r in rows}
  assert 'asynchronous SGD' in by_name['async-04']['predicted_cluster']
  assert 'local SGD' in by_name['local-n2-h02']['predicted_cluster']
  assert by_name['sync']['final_loss'] != by_name['async-04']['final_loss']
  for name in ('accuracy_vs_epochs.png', 'accuracy_vs_time.png'):
    assert (out / name).stat().st_size > 1000
  summary = (out / 'summary.md').read_text()
  assert '| async-04 |' in summary and 'predicted epoch' in summary
  capsys.readouterr()
  assert sam.main(argv) == 0  # Everything finished: nothing retrained.
  assert capsys.readouterr().out.count('finished earlier, skipped') == 3

  # The per-arm lr grid on the same directory (sync and async-04 at x1 finished above).
  argv = ['--preset', 'tiny', '--out', str(out), '--nodes', '', '--lr_grid', '0.5,1',
          '--target_top1', '0.05', f'--config.data_dir={data_dir}']
  real = trainer.train_and_evaluate

  def nan_at_x05_async(config, workdir):
    if os.path.basename(workdir) == 'async-04-lrx0.5':
      raise errors.NonFiniteLossError('loss is nan at step 1')
    return real(config, workdir)
  monkeypatch.setattr(trainer, 'train_and_evaluate', nan_at_x05_async)
  assert sam.main(argv) == 0
  log = capsys.readouterr().out
  assert log.count('finished earlier, skipped') == 2 and 'sync-lrx0.5: training' in log
  grid = json.load(open(out / 'grid.json'))
  assert sorted(r['run'] for r in grid) == ['async-04', 'async-04-lrx0.5', 'local-n2-h02',
                                            'sync', 'sync-lrx0.5']
  rows = {r['name']: r for r in json.load(open(out / 'results.json'))}
  # The arms of this invocation, then the local-SGD arm the first part trained in DIR.
  assert list(rows) == ['sync', 'async-04', 'local-n2-h02']
  assert rows['async-04']['lr_mult'] == 1.0 and rows['async-04']['run'] == 'async-04'
  assert not rows['async-04']['diverged']
  by_mult = {g['lr_mult']: g for g in rows['async-04']['lr_grid']}
  assert by_mult[0.5]['status'] == 'diverged' and by_mult[1.0]['status'] == 'finished'
  sync_grid = [r for r in grid if r['arm'] == 'sync']
  assert rows['sync']['steps_to_target'] == min(r['steps_to_target'] for r in sync_grid)
  assert rows['sync']['lr'] == pytest.approx(0.1 * rows['sync']['lr_mult'])  # 0.1 per 32.
  for r in rows.values():  # The earlier columns are still there.
    assert {'final_top1', 'best_top1', 'predicted_epoch_s', 'predicted_cluster', 'curve',
            'diverged'} <= set(r)
    assert r['examples_to_target'] == r['steps_to_target'] * r['batch']
  summary = (out / 'summary.md').read_text()
  header = next(l for l in summary.splitlines() if l.startswith('| run |'))
  assert header.split('|')[1:-1] == [
      ' run ', ' examples / update ', ' mean staleness (updates; examples) ', ' final top-1 ',
      ' best top-1 ', ' predicted epoch ', ' time for the run ', ' cluster ', ' chosen lr ',
      ' lr grid (seeds on validation) ', ' examples to target ']
  assert '| async-04 | 32 | 3; 96 |' in summary  # Unmapped: every arm at the config's 32.
  assert 'x0.5: diverged' in summary and 'never chosen' in summary
  assert 'Cluster sizes differ' in summary  # sync predicted on 16 devices, async-04 on 4.

  # Rerun: every grid point is finished (the diverged one too): nothing is trained.
  monkeypatch.setattr(trainer, 'train_and_evaluate', real)
  assert sam.main(argv) == 0
  assert capsys.readouterr().out.count('finished earlier, skipped') == 4
  assert len(json.load(open(out / 'grid.json'))) == 5  # local-n2-h02 is read, not planned.
  # A grid point without final metrics (killed) is trained again, the others are skipped.
  os.remove(out / 'runs' / 'sync-lrx0.5' / 'final_metrics.json')
  assert sam.main(argv) == 0
  log = capsys.readouterr().out
  assert log.count('finished earlier, skipped') == 3 and 'sync-lrx0.5: resuming' in log
  assert json.load(open(out / 'results.json'))[0]['name'] == 'sync'


@pytest.mark.parametrize('extra,message', [
    (['--workers', '0'], 'must be >= 1'),
    (['--config.method=async'], 'set per run'),
    (['--noconfig.async_sgd.staleness_aware_lr'], 'set per run'),  # absl's boolean "off".
    (['--config.async_sgd.staleness_aware_lr', '--epochs', '1'], 'set per run'),
    (['-config.method=async'], 'set per run'),  # One dash is absl too.
    (['--nodes', '3'], 'does not divide the 8 devices'),
    (['--config.no_such_field=1'], 'Unknown config field --config.no_such_field'),
    (['--mixed', '3'], 'N must divide 16'),
    (['--mixed', '2'], 'at most 4 devices per worker'),
    (['--lr_extensions=-1'], '--lr_extensions must be >= 0'),
])
def test_bad_input_is_reported_before_training(data_dir, tmp_path, capsys, extra, message):
  argv = ['--preset', 'tiny', '--out', str(tmp_path), f'--config.data_dir={data_dir}'] + extra
  assert sam.main(argv) == 2
  assert message in capsys.readouterr().err
  assert not os.path.exists(tmp_path / 'runs')


def test_an_explicit_checkpoint_or_log_cadence_is_kept(data_dir, tmp_path):
  """The runner's checkpoint (one per epoch) and log (4 per epoch) cadences are defaults: an
  explicit ``--config.checkpoint_every_steps`` / ``--config.log_every_steps`` is used as given
  (results are read from the evaluations, whatever was checkpointed or logged)."""
  argv = ['--preset', 'tiny', '--out', str(tmp_path), f'--config.data_dir={data_dir}']
  runs, _ = sam.plan_runs(sam.resolve(argv), devices=8)
  assert {(r.config.checkpoint_every_steps, r.config.log_every_steps) for r in runs} != {(1, 1)}
  runs, _ = sam.plan_runs(sam.resolve(argv + ['--config.checkpoint_every_steps=1',
                                              '--config.log_every_steps=1']), devices=8)
  assert [(r.config.checkpoint_every_steps, r.config.log_every_steps) for r in runs] == [
      (1, 1)] * len(runs)
  runs, _ = sam.plan_runs(sam.resolve(argv + ['--config.checkpoint_every_steps=0']), devices=8)
  assert [r.config.checkpoint_every_steps for r in runs] == [0] * len(runs)  # 0: none.


def _record(arm, mult, steps, top1, status='finished'):
  return {'arm': arm, 'run': f'{arm}-lrx{mult:g}', 'lr_mult': mult, 'lr': 0.1 * mult,
          'status': status, 'final_top1': None if status == 'diverged' else top1,
          'best_top1': top1, 'steps_to_target': steps,
          'examples_to_target': None if steps is None else 32 * steps}


def test_each_arm_gets_the_rate_reaching_the_target_in_the_fewest_examples():
  records = [
      _record('sync', 0.5, 40.0, 0.30), _record('sync', 1.0, 25.0, 0.28),  # fewer steps wins
      _record('async-16', 0.5, None, 0.12), _record('async-16', 1.0, None, 0.09),  # none reach:
      _record('async-16', 2.0, 5.0, 0.5, status='diverged'),          # best top-1, never NaN
      _record('local-n4-h04', 1.0, None, 0.2, status='diverged')]     # nothing to choose
  rows = {r['name'] if 'name' in r else r['arm']: r for r in sam.choose(records)}
  assert (rows['sync']['lr_mult'], rows['sync']['lr_chosen']) == (1.0, True)
  assert (rows['async-16']['lr_mult'], rows['async-16']['lr_chosen']) == (0.5, True)
  assert [g['status'] for g in rows['async-16']['lr_grid']] == ['finished', 'finished',
                                                                'diverged']
  assert rows['local-n4-h04']['lr_chosen'] is False
  # Edges: sync's best is its highest rate, async-16's its lowest; all diverged: go lower.
  assert [rows[a]['lr_edge'] for a in ('sync', 'async-16', 'local-n4-h04')] == [
      'high', 'low', 'low']
  assert _extensions(records, 2) == {'sync': 2.0, 'async-16': 0.25, 'local-n4-h04': 0.5}
  assert _extensions(records, 0) == {}
  # An arm extended `limit` times beyond the base grid is not extended again.
  twice = [_record('sync', m, None, 0.1 * (1 + math.log2(1 / m))) for m in (0.25, 0.5, 1.0)]
  (row,) = sam.choose(twice)
  assert row['lr_edge'] == 'low' and row['lr_mult'] == 0.25
  assert _extensions(twice, 1) == {}
  assert _extensions(twice, 2) == {'sync': 0.125}


def _extensions(records, limit):
  """The runner's next multipliers for the arms of `records` (base grid 0.5, 1, 2)."""
  choices = study_results.choose_rates(records, lambda r: r['arm'], lambda r: r['final_top1'])
  return study_results.extensions(choices, (0.5, 1.0, 2.0), limit)


def test_dry_run_estimates_the_cpu_preset_and_trains_nothing(data_dir, tmp_path, capsys):
  """The cpu preset is mapped to 16 K80s of 32 images: each arm's examples per update and
  staleness in examples are the cluster's (before: every arm at 128 per update, so async-16's
  staleness was 4x the cluster's in examples)."""
  out = tmp_path / 'sam'
  assert sam.main(['--preset', 'cpu', '--out', str(out), '--dry_run', '--nodes', '4',
                   '--config.bn_group_size=4', f'--config.data_dir={data_dir}']) == 0
  text = capsys.readouterr().out
  assert ('72 runs (0 finished earlier) = 8 points x 3 seed(s) x lr multipliers [0.5, 1, 2]'
          in text)
  assert 'at most 4 time(s) each: up to 96 more runs' in text
  assert 'estimated' in text and not out.exists()
  for run, batch in (('sync', 512), ('async-16', 32), ('async-16-comp-s2', 32),
                     ('mixed-n04', 128), ('mixed-n08', 64), ('local-n4-h04', 512)):
    line = text.split(f'\n  {run}: ')[1].split('\n')[0]
    assert line.endswith(f', {batch // 8}/device'), (run, line)  # 8 test devices.
  ex = sam.resolve(['--preset', 'cpu', '--out', str(out)])
  assert [a.name for a in ex.arms] == [
      'sync', 'async-16', 'async-16-comp', 'mixed-n04', 'mixed-n08', 'local-n4-h01',
      'local-n4-h04', 'local-n4-h16']
  assert {arm.devices(ex.sync_devices) for arm in ex.arms} == {16}  # One cluster size.
  batch = {a.name: ex.fields(a)['batch_size'] for a in ex.arms}
  assert batch == {'sync': 512, 'async-16': 32, 'async-16-comp': 32, 'mixed-n04': 128,
                   'mixed-n08': 64, 'local-n4-h01': 512, 'local-n4-h04': 512,
                   'local-n4-h16': 512}
  # Staleness in examples as on the cluster: (N - 1) updates of one worker's examples.
  stale = {a.name: a.staleness() * batch[a.name] for a in ex.arms}
  assert (stale['async-16'], stale['mixed-n04'], stale['mixed-n08'], stale['sync']) == (
      480, 384, 448, 0)
  comp = ex.fields(next(a for a in ex.arms if a.name == 'async-16-comp'))
  assert comp['async_sgd.momentum'] == 'compensate'
  assert ex.fields(ex.arm['async-16'])['async_sgd.momentum'] == 'keep'
  assert all(sam.parse_arm(a.name) == a for a in ex.arms)  # Names read back as their arms.
  assert sam.parse_arm('b00032-sqrt-warmup') is None


@pytest.mark.parametrize('workers', [4, 8])
def test_a_mixed_arm_trains_with_the_staleness_of_n_workers_predicted_on_16_devices(workers):
  ex = sam.resolve(['--preset', 'cpu', '--out', '/nonexistent/sam'])
  arm = next(a for a in ex.arms if a.name == f'mixed-n{workers:02d}')
  key = RunKey(arm.name, arm.name, arm.fields, 1.0, 0)
  config = runner.make_run_config(ex.base, sam.study(ex), key, stop_at_target=False)
  assert config.method == 'async' and config.async_sgd.staleness == 'simulated'
  taus = asynchronous.staleness_sequence(config, 5000)
  assert taus.mean() == pytest.approx(workers - 1, abs=0.1)
  assert config.async_sgd.max_tau == 2 * workers
  p = sam.predict_arm(arm, ex.sync_devices)
  assert p.method == 'mixed' and p.num_devices == 16 == arm.devices(ex.sync_devices)
  assert (p.nodes, p.devices_per_node, p.num_workers) == (workers, 16 // workers, workers)
  assert p.mean_staleness == pytest.approx(workers - 1, abs=0.1)  # The model agrees.
  assert 'mixed-asynchronous' in sam.predicted_epoch(arm, ex.sync_devices)[1]


def test_an_edge_rate_extends_the_grid_until_interior_or_the_limit(data_dir, tmp_path, capsys,
                                                                  monkeypatch):
  """Emulated training (top-1 peaks at x4 for sync, below x0.125 for mixed-n04): sync is
  extended to x4 then x8 and ends interior at x4; mixed-n04 to x0.25, x0.125 and stays at the
  edge after its 2 extensions; a rerun trains nothing."""
  from anp_jax import trainer
  trained = []

  def emulated(config, workdir):
    name = os.path.basename(workdir)
    arm, _, mult = name.partition('-lrx')
    mult = float(mult or 1)
    peak = {'sync': 4.0, 'mixed-n04': 0.0625}[arm]
    top1 = 0.2 - 0.02 * abs(math.log2(mult / peak))
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      for step in (1, 2):
        f.write(json.dumps({'step': step, 'eval/anp_top1': top1 * step / 2,
                            'eval/loss': 3.0}) + '\n')
    final = {'eval/anp_top1': top1, 'eval/loss': 3.0, 'wall_time_s': 1.0}
    with open(os.path.join(workdir, 'final_metrics.json'), 'w') as f:
      json.dump(final, f)
    trained.append(name)
    return types.SimpleNamespace(wall_time_s=1.0, final_eval=final)
  monkeypatch.setattr(trainer, 'train_and_evaluate', emulated)
  out = tmp_path / 'sam'
  argv = ['--preset', 'tiny', '--out', str(out), '--workers', '', '--nodes', '', '--mixed', '4',
          '--lr_grid', '0.5,1,2', '--lr_extensions', '2', '--target_top1', '0.9',
          f'--config.data_dir={data_dir}']
  assert sam.main(argv) == 0
  assert trained == ['sync-lrx0.5', 'sync', 'sync-lrx2', 'mixed-n04-lrx0.5', 'mixed-n04',
                     'mixed-n04-lrx2', 'sync-lrx4', 'mixed-n04-lrx0.25', 'sync-lrx8',
                     'mixed-n04-lrx0.125']
  rows = {r['name']: r for r in json.load(open(out / 'results.json'))}
  assert (rows['sync']['lr_mult'], rows['sync']['lr_edge']) == (4.0, None)
  assert (rows['mixed-n04']['lr_mult'], rows['mixed-n04']['lr_edge']) == (0.125, 'low')
  assert [g['lr_mult'] for g in rows['mixed-n04']['lr_grid']] == [0.125, 0.25, 0.5, 1.0, 2.0]
  assert len(json.load(open(out / 'grid.json'))) == 10
  assert rows['mixed-n04']['predicted_cluster'].startswith('4x4 K80, mixed-asynchronous SGD')
  summary = (out / 'summary.md').read_text()
  assert 'Cluster size: every arm on 16 devices.' in summary
  edge = next(l for l in summary.splitlines() if l.startswith('Best rate still at the edge'))
  assert edge.endswith('after at most 2 factor-2 extension(s) per arm (the optimum may lie '
                       'beyond): mixed-n04 (lowest, x0.125).')
  assert '| sync | 32 | 0; 0 | 20.00 % |' in summary and '0.4 (x4) |' in summary
  trained.clear()
  capsys.readouterr()
  assert sam.main(argv) == 0  # Everything finished: nothing retrained (the choices read the
  # extension runs too, so no extension round is planned again).
  assert trained == [] and capsys.readouterr().out.count('finished earlier, skipped') == 6
  assert len(json.load(open(out / 'grid.json'))) == 10
  assert sam.main(argv + ['--dry_run']) == 0
  text = capsys.readouterr().out
  assert '6 runs (6 finished earlier)' in text
  assert 'first extension' not in text  # Every extension is among the finished runs.


def studies_row(r):
  """An arm's row of docs/studies.md's mapped sync/async/mixed table, from its results.json
  record: every figure over the seeds of its chosen rate, on the test split."""
  from anp_jax.research import stats
  st = r['statistics']
  lr = f'{r["lr"]:.3g} (x{r["lr_mult"]:g}{", edge" if r["lr_edge"] else ""})'
  tried = ', '.join(f'{m:g}' for m in st['lr_tried'])
  examples = st['test_examples_to_target']
  hours = lambda x: x / r['train_size'] * r['predicted_epoch_s'] / 3600
  if examples['kind'] == 'complete':
    time = (f'{hours(examples["mean"]):.2f} [{hours(examples["low"]):.2f}, '
            f'{hours(examples["high"]):.2f}]')
  else:
    time = f'≥ {hours(examples["lower_bound"]):.2f}'
  return (f'| {r["name"]} | {r["batch"]} | {r["staleness"]:g}; {r["staleness_examples"]:,.0f} | '
          f'{lr} | {tried} | {stats.format_summary(st["final"]["test/anp_top1"], ".1f", 100)} % | '
          f'{stats.format_summary(examples, ",.0f")} | {time} |')


def _summary_rows(text, heading):
  """The table rows of `heading`'s section of a summary.md."""
  section = text.split(heading, 1)[1].split('\n## ', 1)[0]
  return [line for line in section.splitlines() if line.startswith('| ')
          and not line.startswith('| arm |')]


def test_the_studies_table_is_the_committed_mapped_study():
  """docs/studies.md section 3 is the committed mapped study: every arm with 3 seeds at its
  chosen rate, per-update batches and staleness in examples as on 16 K80s (sync 512, async-16
  32 with 15 x 32 = 480 examples of staleness), each row, comparison and noise-floor row as the
  results and summary give them."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  here = os.path.join(root, 'experiments', 'results', 'sync_async_mixed_cpu')
  rows = {r['name']: r for r in json.load(open(os.path.join(here, 'results.json')))}
  doc = open(os.path.join(root, 'docs', 'studies.md')).read()
  section = doc.split('## 3. ', 1)[1].split('\n## ', 1)[0]
  assert {'sync', 'async-16', 'async-16-comp', 'mixed-n04', 'mixed-n08', 'local-n4-h01',
          'local-n4-h04', 'local-n4-h16'} <= set(rows)
  assert {n: r['batch'] for n, r in rows.items() if not n.startswith('local')} == {
      'sync': 512, 'async-16': 32, 'async-16-comp': 32, 'mixed-n04': 128, 'mixed-n08': 64}
  assert rows['async-16']['staleness_examples'] == 480
  for r in rows.values():
    assert r['statistics']['seeds'] == 3 and r['statistics']['published_split'] == 'test'
    assert studies_row(r) in section, studies_row(r)
    grid = {g['lr_mult'] for g in r['lr_grid']}
    # The chosen rate is interior, or the row says "edge" and the text names the arm.
    assert (min(grid) < r['lr_mult'] < max(grid)) or (r['lr_edge'] and f'`{r["name"]}`' in section)
  summary = open(os.path.join(here, 'summary.md')).read()
  for heading in ('## Each arm against sync', '## The arms against sync as one family',
                  '## Noise floor'):
    quoted = _summary_rows(summary, heading)
    assert len(quoted) == len(rows) - (not heading.startswith('## Noise'))
    for line in quoted:
      assert line in section, line


@pytest.mark.slow(240)
def test_mapped_arms_on_their_own_devices_in_two_invocations_end_to_end(data_dir, tmp_path):
  """--device_batch maps every arm to the cluster (here 8 devices of 4 images): sync trains 32
  per update, async-08 4 (staleness 7 updates = 28 examples), mixed-n02 16, each on one
  simulated device; then the local-SGD arm (2 nodes of 16) on 2 devices into the same DIR. The
  second invocation's results and summary hold every arm, with 2 seeds each, runs stopped at
  the later of both crossings, and each arm compared with sync."""
  from conftest import run_experiment
  out = tmp_path / 'sam'
  common = ('--preset', 'tiny', '--out', str(out), '--device_batch', '4', '--sync_devices', '8',
            '--seeds', '0,1', '--target_top1', '0.1', '--stop_at_target',
            f'--config.data_dir={data_dir}')
  r = run_experiment('sync_async_mixed.py', *common, '--workers', '8', '--mixed', '2',
                     '--nodes', '', devices=1)
  assert r.returncode == 0, r.stderr[-3000:]
  r = run_experiment('sync_async_mixed.py', *common, '--workers', '', '--nodes', '2',
                     '--sync_every', '2', devices=2)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.count('finished earlier, skipped') == 2  # sync's seeds.
  rows = {r['name']: r for r in json.load(open(out / 'results.json'))}
  assert list(rows) == ['sync', 'local-n2-h02', 'async-08', 'mixed-n02']
  assert {n: r['batch'] for n, r in rows.items()} == {
      'sync': 32, 'local-n2-h02': 32, 'async-08': 4, 'mixed-n02': 16}
  assert rows['async-08']['staleness_examples'] == 28
  assert rows['mixed-n02']['staleness_examples'] == 16
  grid = json.load(open(out / 'grid.json'))
  assert {g['train_devices'] for g in grid if g['arm'] != 'local-n2-h02'} == {1}
  assert {g['train_devices'] for g in grid if g['arm'] == 'local-n2-h02'} == {2}
  for g in grid:
    config = json.load(open(out / 'runs' / g['run'] / 'config.json'))
    assert config['batch_size'] == g['batch'] and g['has_test']
  summary = (out / 'summary.md').read_text()
  assert '| async-08 | 4 | 7; 28 |' in summary and 'Published figures on the test split' in summary
  assert '## Each arm against sync, both at their own chosen rate' in summary
  assert '| mixed-n02 | 16 |' in summary
  assert '## Noise floor: seed-to-seed spread' in summary and '| sync | 2 |' in summary


@pytest.mark.slow(150)
def test_a_fresh_seed_confirmation_reruns_each_arms_chosen_rate(data_dir, tmp_path, capsys):
  """--confirm_seeds: each arm again at the rate chosen on validation, with new seeds, in
  DIR/confirmation; the selection's runs are untouched, a seed it used is refused, and the
  summary (rewritten by experiments/report.py, nothing trained) puts the confirmation beside the
  selection with its own comparison against sync."""
  out = tmp_path / 'sam'
  common = ['--preset', 'tiny', '--out', str(out), '--nodes', '', '--target_top1', '0.05',
            f'--config.data_dir={data_dir}']
  assert sam.main(common + ['--lr_grid', '0.5,1']) == 0
  chosen = {p['point']: p['lr_mult'] for p in json.load(open(out / 'points.json'))}
  assert sam.main(common + ['--confirm_seeds', '0']) == 2
  assert 'seeds the selection runs used' in capsys.readouterr().err
  assert sam.main(common + ['--confirm_seeds', '3,4']) == 0
  grid = json.load(open(out / 'confirmation' / 'grid.json'))
  assert {(g['arm'], g['lr_mult']) for g in grid} == set(chosen.items())
  assert {g['seed'] for g in grid} == {3, 4}
  assert {g['seed'] for g in json.load(open(out / 'grid.json'))} == {0}  # Untouched.
  from conftest import run_experiment
  r = run_experiment('report.py', str(out))
  assert r.returncode == 0, r.stderr
  summary = (out / 'summary.md').read_text()
  section = summary.split('## Fresh-seed confirmation', 1)[1]
  assert 'seeds [3, 4]' in section and '| async-04 |' in section
  assert 'Each arm against sync on the confirmation runs' in section


def test_the_noise_floor_is_the_spread_over_seeds_at_the_chosen_rate():
  """Per arm, the SD over the seeds of its chosen rate, read from the runner's statistics (the
  test split when evaluated), and nothing where a seed missed the target or diverged."""
  from anp_jax.research import stats, study_results

  def row(seed, examples, top1, outcome='reached'):
    return {'seed': seed, 'status': 'diverged' if outcome == 'diverged' else 'finished',
            'outcome': outcome, 'test_outcome': outcome, 'has_test': True, 'total_steps': 100,
            'batch': 32, 'steps_to_target': None if examples is None else examples / 32,
            'examples_to_target': examples, 'test_examples_to_target': examples,
            'test_steps_to_target': None if examples is None else examples / 32,
            'test/anp_top1': top1, 'eval/anp_top1': top1}

  def point(rows):
    return study_results.point_statistics(rows, 'eval/anp_top1', ['anp_top1'])
  sync = [row(0, 1000, .30), row(1, 1200, .32), row(2, 1400, .28)]
  slow = [row(0, None, .1, 'missed'), row(1, 2000, .3), row(2, 3000, .2)]
  bad = [row(0, 1000, .3), row(1, 2000, .3), row(2, None, None, 'diverged')]
  arms = [{'name': 'sync', 'lr_chosen': True, 'statistics': point(sync)},
          {'name': 'async-16', 'lr_chosen': True, 'statistics': point(slow)},
          {'name': 'mixed-n08', 'lr_chosen': True, 'statistics': point(bad)},
          {'name': 'none', 'lr_chosen': False, 'statistics': None}]
  floor = {f['arm']: f for f in sam.noise_floor(arms)}
  assert set(floor) == {'sync', 'async-16', 'mixed-n08'} and floor['sync']['n'] == 3
  assert floor['sync']['examples']['sd'] == pytest.approx(200.0)
  assert floor['sync']['examples']['cv'] == pytest.approx(200.0 / 1200.0)
  assert floor['sync']['top1']['sd'] == pytest.approx(stats.spread([.30, .32, .28])['sd'])
  assert floor['sync']['examples']['detectable'] == pytest.approx(
      stats.detectable_difference(200.0, 3, 3))
  assert floor['async-16']['examples'] is None and floor['async-16']['top1']['n'] == 3
  assert floor['mixed-n08']['examples'] is None and floor['mixed-n08']['top1'] is None


def test_the_committed_noise_floor_is_the_spread_of_the_chosen_runs():
  """On the committed mapped study, the noise floor read from the runner's statistics equals the
  spread recomputed from the grid's runs at each arm's chosen rate (one source, no drift)."""
  from anp_jax.research import stats
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  here = os.path.join(root, 'experiments', 'results', 'sync_async_mixed_cpu')
  arms = json.load(open(os.path.join(here, 'results.json')))
  grid = json.load(open(os.path.join(here, 'grid.json')))
  floor = {f['arm']: f for f in sam.noise_floor(arms)}
  assert len(floor) == len(arms)
  for a in arms:
    runs = sam.chosen_runs(a, grid)
    assert len(runs) == floor[a['name']]['n'] == 3
    examples = [g['test_examples_to_target'] for g in runs]
    assert floor[a['name']]['examples']['sd'] == pytest.approx(stats.spread(examples)['sd'])
    top1 = [g['test/anp_top1'] for g in runs]
    assert floor[a['name']]['top1']['sd'] == pytest.approx(stats.spread(top1)['sd'])


def test_the_mapped_studys_claims_are_inside_their_intervals():
  """docs/studies.md section 3's claims, recomputed from the committed mapped study."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  here = os.path.join(root, 'experiments', 'results', 'sync_async_mixed_cpu')
  rows = {r['name']: r for r in json.load(open(os.path.join(here, 'results.json')))}
  grid = json.load(open(os.path.join(here, 'grid.json')))
  doc = open(os.path.join(root, 'docs', 'studies.md')).read()
  section = ' '.join(doc.split('## 3. ', 1)[1].split('\n## ', 1)[0].split())
  compared = sam.comparisons(list(rows.values()), grid)
  ratio = {c['arm']: c['examples_ratio'] for c in compared}
  fmt = lambda r: f'{r["ratio"]:.2f} [{r["low"]:.2f}, {r["high"]:.2f}]'
  # Local SGD: every interval contains 1 and reaches past 1.3.
  for arm in ('local-n4-h01', 'local-n4-h04', 'local-n4-h16'):
    assert ratio[arm]['low'] < 1 < 1.3 < ratio[arm]['high'] and fmt(ratio[arm]) in section
  # Asynchrony: excluded 1 for async-16, -comp and mixed-8, not for mixed-4.
  for arm in ('async-16', 'async-16-comp', 'mixed-n08'):
    assert ratio[arm]['low'] > 1 and fmt(ratio[arm]) in section
  assert ratio['mixed-n04']['low'] < 1 and fmt(ratio['mixed-n04']) in section
  # No ordering by staleness: the three asynchronous intervals overlap pairwise.
  for a, b in (('mixed-n04', 'mixed-n08'), ('mixed-n08', 'async-16'), ('mixed-n04', 'async-16')):
    assert ratio[a]['low'] < ratio[b]['high'] and ratio[b]['low'] < ratio[a]['high']
  # Compensation: same examples (overlapping intervals), best rate 8x higher; the plain arm's
  # outcomes at x1 (2 missed, 1 diverged) and x2 (3 diverged) on validation.
  plain, comp = (rows[n]['statistics']['test_examples_to_target'] for n in ('async-16',
                                                                             'async-16-comp'))
  assert plain['low'] < comp['high'] and comp['low'] < plain['high']
  assert rows['async-16-comp']['lr_mult'] / rows['async-16']['lr_mult'] == 8
  outcomes = lambda m: sorted(g['outcome'] for g in rows['async-16']['lr_grid']
                              if g['lr_mult'] == m)
  assert outcomes(1.0) == ['diverged', 'missed', 'missed'] and outcomes(2.0) == ['diverged'] * 3
  # Every arm's chosen rate is interior (a fourth extension took the last two edge arms lower);
  # the budget fractions quoted.
  assert not {n for n, r in rows.items() if r['lr_edge']}
  assert 'Every arm\'s chosen rate is interior' in section
  share = {n: r['statistics']['test_examples_to_target']['mean'] / 64000 for n, r in rows.items()}
  sync_like = [share[n] for n in share if n == 'sync' or n.startswith('local')]
  asynchronous = [share[n] for n in share if n not in ('sync',) and not n.startswith('local')]
  assert f'{100 * min(sync_like):.0f}–{100 * max(sync_like):.0f} %' in section
  assert f'{100 * min(asynchronous):.0f}–{100 * max(asynchronous):.0f} %' in section
  # Predicted time: the examples ratio times the epoch-time ratio, interval scaled alike.
  k = rows['async-16']['predicted_epoch_s'] / rows['sync']['predicted_epoch_s']
  r = ratio['async-16']
  assert f'{k * r["ratio"]:.2f} times sync\'s' in section
  assert f'[{k * r["low"]:.2f}, {k * r["high"]:.2f}]' in section and k * r['low'] > 1
  # Top-1 at equal examples: every interval at least 30 points wide.
  widths = [c['top1_difference']['high'] - c['top1_difference']['low'] for c in compared]
  assert min(widths) > 0.3
  # As a family of seven: with Holm none excludes 1; with one pooled variance all four
  # asynchronous arms do and no local arm; async-16's CV against the others'.
  family = sam.multiple_comparisons(compared, list(rows.values()), grid)
  fam = {r['arm']: r for r in family[1:]}
  asynchronous = ('async-16', 'async-16-comp', 'mixed-n04', 'mixed-n08')
  assert len(fam) == 7 and all(r['p_holm'] >= 0.05 for r in fam.values())
  assert all(r['simultaneous']['low'] < 1 < r['simultaneous']['high'] for r in fam.values())
  assert all(fam[a]['pooled']['low'] > 1 and fam[a]['pooled']['p_holm'] < 0.05
             for a in asynchronous)
  assert all(fam[a]['pooled']['low'] < 1 for a in fam if a.startswith('local'))
  holm = [fam[a]['p_holm'] for a in asynchronous]
  assert f"Holm's adjusted p-values are {min(holm):.2f}-{max(holm):.2f}" in section
  pooled = [fam[a]['pooled'] for a in asynchronous]
  assert (f'({min(p["ratio"] for p in pooled):.2f}-{max(p["ratio"] for p in pooled):.2f}x, '
          f'Holm-adjusted p {min(p["p_holm"] for p in pooled):.3f}-'
          f'{max(p["p_holm"] for p in pooled):.3f})') in section
  cvs = [fam[a]['cv'] for a in fam if a != 'async-16']
  assert (f'a CV of {100 * fam["async-16"]["cv"]:.0f} % over its 3 seeds against '
          f'{100 * min(cvs):.0f}-{100 * max(cvs):.0f} % for the other arms') in section
  # Compensation: no difference detected, the ratio's interval about a third either way.
  comp = [g['test_examples_to_target'] for g in sam.chosen_runs(rows['async-16-comp'], grid)]
  plain = [g['test_examples_to_target'] for g in sam.chosen_runs(rows['async-16'], grid)]
  from anp_jax.research import stats
  r = stats.ratio_interval(comp, plain)
  assert f'a ratio of {r["ratio"]:.2f} [{r["low"]:.2f}, {r["high"]:.2f}]' in section
  assert r['low'] < 1 < r['high']
  # The planner's penalty is this study's, quoted.
  from anp_jax.research import planner
  pen = planner.mapped_penalty(here)
  a, l = pen['async'], pen['local_sgd']
  assert f'{a.ratio:.2f} [{a.low:.2f}, {a.high:.2f}]' in section
  assert f'{l.ratio:.2f} [{l.low:.2f}, {l.high:.2f}]' in section
  assert {m['arm'] for m in a.arms} == {'async-16', 'mixed-n04', 'mixed-n08'}


# ----------------------------------------------------------------------------------------------
# A preset in parts: `--preset cpu --out DIR` (README) was exit 2 "config.local_sgd.nodes=4 does
# not divide the 1 devices", repeated per point: its local-SGD arms need four simulated devices,
# the others one; the command now runs both parts, each a process of its own.


def test_a_preset_with_parts_runs_each_as_its_own_invocation():
  from anp_jax.research import sync_async_mixed as sam
  argv = ['--preset', 'cpu', '--out', 'DIR', '--stop_at_target']
  first, second = sam.part_commands(argv)
  assert first[0] == sys.executable and first[1].endswith('experiments/sync_async_mixed.py')
  assert first[2:] == argv + ['--nodes='] and second[2:] == argv + [
      '--workers=', '--mixed=', '--cpu_devices=4']
  for own in (['--nodes='], ['--nodes', '4'], ['--cpu_devices=4'], ['--help']):
    assert sam.part_commands(argv + own) == []  # One invocation: the user's.
  assert sam.part_commands(['--preset', 'tiny', '--out', 'DIR']) == []


def test_the_parts_run_in_turn_and_stop_at_the_first_failure(capsys):
  from anp_jax.research import sync_async_mixed as sam
  log = lambda n, rc: [sys.executable, '-c', f'print("part {n}"); raise SystemExit({rc})']
  assert sam.run_parts([log(1, 0), log(2, 0)]) == 0
  assert sam.run_parts([log(1, 75), log(2, 0)]) == 75  # Preempted: the same command resumes.
  out = capsys.readouterr().out
  assert out.count('sync_async_mixed: part 1 of 2') == 2 and out.count('part 2 of 2') == 1
