"""experiments/plan_time_validation.py: predicted vs measured time to target, end to end.

Correctness only (the tiny config on a loaded machine: no timing is asserted). The whole plan
(calibrations at two batches, the step time interpolated between them, and of two processes'
start-up; the pilot and six configurations: 1 process x 1 and 2 devices and 2 processes at two
batch sizes; two seeds each; 17 runs) goes through the script's command line with a simulated
trainer (tests/plan_time_simulated.py: the trainer's files without training), and the report holds
every configuration's prediction, its measured mean with an interval and the errors of the model
and of both baselines; a rerun reuses all 17. The real trainer, launched as the script launches
it, runs the smallest plan that has every kind of run: one calibration, the pilot (two devices:
the noise scale) and each of the three shapes (one of them two processes), one seed, to the
target, and its files give the same report and are reused by a rerun.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import TESTS, run_experiment, subprocess_env

TINY = ('--config=anp_jax/configs/tiny.py', '--config.num_train_steps=-1',
        '--config.num_epochs=2.0', '--config.eval_every_epochs=0.5',
        '--metric=eval/anp_top1', '--target=0.05', '--batches=16,64', '--pilot_batch=32',
        '--calibration_batches=8,128', '--calibration_steps=6', '--seeds=2')
MEASURED = [f'measure-{shape}-b{b}' for b in (16, 64) for shape in ('1x1', '1x2', '2x1')]
# The real trainer's plan: every kind of run once (5 runs, 6 processes; 17 runs took ~9 min).
REAL = TINY + ('--batches=16', '--seeds=1', '--calibration_batches=8', '--startup_processes=0')
REAL_MEASURED = [f'measure-{shape}-b16' for shape in ('1x1', '1x2', '2x1')]


def test_dry_run_lists_the_runs_and_bounds_their_cost(data_dir, tmp_path):
  r = run_experiment('plan_time_validation.py', '--out', str(tmp_path / 'out'), '--dry_run',
                     *TINY, f'--config.data_dir={data_dir}')
  assert r.returncode == 0, r.stderr[-3000:]
  runs = r.stdout.splitlines()[0]
  assert runs.startswith('17 runs in ')
  for name in ['calibration-1x1-b8', 'calibration-1x1-b128', 'calibration-2x1-b8',
               'pilot-1x2-b32-s0',
               'pilot-1x2-b32-s1'] + [f'{m}-s{s}' for m in MEASURED for s in (0, 1)]:
    assert name in runs
  assert 'At most' in r.stdout and 'anp_jax.main' in r.stdout
  assert not (tmp_path / 'out').exists()  # A dry run trains and writes nothing.


def _check_report(out, measured, seeds, calibration_batches, multi_processes):
  """What every invocation's results.json and report.md hold: each configuration's prediction,
  its measured mean over ``seeds`` seeds and the errors of the model and both baselines."""
  results = json.loads((out / 'results.json').read_text())
  rows = {row['name']: row for row in results['rows']}
  assert set(rows) == {'pilot-1x2-b32'} | set(measured)
  assert {(row['processes'], row['devices']) for row in rows.values()} >= {(1, 1), (1, 2), (2, 1)}
  cal = results['calibration']
  assert [b for b, _ in cal['points']] == calibration_batches
  assert all(t > 0 for _, t in cal['points'])
  assert cal['eval_s'] > 0 and cal['fixed_s'] >= 0
  assert cal['reference_batch'] == 8  # Nearest the pilot's 32 in ratio (4x either way: smaller).
  if multi_processes:
    # Two processes' start-up: calibrated by a run of its own, used for the 2-process layouts.
    assert cal['multi_processes'] == 2 and cal['multi_fixed_s'] >= 0
    assert results['calibration_multi_run']['steps'] == 6
  else:
    assert cal['multi_fixed_s'] is None and results['calibration_multi_run'] is None
  # The steps model is the pilot's seeds.
  assert f'from {seeds} seed(s) of pilot-1x2-b32' in results['steps_model']
  for row in rows.values():
    p, m = row['predicted'], row['measured']
    assert row['seeds'] == list(range(seeds)) and m['runs'] == seeds
    assert len(m['seeds']) == seeds
    assert m['stopped_at_target'] and m['crossing'] is not None
    walls = [run['wall_s'] for run in m['seeds']]
    assert m['wall_s'] == pytest.approx(sum(walls) / seeds)
    if seeds > 1:
      assert m['wall_low'] < m['wall_s'] < m['wall_high'] or walls[0] == walls[1]
    else:
      assert m['wall_low'] is None
    for run in m['seeds']:  # The loop runs to the first evaluation at or after the crossing.
      assert run['steps'] % p['eval_every'] == 0 and run['steps'] >= run['crossing']
    assert p['loop_steps'] % p['eval_every'] == 0 and p['loop_steps'] >= p['steps'] - 1e-9
    for kind in ('model', 'constant', 'one_parameter'):
      assert p['loop_s'][kind] > 0
      assert row['errors'][kind]['loop'] == pytest.approx(p['loop_s'][kind] / m['wall_s'] - 1)
    # Baselines from the reference calibration alone: constant images/s, and per device.
    assert row['batch'] / p['step_s']['constant'] == pytest.approx(8 / cal['points'][0][1])
    assert p['step_s']['one_parameter'] == pytest.approx(
        p['step_s']['constant'] / (row['processes'] * row['devices']))
    assert row['calibrated_batch'] == (len(calibration_batches) > 1)
    assert p['fixed_s'] == (cal['multi_fixed_s'] if row['processes'] > 1 and multi_processes
                            else cal['fixed_s'])
    assert m['images_per_s'] > 0 and all(run['mean_images_per_s'] > 0 for run in m['seeds'])
  summary = results['summary']
  # The pilot's (steps in sample) is not summarised.
  assert summary['configurations'] == len(measured)
  assert summary['model']['loop'] == pytest.approx(
      sum(abs(rows[n]['errors']['model']['loop']) for n in measured) / len(measured))
  assert summary['throughput_span'] >= 1
  if seeds > 1:
    assert summary['max_loop_half_width'] >= 0
  else:
    assert summary['max_loop_half_width'] is None  # One run: no interval.
  text = (out / 'report.md').read_text()
  assert 'performance model' in text and 'constant images/s' in text and 'Targets:' in text
  assert f'Each configuration ran {seeds} seed(s)' in text
  return results


def _check_rerun(again, out, results, runs):
  """A rerun: every finished run is reused, nothing retrains, the same report."""
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count('finished before, reused') == runs
  # The report says its timings are from the earlier invocation, and its steps model is B_crit's.
  again_results = json.loads((out / 'results.json').read_text())
  assert len(again_results['reused']) == runs and results['reused'] == []
  assert 'Runs reused from an earlier invocation, timed then' in (out / 'report.md').read_text()
  assert 'B_crit = ' in again_results['steps_model']
  assert again_results['rows'] == results['rows']


def _simulated(*args):
  return subprocess.run([sys.executable, os.path.join(TESTS, 'plan_time_simulated.py'), *args],
                        env=subprocess_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.slow(7)
def test_every_configuration_of_the_plan_is_predicted_measured_and_reused(data_dir, tmp_path):
  """The script's whole plan (17 runs: 3 calibrations, 2 pilot seeds, 6 configurations x 2
  seeds) and its rerun, with the trainer simulated (tests/plan_time_simulated.py); the real
  trainer's files: the next test."""
  out = tmp_path / 'out'
  r = _simulated('--out', str(out), *TINY, f'--config.data_dir={data_dir}')
  assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
  assert r.stdout.count(': training ...') == 17
  results = _check_report(out, MEASURED, 2, [8, 128], multi_processes=True)
  rows = {row['name']: row for row in results['rows']}
  # The seeds of a configuration: the simulated second seed reaches the target later.
  for row in rows.values():
    crossings = [run['crossing'] for run in row['measured']['seeds']]
    assert crossings[0] < crossings[1]
  # The step time is interpolated between the calibration batches: at batch 16 and 64, between
  # the simulated 8 and 128 (linear in the batch), the model's one-device step is the simulator's.
  for b in (16, 64):
    assert rows[f'measure-1x1-b{b}']['predicted']['step_s']['model'] == pytest.approx(
        0.002 + 1e-4 * b, rel=1e-3)
  _check_rerun(_simulated('--out', str(out), *TINY, f'--config.data_dir={data_dir}'), out,
               results, 17)


