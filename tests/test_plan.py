"""The time-to-accuracy planner: statistical side, penalty, cluster files, plan, CLI, bad input.

Synthetic pilots and sweeps follow S(B) = S_min (1 + B_noise / B) exactly, so the planner must
recover their parameters; one end-to-end test plans from a real (tiny) pilot run's workdir.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from anp_jax.research import perfmodel as pm
from anp_jax.research import plan_validation as validation
from anp_jax.research import planner as plan
from conftest import ROOT, run_experiment, subprocess_env
from planner_helpers import plan_cli, sweep_rows, write_pilot


def test_pilot_b_noise_is_measured_up_to_the_target_and_its_band_widens_away_from_the_pilot(
    tmp_path):
  """B_noise is the window mean up to the target crossing (the noise scale grows during
  training; what sets the steps to the target is the training before it), the late window (the
  second half of the run, as the sweep reports it) beside it. (Before: the second half of the
  whole run, 262 here, for a target crossed at step 35.)"""
  model = plan.load_pilot(write_pilot(tmp_path / 'p', drift=2.0), target=0.3, predictor='factor')
  # S0: top-1 0.1 at step 30, 0.5 at 40; the target 0.3 is crossed half-way, at step 35.
  assert model.notes['pilot_steps'] == pytest.approx(35)
  # Window = steps 2..34 (up to the crossing): mean trace = 200 + 2 * mean(2..34) = 236.
  assert model.b_noise == pytest.approx(236.0)
  # The late window = steps 21..40: 200 + 2 * mean(22..40) = 262.
  assert model.notes['b_simple_late'] == pytest.approx(262.0)
  # B_crit = the calibrated factor x B_noise; S(B) goes through the pilot's steps at its batch.
  k = plan.B_CRIT_FACTOR
  assert model.b_crit == pytest.approx(k * 236.0)
  assert model.s_min == pytest.approx(35 / (1 + k * 236 / 64))
  assert len(model.alternatives) == 4  # Sub-windows of the window up to the crossing.
  # B_noise's part of the band vanishes at the pilot batch; the seeds' spread (the pilot's and
  # the new run's, the default when one pilot) does not.
  assert model.noise_log_sd(64) == 0.0 and model.noise_log_sd(512) > 0
  central, lo, hi = model.steps(64)
  width = plan.steps_model.BAND_Z * plan.steps_model.DEFAULT_SEED_LOG_SD * math.sqrt(2)
  assert central == pytest.approx(35)
  assert (lo, hi) == pytest.approx((35 * math.exp(-width), 35 * math.exp(width)))
  central, lo, hi = model.steps(512)
  assert lo < central * math.exp(-width) and hi > central * math.exp(width)
  assert model.e_min == pytest.approx(model.s_min * model.b_crit)
  # Given a factor, it is taken as exact: 1 is B_crit = B_noise.
  exact = plan.load_pilot(write_pilot(tmp_path / 'p1', drift=2.0), target=0.3, b_crit_factor=1)
  assert exact.s_min == pytest.approx(35 / (1 + 236 / 64)) and exact.factor_log_var(512) == 0



def test_the_default_predictor_is_the_registered_decision_and_still_shows_the_pilot_noise(
    tmp_path):
  """With no predictor named, a pilot is read by `default_predictor.DEFAULT` (set by issue 46's
  registered rule: the constant B_crit). A predictor that ignores the noise scale still reports
  the pilot's measured B_noise, marked unused, and the plan says what its default rests on."""
  from anp_jax.research.planner.default_predictor import DEFAULT
  pilot = write_pilot(tmp_path / 'p', drift=2.0)
  model = plan.load_pilot(pilot, target=0.3)
  assert model.notes['predictor'] == DEFAULT['predictor']
  assert model.notes['default_heldout'] == DEFAULT['heldout']
  named = plan.load_pilot(pilot, target=0.3, predictor=DEFAULT['predictor'])
  assert named.steps(256) == pytest.approx(model.steps(256))
  assert 'default_heldout' not in named.notes  # Only the default says why it is the default.
  constant = plan.load_pilot(pilot, target=0.3, predictor='constant')
  assert constant.b_crit == pytest.approx(DEFAULT['parameters']['constant']['b_crit'])
  assert constant.notes['pilot_b_noise_unused'] == pytest.approx(236.0)
  assert constant.steps(64)[0] == pytest.approx(35)  # Through the pilot's steps.
  # The noise scale is what the factor reads: the two differ away from the pilot.
  factor = plan.load_pilot(pilot, target=0.3, predictor='factor')
  assert factor.steps(512)[0] != pytest.approx(constant.steps(512)[0], rel=1e-3)
  assert 'pilot_b_noise_unused' not in factor.notes

