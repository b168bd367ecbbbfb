"""Settings of a multi-process job read from the environment: integers, and the time-outs
(seconds) that bound its waits (`TIMEOUT_DEFAULTS`)."""

import os
from typing import Optional


def _int_env(name: str) -> Optional[int]:
  value = os.environ.get(name)
  if value in (None, ''):
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f'Environment variable {name}={value!r} must be an integer.') from None


# The time-outs a user may set (seconds) and their defaults.
TIMEOUT_DEFAULTS = {'ANP_INIT_TIMEOUT': 120, 'ANP_HEARTBEAT_TIMEOUT': 30,
                    'ANP_SHUTDOWN_TIMEOUT': 60, 'ANP_BARRIER_TIMEOUT': 3600}


def _seconds_env(name: str) -> int:
  """A time-out from the environment (`TIMEOUT_DEFAULTS` when unset); 0 or a negative number is
  an error, not the default (0 silently meant the default, a negative one went to JAX)."""
  value = _int_env(name)
  if value is None:
    return TIMEOUT_DEFAULTS[name]
  if value <= 0:
    raise ValueError(f'Environment variable {name}={value} must be a positive number of seconds '
                     f'(unset: {TIMEOUT_DEFAULTS[name]}).')
  return value
