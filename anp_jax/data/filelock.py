"""An exclusive file lock that says what it waits for, and for how long it will.

Dataset preparation is serialised across processes and jobs that share a data_dir with
``flock`` on a lock file in it. A plain ``flock(LOCK_EX)`` waits silently and for ever: behind
another job's long preparation (fine, but the user should be told), or behind a process that is
stuck or stopped while it holds the lock (a hang). `exclusive` polls instead, logs who holds the
lock (pid and command line, from ``/proc/locks``) once the wait gets long, and can give up after a
time-out with an error that names the lock file and the holder.
"""

import contextlib
import errno
import fcntl
import logging
import os
import time
from typing import Iterator, Optional


def holders(path: str) -> list:
  """Pids holding a ``flock`` on `path` according to ``/proc/locks`` (Linux; [] elsewhere)."""
  try:
    st = os.stat(path)
    with open('/proc/locks') as f:
      lines = f.read().splitlines()
  except OSError:
    return []
  pids = []
  for line in lines:
    fields = line.split()
    if '->' in fields:  # A waiter ("1: -> FLOCK ..."), not a holder.
      continue
    if len(fields) < 6 or fields[1] != 'FLOCK':
      continue
    try:
      _, _, inode = fields[5].split(':')
      if int(inode) == st.st_ino:
        pids.append(int(fields[4]))
    except ValueError:
      continue
  return pids


def describe(pids) -> str:
  """'pid 123 (python -m anp_jax.main ...)' for each pid (best effort)."""
  out = []
  for pid in pids:
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        cmd = f.read().replace(b'\0', b' ').decode(errors='replace').strip()
    except OSError:
      cmd = ''
    out.append(f'pid {pid}' + (f' ({cmd[:200]})' if cmd else ''))
  return ', '.join(out) or 'another process'


@contextlib.contextmanager
def exclusive(path: str, what: str, timeout_s: Optional[float] = None,
              notice_after_s: float = 10.0, poll_s: float = 0.25) -> Iterator[None]:
  """Holds an exclusive ``flock`` on `path` (created if missing) for the ``with`` block.

  `what` says what the lock protects ("generating synthetic_anp in /data"), for the messages.
  After `notice_after_s` of waiting, logs a warning naming the holder; after `timeout_s`
  (None: never) raises TimeoutError (an OSError: the entry points' exit code 2) saying what to do.
  """
  with open(path, 'a') as lock:
    start = time.monotonic()
    noticed = False
    while True:
      try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
          raise
      waited = time.monotonic() - start
      if timeout_s is not None and waited >= timeout_s:
        raise TimeoutError(
            f'Gave up after {waited:.0f} s waiting for the lock {path} ({what}), held by '
            f'{describe(holders(path))}. If that process is another job preparing the same '
            'data, wait for it or raise ANP_BARRIER_TIMEOUT; if it is stuck or stopped, end it '
            'and rerun.')
      if not noticed and waited >= notice_after_s:
        logging.warning('Waiting for the lock %s (%s), held by %s%s.', path, what,
                        describe(holders(path)),
                        '' if timeout_s is None else f'; giving up after {timeout_s:.0f} s')
        noticed = True
      time.sleep(poll_s)
    if noticed:
      logging.warning('Got the lock %s after %.0f s.', path, time.monotonic() - start)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)