@pytest.mark.slow(60)
def test_time_to_target_is_predicted_and_measured_for_every_configuration(data_dir, tmp_path):
  """The real trainer (``python -m anp_jax.main``, as the script launches it: one process or two
  on 127.0.0.1) on the smallest plan with every kind of run, one seed; its files are what the
  script measures (the steady rate, an evaluation's time, the crossing, the stop at the first
  evaluation past it, the pilot's noise scale), and a rerun reuses its runs (their recorded
  configs are the ones the script plans). Two seeds, two calibration batches, the two-process
  start-up calibration and six configurations: the test above, on the same code."""
  out = tmp_path / 'out'
  # The launched processes inherit the environment: unpinned, as every multi-process job of the
  # suite (conftest.multiprocess_env; pinned to one of 2 busy cores each, the 2-process run took
  # 2-3x as long as a one-process one).
  r = run_experiment('plan_time_validation.py', '--out', str(out), *REAL,
                     f'--config.data_dir={data_dir}', timeout=1200, ANP_PIN_CORES=0)
  assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
  results = _check_report(out, REAL_MEASURED, 1, [8], multi_processes=False)
  again = run_experiment('plan_time_validation.py', '--out', str(out), *REAL,
                         f'--config.data_dir={data_dir}', timeout=900, ANP_PIN_CORES=0)
  _check_rerun(again, out, results, 5)


