"""Exit codes of the entry points and the exception types the library raises for them.

The lowest module of the package (it imports nothing of anp_jax), so that whoever raises an error
imports its type from here and the entry points (`anp_jax.main`, the experiment scripts) map
each type to one documented exit code:

* `EXIT_CONFIG` (2): bad config, input or environment (`ConfigError`, any ValueError / OSError
  the run raises before or while it trains), with a message that says what to change.
* `EXIT_DIVERGED` (3): the loss became NaN or Inf (`NonFiniteLossError`).
* `EXIT_PREEMPTED` (75, EX_TEMPFAIL: "try again"): a preemption checkpoint was written
  (`Preempted`); run.sh and the SLURM script requeue the job on this code.
"""

from typing import Optional

EXIT_CONFIG = 2
EXIT_DIVERGED = 3
EXIT_PREEMPTED = 75


class ConfigError(ValueError):
  """A config value the run cannot use; the message names the field and what to change."""


class InitFromError(ConfigError):
  """A fine-tuning field (``config.init_from``, ``init_exclude``, ``freeze``,
  ``backbone_lr_multiplier``) cannot be used: the message says what to change."""


class NonFiniteLossError(FloatingPointError):
  """Training diverged: the loss became NaN or Inf (first at ``step``, 1-based, if known)."""

  def __init__(self, message: str, step: Optional[int] = None):
    super().__init__(message)
    self.step = step


class Preempted(SystemExit):
  """Raised after the preemption checkpoint is written (or between runs); exits 75."""

  def __init__(self, step: Optional[int] = None):
    super().__init__(EXIT_PREEMPTED)
    self.step = step
