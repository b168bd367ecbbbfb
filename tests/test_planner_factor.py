"""The planner's B_crit / B_noise factor: its calibration (recomputed from the committed held-out
tasks), how it moves a pilot's predictions, and its part of the band."""

import math
import os

import pytest

from anp_jax.research import planner as plan
from anp_jax.research import stats
from anp_jax.research.planner import steps_model
from conftest import ROOT
from planner_helpers import plan_cli, write_pilot

HELDOUT = os.path.join(ROOT, 'experiments', 'results', 'plan_validation', 'heldout')


def test_the_default_parameters_are_the_committed_calibration_tasks_fit():
  """`B_CRIT_FACTOR` and its log-sd are the geometric mean and log-sd of fitted B_crit / pilot
  B_noise over the six committed tasks a-f (over a, b, c alone: 1.891, log-sd 0.0985, the factor
  that scored d, e, f); every other predictor's default parameters come from the same tasks, as
  the registration of tasks g-m records them."""
  from anp_jax.research import plan_validation as validation
  from anp_jax.research import registration
  from anp_jax.research.planner.default_predictor import DEFAULT
  dirs = [os.path.join(HELDOUT, t) for t in 'abcdef']
  tasks = [validation.task_calibration(d, validation.task_diagnostics(d)) for d in dirs]
  params = validation.calibrate_parameters(tasks)
  c = params['factor']
  assert round(c['factor'], 3) == steps_model.B_CRIT_FACTOR == DEFAULT['parameters']['factor'][
      'factor']
  assert round(c['log_sd'], 4) == steps_model.B_CRIT_FACTOR_LOG_SD
  assert c['tasks'] == steps_model.B_CRIT_FACTOR_TASKS == 6
  assert [round(r, 2) for r in c['values'].values()] == [2.05, 1.95, 1.69, 1.30, 2.01, 1.60]
  three = validation.calibrate_parameters(tasks[:3])['factor']
  assert (round(three['factor'], 3), round(three['log_sd'], 4)) == (1.891, 0.0985)
  registered = registration.load('experiments/registrations/plan_heldout_2.json')
  for kind, fitted in params.items():
    default = DEFAULT['parameters'][kind]
    entry = {**registered['predictors'], **registered['baselines']}[kind]['parameters']
    for key, value in default.items():
      assert value == float(f'{fitted[key]:.4g}') == entry[key], (kind, key)


def test_the_factor_moves_b_crit_and_keeps_the_pilots_steps():
  """B_crit = k B_noise; S(B) = S0 (1 + k Bn / B) / (1 + k Bn / B0): through the pilot's steps at
  its batch, more steps below it and fewer above it than B_crit = B_noise."""
  k = 1.9
  one = plan.pilot_model(128, 200.0, 300.0, [250.0, 350.0])
  model = plan.pilot_model(128, 200.0, 300.0, [250.0, 350.0], b_crit_factor=k)
  assert model.b_crit == pytest.approx(k * 300.0) and model.b_noise == 300.0
  for batch in (32, 128, 1024):
    assert model.central(batch) == pytest.approx(
        200.0 * (1 + k * 300 / batch) / (1 + k * 300 / 128))
  assert model.central(128) == pytest.approx(200.0)
  assert model.central(32) > one.central(32) and model.central(1024) < one.central(1024)
  # The sub-windows' alternatives go through the same anchor with the same factor.
  assert all(s * (1 + k * b / 128) == pytest.approx(200.0) for s, b in model.alternatives)
  with pytest.raises(plan.PlanError, match='factor'):
    plan.pilot_model(128, 200.0, 300.0, b_crit_factor=0.0)