def test_pilot_errors_say_what_to_change(tmp_path):
  with pytest.raises(plan.PlanError, match='no usable noise-scale logs'):
    plan.load_pilot(write_pilot(tmp_path / 'a', noise=False), target=0.3)
  with pytest.raises(plan.PlanError, match=r'never reached eval/anp_top1 >= 0.9 \(best: 0.5\)'):
    plan.load_pilot(write_pilot(tmp_path / 'b'), target=0.9)
  with pytest.raises(plan.PlanError, match='Give --target'):
    plan.load_pilot(write_pilot(tmp_path / 'c'))
  with pytest.raises(plan.PlanError, match='not a trainer workdir'):
    plan.load_pilot(str(tmp_path / 'missing'), target=0.3)


def test_pilot_seeds_continued_to_their_test_crossing_keep_the_validation_target(tmp_path):
  """A study seed that stopped at its validation crossing before its test split crossed is
  continued with the test metric as its target and records it (`runner.test_continuation`).
  The held-out validation's pilots (3 seeds, one of them continued) were refused as "pilots
  recorded different targets"; the target its choices were made on is the validation one."""
  target = {'target_value': 0.3, 'stop_at_target': True}
  dirs = [write_pilot(tmp_path / 's0', seed=0, target_metric='eval/anp_top1', **target),
          write_pilot(tmp_path / 's1', seed=1, target_metric='test/anp_top1', **target)]
  model = plan.load_pilot(dirs)
  assert (model.notes['metric'], model.notes['target']) == ('eval/anp_top1', 0.3)
  # Without stop_at_target no runner continued it: a recorded test target is taken as given.
  other = write_pilot(tmp_path / 's2', target_metric='test/anp_top1', target_value=0.3)
  with pytest.raises(plan.PlanError, match='recorded different targets'):
    plan.load_pilot([dirs[0], other])


def test_the_pilots_steps_to_target_are_the_sweeps_interpolated_crossing(tmp_path):
  """S0 is where the evaluations cross the target, interpolated as the sweep does
  (`metrics_io.target_crossing`): the first evaluation at or above it over-states the steps by
  up to one evaluation interval. (Before: the pilot took that evaluation's step, 100 here, while
  the same run as a sweep row had 81.8.)"""
  evals = {20: 0.10, 40: 0.15, 60: 0.20, 80: 0.249, 100: 0.26}
  model = plan.load_pilot(write_pilot(tmp_path / 'p', batch=128, trace=256.0, steps=100,
                                       evals=evals), target=0.25, b_crit_factor=1.0)
  crossing = 80 + (0.25 - 0.249) / (0.26 - 0.249) * 20
  assert model.notes['pilot_steps'] == pytest.approx(crossing)
  assert model.s_min == pytest.approx(crossing / (1 + 256 / 128))
  records = [{'step': s, 'eval/anp_top1': a} for s, a in evals.items()]
  assert sweep_target_crossing(records, 0.25)['step'] == pytest.approx(crossing)
  # Already the first evaluation at the target: its step (nothing to interpolate from).
  first = plan.load_pilot(write_pilot(tmp_path / 'q', evals={10: 0.5, 20: 0.6}), target=0.3)
  assert first.notes['pilot_steps'] == 10


def sweep_target_crossing(evals, target):
  """`sweep.target_crossing`, which must stay the same function as the planner's."""
  from anp_jax.research import sweep
  from anp_jax import metrics_io
  assert sweep.target_crossing is metrics_io.target_crossing
  return sweep.target_crossing(evals, target)


def test_a_pilot_must_be_a_synchronous_run(tmp_path):
  """An asynchronous, mixed or local-SGD pilot's steps already include the cost of stale or
  averaged updates, which the plan adds on top: refused. (Before: accepted as synchronous.)"""
  for method in ('async', 'mixed', 'local_sgd'):
    with pytest.raises(plan.PlanError, match=f"method '{method}'.*synchronous"):
      plan.load_pilot(write_pilot(tmp_path / method, method=method), target=0.3)
  assert plan.load_pilot(write_pilot(tmp_path / 'sync', method='sync'), target=0.3).s_min > 0


