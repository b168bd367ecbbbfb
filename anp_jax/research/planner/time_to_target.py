"""Joining the two sides: time to target = steps to target x time per step, per configuration.

`plan_row` predicts one (nodes, global batch, method) configuration: steps from the steps model
and the convergence penalty (with an approximate 90 % band), step time or update rate from the
performance model, whether the target falls inside the run's budget (`budget`) and whether the
prediction extrapolates beyond its inputs. `make_plan` does every configuration and picks the
fastest and the cheapest within 10 % of the fastest among those that reach the target before
`budget.DEEP_DECAY_FRACTION` of their budget, and what SPRINT's criterion (the fastest
synchronous configuration by epoch time meeting a target global batch, blind to convergence)
would choose.
"""

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

from anp_jax.research import perfmodel as pm
from anp_jax.research.planner.budget import DEEP_DECAY_FRACTION, feasibility
from anp_jax.research.planner.errors import PlanError
from anp_jax.research.planner.penalty import Penalty
from anp_jax.research.planner.steps_model import BAND_Z, StepsModel

PLAN_METHODS = ('sync', 'async', 'mixed', 'local_sgd')


@dataclasses.dataclass
class Row:
  """One planned configuration; times in seconds, ranges (low, high) the approximate 90 %
  prediction band (`steps_model.BAND_LEVEL`) of one run.

  ``budget_steps``: the updates its run would get (the pilot's budget carried to its batch per
  update, `budget.Budget`), ``budget_fraction`` = steps / budget_steps and ``feasibility`` 'ok',
  'late' (after `budget.DEEP_DECAY_FRACTION` of it), 'unreachable' (beyond it) or 'unknown' (no
  budget known). ``extrapolated``: why its prediction rests on inputs outside what they cover
  (a batch size beyond the validated range, a staleness or sync period beyond the measured).
  """
  nodes: int
  devices: int
  global_batch: int
  per_device_batch: int
  method: str
  sync_period: int
  update_batch: int
  mean_staleness: float
  steps: float
  steps_range: Tuple[float, float]
  step_time: float
  epoch_time: float
  time: float
  time_range: Tuple[float, float]
  device_hours: float
  budget_steps: Optional[int] = None
  budget_fraction: Optional[float] = None
  feasibility: str = 'unknown'
  extrapolated: List[str] = dataclasses.field(default_factory=list)

  def label(self) -> str:
    extra = f' H={self.sync_period}' if self.method == 'local_sgd' else ''
    return f'{self.nodes}x{self.devices // self.nodes} B={self.global_batch} {self.method}{extra}'

  @property
  def eligible(self) -> bool:
    """May be recommended: not predicted to cross the target late in its budget or never."""
    return self.feasibility in ('ok', 'unknown')

  def why_not(self) -> str:
    """Why it is not recommended ('' if it may be)."""
    if self.eligible:
      return ''
    where = ('never within it' if self.feasibility == 'unreachable' else
             f'after {100 * DEEP_DECAY_FRACTION:.0f} %: deep in the decay')
    return (f'predicted {self.steps:.0f} of its {self.budget_steps} updates '
            f'({100 * self.budget_fraction:.0f} % of its budget, {where})')


@dataclasses.dataclass
class Plan:
  """The rows and the picks. ``fastest`` / ``cheapest`` are None when no row is eligible;
  ``passed_over``: faster rows than the fastest pick that were not eligible, with why."""
  rows: List[Row]
  fastest: Optional[Row]
  cheapest: Optional[Row]
  sprint: Optional[Row]
  sprint_batch: int
  model: StepsModel
  penalties: Dict[str, Penalty]
  skipped: List[str]
  passed_over: List[Tuple[Row, str]] = dataclasses.field(default_factory=list)
  workload: Optional[pm.Workload] = None  # What the rows' step times were predicted for.