def test_the_factors_uncertainty_is_zero_at_the_pilot_and_is_its_log_derivative_elsewhere():
  """Var log S(B) from the factor = (d log S / d log k)² · sd² (1 + 1/tasks), 0 at the pilot;
  the band's quantile combines its 2 degrees of freedom with the seeds' (Welch-Satterthwaite)."""
  sd, tasks, k = 0.1, 3, 1.9
  model = plan.pilot_model(128, 200.0, 300.0, b_crit_factor=k, factor_log_sd=sd,
                           factor_tasks=tasks)
  assert model.factor_log_var(128) == 0.0
  eps = 1e-6
  for batch in (32, 1024):
    up = plan.pilot_model(128, 200.0, 300.0, b_crit_factor=k * math.exp(eps)).central(batch)
    slope = (math.log(up) - math.log(model.central(batch))) / eps
    assert model.factor_log_var(batch) == pytest.approx(slope ** 2 * sd ** 2 * (1 + 1 / tasks),
                                                        rel=1e-4)
  # At the pilot: only the default seed spread (normal quantile); away from it, wider, with
  # Student's t of the combined degrees of freedom.
  seed_var = model.seed_log_sd ** 2 * 2
  assert model.band_width(128) == pytest.approx(steps_model.BAND_Z * math.sqrt(seed_var))
  total = seed_var + model.factor_log_var(1024)
  dof = total ** 2 / (model.factor_log_var(1024) ** 2 / (tasks - 1))
  assert model.band_width(1024) == pytest.approx(
      stats.t_quantile(0.5 + steps_model.BAND_LEVEL / 2, dof) * math.sqrt(total))


def test_the_planner_uses_the_calibrated_factor_and_says_so(tmp_path):
  """--predictor factor: the plan states B_crit = factor x B_noise and where the factor comes
  from; without --predictor the plan names the registered default and what it rests on;
  --b_crit_factor 1 is the uncorrected premise, taken as exact; with --sweep, with --predictor
  or with pilots at two batch sizes the flags are refused."""
  from anp_jax.research.planner.default_predictor import DEFAULT
  pilot = write_pilot(tmp_path / 'p', drift=2.0)
  model = plan.load_pilot(pilot, target=0.3, predictor='factor')
  assert model.b_crit_factor == steps_model.B_CRIT_FACTOR
  assert model.factor_log_sd == steps_model.B_CRIT_FACTOR_LOG_SD and model.factor_tasks == 6
  r = plan_cli('--pilot', pilot, '--target', '0.3', '--methods', 'sync', '--nodes', '1',
               '--predictor', 'factor')
  assert r.returncode == 0, r.stderr[-2000:]
  assert f'B_crit = {steps_model.B_CRIT_FACTOR:.4g} x B_noise' in r.stdout
  assert 'held-out tasks a-f' in r.stdout and 'Default predictor' not in r.stdout
  r = plan_cli('--pilot', pilot, '--target', '0.3', '--methods', 'sync', '--nodes', '1')
  assert r.returncode == 0, r.stderr[-2000:]
  assert f'Default predictor: {plan.predictors.NAMES[DEFAULT["predictor"]]}' in r.stdout
  assert DEFAULT['heldout'][:60] in ' '.join(r.stdout.split())
  r = plan_cli('--pilot', pilot, '--target', '0.3', '--methods', 'sync', '--nodes', '1',
               '--b_crit_factor', '1')
  assert r.returncode == 0, r.stderr[-2000:]
  assert '--b_crit_factor 1, taken as exact' in r.stdout
  r = plan_cli('--sweep', str(tmp_path), '--b_crit_factor', '2')
  assert r.returncode == 2 and '--b_crit_factor' in r.stderr and 'Traceback' not in r.stderr
  r = plan_cli('--pilot', pilot, '--target', '0.3', '--predictor', 'pollux',
               '--b_crit_factor', '2')
  assert r.returncode == 2 and 'give one of them' in r.stderr and 'Traceback' not in r.stderr
  with pytest.raises(plan.PlanError, match='sweep fits B_crit itself'):
    plan.build_plan(sweep=str(tmp_path), predictor='constant')
  other = write_pilot(tmp_path / 'q', drift=2.0, batch=256)
  with pytest.raises(plan.PlanError, match='batch sizes fit B_crit itself'):
    plan.load_pilot([pilot, other], target=0.3, predictor='factor')