def test_sweep_fit_recovers_s_min_and_b_crit_and_shows_b_simple(tmp_path):
  model = plan.sweep_model(plan.sweep_points(sweep_rows()))
  assert model.s_min == pytest.approx(120.0) and model.b_noise == pytest.approx(200.0)
  assert model.notes['b_simple'] == pytest.approx(250.0 + (128 + 256) / 20)
  assert len(model.alternatives) == 6  # Leave-one-batch-out fits.
  noisy = plan.sweep_model(plan.sweep_points(sweep_rows(jitter=0.05)))
  central, lo, hi = noisy.steps(2048)
  assert lo < central < hi
  by_simple = plan.sweep_model(plan.sweep_points(sweep_rows()), use='b_simple')
  assert by_simple.b_noise == pytest.approx(model.notes['b_simple'])
  (tmp_path / 'results.json').write_text(json.dumps(sweep_rows() + [
      dict(sweep_rows()[0], rule='none')]))
  with pytest.raises(plan.PlanError, match='choose one with --rule'):
    plan.load_sweep(str(tmp_path))
  assert plan.load_sweep(str(tmp_path), rule='linear').b_noise == pytest.approx(200.0)
  with pytest.raises(plan.PlanError, match='not 0.5'):
    plan.load_sweep(str(tmp_path), rule='linear', target=0.5)
  with pytest.raises(plan.PlanError, match='needs two'):
    plan.sweep_model(plan.sweep_points([dict(r, steps_to_target=None) for r in sweep_rows()][1:]))


def test_a_batch_where_a_seed_missed_the_target_is_left_out_of_the_fit(tmp_path):
  """As in the sweep report (`sweep_report.aggregate`): a batch size where some finished seed
  never reached the target is not averaged over the seeds that did, nor fitted, and the notes
  say so. (Before: the lucky seed at B=1024 alone gave S_min=40.9, B_crit=602 for 100, 200.)"""
  from anp_jax.research import sweep_report
  rows = [dict(r, seed=seed, final_top1=0.3, best_top1=0.3, lr=0.1, total_steps=1000,
               examples_to_target=r['steps_to_target'] * r['batch'])
          for r in sweep_rows(100.0, 200.0, batches=(32, 64, 128, 256)) for seed in (0, 1)]
  lucky = dict(rows[0], batch=1024, steps_to_target=60.0, examples_to_target=60.0 * 1024)
  rows += [lucky, dict(lucky, seed=1, steps_to_target=None, examples_to_target=None)]
  points = plan.sweep_points(rows)
  assert points[1024]['steps'] is None and points[1024]['missed'] == 1
  assert points[1024]['seeds'] == 2
  model = plan.sweep_model(points)
  assert model.s_min == pytest.approx(100.0) and model.b_noise == pytest.approx(200.0)
  report = sweep_report.fit_arms(sweep_report.aggregate(rows))[('linear', 'on')]
  assert (model.s_min, model.b_noise) == pytest.approx((report['s_min'], report['b_crit']))
  assert model.notes['batches'] == 4 and model.notes['fit_batches'] == [32, 64, 128, 256]
  assert '1024 (1 of 2 seeds missed the target)' in model.notes['excluded']
  text = plan.format_plan(plan.make_plan(model, pm.minotauro(nodes=2), pm.resnet50(), [1],
                                         [128], ['sync']))
  assert 'excluded = ' in text and '1024 (1 of 2 seeds missed the target)' in text


def test_a_sweep_plans_for_its_own_batch_sizes_by_default(tmp_path):
  """No --batches with --sweep: the batch sizes of its fit, as the flag's help says. (Before:
  128 x 1/4 ... 32, batch sizes the sweep never ran.) A default size that splits over no
  configuration's devices is left out (12 on 8-GPU nodes)."""
  rows = sweep_rows(batches=(12, 24, 48, 96)) + [
      dict(sweep_rows(batches=(2048,))[0], steps_to_target=None)]
  (tmp_path / 'results.json').write_text(json.dumps(rows))
  p = plan.build_plan(sweep=str(tmp_path), methods='sync', cluster='minotauro')
  assert sorted({r.global_batch for r in p.rows}) == [12, 24, 48, 96]
  assert p.sprint_batch == 12
  p = plan.build_plan(sweep=str(tmp_path), methods='sync', cluster='dgx_h200')
  assert sorted({r.global_batch for r in p.rows}) == [24, 48, 96]


