"""Pre-registration as a mechanism: a study's registration is recorded before its first run.

A **registration** is a JSON file that says, before any result exists, what a study will
measure and how it will be judged: its tasks, the predictors and the baselines it scores, the
decision rule. A study preset names it (``get_sweep()``'s ``registration``: a path relative to
the repository root). The study runner (`check`) then:

* before the first run of the study directory, copies it into the directory as
  ``registration.json``: its content, its SHA-256, the path it came from and the time it was
  recorded (`record_of`);
* on every later invocation, compares the file with that record: the same hash passes; a
  changed registration is refused once any run of the directory has started (before that, it is
  recorded again, with the new time); a directory whose runs exist but which recorded no
  registration is refused (registering after the first run is no registration), as is one that
  recorded a registration its preset no longer names;
* when the registration lists its studies (``studies``: {preset: {points, seeds, target}}),
  refuses a preset it does not list and one whose points, seeds or target differ from those
  registered.

Every report prints `describe`: the registration's hash and recorded time beside the first
run's (the earliest record of any run's log). `verify` is what a scoring script calls: the
study recorded this very registration, before its first run.

No JAX: reports and scoring scripts read this.
"""

import datetime
import hashlib
import json
import os
from typing import Dict, List, Optional

from anp_jax.research.study import StudyError

REGISTRATION_FILE = 'registration.json'
# Paths in presets are relative to the repository root.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolve_path(path: str) -> str:
  """A registration path as a preset gives it (relative to the repository root) made absolute."""
  return path if os.path.isabs(path) else os.path.join(ROOT, path)


def file_hash(path: str) -> str:
  """The SHA-256 of the file's bytes (hex)."""
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def load(path: str) -> Dict:
  """A registration file's content (a JSON object); StudyError when it is not one."""
  path = resolve_path(path)
  try:
    with open(path) as f:
      content = json.load(f)
  except (OSError, ValueError) as e:
    raise StudyError(f'The registration {path} is not readable JSON ({e}).') from None
  if not isinstance(content, dict):
    raise StudyError(f'The registration {path} must hold one JSON object.')
  return content


def recorded(out: str) -> Optional[Dict]:
  """The registration a study directory recorded (``registration.json``), or None."""
  path = os.path.join(out, REGISTRATION_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def started_runs(out: str) -> List[str]:
  """The runs of a study directory that have started: a run directory with a log or a record."""
  runs = os.path.join(out, 'runs')
  if not os.path.isdir(runs):
    return []
  return sorted(name for name in os.listdir(runs)
                if any(os.path.exists(os.path.join(runs, name, f))
                       for f in ('metrics.jsonl', 'sweep_run.json', 'config.json')))


def first_run_time(out: str) -> Optional[float]:
  """When the directory's first run started: the earliest ``time`` of any run's log record
  (the trainer stamps every record), None without one."""
  earliest = None
  runs = os.path.join(out, 'runs')
  for name in started_runs(out):
    path = os.path.join(runs, name, 'metrics.jsonl')
    if not os.path.exists(path):
      continue
    with open(path) as f:
      for line in f:
        try:
          t = json.loads(line).get('time')
        except ValueError:
          continue
        if isinstance(t, (int, float)) and (earliest is None or t < earliest):
          earliest = float(t)
        break  # Records are in time order: the first is the run's earliest.
  return earliest


def record_of(path: str) -> Dict:
  """What a study directory records of the registration at ``path`` (before its first run)."""
  full = resolve_path(path)
  return {'source': os.path.relpath(full, ROOT) if full.startswith(ROOT) else full,
          'sha256': file_hash(full), 'recorded_at': datetime.datetime.now(
              datetime.timezone.utc).timestamp(), 'content': load(full)}


def _check_study(content: Dict, preset: str, study) -> None:
  """Refuses a preset the registration does not list, or one that differs from its entry."""
  studies = content.get('studies')
  if studies is None:
    return
  if preset not in studies:
    raise StudyError(f'The registration lists the studies {sorted(studies)}, not {preset!r}: '
                     'run a registered one, or register this one before its first run.')
  entry = studies[preset]
  now = {'points': {name: dict(fields) for name, fields in study.points},
         'seeds': list(study.seeds), 'target_value': study.target_value}
  differ = [k for k in ('points', 'seeds', 'target_value')
            if k in entry and json.loads(json.dumps(entry[k])) != json.loads(json.dumps(now[k]))]
  if differ:
    raise StudyError(f'The study {preset!r} differs from its registration in {differ} '
                     f'(registered: {[entry[k] for k in differ]}; now: '
                     f'{[now[k] for k in differ]}): run what was registered.')


def check(study, out: str, preset: str = '', write: bool = True) -> Optional[Dict]:
  """Enforces a study's registration in its directory ``out`` before any training (see the
  module docstring); with ``write``, records it when it is new. Returns the record (None for a
  study without registration whose directory recorded none). Raises StudyError."""
  there = recorded(out)
  path = getattr(study, 'registration', '') or ''
  started = started_runs(out)
  if not path:
    if there is not None:
      raise StudyError(f'{out} recorded the registration {there["source"]} (sha256 '
                       f'{there["sha256"][:12]}), which this study no longer names: run it with '
                       'its registration.')
    return None
  full = resolve_path(path)
  if not os.path.exists(full):
    raise StudyError(f'The study\'s registration {full} does not exist.')
  content = load(full)
  _check_study(content, preset, study)
  digest = file_hash(full)
  if there is not None and there['sha256'] == digest:
    return there
  if started:
    if there is None:
      raise StudyError(f'{out} holds runs ({", ".join(started[:3])}'
                       + (' ...' if len(started) > 3 else '') + ') but recorded no registration: '
                       'a registration recorded after the first run registers nothing. Use a new '
                       '--out.')
    raise StudyError(f'The registration {path} changed (sha256 {digest[:12]}, recorded '
                     f'{there["sha256"][:12]} at {_when(there["recorded_at"])}) after the '
                     f'study\'s first run ({started[0]}): a registration is fixed before any '
                     'result. Restore it (git), or register a new study in a new --out.')
  record = record_of(full)
  if write:
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, REGISTRATION_FILE + '.tmp')
    with open(tmp, 'w') as f:
      json.dump(record, f, indent=2)
    os.replace(tmp, os.path.join(out, REGISTRATION_FILE))
  return record


