"""Adapter between the study runner and the trainer's evaluation settings.

The trainer's evaluation seam names the target ``config.target_metric`` (a validation metric,
``'eval/anp_top1'``), ``config.target_value`` and ``config.stop_at_target``, and lists its
evaluations in ``config.evals`` (``'eval'`` on the validation split, ``'test'`` on the test
split: metric prefixes ``eval/`` and ``test/``). Choices are made on ``eval/``, published figures
come from ``test/`` when the runs evaluated it. Recorded configs of earlier runs are read with
the new fields (`anp_jax.configs.default.read_run_config`).
"""

from typing import Optional, Tuple

DEFAULT_TARGET_METRIC = 'eval/anp_top1'
VALIDATION_PREFIX = 'eval/'  # Choices (learning rate, stopping) are made on it.
TEST_PREFIX = 'test/'  # Published figures come from it when the runs evaluated it.
TARGET_FIELDS = ('target_metric', 'target_value')


def target(config, metric: Optional[str] = None,
           value: Optional[float] = None) -> Tuple[str, Optional[float]]:
  """(metric, value) of the target: `metric` / `value` when given (a study's flags), else the
  config's ``target_metric`` / ``target_value`` when it has them, else the default metric."""
  if metric is None:
    metric = str(config.get('target_metric') or DEFAULT_TARGET_METRIC)
  if value is None and config.get('target_value') is not None:
    value = float(config.target_value)
  return metric, value


def set_target(config, metric: str, value: float, stop: bool) -> None:
  """Writes the target into a run's config, and whether the run stops at it."""
  config.target_metric, config.target_value = metric, float(value)
  config.stop_at_target = bool(stop)


def stops_at_target(config) -> bool:
  """Whether a run's config stops at its target."""
  return bool(config.get('stop_at_target'))


def test_metric(metric: str) -> str:
  """The test-split counterpart of a validation metric ('eval/anp_top1' -> 'test/anp_top1')."""
  if not metric.startswith(VALIDATION_PREFIX):
    raise ValueError(f'The target metric {metric!r} is not a validation metric '
                     f'({VALIDATION_PREFIX}...): choices are made on the validation split.')
  return TEST_PREFIX + metric[len(VALIDATION_PREFIX):]