def test_default_batch_sizes_that_fit_no_configuration_are_left_out(tmp_path):
  """The default list (pilot batch x 1/4 ... 8) keeps only sizes that split over some node
  count's devices; sizes the user gives must all fit. (Before: a pilot at B0=16 on 8-GPU nodes
  was refused: 'Global batch 4 fits none of the configurations', for a --batches never given.)"""
  pilot = write_pilot(tmp_path / 'p', batch=16)
  p = plan.build_plan(pilot=pilot, target=0.3, methods='sync', cluster='dgx_h200')
  assert sorted({r.global_batch for r in p.rows}) == [8, 16, 32, 64, 128]  # 16 x 1/2 ... 8.
  assert any('B=4' in s for s in p.skipped)
  with pytest.raises(plan.PlanError, match='Global batch 4 fits none'):
    plan.build_plan(pilot=pilot, target=0.3, methods='sync', cluster='dgx_h200', batches=[4, 16])
  # Three devices per node: no power-of-two multiple of the pilot batch splits over them.
  (tmp_path / 'c.json').write_text(json.dumps({'nodes': 2, 'devices_per_node': 3,
                                               'device': 'v100', 'interconnect': 'minotauro'}))
  with pytest.raises(plan.PlanError, match=r'None of the default batch sizes \[4, 8, .*--batches'):
    plan.build_plan(pilot=pilot, target=0.3, methods='sync', cluster=str(tmp_path / 'c.json'))


def _curve(scale, epochs=4.0, cap=1.0):
  """top1 = 0.1 * epoch / scale (capped): reaching a level takes `scale` times the sync epochs."""
  return [{'epoch': e, 'top1': min(0.1 * e / scale, cap)} for e in np.arange(0.5, epochs + 0.1, 0.5)]


def test_convergence_penalty_recovers_a_linear_staleness_cost():
  results = [{'method': 'sync', 'workers': 0, 'sync_every': 1, 'curve': _curve(1.0)}]
  for n in (4, 8):
    results.append({'method': 'async', 'workers': n, 'sync_every': 1,
                    'curve': _curve(1 + 0.2 * (n - 1))})
  for h in (4, 16):
    results.append({'method': 'local_sgd', 'workers': 0, 'sync_every': h,
                    'curve': _curve(1 + 0.01 * (h - 1))})
  pen = plan.convergence_penalty(results)
  assert pen['async'].slope == pytest.approx(0.2, rel=1e-6)
  assert pen['local_sgd'].slope == pytest.approx(0.01, rel=1e-6)
  assert pen['async'].factor(3)[0] == pytest.approx(1.6)
  # An arm that never reaches the levels bounds the slope from below.
  results.append({'method': 'async', 'workers': 16, 'sync_every': 1, 'curve': _curve(1, cap=0.01)})
  bounded = plan.convergence_penalty(results)['async']
  assert bounded.bounds and bounded.slope >= max((b[1] - 1) / b[0] for b in bounded.bounds) - 1e-9
  with pytest.raises(plan.PlanError, match='no synchronous arm'):
    plan.convergence_penalty(results[1:])


def test_mixed_asynchronous_arms_measure_the_async_penalty_at_their_staleness():
  """Mixed arms of N workers (a synchronous group each) count at mean staleness N − 1."""
  results = [{'name': 'sync', 'method': 'sync', 'workers': 0, 'sync_every': 1,
              'predicted_epoch_s': 3600.0, 'curve': _curve(1.0)}]
  for method, n in (('mixed', 4), ('mixed', 8), ('async', 16)):
    results.append({'name': f'{method}-{n}', 'method': method, 'workers': n, 'sync_every': 1,
                    'predicted_epoch_s': 3600.0, 'curve': _curve(1 + 0.05 * (n - 1))})
  pen = plan.convergence_penalty(results)
  assert sorted({p[0] for p in pen['async'].points}) == [3.0, 7.0, 15.0]
  assert pen['async'].slope == pytest.approx(0.05, rel=1e-6)
  rows = {r['name']: r for r in validation.validate_methods(results, 0.5)}
  for name in ('mixed-4', 'mixed-8', 'async-16'):  # Each predicted from the other two.
    assert rows[name]['predicted_h'] == pytest.approx(rows[name]['measured_h'], rel=1e-6)