def _when(t: Optional[float]) -> str:
  if t is None:
    return 'unknown'
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')


def describe(out: str) -> str:
  """One line for a report: the registration (source, hash, recorded time) beside the time of
  the first run, or that there is none."""
  there = recorded(out)
  first = first_run_time(out)
  run = f'first run started {_when(first)}' if first is not None else 'no run log found'
  if there is None:
    return (f'Registration: none recorded (this study was not pre-registered by the tools); '
            f'{run}.')
  order = ''
  if first is not None:
    order = (': recorded before the first run' if there['recorded_at'] < first else
             ': **recorded after the first run** (not a pre-registration)')
  return (f'Registration: `{there["source"]}` (sha256 {there["sha256"][:12]}), recorded '
          f'{_when(there["recorded_at"])}; {run}{order}.')


def verify(out: str, path: str) -> Dict:
  """What a scoring script checks before it scores a study against a registration: the study
  directory recorded this very file (same SHA-256), before its first run. Returns the record
  with ``first_run`` (time); ValueError otherwise."""
  there = recorded(out)
  full = resolve_path(path)
  if there is None:
    raise ValueError(f'{out} recorded no registration: it cannot be scored as registered by '
                     f'{path}.')
  digest = file_hash(full)
  if there['sha256'] != digest:
    raise ValueError(f'{out} recorded the registration sha256 {there["sha256"][:12]}, but {path} '
                     f'is {digest[:12]} now: score with the registration it recorded.')
  first = first_run_time(out)
  if first is not None and there['recorded_at'] >= first:
    raise ValueError(f'{out} recorded its registration at {_when(there["recorded_at"])}, after '
                     f'its first run ({_when(first)}).')
  return dict(there, first_run=first)


def unscored(content: Dict, dirs: List[str]) -> List[str]:
  """The registration's studies (their presets) that none of the study directories `dirs` ran
  (each records its preset in ``study.json``): a score over `dirs` alone is an interim one, and
  a rule registered for all of them is not applied to it."""
  ran = set()
  for d in dirs:
    try:
      with open(os.path.join(d, 'study.json')) as f:
        ran.add(json.load(f).get('preset'))
    except (OSError, ValueError):
      pass
  return sorted(set(content.get('studies', {})) - ran)
