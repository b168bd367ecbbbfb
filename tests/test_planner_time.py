"""experiments/plan_time_validation.py: predicted vs measured time to target, end to end.

Correctness only (the tiny config on a loaded machine: no timing is asserted): two calibrations
(two batches: the fixed cost per step), the pilot and five configurations (1 process x 1 and 2
devices, 2 processes, three batch sizes)
run the real trainer to the target; the report holds every configuration's prediction, its
measurement and the errors of the model and of both baselines.
"""

import json

import pytest

from conftest import run_experiment

TINY = ('--config=anp_jax/configs/tiny.py', '--config.num_train_steps=-1',
        '--config.num_epochs=2.0', '--config.eval_every_epochs=0.5',
        '--metric=eval/anp_top1', '--target=0.05', '--batches=16,32', '--pilot_batch=32',
        '--calibration_batch=32', '--calibration_steps=6', '--calibration_small_batch=16',
        '--tiny_batch=8')


def test_dry_run_lists_the_runs_and_bounds_their_cost(data_dir, tmp_path):
  r = run_experiment('plan_time_validation.py', '--out', str(tmp_path / 'out'), '--dry_run',
                     *TINY, f'--config.data_dir={data_dir}')
  assert r.returncode == 0, r.stderr[-3000:]
  for name in ('calibration-1x1-b16', 'calibration-1x1-b32', 'pilot-1x2-b32', 'measure-1x1-b8',
               'measure-1x1-b16', 'measure-1x2-b16', 'measure-1x2-b32', 'measure-2x1-b32'):
    assert name in r.stdout
  assert 'At most' in r.stdout and 'anp_jax.main' in r.stdout
  assert not (tmp_path / 'out').exists()  # A dry run trains and writes nothing.


@pytest.mark.slow(240)
def test_time_to_target_is_predicted_and_measured_for_every_configuration(data_dir, tmp_path):
  out = tmp_path / 'out'
  r = run_experiment('plan_time_validation.py', '--out', str(out), *TINY,
                     f'--config.data_dir={data_dir}', timeout=900)
  assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
  results = json.loads((out / 'results.json').read_text())
  rows = {row['name']: row for row in results['rows']}
  assert set(rows) == {'pilot-1x2-b32', 'measure-1x1-b8', 'measure-1x1-b16', 'measure-1x2-b16',
                       'measure-1x2-b32', 'measure-2x1-b32'}
  assert {(row['processes'], row['devices']) for row in rows.values()} >= {(1, 1), (1, 2), (2, 1)}
  cal = results['calibration']
  assert cal['step_s'] > 0 and cal['eval_s'] > 0 and cal['fixed_s'] >= 0
  # Two calibration batches: the fixed cost per step is the intercept of the line through them.
  assert cal['small_batch'] == 16 and 0 < cal['small_step_s']
  per_image = (cal['step_s'] - cal['small_step_s']) / (32 - 16)
  assert cal['overhead_s'] == pytest.approx(
      min(max(cal['small_step_s'] - 16 * per_image, 0.0), cal['small_step_s']))
  for row in rows.values():
    p, m = row['predicted'], row['measured']
    assert m['stopped_at_target'] and m['crossing'] is not None
    # The loop runs to the first evaluation at or after the crossing, a multiple of its cadence.
    assert m['steps'] % p['eval_every'] == 0 and m['steps'] >= m['crossing']
    assert p['loop_steps'] % p['eval_every'] == 0 and p['loop_steps'] >= p['steps'] - 1e-9
    for kind in ('model', 'constant', 'one_parameter'):
      assert p['loop_s'][kind] > 0 and m['wall_s'] > 0
      assert row['errors'][kind]['loop'] == pytest.approx(p['loop_s'][kind] / m['wall_s'] - 1)
    # Baselines from the calibration alone: constant images/s, and images/s per device.
    assert row['batch'] / p['step_s']['constant'] == pytest.approx(
        cal['batch'] / cal['step_s'])
    assert p['step_s']['one_parameter'] == pytest.approx(
        p['step_s']['constant'] / (row['processes'] * row['devices']))
  summary = results['summary']
  assert summary['throughput_span'] >= 1
  text = (out / 'report.md').read_text()
  assert 'performance model' in text and 'constant images/s' in text and 'Targets:' in text
  # Rerun: every finished run is reused, nothing retrains, the same report.
  again = run_experiment('plan_time_validation.py', '--out', str(out), *TINY,
                         f'--config.data_dir={data_dir}', timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count('finished before, reused') == 8
  # The report says its timings are from the earlier invocation, and its steps model is B_crit's.
  again_results = json.loads((out / 'results.json').read_text())
  assert len(again_results['reused']) == 8 and results['reused'] == []
  assert 'Runs reused from an earlier invocation, timed then' in (out / 'report.md').read_text()
  assert 'B_crit = ' in again_results['steps_model']


def test_two_calibration_batches_give_the_fixed_cost_per_step_and_the_model_uses_it():
  """A step on b images takes overhead + b x cost: the line through the two calibration runs
  recovers both, and the performance model then predicts a small batch's slower images/s where
  the constant baseline cannot (before: one calibration batch, no fixed cost)."""
  import sys
  from conftest import ROOT
  import os
  sys.path.insert(0, os.path.join(ROOT, 'experiments'))
  import plan_time_validation as ptv
  from anp_jax.research import perfmodel as pm
  overhead, cost = 0.004, 0.0008  # 4 ms + 0.8 ms per image.

  def run(batch, steps=60, evals=3):
    step = overhead + batch * cost
    return {'images_per_s': batch / step, 'eval_s': 0.5, 'steps': steps, 'evals': evals,
            'wall_s': 10.0 + steps * step + evals * 0.5}

  cal = ptv.Calibration.from_run(run(128), 128, run(16), 16)
  assert cal.overhead_s == pytest.approx(overhead) and cal.fixed_s == pytest.approx(10.0)
  assert ptv.Calibration.from_run(run(128), 128).overhead_s == 0.0
  with pytest.raises(ValueError, match='below the calibration batch'):
    ptv.Calibration.from_run(run(128), 128, run(256), 256)
  links = pm.Interconnect(intra_node_bandwidth=1e9, intra_node_latency=1e-4,
                          inter_node_bandwidth=1e9, inter_node_latency=1e-4)
  workload = pm.Workload(name='w', flops_per_image_fwd=1e6, param_bytes=4e3, dataset_size=8000)
  times = ptv.step_times(cal, workload, links, ptv.Layout(1, 1, 8))
  assert times['model'] == pytest.approx(overhead + 8 * cost, rel=1e-6)
  assert times['constant'] == pytest.approx(8 / (128 / (overhead + 128 * cost)))