def test_cluster_files_reject_unknown_fields(tmp_path):
  good = {'name': 'lab', 'nodes': 8, 'devices_per_node': 4, 'device': 'v100',
          'interconnect': {'intra_node_bandwidth': 1e10, 'intra_node_latency': 1e-5,
                           'inter_node_bandwidth': 1e9, 'inter_node_latency': 1e-5}}
  (tmp_path / 'c.json').write_text(json.dumps(good))
  cluster, counts = plan.load_cluster(str(tmp_path / 'c.json'))
  assert cluster.nodes == 8 and cluster.device.name == 'v100' and counts == [1, 2, 4, 8]
  (tmp_path / 'c.yaml').write_text('nodes: 3\ndevices_per_node: 2\ninterconnect: minotauro\n'
                                   'device: {preset: k80, efficiency: 0.2}\nnode_counts: [1, 3]\n')
  cluster, counts = plan.load_cluster(str(tmp_path / 'c.yaml'))
  assert cluster.device.efficiency == 0.2 and counts == [1, 3]
  for bad, where in ((dict(good, gpus=4), "'gpus'"),
                     (dict(good, device={'preset': 'k80', 'tflops': 3}), "'tflops'"),
                     (dict(good, interconnect=dict(good['interconnect'], bw=1)), "'bw'")):
    (tmp_path / 'bad.json').write_text(json.dumps(bad))
    with pytest.raises(plan.PlanError, match=f'Unknown field.*{where}'):
      plan.load_cluster(str(tmp_path / 'bad.json'))
  with pytest.raises(plan.PlanError, match='Bad cluster description'):
    plan.cluster_from_dict(dict(good, nodes=0))
  with pytest.raises(plan.PlanError, match='neither a preset'):
    plan.load_cluster(str(tmp_path / 'nope.json'))


def test_cluster_file_node_counts_must_be_a_list(tmp_path):
  """A scalar ``node_counts: 4`` (a YAML slip) is a PlanError naming the fix (before: TypeError,
  a traceback and exit 1 from the command line)."""
  (tmp_path / 'c.yaml').write_text('nodes: 8\ndevices_per_node: 4\ndevice: v100\n'
                                   'interconnect: minotauro\nnode_counts: 4\n')
  with pytest.raises(plan.PlanError, match=r'node_counts must be a list.*\[1, 2, 4\]'):
    plan.load_cluster(str(tmp_path / 'c.yaml'))
  good = {'nodes': 8, 'devices_per_node': 4, 'device': 'v100', 'interconnect': 'minotauro'}
  for bad in ([], [1, 'two'], [True], [1, 9]):
    with pytest.raises(plan.PlanError, match='node_counts'):
      plan.cluster_from_dict(dict(good, node_counts=bad))
  assert plan.cluster_from_dict(dict(good, node_counts=[4, 2, 4]))[1] == [2, 4]


def test_plan_picks_fastest_cheapest_and_sprint_and_rejects_batches_that_do_not_fit():
  model = plan.pilot_model(128, 160.0, 400.0, [300.0, 500.0])
  cluster = pm.minotauro(nodes=8)
  pen = {'async': plan.Penalty(0.3, 0.2, 0.4, [], [])}
  p = plan.make_plan(model, cluster, pm.resnet50(307_406), [1, 2, 4, 8], [128, 512, 2048],
                     ['sync', 'mixed'], pen, sprint_batch=512)
  assert p.fastest.time == min(r.time for r in p.rows)
  near = [r for r in p.rows if r.time <= 1.1 * p.fastest.time]
  assert p.cheapest in near and p.cheapest.device_hours == min(r.device_hours for r in near)
  sync512 = [r for r in p.rows if r.method == 'sync' and r.global_batch >= 512]
  assert p.sprint.epoch_time == min(r.epoch_time for r in sync512)
  for r in p.rows:
    assert r.time_range[0] <= r.time <= r.time_range[1]
    assert r.device_hours == pytest.approx(r.time * r.devices / 3600)
    if r.method == 'sync':
      assert r.steps == pytest.approx(model.steps(r.global_batch)[0])
    elif r.nodes > 1:  # Mixed: node batches as updates, slowed by their staleness.
      assert r.update_batch == r.global_batch // r.nodes and r.mean_staleness > 0
      assert r.steps == pytest.approx(model.steps(r.update_batch)[0] * (1 + 0.3 * r.mean_staleness))
  front = plan.pareto_front(p.rows)
  assert all(not (o.time < f.time and o.device_hours < f.device_hours) for f in front
             for o in p.rows)
  with pytest.raises(plan.PlanError, match='Global batch 6 fits none'):
    plan.make_plan(model, cluster, pm.resnet50(), [1, 2], [6], ['sync'])
  with pytest.raises(plan.PlanError, match='need a convergence penalty'):
    plan.make_plan(model, cluster, pm.resnet50(), [1], [128], ['async'])


