"""The planner's one error type."""


class PlanError(ValueError):
  """Bad planner input: the message says what to change."""
