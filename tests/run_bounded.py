"""Runs a command with an overall time bound, and never lets it hang: ``run_bounded.py SECONDS CMD...``.

`.ci/run` runs the suite through it (test.sh with ``ANP_TEST_TIME_LIMIT``). The command runs in
a process group of its own; if it is still running after SECONDS, every process of that group
gets SIGABRT (pytest's fault handler, on in the controller and in every xdist worker, and
``PYTHONFAULTHANDLER`` in the tests' children, then write each thread's Python stack to stderr:
what was waiting on what), then SIGKILL after a grace period, and this exits 124 with a line
naming the bound. Otherwise it exits with the command's own status. SIGINT / SIGTERM given to
this process are passed on to the group.

Why: a pytest-xdist session whose worker crashed was once seen waiting forever (controller in
``DSession.loop_once``, the replacement worker in ``TestQueue.get``, no test running): on CI's
clock a run that never ends, so nothing lands. test.sh also runs xdist with
``--max-worker-restart=0`` (a crashed worker stops the session, naming the test it ran), so this
bound is the last line of defence, not the usual way a run ends.
"""

import os
import signal
import subprocess
import sys
import time

GRACE_S = 60  # Between SIGABRT (stacks written) and SIGKILL.
EXIT_TIMED_OUT = 124  # As coreutils' timeout.


def _signal_group(pgid: int, sig: int) -> None:
  try:
    os.killpg(pgid, sig)
  except ProcessLookupError:
    pass


def run(limit_s: float, cmd, grace_s: float = GRACE_S) -> int:
  """`cmd`'s exit status, or `EXIT_TIMED_OUT` after dumping stacks and killing its group."""
  proc = subprocess.Popen(cmd, start_new_session=True)
  forward = lambda sig, _frame: _signal_group(proc.pid, sig)  # noqa: E731
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, forward)
  deadline = time.monotonic() + limit_s
  while proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.5)
  if proc.poll() is not None:
    return proc.returncode
  print(f'\nrun_bounded: {" ".join(cmd[:3])} ... still running after {limit_s:g} s (the bound '
        f'ANP_TEST_TIME_LIMIT): sending SIGABRT to its processes (their Python stacks follow), '
        f'then SIGKILL after {grace_s:g} s.', file=sys.stderr, flush=True)
  _signal_group(proc.pid, signal.SIGABRT)
  try:
    proc.wait(timeout=grace_s)
  except subprocess.TimeoutExpired:
    pass
  _signal_group(proc.pid, signal.SIGKILL)  # The group's other processes too.
  proc.wait()
  print(f'run_bounded: stopped after {limit_s:g} s; exit {EXIT_TIMED_OUT}.', file=sys.stderr,
        flush=True)
  return EXIT_TIMED_OUT


def main(argv) -> int:
  if len(argv) < 3:
    print('usage: run_bounded.py SECONDS COMMAND [ARGS...]', file=sys.stderr)
    return 2
  try:
    limit = float(argv[1])
  except ValueError:
    limit = -1.0
  if not limit > 0:
    print(f'run_bounded.py: SECONDS must be a positive number, got {argv[1]!r}', file=sys.stderr)
    return 2
  grace = float(os.environ.get('ANP_TEST_KILL_GRACE', GRACE_S))
  return run(limit, argv[2:], grace_s=grace)


if __name__ == '__main__':
  sys.exit(main(sys.argv))