def _log_sd_of_range(factor: Tuple[float, float, float]) -> float:
  """A penalty's (central, low, high) factor range read as its band: ln(high / low) / 2 z."""
  return math.log(factor[2] / factor[1]) / (2 * BAND_Z) if factor[1] > 0 else 0.0


def plan_row(model: StepsModel, penalties: Dict[str, Penalty], cluster: pm.Cluster,
             workload: pm.Workload, nodes: int, global_batch: int, method: str,
             sync_period: int = 1, **predict_kwargs) -> Row:
  """Predicted steps and time to target of one configuration (ValueError if it cannot run).

  Steps: with the mapped study's penalty (`penalty.MappedPenalty`, the default), synchronous
  SGD's examples at the row's global batch times the penalty's ratio, in updates of the row's
  update batch (asynchrony: any mean staleness, flagged outside the measured range; local SGD
  on more than one node). With an explicitly given unmapped penalty (`penalty.Penalty`), the
  steps model at the batch of one update times 1 + slope x (staleness or H − 1). The band adds
  the penalty's uncertainty to the steps model's variance (`StepsModel.band_width`).
  """
  c = cluster.resized(nodes=nodes)
  devices = c.num_devices
  if global_batch % devices:
    raise ValueError(f'global batch {global_batch} does not split over {devices} devices')
  b = global_batch // devices
  if method in ('sync', 'async', 'mixed'):
    p = pm.predict(c, workload, b, method, **predict_kwargs)
  elif method == 'local_sgd':
    p = pm.predict(c, workload, b, 'mixed', mixed_mode='local_sgd', local_steps=sync_period,
                   **predict_kwargs)
  else:
    raise ValueError(f'method {method!r}; choose one of {PLAN_METHODS}')
  extrapolated = []
  if method in ('async', 'mixed'):
    update_batch, staleness = p.worker_batch, p.mean_staleness
    pen, x = penalties.get('async'), staleness
    seconds_per_update = 1.0 / p.updates_per_s
  else:
    update_batch, staleness = global_batch, 0.0
    # Local SGD averages over the node axis: on one node every step is a synchronous step, with
    # nothing to average and no penalty (before, one node was charged the H - 1 local steps).
    pen = penalties.get('local_sgd') if method == 'local_sgd' and nodes > 1 else None
    x = sync_period - 1
    seconds_per_update = p.step_time
  factor = pen.factor(x) if pen else (1.0, 1.0, 1.0)
  what = 'mean staleness' if method in ('async', 'mixed') else 'H − 1'
  mapped = getattr(pen, 'reference', None) == 'global_batch'
  if pen and x > pen.measured_x[1] * (1 + 1e-9):
    extrapolated.append(f'{what} {x:.3g} beyond the measured {pen.measured_x[1]:g}')
  elif mapped and 0 < x < pen.measured_x[0] * (1 - 1e-9):
    extrapolated.append(f'{what} {x:.3g} below the measured {pen.measured_x[0]:g}')
  # A mapped penalty is relative to synchronous SGD at the row's global batch (what the study
  # measured: the same cluster, sync against async): the steps model is read there, and its
  # examples are spread over updates of update_batch examples each.
  model_batch = global_batch if mapped else update_batch
  outside = model.extrapolation(model_batch)
  if outside:
    extrapolated.insert(0, outside)
  central = model.central(model_batch) * model_batch / update_batch * factor[0]
  extra = pen.log_var(x) if mapped else _log_sd_of_range(factor) ** 2
  width = model.band_width(model_batch, extra_log_var=extra)
  steps = (central, central * math.exp(-width), central * math.exp(width))
  budget_steps, fraction, status = feasibility(model.budget, central, update_batch)
  time = steps[0] * seconds_per_update
  return Row(nodes=nodes, devices=devices, global_batch=global_batch, per_device_batch=b,
             method=method, sync_period=sync_period, update_batch=update_batch,
             mean_staleness=staleness, steps=steps[0], steps_range=(steps[1], steps[2]),
             step_time=seconds_per_update, epoch_time=p.epoch_time, time=time,
             time_range=(steps[1] * seconds_per_update, steps[2] * seconds_per_update),
             device_hours=time * devices / 3600, budget_steps=budget_steps,
             budget_fraction=fraction, feasibility=status, extrapolated=extrapolated)


