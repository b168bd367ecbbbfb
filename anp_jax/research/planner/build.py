"""From run directories to a plan: what ``.venv/bin/python -m anp_jax.research.planner``
computes."""

import math
import os
from typing import Optional, Sequence

from anp_jax.research import perfmodel as pm
from anp_jax.research.planner.clusters import load_cluster
from anp_jax.research.planner.errors import PlanError
from anp_jax.research.planner.inputs import (DEFAULT_METRIC, load_pilot, load_sweep, pilot_dirs,
                                             read_rows, workload_for)
from anp_jax.research.planner.penalty import convergence_penalty, mapped_penalty
from anp_jax.research.planner.steps_model import VALIDATED_RATIOS
from anp_jax.research.planner.time_to_target import Plan, make_plan


def build_plan(*, pilot=None, sweep: Optional[str] = None,
               metric: Optional[str] = None, target: Optional[float] = None,
               b_crit_factor: Optional[float] = None, predictor: Optional[str] = None,
               rule: Optional[str] = None,
               warmup: Optional[str] = None, use: str = 'fit',
               cluster: str = 'minotauro', nodes: Optional[Sequence[int]] = None,
               batches: Optional[Sequence[int]] = None, methods: str = 'sync,mixed',
               sync_periods: Sequence[int] = (4,), penalty_results: Optional[str] = None,
               workload: str = 'resnet50', dataset_size: int = pm.MUSA2_TRAIN_IMAGES,
               sprint_batch: Optional[int] = None) -> Plan:
  """The plan from a pilot or a sweep directory (one of them); arguments as the CLI's flags.

  ``pilot``: a pilot run's workdir, or several seeds of one configuration (a list, or
  comma-separated in one string).

  ``predictor``: how a one-batch pilot's steps are carried to other batches (one of
  `predictors.PREDICTORS`; default `default_predictor.DEFAULT`, the one issue 46's registered
  rule chose on held-out tasks); ``b_crit_factor`` instead: the factor model with that factor,
  taken as exact.

  ``penalty_results``: the mapped sync/async/mixed study directory the asynchrony and local-SGD
  penalties come from (`penalty.mapped_penalty`; default on the command line: the committed
  `experiments/results/sync_async_mixed_cpu/`), or an unmapped results.json (the earlier
  censored-slope form, `penalty.convergence_penalty`); needed when ``methods`` names anything
  but sync. Raises `PlanError` on bad input.
  """
  if (pilot is None) == (sweep is None):
    raise PlanError('Give one of --pilot (a pilot run) or --sweep (a sweep directory).')
  if sweep is not None and metric not in (None, DEFAULT_METRIC):
    raise PlanError(f'--metric {metric}: a sweep records steps to its ANP top-1 target only '
                    '(eval/anp_top1); drop --metric, or plan from a --pilot run for another '
                    'metric.')
  if target is not None and not 0 < target <= 1:
    raise PlanError(f'--target {target}: give the target accuracy as a fraction, 0 < target <= 1 '
                    '(e.g. 0.25).')
  if not (isinstance(dataset_size, int) and dataset_size > 0):
    raise PlanError(f'--dataset_size {dataset_size}: give the number of training images (> 0).')
  if sprint_batch is not None and sprint_batch <= 0:
    raise PlanError(f'--sprint_batch {sprint_batch}: give a global batch size > 0.')
  if predictor is not None:
    if sweep is not None:
      raise PlanError('--predictor carries a one-batch pilot to other batches; a --sweep fits '
                      'B_crit itself: drop it.')
    if b_crit_factor is not None:
      raise PlanError('--b_crit_factor gives the factor model its factor; --predictor chooses a '
                      'predictor with its calibrated parameters: give one of them.')
  if pilot:
    model = load_pilot(pilot, metric, target, b_crit_factor=b_crit_factor, predictor=predictor)
  else:
    model = load_sweep(sweep, rule, warmup, target, use)
  method_list = [m for m in methods.split(',') if m]
  penalties = {}
  if any(m != 'sync' for m in method_list):
    if not penalty_results or not os.path.exists(penalty_results):
      raise PlanError(f'--penalty_results {penalty_results!r} does not exist.')
    if os.path.isdir(penalty_results):  # The mapped study: examples relative to sync.
      penalties = mapped_penalty(penalty_results)
    else:  # An unmapped results.json, given explicitly (the withdrawn study's form).
      rows = read_rows(penalty_results, 'penalty', f'--penalty_results {penalty_results}')
      penalties = convergence_penalty(rows)
  the_cluster, counts = load_cluster(cluster)
  counts = nodes or counts
  if any(n > the_cluster.nodes or n < 1 for n in counts):
    raise PlanError(f'--nodes {counts}: the cluster has 1..{the_cluster.nodes} nodes.')
  # Default batch sizes: what the inputs cover, where the model has been checked. A pilot's
  # batch B0 x 1/4 ... 8 (`steps_model.VALIDATED_RATIOS`); pilots at several batch sizes, their
  # validated range (`steps_model.MULTI_VALIDATED_RATIOS`) in factors of 2 from the smallest; a
  # sweep's own batch sizes (those of its fit). Sizes the user did not choose that split over
  # none of the node counts' devices are dropped, not refused (`make_plan`). Batches the user
  # gives beyond are planned, marked extrapolated.
  default = not batches
  if default and 'fit_batches' in model.notes:
    batches = list(model.notes['fit_batches'])
  elif default and 'pilot_batches' in model.notes:
    lo, hi = model.validated
    batches = [int(lo * 2 ** k) for k in range(round(math.log2(hi / lo)) + 1)
               if (lo * 2 ** k).is_integer()]
  elif default:
    b0 = int(model.notes.get('pilot_batch', 128))
    lo, hi = VALIDATED_RATIOS
    factors = [lo * 2 ** k for k in range(round(math.log2(hi / lo)) + 1)]  # 1/4, 1/2, ... 8.
    batches = [round(b0 * f) for f in factors if (b0 * f).is_integer()]
  first_pilot = pilot_dirs(pilot)[0] if pilot else None
  return make_plan(model, the_cluster, workload_for(workload, dataset_size, first_pilot), counts,
                   batches, method_list, penalties, sync_periods, sprint_batch,
                   drop_unfit=default)