def _ptv():
  from anp_jax.research import plan_time
  return plan_time


def test_the_step_time_is_interpolated_between_the_calibration_batches_and_the_model_uses_it():
  """A CPU's step time is not linear in the batch (before: a line through two calibrations
  gave batch 16 a fixed cost larger than its whole measured step): the model now takes the
  calibrated curve, linear between the batches around the one asked for, and its end segments
  beyond them (scaled with the batch where the segment's fixed cost would be negative)."""
  ptv = _ptv()
  from anp_jax.research import perfmodel as pm
  step = {32: 0.020, 128: 0.060, 512: 0.280}  # Concave then convex: no single line fits.

  def run(batch, steps=90, evals=3, fixed=8.0):
    return {'images_per_s': batch / step[batch], 'eval_s': 0.7 + batch / 1e4, 'steps': steps,
            'evals': evals, 'wall_s': fixed + steps * step[batch] + evals * (0.7 + batch / 1e4)}

  cal = ptv.Calibration.from_runs({b: run(b) for b in step}, 128)
  assert cal.points == ((32, 0.020), (128, 0.060), (512, 0.280))
  assert cal.fixed_s == pytest.approx(8.0) and cal.eval_s == pytest.approx(0.7 + 128 / 1e4)
  for b, t in step.items():
    assert cal.step_at(b) == pytest.approx(t)
  assert cal.step_at(64) == pytest.approx(0.020 + 32 * 0.040 / 96)
  assert cal.step_at(256) == pytest.approx(0.060 + 128 * 0.220 / 384)
  # Below 32: the first segment's line (fixed cost 0.020 - 32 x 0.040 / 96 > 0).
  assert cal.step_at(16) == pytest.approx(0.020 - 16 * 0.040 / 96)
  # Beyond 512: the last segment's fixed cost is negative, so 512's time scaled with the batch.
  assert cal.step_at(1024) == pytest.approx(0.280 * 2)
  assert cal.in_range(64) and not cal.in_range(16) and not cal.in_range(1024)
  assert cal.images_per_s == pytest.approx(128 / 0.060)
  one = ptv.Calibration.from_runs({128: run(128)}, 128)
  assert one.step_at(64) == pytest.approx(0.030)  # One batch: proportional.
  with pytest.raises(ValueError, match='not a calibration batch'):
    ptv.Calibration.from_runs({128: run(128)}, 64)
  links = pm.Interconnect(intra_node_bandwidth=1e9, intra_node_latency=1e-4,
                          inter_node_bandwidth=1e9, inter_node_latency=1e-4)
  workload = pm.Workload(name='w', flops_per_image_fwd=1e6, param_bytes=4e3, dataset_size=8000)
  times = ptv.step_times(cal, workload, links, ptv.Layout(1, 1, 64))
  assert times['model'] == pytest.approx(cal.step_at(64), rel=1e-6)
  assert times['constant'] == pytest.approx(64 / (128 / 0.060))
  # Two devices on the same cores: the pool runs the global batch, plus the all-reduce.
  two = ptv.step_times(cal, workload, links, ptv.Layout(1, 2, 64))
  assert cal.step_at(64) < two['model'] < cal.step_at(64) + 0.01
  assert two['one_parameter'] == pytest.approx(times['constant'] / 2)