def make_plan(model: StepsModel, cluster: pm.Cluster, workload: pm.Workload,
              node_counts: Sequence[int], batches: Sequence[int], methods: Sequence[str],
              penalties: Optional[Dict[str, Penalty]] = None, sync_periods: Sequence[int] = (4,),
              sprint_batch: Optional[int] = None, tolerance: float = 0.10,
              drop_unfit: bool = False, **predict_kwargs) -> Plan:
  """Every (nodes, batch, method) that runs -> a `Row`; fastest, cheapest-near-fastest, SPRINT.

  The fastest and the cheapest within ``tolerance`` of it are picked among the eligible rows
  (`Row.eligible`: not predicted to need more than `budget.DEEP_DECAY_FRACTION` of their
  budget); the faster rows passed over are listed with why. SPRINT's pick is its criterion's,
  blind to convergence, shown with its feasibility. A batch size that fits none of the
  configurations (splits over none of the node counts' devices) is an error naming it, since
  the caller asked for it; with ``drop_unfit`` (a default list the user never chose) it is left
  out and noted in ``skipped`` instead.
  """
  penalties = penalties or {}
  bad = sorted(set(methods) - set(PLAN_METHODS))
  if bad:
    raise PlanError(f'Unknown method(s) {bad}; choose from {PLAN_METHODS}.')
  if any(m in ('async', 'mixed') for m in methods) and 'async' not in penalties:
    raise PlanError('Asynchronous methods need a convergence penalty: pass --penalty_results '
                    '(the sync/async/mixed experiment results.json).')
  rows, skipped = [], []
  devices = [n * cluster.devices_per_node for n in node_counts]
  for batch in batches:
    fits_somewhere = False
    for n in node_counts:
      for method in methods:
        for h in (sync_periods if method == 'local_sgd' else (1,)):
          try:
            rows.append(plan_row(model, penalties, cluster, workload, n, batch, method, h,
                                 **predict_kwargs))
            fits_somewhere = True
          except ValueError as e:
            skipped.append(f'{n} node(s), B={batch}, {method}: {e}')
    if not fits_somewhere and drop_unfit:
      skipped.append(f'B={batch}: fits none of the configurations (devices {devices}); left out '
                     'of the default batch sizes')
    elif not fits_somewhere:
      raise PlanError(f'Global batch {batch} fits none of the configurations (devices {devices}): '
                      f'{skipped[-1] if skipped else ""}. Use a multiple of the device counts.')
  if not rows:  # Only with drop_unfit: every default batch size was left out.
    raise PlanError(f'None of the default batch sizes {list(batches)} fits a configuration '
                    f'(devices {devices}): give --batches, multiples of the device counts.')
  eligible = [r for r in rows if r.eligible]
  fastest = min(eligible, key=lambda r: r.time) if eligible else None
  cheapest = None
  if fastest is not None:
    near = [r for r in eligible if r.time <= (1 + tolerance) * fastest.time]
    cheapest = min(near, key=lambda r: (r.device_hours, r.time))
  passed_over = sorted(((r, r.why_not()) for r in rows if not r.eligible and
                        (fastest is None or r.time < fastest.time)), key=lambda rw: rw[0].time)
  sprint_batch = (sprint_batch or int(model.notes.get('pilot_batch', 0))
                  or int(min(model.notes.get('pilot_batches', [0])))
                  or min(r.global_batch for r in rows))
  meets = [r for r in rows if r.method == 'sync' and r.global_batch >= sprint_batch]
  sprint = min(meets, key=lambda r: (r.epoch_time, r.devices)) if meets else None
  return Plan(rows, fastest, cheapest, sprint, sprint_batch, model, penalties, skipped,
              passed_over, workload)
