"""Time-to-accuracy planner: which batch size, sync or async, how many nodes.

The command line is ``.venv/bin/python -m anp_jax.research.planner --pilot DIR ...`` (`__main__`);
`build_plan` is the same from Python, `write_plan` writes what ``--out`` gets. Reference page:
docs/planner.md.

Two halves, joined by time to target = steps to target x time per step:

* **Statistical side** (`steps_model`, `predictors`; McCandlish et al. 2018, docs/references.md):
  steps to a target follow S(B) = S_min (1 + B_noise / B) and examples E(B) = E_min (1 + B /
  B_noise). From a *pilot* at batch B0 (one run, or several seeds of one configuration) that
  reached the target after S0 steps and logged the noise scale (`anp_jax.noise_scale`: the two
  EMAs tr(Σ) and |G|²), B_noise is the ratio of their means over the window up to the target
  crossing; the default predictor (`default_predictor`, set by a registered decision rule on
  held-out tasks) takes B_crit = `B_CRIT_FACTOR` x B_noise (calibrated on held-out tasks a-f,
  its uncertainty in the band) and S_min = S0 / (1 + B_crit / B0) (`inputs.load_pilot`,
  `pilot_model`); `predictors` also holds B_crit = B_noise (Pollux / AdaptDL's model) and the
  baselines that ignore the noise scale (a constant B_crit, a power law, perfect scaling), scored
  beside it. From a *sweep* with two or more batch sizes reaching the target, S_min and B_crit
  are fitted directly (`fit_steps_to_target`) and the measured B_simple is shown next to them
  (`sweep_model`). Every prediction carries an approximate 90 % band (`StepsModel.steps`):
  B_noise's uncertainty (sub-windows of the pilot's log, or the fit's jackknife) and the
  run-to-run spread of steps to target (measured over seeds, else
  `steps_model.DEFAULT_SEED_LOG_SD`); `scoring.score_predictions` measures how often measured
  means fall inside it, points where seeds missed counted as bounds.
* **Asynchrony** (`penalty`, `mapped_penalty`): stale gradients and infrequent averaging cost
  extra examples. The mapped sync/async/mixed study (every arm with its examples per update and
  staleness on the 16-K80 cluster, each at its tuned rate, 3 seeds) gives the ratio of an
  asynchronous (or mixed, or local-SGD) arm's examples to the target over synchronous SGD's at
  the same global batch, with its 95 % interval in the band, over the staleness it measured
  (beyond it: extrapolated). One node of local SGD is synchronous SGD (no penalty). The earlier
  censored fit of 1 + alpha·(mean staleness) (`convergence_penalty`) is used only for a
  results.json given explicitly.
* **Hardware side** (`anp_jax.research.perfmodel`): step time (sync, local SGD) or update rate and
  mean staleness (async, mixed-async) for every (nodes, global batch, method) of a cluster preset
  or a small cluster file (`clusters.load_cluster`, JSON or YAML, unknown fields rejected).

`time_to_target.make_plan` joins them into rows (nodes, global batch, method) -> steps, step
time, time to target, device-hours, the share of the run's budget (`budget`: the pilot's budget
and learning-rate schedule carried to each batch) and whether the row extrapolates beyond its
inputs; it picks the fastest and the cheapest within 10 % of the fastest among the rows that
reach the target before 60 % of their budget, and what SPRINT's criterion (the fastest
configuration by epoch time meeting a target global batch, blind to convergence) would choose.
`inputs` reads the run directories, `build` joins everything for the command line, `output`
writes the plan. Pure numpy + `perfmodel` (no JAX unless the workload is measured from the
pilot's model with XLA's cost analysis).
"""

from anp_jax.research.planner.budget import DEEP_DECAY_FRACTION, Budget, feasibility
from anp_jax.research.planner.build import build_plan
from anp_jax.research.planner.clusters import cluster_from_dict, load_cluster
from anp_jax.research.planner.errors import PlanError
from anp_jax.research.planner.inputs import (PENALTY_FIELDS, SWEEP_FIELDS, check_rows, flat_config,
                                             load_pilot, load_sweep, pilot_classes,
                                             pilot_train_size, read_rows, recorded_target,
                                             run_record, workload_for)
from anp_jax.research.planner.output import (format_plan, pareto_front, plan_to_json, plot_plan,
                                             write_plan)
from anp_jax.research.planner.penalty import (MappedPenalty, Penalty, censored_slope,
                                              convergence_penalty, epochs_to_level, fit_penalty,
                                              mapped_penalty, penalty_kind)
from anp_jax.research.planner import predictors
from anp_jax.research.planner.scoring import WITHIN, describe_score, score_predictions
from anp_jax.research.planner.steps_model import (B_CRIT_FACTOR, BAND_LEVEL, DEFAULT_SEED_LOG_SD,
                                                  VALIDATED_RATIOS, StepsModel,
                                                  fit_steps_to_target, log_sd_over_seeds,
                                                  pilot_model, sweep_model, sweep_points)
from anp_jax.research.planner.time_to_target import PLAN_METHODS, Plan, Row, make_plan, plan_row

__all__ = [
    'B_CRIT_FACTOR', 'BAND_LEVEL', 'Budget', 'DEEP_DECAY_FRACTION', 'DEFAULT_SEED_LOG_SD',
    'MappedPenalty', 'PENALTY_FIELDS',
    'PLAN_METHODS', 'Penalty', 'Plan', 'PlanError', 'Row', 'SWEEP_FIELDS', 'StepsModel',
    'VALIDATED_RATIOS', 'WITHIN', 'build_plan', 'censored_slope', 'check_rows',
    'cluster_from_dict', 'convergence_penalty', 'describe_score', 'epochs_to_level',
    'feasibility', 'fit_penalty', 'fit_steps_to_target', 'flat_config', 'format_plan',
    'load_cluster', 'load_pilot', 'load_sweep', 'log_sd_over_seeds', 'make_plan',
    'mapped_penalty', 'predictors',
    'pareto_front', 'penalty_kind', 'pilot_classes', 'pilot_model', 'pilot_train_size',
    'plan_row', 'plan_to_json', 'plot_plan', 'read_rows', 'recorded_target', 'run_record',
    'score_predictions', 'sweep_model', 'sweep_points', 'workload_for', 'write_plan',
]
