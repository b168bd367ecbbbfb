"""Where a process's wall time goes: named phases, and the compilation inside each.

The trainer and the study runner mark their coarse stages (`phase`): opening the dataset,
building the run, initialising the state, training, each evaluation, checkpoints, the final
metrics, the runner's planning, bookkeeping and reports. Time is counted *exclusively*: a phase
inside another (an evaluation inside training) is taken out of the outer one, so the phases add
up to the time they cover. JAX's compilation events (`jax.monitoring`: tracing, lowering to
MLIR, XLA's compilation or a load from the persistent cache) are credited to the innermost phase
as well, so ``train`` minus its compilation is the training steps, and ``eval:test``'s
compilation the evaluation program's.

`section(label)` collects the phases of one stretch (a study's run) on their own; `totals()` is
the whole process. With ``ANP_PROFILE=PATH`` the process writes both as JSON at exit
(`experiments/study_throughput.py` reads it, docs/performance.md). The cost is a few clock reads
per phase (none per training step): it is always on. No JAX import here: the listener is
registered when JAX is first asked for (`watch_compiles`).
"""

import atexit
import contextlib
import json
import os
import threading
import time
from typing import Dict, List, Optional

PROFILE_ENV = 'ANP_PROFILE'  # A path: write the profile there at exit.

# JAX's duration events (jax._src.dispatch, jax._src.compiler) and what they are called here.
COMPILE_EVENTS = {
    '/jax/core/compile/jaxpr_trace_duration': 'trace',
    '/jax/core/compile/jaxpr_to_mlir_module_duration': 'lower',
    '/jax/core/compile/backend_compile_duration': 'compile',
    # Inside 'compile' (JAX times the persistent cache's read within the backend compile).
    '/jax/compilation_cache/cache_retrieval_time_sec': 'cache_read',
}
COUNT_EVENTS = {'/jax/compilation_cache/cache_hits': 'cache_hits',
                '/jax/compilation_cache/cache_misses': 'cache_misses'}

_lock = threading.Lock()
_stack: List[str] = []  # The open phases, innermost last (the main thread's).
_entered: List[float] = []  # When each open phase last resumed (time.perf_counter()).
_totals: Dict[str, Dict[str, float]] = {}
_sections: List[Dict] = []  # Finished sections: {'label', 'wall_s', 'phases'}.
_open_sections: List[Dict] = []
_first_phase_time: Optional[float] = None  # time.time() of the first phase (after imports).
_watching = False


def _add(name: str, key: str, value: float) -> None:
  for table in [_totals] + [s['phases'] for s in _open_sections]:
    entry = table.setdefault(name, {})
    entry[key] = entry.get(key, 0.0) + value


def begin(name: str) -> int:
  """Opens phase `name` (the outer one pauses); returns the token `end` closes it with. For a
  stretch of code that a ``with phase(...)`` block would have to re-indent."""
  global _first_phase_time
  now = time.perf_counter()
  with _lock:
    if _first_phase_time is None:
      _first_phase_time = time.time()
    if _stack:  # The outer phase pauses.
      _add(_stack[-1], 'seconds', now - _entered[-1])
    _stack.append(name)
    _entered.append(now)
    _add(name, 'count', 1)
    return len(_stack)


def end(token: int) -> None:
  """Closes the phase `begin` returned `token` for (and any phase left open inside it, as an
  exception leaves them); the outer phase resumes. Closing one already closed does nothing."""
  now = time.perf_counter()
  with _lock:
    while len(_stack) >= token:
      _add(_stack.pop(), 'seconds', now - _entered.pop())
    if _stack:
      _entered[-1] = now


@contextlib.contextmanager
def phase(name: str):
  """Counts the wall time of the block under `name` (exclusive of phases opened inside it)."""
  token = begin(name)
  try:
    yield
  finally:
    end(token)


def current() -> str:
  """The innermost open phase ('' outside every phase)."""
  return _stack[-1] if _stack else ''


@contextlib.contextmanager
def section(label: str):
  """Collects the phases of the block apart (one run of a study), besides the totals."""
  record = {'label': label, 'phases': {}}
  start = time.perf_counter()
  with _lock:
    _open_sections.append(record)
  try:
    yield record
  finally:
    with _lock:
      _open_sections.remove(record)
      record['wall_s'] = time.perf_counter() - start
      _sections.append(record)


def _on_duration(event: str, duration: float, **kwargs) -> None:
  del kwargs
  kind = COMPILE_EVENTS.get(event)
  if kind is not None:
    with _lock:
      _add(current() or 'outside', kind + '_s', float(duration))


def _on_event(event: str, **kwargs) -> None:
  del kwargs
  kind = COUNT_EVENTS.get(event)
  if kind is not None:
    with _lock:
      _add(current() or 'outside', kind, 1)


def watch_compiles() -> None:
  """Registers the compilation listeners with JAX (once per process; imports JAX)."""
  global _watching
  if _watching:
    return
  _watching = True
  from jax import monitoring
  monitoring.register_event_duration_secs_listener(_on_duration)
  monitoring.register_event_listener(_on_event)


def totals() -> Dict[str, Dict[str, float]]:
  """{phase: {'seconds', 'count', 'trace_s', 'lower_s', 'compile_s', ...}} so far (a copy).
  A phase's compilation is ``trace_s + lower_s + compile_s`` (``cache_read_s``, a load from
  the persistent cache, is part of ``compile_s``)."""
  with _lock:
    return json.loads(json.dumps(_totals))


def sections() -> List[Dict]:
  """The finished `section`s, in order (a copy)."""
  with _lock:
    return json.loads(json.dumps(_sections))


def profile() -> Dict:
  """Everything recorded: the totals, the sections, and when the first phase began (epoch
  seconds: a launcher subtracts its own start time to get the process start and imports)."""
  return {'first_phase_time': _first_phase_time, 'end_time': time.time(), 'pid': os.getpid(),
          'phases': totals(), 'sections': sections()}


def reset() -> None:
  """Forgets everything recorded (tests)."""
  global _first_phase_time
  with _lock:
    _totals.clear()
    _sections.clear()
    _first_phase_time = None


def _write_at_exit() -> None:
  path = os.environ.get(PROFILE_ENV)
  if not path:
    return
  tmp = f'{path}.tmp{os.getpid()}'
  try:
    with open(tmp, 'w') as f:
      json.dump(profile(), f, indent=2)
    os.replace(tmp, path)
  except OSError:
    pass


atexit.register(_write_at_exit)
