"""Feasibility within a budget: can a configuration reach the target in the run it would get?

The pilot trained under a budget (``num_epochs`` of its training split, or ``num_train_steps``)
and a learning-rate schedule; a plan carries both to every other batch size the way the trainer
does (`anp_jax.optim`, `anp_jax.durations`): the peak rate is ``base_lr x rule(B /
base_batch_size)`` (``lr_scaling``), warmup lasts ``warmup_epochs`` epochs (warmup_epochs x
train_size / B steps), and the decay spans the whole run: ``num_epochs`` epochs = num_epochs x
train_size / B steps (rounded up), or a fixed ``num_train_steps`` at every batch size. A
configuration whose predicted steps exceed its budget never gets there; one that needs more
than `DEEP_DECAY_FRACTION` of it crosses the target deep in the decay, where the steps model,
fitted where the rate is still high, no longer holds (Shallue et al. 2018 size budgets so the
target falls before that; a B=1024 run of the cpu sweep crossed at step 56 of 79 and larger
batches of another task never got there).
"""

import dataclasses
from typing import Optional, Tuple

from anp_jax import durations, registry
from anp_jax.research import study_results

# Crossing the target after this fraction of the run's steps leans on the schedule's end (under
# cosine decay the rate is then below 35 % of its peak): flagged, never recommended. The study
# runner flags a measured crossing after the same fraction.
DEEP_DECAY_FRACTION = study_results.LATE_FRACTION
FEASIBILITY = ('ok', 'late', 'unreachable', 'unknown')


def decays(schedule: str) -> bool:
  """Whether `schedule` lowers the rate over the run: its registration says
  (`anp_jax.optim.register_schedule(..., decays=...)`; read without JAX)."""
  return registry.SCHEDULES.get(schedule).decays


@dataclasses.dataclass(frozen=True)
class Budget:
  """A run's example budget and learning-rate schedule, as its config records them."""
  train_size: int
  num_epochs: float
  num_train_steps: int  # > 0: a fixed number of steps at every batch size, not epochs.
  warmup_epochs: float
  schedule: str
  lr_scaling: str
  base_lr: float
  base_batch_size: int

  @classmethod
  def from_config(cls, config, train_size: int) -> 'Budget':
    return cls(train_size=int(train_size), num_epochs=float(config.num_epochs),
               num_train_steps=int(config.num_train_steps),
               warmup_epochs=float(config.warmup_epochs), schedule=str(config.schedule),
               lr_scaling=str(config.lr_scaling), base_lr=float(config.base_lr),
               base_batch_size=int(config.base_batch_size))

  def steps(self, examples_per_update: float) -> int:
    """The run's updates at this batch per update, as the trainer counts its total steps."""
    if self.num_train_steps > 0:
      return self.num_train_steps
    return durations.to_steps(steps_per_epoch=self.train_size / examples_per_update,
                              epochs=self.num_epochs, rounding='ceil', minimum=1)

  def feasibility(self, steps: float, examples_per_update: float) -> Tuple[float, str]:
    """(steps / budget, 'ok' | 'late' | 'unreachable') of a prediction of ``steps`` updates."""
    fraction = steps / self.steps(examples_per_update)
    if fraction > 1:
      return fraction, 'unreachable'
    if fraction > DEEP_DECAY_FRACTION and decays(self.schedule):
      return fraction, 'late'
    return fraction, 'ok'

  def describe(self) -> str:
    """How the schedule is carried to another batch size B, in one sentence."""
    rule = {'linear': 'B / {b}', 'sqrt': 'sqrt(B / {b})', 'none': '1'}.get(
        self.lr_scaling, self.lr_scaling).format(b=self.base_batch_size)
    length = (f'{self.num_train_steps} steps at every batch size' if self.num_train_steps > 0
              else f'{self.num_epochs:g} epochs of {self.train_size:,} examples = '
                   f'ceil({self.num_epochs:g} x {self.train_size} / B) steps')
    return (f'Budget and schedule (the input\'s, carried to batch B as the trainer does): peak '
            f'lr {self.base_lr:g} x {rule} ({self.lr_scaling} rule), warmup '
            f'{self.warmup_epochs:g} epochs, {self.schedule} schedule over {length}. A target '
            f'predicted after {100 * DEEP_DECAY_FRACTION:.0f} % of the budget is flagged '
            '"late" (deep in the decay), beyond it "unreachable"; neither is recommended.')


def feasibility(budget: Optional[Budget], steps: float,
                examples_per_update: float) -> Tuple[Optional[int], Optional[float], str]:
  """(budget steps, fraction, status) of a prediction; (None, None, 'unknown') without a budget."""
  if budget is None:
    return None, None, 'unknown'
  fraction, status = budget.feasibility(steps, examples_per_update)
  return budget.steps(examples_per_update), fraction, status