def test_cli_writes_the_plan_and_exits_2_on_bad_input(tmp_path):
  pilot = write_pilot(tmp_path / 'pilot')
  out = tmp_path / 'plan'
  r = plan_cli('--pilot', pilot, '--target', '0.3', '--cluster', 'minotauro', '--nodes', '1,2,4',
                '--batches', '64,256', '--methods', 'sync,mixed', '--out', str(out))
  assert r.returncode == 0, r.stderr[-2000:]
  text = r.stdout
  assert 'Fastest:' in text and 'SPRINT' in text and 'Cheapest within 10 %' in text
  saved = json.loads((out / 'plan.json').read_text())
  assert len(saved['rows']) == 2 * 3 * 2  # batches x node counts x methods: all fit.
  for name in ('plan.md', 'time_vs_nodes.png', 'pareto.png'):
    assert (out / name).stat().st_size > 500
  r = plan_cli('--pilot', pilot, '--target', '0.3', '--batches', '6')
  assert r.returncode == 2 and 'Global batch 6 fits none' in r.stderr, r.stderr[-2000:]
  r = plan_cli('--pilot', pilot, '--target', '0.99')
  assert r.returncode == 2 and 'never reached' in r.stderr, r.stderr[-2000:]
  r = plan_cli('--target', '0.3')
  assert r.returncode == 2 and 'Give one of --pilot' in r.stderr, r.stderr[-2000:]


@pytest.mark.slow(30)
def test_plan_from_a_real_pilot_run(data_dir, tmp_path):
  """The trainer's logs are what the planner reads: a tiny pilot to a reachable target."""
  from anp_jax import trainer
  from conftest import tiny_config
  config = tiny_config(data_dir, num_train_steps=16, log_every_steps=2, eval_every_epochs=1.0,
                       target_metric='eval/anp_top5', target_value=0.05)
  trainer.train_and_evaluate(config, str(tmp_path / 'pilot'))
  model = plan.load_pilot(str(tmp_path / 'pilot'))
  assert model.notes['pilot_batch'] == 32 and model.notes['target'] == 0.05
  assert model.b_noise > 0 and model.steps(32)[0] == pytest.approx(model.notes['pilot_steps'])
  # The pilot's own model as the workload: FLOPs from XLA's cost analysis.
  r = plan_cli('--pilot', str(tmp_path / 'pilot'), '--workload', 'pilot', '--dataset_size',
                '256', '--nodes', '1,2', '--methods', 'sync', '--out', str(tmp_path / 'plan'))
  assert r.returncode == 0, r.stderr[-2000:]
  assert 'WARNING' not in r.stderr, r.stderr  # Was the 224 px JPEG input's, for 16 px images.
  saved = json.loads((tmp_path / 'plan' / 'plan.json').read_text())
  assert saved['rows'] and all(r['step_time'] > 0 for r in saved['rows'])


