"""The planner's B_crit / B_noise factor: its calibration (recomputed from the committed held-out
tasks), how it moves a pilot's predictions, and its part of the band."""

import json
import math
import os

import pytest

from anp_jax.research import planner as plan
from anp_jax.research import stats
from anp_jax.research.planner import steps_model
from conftest import ROOT
from planner_helpers import plan_cli, write_pilot

HELDOUT = os.path.join(ROOT, 'experiments', 'results', 'plan_validation', 'heldout')


def test_the_default_factor_is_the_committed_calibration_tasks_fit():
  """`B_CRIT_FACTOR` and its log-sd are the geometric mean and log-sd of fitted B_crit / pilot
  B_noise over the calibration tasks of the committed held-out results (a, b, c), no other."""
  from anp_jax.research import plan_validation as validation
  results = json.load(open(os.path.join(HELDOUT, 'results.json')))
  names = results.get('calibration') or [t['study'] for t in results['tasks']]
  pairs = [validation.task_factor_pair(t, d) for t, d in zip(results['tasks'],
                                                             results['diagnostics'])
           if t['study'] in names]
  assert sorted(os.path.basename(n) for n in names) == ['a', 'b', 'c']
  c = validation.calibrate_factor(pairs)
  assert round(c['factor'], 3) == steps_model.B_CRIT_FACTOR
  assert round(c['log_sd'], 4) == steps_model.B_CRIT_FACTOR_LOG_SD
  assert c['tasks'] == steps_model.B_CRIT_FACTOR_TASKS == 3
  assert [round(r, 2) for r in c['ratios']] == [2.05, 1.95, 1.69]  # As the comment says.


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
  """A pilot's plan states B_crit = factor x B_noise and where the factor comes from;
  --b_crit_factor 1 is the uncorrected premise, taken as exact; with --sweep it is refused."""
  pilot = write_pilot(tmp_path / 'p', drift=2.0)
  model = plan.load_pilot(pilot, target=0.3)
  assert model.b_crit_factor == steps_model.B_CRIT_FACTOR
  assert model.factor_log_sd == steps_model.B_CRIT_FACTOR_LOG_SD and model.factor_tasks == 3
  r = plan_cli('--pilot', pilot, '--target', '0.3', '--methods', 'sync', '--nodes', '1')
  assert r.returncode == 0, r.stderr[-2000:]
  assert f'B_crit = {steps_model.B_CRIT_FACTOR:.4g} x B_noise' in r.stdout
  assert 'held-out tasks a, b, c' in r.stdout
  r = plan_cli('--pilot', pilot, '--target', '0.3', '--methods', 'sync', '--nodes', '1',
                '--b_crit_factor', '1')
  assert r.returncode == 0, r.stderr[-2000:]
  assert '--b_crit_factor 1, taken as exact' in r.stdout
  r = plan_cli('--sweep', str(tmp_path), '--b_crit_factor', '2')
  assert r.returncode == 2 and '--b_crit_factor' in r.stderr and 'Traceback' not in r.stderr
