"""experiments/plan_time_validation.py: predicted vs measured time to target, end to end.

Correctness only (the tiny config on a loaded machine: no timing is asserted): the calibration,
the pilot and four configurations (1 process x 1 and 2 devices, 2 processes, two batch sizes)
run the real trainer to the target; the report holds every configuration's prediction, its
measurement and the errors of the model and of both baselines.
"""

import json

import pytest

from conftest import run_experiment

TINY = ('--config=anp_jax/configs/tiny.py', '--config.num_train_steps=-1',
        '--config.num_epochs=2.0', '--config.eval_every_epochs=0.5',
        '--metric=eval/anp_top1', '--target=0.05', '--batches=16,32', '--pilot_batch=32',
        '--calibration_batch=32', '--calibration_steps=6')


def test_dry_run_lists_the_runs_and_bounds_their_cost(data_dir, tmp_path):
  r = run_experiment('plan_time_validation.py', '--out', str(tmp_path / 'out'), '--dry_run',
                     *TINY, f'--config.data_dir={data_dir}')
  assert r.returncode == 0, r.stderr[-3000:]
  for name in ('calibration-1x1-b32', 'pilot-1x2-b32', 'measure-1x1-b16', 'measure-1x2-b16',
               'measure-1x2-b32', 'measure-2x1-b32'):
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
  assert set(rows) == {'pilot-1x2-b32', 'measure-1x1-b16', 'measure-1x2-b16',
                       'measure-1x2-b32', 'measure-2x1-b32'}
  assert {(row['processes'], row['devices']) for row in rows.values()} >= {(1, 1), (1, 2), (2, 1)}
  cal = results['calibration']
  assert cal['step_s'] > 0 and cal['eval_s'] > 0 and cal['fixed_s'] >= 0
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
  assert again.stdout.count('finished before, reused') == 6
