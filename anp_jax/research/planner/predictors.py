"""Predictors of a pilot's steps to target at other batch sizes, the planner's and the baselines.

Each takes the pilot's mean steps S0 at its batch B0 (all predictors go through it) and, for
some, the pilot's gradient noise scale; its parameters are calibrated on other tasks
(``experiments/plan_validation_heldout.py``, `default_predictor`):

* ``factor``: B_crit = k x B_noise (the window up to the target crossing), S(B) = S_min (1 +
  B_crit / B) through S0 (the planner since issue 35);
* ``pollux``: B_crit = B_noise, k = 1 exactly: McCandlish et al.'s premise, which the
  statistical-efficiency model of Pollux / AdaptDL also takes (Qiao et al., OSDI 2021);
* ``near_crossing``: B_crit = k' x B_simple over the last quarter of the window (the records
  just before the crossing), the hypothesis that the noise scale near the target, not its mean
  over the window, tracks B_crit;

and the **baselines**, which ignore the noise scale (they test whether it adds anything):

* ``constant``: one B_crit for every task (the geometric mean of the calibration tasks' fitted
  B_crit), S(B) through S0;
* ``power_law``: S(B) = S0 (B / B0)^-alpha, alpha fitted on the calibration tasks;
* ``perfect``: perfect scaling, S(B) = S0 B0 / B (no parameter).

`build` makes any of them a `steps_model.StepsModel` (band and all), so the planner and the
scoring read them alike. A parameter calibrated over a few tasks carries its spread into the
band as the factor does (`StepsModel.factor_log_var`).
"""

import dataclasses
import math
from typing import Dict, Optional, Sequence

from anp_jax.research.planner.default_predictor import DEFAULT as _DEFAULT
from anp_jax.research.planner.errors import PlanError
from anp_jax.research.planner.steps_model import VALIDATED_RATIOS, StepsModel, pilot_model

PREDICTORS = ('factor', 'pollux', 'near_crossing', 'constant', 'power_law', 'perfect')
# The baselines: the pilot's steps alone, not its noise scale.
NOISE_FREE = ('constant', 'power_law', 'perfect')
# The planner's default (`default_predictor`, written by a registered decision rule).
DEFAULT_PREDICTOR = _DEFAULT['predictor']
# Fewer inputs and fitted numbers first: the order in which ties are broken.
SIMPLICITY = ('perfect', 'power_law', 'constant', 'pollux', 'factor', 'near_crossing')
NAMES = {'factor': 'B_crit = k x B_noise (the planner)',
         'pollux': 'B_crit = B_noise (Pollux / AdaptDL)',
         'near_crossing': 'B_crit = k\' x B_simple near the crossing',
         'constant': 'constant B_crit (baseline)', 'power_law': 'power law (baseline)',
         'perfect': 'perfect scaling (baseline)'}


@dataclasses.dataclass
class PowerLawModel(StepsModel):
  """S(B) = s_min (B / anchor_batch)^-alpha: the power-law and perfect-scaling baselines (s_min
  holds the pilot's steps S0, b_noise its batch: the form has no critical batch). alpha's
  spread over the calibration tasks (``factor_log_sd``, over ``factor_tasks``) joins the band:
  d log S / d alpha = -log(B / B0)."""
  alpha: float = 1.0

  def central(self, batch: float) -> float:
    return self.s_min * (batch / self.anchor_batch) ** -self.alpha

  def noise_log_sd(self, batch: float) -> float:
    return 0.0

  def factor_log_var(self, batch: float) -> float:
    if not self.factor_log_sd:
      return 0.0
    tasks = max(self.factor_tasks, 1)
    return (math.log(batch / self.anchor_batch) * self.factor_log_sd) ** 2 * (1 + 1 / tasks)

  def form(self) -> str:
    return (f'S(B) = {self.s_min:.4g} (B / {self.anchor_batch:g})^-{self.alpha:.4g}'
            + (' (perfect scaling)' if self.alpha == 1.0 and not self.factor_log_sd else ''))

  @property
  def b_crit(self) -> float:
    return math.nan

  @property
  def e_min(self) -> float:
    return math.nan


