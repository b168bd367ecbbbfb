"""One writer per workdir: the lock a training job holds, and that readers never touch.

A training job writes its workdir (checkpoints, logs) and cleans up after its own killed saves
(orbax's temporary folders). A second job writing the same workdir would interleave checkpoints,
and its clean-up would delete the first job's save in flight. So process 0 of a training job holds
``workdir/.lock`` for the run's life (`acquire`, released by `WorkdirLock.release`); a second
training job on the workdir is refused with an error naming the holder. Readers (eval_only,
`trainer.load_checkpoint`, the planner, the reports) take no lock and write nothing.

What the lock relies on (docs/checkpointing.md):

* ``flock`` on the lock file, held open for the run's life. The kernel drops it when the holder
  exits, however it exits (kill -9 included): a dead holder never blocks anyone. It is seen
  across nodes on NFS (Linux maps flock to POSIX locks there: NFSv4, or NFSv3 with lockd), GPFS,
  BeeGFS with global locks, and Lustre mounted with ``-o flock``; with Lustre's ``localflock``
  it only reaches the processes of one node, with ``noflock`` it fails (then only the record
  below is used, with a warning).
* The record in the file (host, pid, the process's start time, the command), whose modification
  time the holder refreshes every `HEARTBEAT_S` seconds. It names the holder in the error, and
  covers file systems where flock does not reach other nodes: a record left by a process of
  this host that no longer runs is stale, and so is one of another host whose heartbeat is older
  than `STALE_S` seconds; any other record is a live holder. Released cleanly, the record is
  emptied (the file stays: removing a lock file races with a job that has just opened it), so a
  job requeued on another node right after a preemption takes the workdir at once; after a crash
  on another node it waits out `STALE_S`.
"""

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, Optional

LOCK_FILE = '.lock'
HEARTBEAT_S = 30.0  # How often the holder refreshes the record's modification time.
STALE_S = 120.0  # A record of another host older than this is left by a job that is gone.
# flock errors that mean "not supported here", not "held".
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class WorkdirBusyError(OSError):
  """Another live job holds the workdir (the entry points exit with code 2)."""


def _process_start(pid: int) -> Optional[str]:
  """The start time of process `pid` in clock ticks since boot (``/proc``; None elsewhere):
  with the pid, it tells a process from a later one that reused its pid."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _record() -> Dict[str, Any]:
  return {'host': socket.gethostname(), 'pid': os.getpid(),
          'pid_start': _process_start(os.getpid()), 'since': time.time(),
          'command': ' '.join(sys.argv)[:300]}


def _read(fd: int) -> Optional[Dict[str, Any]]:
  """The record in the open lock file (None if empty or unreadable)."""
  os.lseek(fd, 0, os.SEEK_SET)
  text = b''
  while chunk := os.read(fd, 65536):
    text += chunk
  try:
    record = json.loads(text.decode())
  except ValueError:
    return None
  return record if isinstance(record, dict) else None


def describe(record: Dict[str, Any], heartbeat_age_s: Optional[float] = None) -> str:
  """'pid 123 on host node7 (since 2026-01-01 10:00:00, last heartbeat 12 s ago: python ...)'."""
  since = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record.get('since', 0)))
  beat = '' if heartbeat_age_s is None else f', last heartbeat {heartbeat_age_s:.0f} s ago'
  return (f'pid {record.get("pid")} on host {record.get("host")} (since {since}{beat}: '
          f'{record.get("command", "")})')


def _stale_because(record: Dict[str, Any], heartbeat_age_s: float) -> str:
  """Why `record` was left by a job that no longer runs ('' if it may be running)."""
  pid = record.get('pid')
  if record.get('host') == socket.gethostname():
    if not isinstance(pid, int) or pid <= 0:
      return 'it names no process'
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return f'process {pid} no longer runs on this host'
    except PermissionError:
      pass  # Another user's process: it runs.
    start = _process_start(pid)
    if start is not None and record.get('pid_start') not in (None, start):
      return f'process {pid} of this host is another process now (its pid was reused)'
    return ''
  if heartbeat_age_s > STALE_S:
    return (f'its heartbeat is {heartbeat_age_s:.0f} s old (a live holder refreshes it every '
            f'{HEARTBEAT_S:.0f} s)')
  return ''


class WorkdirLock:
  """The held lock: the open lock file, its flock (if supported) and the heartbeat thread."""

  def __init__(self, path: str, fd: int, flocked: bool):
    self.path = path
    self._fd = fd
    self._flocked = flocked
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._beat, name='anp_jax-workdir-lock',
                                    daemon=True)
    self._thread.start()

  def _beat(self):
    while not self._stop.wait(HEARTBEAT_S):
      try:
        os.utime(self._fd)
      except OSError as e:  # A file-system hiccup: the next beat tries again.
        logging.warning('Could not refresh the workdir lock %s: %s', self.path, e)

  def release(self) -> None:
    """Empties the record and drops the lock (idempotent)."""
    if self._fd is None:
      return
    self._stop.set()
    self._thread.join(timeout=5)
    try:
      os.ftruncate(self._fd, 0)
      os.fsync(self._fd)
    except OSError as e:
      logging.warning('Could not clear the workdir lock %s: %s', self.path, e)
    finally:
      if self._flocked:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None


def acquire(workdir: str) -> WorkdirLock:
  """Takes ``workdir/.lock`` for this process (process 0 of a training job), or raises
  WorkdirBusyError naming the job that holds it. A stale record (see the module docstring) is
  taken over with a warning."""
  path = os.path.join(workdir, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    flocked = True
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        record, age = _read(fd), time.time() - os.fstat(fd).st_mtime
        raise WorkdirBusyError(
            f'The workdir {workdir} is in use by another training job: '
            f'{describe(record, age) if record else "a process that holds " + path}. Two jobs '
            'writing one workdir would mix their checkpoints; wait for that job to end, stop '
            'it, or use another --workdir. (Evaluating it with config.eval_only=True is fine: '
            'that only reads.)') from None
      if e.errno not in _UNSUPPORTED:
        raise
      flocked = False
      logging.warning('flock is not supported on the file system of %s (%s): the workdir lock '
                      'relies on its record alone.', path, e)
    record = _read(fd)
    if record:  # Not released cleanly, or held where flock does not reach this node.
      age = time.time() - os.fstat(fd).st_mtime
      why = _stale_because(record, age)
      if not why:
        raise WorkdirBusyError(
            f'The workdir {workdir} is in use by another training job: '
            f'{describe(record, age)}. Wait for that job to end, stop it, or use another '
            f'--workdir. If it is gone (its node crashed), rerun after {STALE_S:.0f} s without '
            f'a heartbeat, or remove {path}.')
      logging.warning('Taking over the workdir lock %s of %s: %s.', path, describe(record, age),
                      why)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(_record()).encode(), 0)
    os.fsync(fd)
  except BaseException:
    os.close(fd)  # Drops the flock, if taken.
    raise
  return WorkdirLock(path, fd, flocked)


def holder(workdir: str) -> Optional[Dict[str, Any]]:
  """The record of the job holding `workdir` (None if free or never locked). Reads only."""
  try:
    fd = os.open(os.path.join(workdir, LOCK_FILE), os.O_RDONLY)
  except FileNotFoundError:
    return None
  try:
    return _read(fd)
  finally:
    os.close(fd)
