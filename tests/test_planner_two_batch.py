"""Pilots at two batch sizes: the planner fits S_min and B_crit to their mean steps (no B_crit /
B_noise factor), carries the seeds' spread through the fit, and states the range it covers."""

import json
import math

import numpy as np
import pytest

from anp_jax.research import planner as plan
from anp_jax.research.planner import steps_model
from planner_helpers import plan_cli as _cli, write_pilot

TARGET = 0.3


def _pilots(tmp_path, crossings, **config):
  """Pilot workdirs: for each batch, one seed per crossing (evaluations every 10 steps, top-1
  0.1 then 0.5: the target 0.3 is crossed 5 steps before the first evaluation above it, so each
  crossing is 5 past a multiple of 10)."""
  dirs = []
  for batch, steps in crossings.items():
    for seed, crossing in enumerate(steps):
      dirs.append(write_pilot(tmp_path / f'b{batch}-s{seed}', batch=batch, trace=100.0,
                               reach_step=crossing + 5, steps=crossing + 15, seed=seed,
                               target_metric='eval/anp_top1', target_value=TARGET, **config))
  return dirs


def test_two_batch_pilots_fit_s_min_and_b_crit_through_their_means(tmp_path):
  """Before: pilots at two batch sizes were refused ("several pilots must be seeds of one
  configuration"); now S(B) goes through both means exactly, with no factor."""
  dirs = _pilots(tmp_path, {64: [35, 55], 256: [15, 25]})
  model = plan.load_pilot(dirs)
  # a + c / 64 = 45, a + c / 256 = 20: c = 25 / (1/64 - 1/256), a = 20 - c / 256.
  c = 25 / (1 / 64 - 1 / 256)
  a = 20 - c / 256
  assert model.s_min == pytest.approx(a) and model.b_crit == pytest.approx(c / a)
  assert model.b_crit_factor == 1.0 and model.factor_log_sd == 0.0
  assert model.central(64) == pytest.approx(45) and model.central(256) == pytest.approx(20)
  assert model.covered == (64, 256) and model.validated == (16, 512)
  assert model.notes['pilot_batches'] == [64, 256] and model.budget is not None
  sd, dof = steps_model.log_sd_over_seeds([[35, 55], [15, 25]])
  assert model.seed_log_sd == pytest.approx(sd) and model.seed_dof == dof == 2
  # The seeds' noise through the fit: 1/n at a pilot batch, less between, more beyond.
  assert model.anchor_weight(64) == pytest.approx(0.5)
  assert model.anchor_weight(256) == pytest.approx(0.5)
  assert model.anchor_weight(128) < 0.5 < model.anchor_weight(16) < model.anchor_weight(4)
  assert model.anchor_weight(1024) > model.anchor_weight(512) > 0.5
  width = lambda b: math.log(model.steps(b)[2] / model.steps(b)[0])
  assert width(128) < width(64) < width(16)


def test_two_batch_pilots_are_refused_where_they_cannot_fit(tmp_path):
  dirs = _pilots(tmp_path / 'ok', {64: [35, 55], 256: [15, 25]})
  with pytest.raises(plan.PlanError, match='fit B_crit itself'):
    plan.load_pilot(dirs, b_crit_factor=1.0)
  # Another field than the batch (and the seeds, bookkeeping) differs: not one configuration.
  other = _pilots(tmp_path / 'wd', {256: [15]}, weight_decay=0.5)
  with pytest.raises(plan.PlanError, match=r"differ in \['weight_decay'\]"):
    plan.load_pilot(dirs[:2] + other)
  # The larger batch needing more steps does not follow S = S_min (1 + B_crit / B).
  worse = _pilots(tmp_path / 'worse', {64: [45], 256: [65]})
  with pytest.raises(plan.PlanError, match='do not follow'):
    plan.load_pilot(worse)
  # Nor does a larger batch that gains more than its ratio (a negative S_min).
  better = _pilots(tmp_path / 'better', {64: [45], 256: [5]})
  with pytest.raises(plan.PlanError, match='do not follow'):
    plan.load_pilot(better)
  with pytest.raises(plan.PlanError, match='needs two or more'):
    steps_model.multi_batch_pilot_model({64: [40.0]})


def test_the_fits_anchor_weight_is_the_delta_method():
  """Var log S(B) from the means' noise: Σ (dS(B)/dS_i)² S_i² / n_i / S(B)² per unit seed
  variance, the derivatives by finite differences of the fit itself (three batch sizes on the
  curve, where the fit's 1/S weights do not move it to first order)."""
  batches, runs = [32.0, 128.0, 512.0], [3.0, 2.0, 4.0]
  curve = lambda b: 20.0 * (1 + 300.0 / b)
  means = [curve(b) for b in batches]
  model = steps_model.multi_batch_pilot_model(
      {int(b): [m] * int(n) for b, m, n in zip(batches, means, runs)})
  assert model.s_min == pytest.approx(20.0) and model.b_crit == pytest.approx(300.0)

  def predict(values, batch):
    s_min, b_crit = steps_model.fit_steps_to_target(batches, values)
    return s_min * (1 + b_crit / batch)

  for batch in (16.0, 64.0, 256.0, 2048.0):
    grads = []
    for i in range(3):
      h = 1e-5 * means[i]
      up, down = list(means), list(means)
      up[i] += h
      down[i] -= h
      grads.append((predict(up, batch) - predict(down, batch)) / (2 * h))
    expected = sum(g ** 2 * m ** 2 / n for g, m, n in zip(grads, means, runs)) / curve(batch) ** 2
    assert model.anchor_weight(batch) == pytest.approx(expected, rel=1e-4)
  # One pilot: 1 / its runs, as before; a sweep's fit: 0 (its jackknife holds the noise).
  assert steps_model.pilot_model(64, 40.0, 100.0, anchor_runs=3).anchor_weight(16) == (
      pytest.approx(1 / 3))
  assert np.isclose(steps_model.StepsModel(10.0, 100.0, [], 'x', anchor_runs=math.inf)
                    .anchor_weight(16), 0.0)


def test_the_plan_from_two_batch_pilots_says_what_it_fitted_and_where_it_holds(tmp_path):
  dirs = _pilots(tmp_path, {64: [35, 55], 256: [15, 25]})
  r = _cli('--pilot=' + ','.join(dirs), '--methods=sync', '--cluster=minotauro',
           f'--out={tmp_path / "plan"}')
  assert r.returncode == 0, r.stderr[-3000:]
  assert "B_crit fitted to the pilots' mean steps at 2 batch sizes" in r.stdout
  assert 'Inputs cover: batches 64-256' in r.stdout
  assert 'predictions validated for 16-512' in r.stdout
  assert "the pilots' seeds, carried through the fit" in r.stdout
  rows = json.loads((tmp_path / 'plan' / 'plan.json').read_text())['rows']
  # Default batches: the validated range in factors of 2 (those that split over the devices).
  assert {r['global_batch'] for r in rows} <= {16, 32, 64, 128, 256, 512}
  assert {64, 256, 512} <= {r['global_batch'] for r in rows}
  r = _cli('--pilot=' + ','.join(dirs), '--methods=sync', '--b_crit_factor=1')
  assert r.returncode == 2 and 'fit B_crit itself' in r.stderr
