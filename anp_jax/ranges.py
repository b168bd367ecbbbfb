"""The values a numeric config field allows, written as text: ``'> 0'``, ``'integer >= 1'``,
``'[0, 1)'``, ``'each >= 0'``.

A range is written `'> a'`, `'>= a'` or an interval `'[a, b)'` (brackets as in mathematics),
prefixed `'integer '` for an integer field or `'each '` for a sequence of numbers; a float is
also always finite (NaN passes every comparison, inf overflows). `anp_jax.setup.RANGES` (the
config's own fields) and the options that registered models, optimizers, schedules and
evaluators declare (`anp_jax.registry.Option`) are written this way and checked by `error`.
Plain Python: imported by the config checks and the registries, below everything else.
"""

import dataclasses
import math
import numbers
import re
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Range:
  """One range, parsed: the bounds (None: unbounded) and whether each is open, whether the value
  is an integer or a sequence of numbers (`each` entry in range), and why."""
  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False
  high_open: bool = False
  integer: bool = False
  each: bool = False
  note: str = ''

  def describe(self) -> str:
    """What to use, for the error message: 'an integer >= 1', 'a number in [0, 1)'."""
    what = 'a sequence of numbers' if self.each else 'an integer' if self.integer else 'a number'
    if self.high is None:
      return f'{what} {">" if self.low_open else ">="} {self.low}'
    return (f'{what} in {"(" if self.low_open else "["}{self.low}, {self.high}'
            f'{")" if self.high_open else "]"}')

  def allows(self, value) -> bool:
    """Whether the number `value` (a sequence's entries one by one) is in the range."""
    above = value > self.low if self.low_open else value >= self.low
    below = self.high is None or (value < self.high if self.high_open else value <= self.high)
    return above and below


_RANGE_SPEC = re.compile(r'(?P<each>each )?(?P<integer>integer )?'
                         r'(?:(?P<op>>=|>) (?P<bound>\S+)'
                         r'|(?:in )?(?P<open>[\[(])(?P<low>\S+), (?P<high>\S+)(?P<close>[\])]))')


def parse(entry) -> Range:
  """A range, ``'spec'`` or ``('spec', 'why')``, as a `Range`; ValueError if it is malformed."""
  spec, note = (entry, '') if isinstance(entry, str) else entry
  m = _RANGE_SPEC.fullmatch(spec)
  if m is None:
    raise ValueError(f'Bad range {spec!r}: write e.g. "> 0", "integer >= 1", "[0, 1)" or '
                     '"each >= 0" (see anp_jax/ranges.py).')
  number = lambda text: int(text) if re.fullmatch(r'-?\d+', text) else float(text)  # noqa: E731
  kind = dict(integer=bool(m['integer']), each=bool(m['each']), note=note)
  if m['op']:
    return Range(low=number(m['bound']), low_open=m['op'] == '>', **kind)
  return Range(low=number(m['low']), high=number(m['high']), low_open=m['open'] == '(',
               high_open=m['close'] == ')', **kind)


def is_number(value, integer: bool) -> bool:
  """A number (an integer if `integer`); True/False are switches, not numbers."""
  if isinstance(value, bool):  # A switch, not a number (True == 1).
    return False
  return isinstance(value, numbers.Integral if integer else numbers.Real)


def error(field: str, r: Range, value) -> str:
  """Why `value` is not allowed in ``config.<field>`` ('' if it is): one line naming the field
  and the range."""
  entries = value if r.each and isinstance(value, (tuple, list)) else (value,)
  if r.each and not isinstance(value, (tuple, list)):
    problem = 'is not a sequence of numbers'
  elif any(is_number(x, False) and not math.isfinite(x) for x in entries):
    problem = 'is not a finite number'  # NaN passes every comparison; inf overflows.
  elif not all(is_number(x, False) for x in entries):
    problem = 'is not a number'
  elif not all(is_number(x, r.integer) for x in entries):
    problem = 'is not an integer'
  elif not all(r.allows(x) for x in entries):
    problem = 'is out of range'
  else:
    return ''
  return (f'config.{field}={value!r} {problem}: use {r.describe()}'
          + (f' ({r.note}).' if r.note else '.'))