def test_the_steady_rate_leaves_the_warm_up_out_and_the_start_up_takes_it():
  """The trainer logs images/s averaged since step 1; the first steps run slower. Before, a
  90-step calibration at a small batch read that warm-up as step time (866 images/s at batch 32
  where its last 30 steps ran at ~1,280): now the rate is the later half's, and the warm-up
  lands in the start-up (wall - steps x step - evaluations)."""
  ptv = _ptv()
  batch, step_s, warm_s = 32, 0.01, 1.0

  def elapsed(k):  # Training seconds from step 1 to step k: 1 s of warm-up over steps 1-10.
    return (k - 1) * step_s + warm_s * min(k - 1, 9) / 9

  records = [{'step': k, 'train/images_per_s': (k - 1) * batch / elapsed(k)}
             for k in (10, 20, 30, 40)]
  assert records[-1]['train/images_per_s'] < 0.3 * batch / step_s  # The average: the warm-up.
  assert ptv.steady_rate(records) == pytest.approx(batch / step_s)
  assert ptv.steady_rate(records[:1]) == records[0]['train/images_per_s']
  assert ptv.steady_rate([]) is None
  run = {'images_per_s': ptv.steady_rate(records), 'eval_s': 0.5, 'steps': 40, 'evals': 2,
         'wall_s': 8.0 + elapsed(40) + step_s + 2 * 0.5}
  cal = ptv.Calibration.from_runs({batch: run}, batch)
  assert cal.points == ((batch, pytest.approx(step_s)),)
  # Start-up: 8 s, the first step (compilation), and the warm-up beyond the steady steps.
  assert cal.fixed_s == pytest.approx(8.0 + warm_s)
  # A two-process start-up calibration, for the multi-process layouts only.
  two = ptv.Calibration.from_runs({batch: run}, batch, dict(run, wall_s=run['wall_s'] + 3.0), 2)
  assert two.fixed_for(1) == pytest.approx(cal.fixed_s)
  assert two.fixed_for(2) == pytest.approx(cal.fixed_s + 3.0) and two.multi_processes == 2
  assert cal.fixed_for(2) == cal.fixed_s  # None calibrated: the one-process start-up.


def test_layouts_measure_every_shape_at_every_batch_with_seeds_and_refuse_in_sample_ones():
  ptv = _ptv()
  plan = ptv.layouts([64, 256], 128, 2, [32, 128, 512], 3)
  assert [l.name for l in plan[:6]] == [
      'calibration-1x1-b32', 'calibration-1x1-b128', 'calibration-1x1-b512',
      'pilot-1x2-b128-s0', 'pilot-1x2-b128-s1', 'pilot-1x2-b128-s2']
  measured = [l for l in plan if l.role == 'measure']
  assert len(measured) == 18
  assert {(l.processes, l.devices, l.batch) for l in measured} == {
      (p, d, b) for b in (64, 256) for p, d in ptv.SHAPES}
  assert {l.seed for l in measured} == {0, 1, 2}
  with pytest.raises(ValueError, match='also a calibration batch'):
    ptv.layouts([32, 256], 128, 2, [32, 512], 3)
  with pytest.raises(ValueError, match='the pilot'):
    ptv.layouts([128, 256], 128, 2, [32, 512], 3)
  with pytest.raises(ValueError, match='--seeds'):
    ptv.layouts([64], 128, 2, [32], 0)
  # The multi-process start-up calibration: at the calibration batch nearest the pilot's.
  plan = ptv.layouts([96, 384], 128, 2, [32, 128, 512], 3, startup_processes=2)
  assert [l.name for l in plan if l.role == 'calibration'][-1] == 'calibration-2x1-b128'
  assert ptv.reference_batch([8, 128], 32) == 8 and ptv.reference_batch([32, 512], 128) == 32


def test_a_configurations_seeds_are_scored_by_their_mean_and_the_summary_leaves_the_pilot_out():
  ptv = _ptv()
  from anp_jax.research import stats
  runs = [{'wall_s': w, 'steps': 100 + 10 * i, 'evals': 4, 'crossing': 95.0 + i,
           'stopped_at_target': True, 'images_per_s': 1000.0 + i, 'eval_s': 0.7}
          for i, w in enumerate((30.0, 33.0, 36.0))]
  m = ptv.aggregate(runs)
  ci = stats.mean_interval([30.0, 33.0, 36.0])
  assert m['wall_s'] == pytest.approx(33.0) and m['steps'] == pytest.approx(110)
  assert (m['wall_low'], m['wall_high']) == pytest.approx((ci['low'], ci['high']))
  missed = ptv.aggregate(runs[:2] + [dict(runs[2], crossing=None, stopped_at_target=False)])
  assert missed['crossing'] is None and not missed['stopped_at_target']

  def row(role, err, rate):
    e = {'loop': err, 'time_side': err / 2, 'images_per_s': err / 4}
    return {'role': role, 'errors': {k: e for k in ('model', 'constant', 'one_parameter')},
            'measured': dict(m, images_per_s=rate)}

  s = ptv.summarise([row('pilot', 0.9, 100.0), row('measure', -0.1, 1000.0),
                     row('measure', 0.3, 2000.0)])
  assert s['configurations'] == 2 and s['model']['loop'] == pytest.approx(0.2)
  assert s['throughput_span'] == pytest.approx(2.0) and s['worst_loop'] == pytest.approx(0.3)
  assert s['max_loop_half_width'] == pytest.approx((ci['high'] - 33.0) / 33.0)