def test_validation_helpers_are_exact_on_model_data_and_the_script_writes_its_report(tmp_path):
  points = plan.sweep_points(sweep_rows(b_crit=200.0))
  points[128]['b_simple'] = 200.0  # A pilot whose B_simple equals B_crit predicts exactly.
  for r in validation.validate_pilot(points, 128) + validation.validate_leave_one_out(points):
    assert r['error'] == pytest.approx(0.0, abs=1e-9)
  results = [{'name': 'sync', 'method': 'sync', 'workers': 0, 'sync_every': 1,
              'predicted_epoch_s': 3600.0, 'curve': _curve(1.0)}]
  for n in (4, 8, 16):
    results.append({'name': f'async-{n}', 'method': 'async', 'workers': n, 'sync_every': 1,
                    'predicted_epoch_s': 3600.0, 'curve': _curve(1 + 0.05 * (n - 1))})
  rows = validation.validate_methods(results, 0.5)
  for r in rows:  # Linear penalty: leave-one-out predicts every arm exactly.
    assert r['predicted_h'] == pytest.approx(r['measured_h'], rel=1e-6)
  out = run_experiment('plan_validation.py', '--out', str(tmp_path))
  assert out.returncode == 0, out.stderr[-3000:]
  text = (tmp_path / 'report.md').read_text()
  assert 'within 25 % out of sample' in text and 'published' in text
  for name in ('steps_predicted_vs_measured.png', 'methods_predicted_vs_measured.png',
               'seed_paper_time_vs_nodes.png', 'results.json'):
    assert (tmp_path / name).stat().st_size > 500


def test_the_pilot_workload_has_the_pilots_class_count(tmp_path):
  """Generated dataset: its config's count. A prepared ANP folder (not in the config): the count
  its newest readable checkpoint records. Before, both used the synthetic count (default 32)."""
  from anp_jax.configs import default
  config = default.get_config()
  config.synthetic.num_pairs = 12
  assert plan.pilot_classes(str(tmp_path), config) == 12
  config.dataset = 'anp'
  with pytest.raises(plan.PlanError, match='no readable checkpoint'):
    plan.pilot_classes(str(tmp_path), config)
  for step, classes in ((5, 553), (9, None)):  # The newest one is unreadable: the older counts.
    meta = tmp_path / 'checkpoints' / str(step) / 'meta'
    meta.mkdir(parents=True)
    (meta / 'metadata').write_text('{"step": 5, "identity": {"num_anps": 553}}' if classes
                                   else '{"step": 9, "ident')
  assert plan.pilot_classes(str(tmp_path), config) == 553
  config.model.name = 'resnet20'
  (tmp_path / 'config.json').write_text(config.to_json())
  anp = plan.workload_for('pilot', 1000, pilot=str(tmp_path))
  config.dataset = 'synthetic_anp'
  (tmp_path / 'config.json').write_text(config.to_json())
  synthetic = plan.workload_for('pilot', 1000, pilot=str(tmp_path))
  width = 64  # ResNet-20's last stage: the head has width x classes + classes parameters.
  assert anp.param_bytes - synthetic.param_bytes == 4 * (width + 1) * (553 - 12)


def _write_rows(path, rows):
  path.mkdir(parents=True, exist_ok=True)
  (path / 'results.json').write_text(json.dumps(rows))
  return str(path)


def _mixed_rows():
  """sync_async_mixed.py's records (per arm: method, curve, ...)."""
  return [{'name': 'sync', 'arm': 'sync', 'method': 'sync', 'workers': 1,
           'curve': _curve(1.0), 'target_top1': 0.25},
          {'name': 'async4', 'arm': 'async4', 'method': 'async', 'workers': 4,
           'curve': _curve(1.5), 'target_top1': 0.25}]


def _refused(r, phrase):
  assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
  assert phrase in r.stderr and 'Traceback' not in r.stderr, r.stderr[-2000:]


def test_the_other_experiments_results_are_refused_with_a_line(tmp_path):
  sweep = _write_rows(tmp_path / 'sweep', sweep_rows())
  mixed = _write_rows(tmp_path / 'mixed', _mixed_rows())
  _refused(plan_cli('--sweep', mixed), 'batch_size_sweep')
  _refused(plan_cli('--sweep', sweep, '--methods', 'sync,mixed', '--penalty_results',
                     str(tmp_path / 'sweep' / 'results.json')), 'sync_async_mixed')
  r = subprocess.run([sys.executable, 'experiments/report.py', mixed], env=subprocess_env(),
                     capture_output=True, text=True, timeout=600, cwd=ROOT)
  _refused(r, 'batch_size_sweep')