def parameters_of(kind: str, given: Optional[Dict] = None) -> Dict:
  """A predictor's parameters: ``given``, else the planner's calibrated ones
  (`default_predictor.DEFAULT`)."""
  if kind not in PREDICTORS:
    raise PlanError(f'Unknown predictor {kind!r}; choose one of {PREDICTORS}.')
  if given is not None:
    return dict(given)
  return dict(_DEFAULT['parameters'][kind])


def build(kind: str, batch: int, steps: float, b_noise: Optional[float] = None,
          windows: Sequence[float] = (), b_near: Optional[float] = None,
          parameters: Optional[Dict] = None, source: str = 'pilot', **fields) -> StepsModel:
  """The steps model of predictor ``kind`` from a pilot at ``batch`` with mean ``steps`` to
  the target: ``b_noise`` (window up to the crossing) and its sub-windows ``windows`` for
  factor and pollux, ``b_near`` for near_crossing; ``parameters`` (default: the planner's);
  ``fields`` the other `StepsModel` fields (seed spread, anchor runs, budget)."""
  p = parameters_of(kind, parameters)
  if kind in ('factor', 'pollux'):
    if b_noise is None:
      raise PlanError(f'The {kind} predictor needs the pilot\'s noise scale.')
    k = 1.0 if kind == 'pollux' else float(p['factor'])
    model = pilot_model(batch, steps, b_noise, windows, source=source, b_crit_factor=k,
                        factor_log_sd=0.0 if kind == 'pollux' else float(p.get('log_sd') or 0.0),
                        factor_tasks=0 if kind == 'pollux' else int(p.get('tasks', 0)),
                        **fields)
  elif kind == 'near_crossing':
    if not b_near:
      raise PlanError('The near_crossing predictor needs B_simple near the pilot\'s crossing.')
    model = pilot_model(batch, steps, b_near, (), source=source,
                        b_crit_factor=float(p['factor']),
                        factor_log_sd=float(p.get('log_sd') or 0.0),
                        factor_tasks=int(p.get('tasks', 0)), **fields)
    model.notes['b_simple_near'] = model.notes.pop('b_simple')
    if b_noise is not None:
      model.notes['b_simple'] = b_noise
  elif kind == 'constant':
    model = pilot_model(batch, steps, float(p['b_crit']), (), source=source,
                        factor_log_sd=float(p.get('log_sd') or 0.0),
                        factor_tasks=int(p.get('tasks', 0)), **fields)
    del model.notes['b_simple']  # B_crit is the constant, no noise scale of this pilot.
  else:
    alpha = 1.0 if kind == 'perfect' else float(p['alpha'])
    fields.setdefault('covered', (batch, batch))
    fields.setdefault('validated', (batch * VALIDATED_RATIOS[0], batch * VALIDATED_RATIOS[1]))
    model = PowerLawModel(steps, float(batch), [], source=source,
                          notes={'pilot_batch': batch, 'pilot_steps': steps},
                          anchor_batch=batch, alpha=alpha,
                          factor_log_sd=0.0 if kind == 'perfect' else float(p.get('sd') or 0.0),
                          factor_tasks=0 if kind == 'perfect' else int(p.get('tasks', 0)),
                          **fields)
  if kind in NOISE_FREE and b_noise is not None:
    # Measured, shown, not used: a pilot far from the calibration tasks' B_crit / B_noise (task
    # i's 14x, docs/studies.md section 5) is worth seeing beside a prediction that ignores it.
    model.notes['pilot_b_noise_unused'] = b_noise
  model.notes['predictor'] = kind
  model.notes['predictor_parameters'] = p
  return model