def test_cli_refuses_flags_it_would_ignore_and_bad_values_before_printing(tmp_path):
  sweep = _write_rows(tmp_path / 'sweep', sweep_rows())
  pilot = write_pilot(tmp_path / 'pilot')
  base = ('--sweep', sweep, '--methods', 'sync')
  _refused(plan_cli(*base, '--metric', 'eval/noun_top1'), '--metric')
  _refused(plan_cli(*base, '--dataset_size', '0'), '--dataset_size')
  for target in ('0', '-1', '1.5'):
    _refused(plan_cli(*base, f'--target={target}'), '--target')
  afile = tmp_path / 'afile'
  afile.write_text('x')
  r = plan_cli(*base, '--out', str(afile))
  _refused(r, '--out')
  assert 'Fastest' not in r.stdout  # Refused before the plan is printed.
  for flag in ('--use=b_simple', '--rule=linear', '--warmup=on'):
    _refused(plan_cli('--pilot', pilot, '--target', '0.3', flag), flag.split('=')[0])
  _refused(plan_cli(*base, 'extra'), 'extra')


def test_cli_expands_a_tilde_in_paths(tmp_path):
  home = tmp_path / 'home'
  _write_rows(home / 'sweep', sweep_rows())
  write_pilot(home / 'pilot')
  env = subprocess_env(HOME=str(home))
  run = lambda *a: subprocess.run([sys.executable, '-m', 'anp_jax.research.planner', *a],
                                  env=env, capture_output=True, text=True, timeout=600,
                                  cwd=str(tmp_path))
  r = run('--sweep=~/sweep', '--methods', 'sync', '--out=~/plan')
  assert r.returncode == 0, r.stderr[-2000:]
  assert (home / 'plan' / 'plan.json').exists() and not (tmp_path / '~').exists()
  r = run('--pilot=~/pilot', '--target=0.3', '--methods', 'sync')
  assert r.returncode == 0, r.stderr[-2000:]


def test_the_performance_model_reads_the_planners_cluster_files(tmp_path):
  """perfmodel's --cluster refused the YAML file the planner accepts; one loader now serves both
  (in the performance model: the planner imports it, never the reverse)."""
  import os
  (tmp_path / 'c.yaml').write_text(
      'nodes: 8\ndevices_per_node: 4\ndevice: {preset: v100, efficiency: 0.15}\n'
      'interconnect: {intra_node_bandwidth: 2.0e+10, intra_node_latency: 1.0e-5,\n'
      '               inter_node_bandwidth: 3.0e+9, inter_node_latency: 5.0e-6}\n')
  cluster, counts = plan.load_cluster(str(tmp_path / 'c.yaml'))
  assert (cluster, counts) == pm.load_cluster(str(tmp_path / 'c.yaml'))
  text = pm.prediction_report(cluster=str(tmp_path / 'c.yaml'))
  assert 'cluster: v100 x 4/node; intra 20.0 GB/s, 10.0 us; inter 3.0 GB/s, 5.0 us' in text
  rows = [l.split()[:2] for l in text.splitlines() if l.strip()[:1].isdigit()]
  assert rows == [['1', '4'], ['2', '8'], ['4', '16'], ['8', '32']]  # The file's node counts.
  text = pm.prediction_report(cluster=str(tmp_path / 'c.yaml'), nodes=2, gpus_per_node=2,
                              device='k80')
  assert "cluster's links with k80 devices: k80 x 2/node" in text
  # The preset path is unchanged: 16 nodes of 4 k80s on minotauro's links.
  assert 'minotauro: k80 x 4/node' in pm.prediction_report()
  out = subprocess.run([sys.executable, '-m', 'anp_jax.research.perfmodel',
                        f'--cluster={tmp_path / "c.yaml"}', '--sweep_nodes=1,8'],
                       env=subprocess_env(1), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0 and 'v100 x 4/node' in out.stdout, out.stderr[-2000:]
  with pytest.raises(ValueError, match='neither a preset'):
    pm.prediction_report(cluster=str(tmp_path / 'nope.yaml'))
  import ast
  perfmodel_dir = os.path.join(ROOT, 'anp_jax', 'research', 'perfmodel')
  for name in os.listdir(perfmodel_dir):
    if name.endswith('.py'):
      tree = ast.parse(open(os.path.join(perfmodel_dir, name)).read())
      imported = [n.module or '' for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
      imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
      assert not [m for m in imported if 'planner' in m], (name, imported)
