"""The suite can never hang CI: a crashed xdist worker stops the session with its test named, and
an overall bound (test.sh's ANP_TEST_TIME_LIMIT, tests/run_bounded.py) writes every process's
stacks and fails. Each is checked on a throwaway inner pytest session run through test.sh itself,
with the options CI uses."""

import os
import subprocess
import sys
import textwrap
import time

from conftest import ROOT

def _inner_suite(tmp_path, files):
  """The test files `files` in `tmp_path`, with the suite's own pytest.ini (its options)."""
  for name, body in files.items():
    (tmp_path / name).write_text(textwrap.dedent(body))
  with open(os.path.join(ROOT, 'pytest.ini')) as f:
    (tmp_path / 'pytest.ini').write_text(f.read())


def _test_sh(tmp_path, *args, timeout, **env):
  """``test.sh ARGS`` on the inner suite in `tmp_path`, with this session's environment as it is
  (ANP_TEST_NO_SETUP: no environment is built), two xdist workers."""
  venv = os.path.dirname(os.path.dirname(sys.executable))
  full_env = dict(os.environ, ANP_VENV=venv, ANP_TEST_NO_SETUP='1', ANP_TEST_WORKERS='2',
                  **{k: str(v) for k, v in env.items()})
  full_env.pop('PYTEST_XDIST_WORKER', None)
  full_env.pop('PYTEST_CURRENT_TEST', None)
  t0 = time.monotonic()
  r = subprocess.run(['bash', os.path.join(ROOT, 'test.sh'), '-c', str(tmp_path / 'pytest.ini'),
                      '--rootdir', str(tmp_path), str(tmp_path), *args],
                     capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)
  return r, time.monotonic() - t0


def test_a_crashed_worker_fails_the_session_fast_and_names_its_test(tmp_path):
  # One file's test aborts its worker (as XLA does on a fatal error); the other files' tests
  # are slow enough that a session waiting for a replacement would still be running.
  _inner_suite(tmp_path, {
      'test_crash.py': '''
          import os
          def test_aborts_its_worker():
            os.write(2, b'F1205 rendezvous.cc:161] Termination timeout for all reduce\\n')
            os.abort()
          ''',
      'test_slow.py': '''
          import time
          import pytest
          @pytest.mark.parametrize('i', range(3))
          def test_takes_a_while(i):
            time.sleep(2)
          ''',
  })
  r, elapsed = _test_sh(tmp_path, timeout=300)
  out = r.stdout + r.stderr
  assert r.returncode != 0, out[-3000:]
  assert 'test_crash.py::test_aborts_its_worker' in out, out[-3000:]
  # What the process wrote to fd 2 before it aborted (XLA's reason) is in the log.
  assert 'Termination timeout for all reduce' in out, out[-3000:]
  # Not replaced: with xdist's default (4 restarts per worker) the crashed test ran again on
  # each replacement, 9 times in all on 2 workers, before the session gave up. Counted by what
  # the test itself writes once per run (xdist's "crashed while running" also appears in the
  # short summary when the terminal is wide enough, as on CI).
  assert 'crashed while running' in out, out[-3000:]
  assert out.count('Termination timeout for all reduce') == 1, out[-3000:]
  assert '1 failed, 3 passed' in out, out[-3000:]
  assert elapsed < 240, elapsed


def test_a_session_past_its_time_limit_writes_its_stacks_and_fails(tmp_path):
  _inner_suite(tmp_path, {
      'test_hangs.py': '''
          import time
          def test_waits_forever_on_a_dead_peer():
            time.sleep(3600)
          ''',
      'test_quick.py': '''
          def test_quick():
            pass
          ''',
  })
  r, elapsed = _test_sh(tmp_path, timeout=300, ANP_TEST_TIME_LIMIT=20, ANP_TEST_KILL_GRACE=20)
  assert r.returncode == 124, (r.returncode, r.stderr[-3000:])
  assert 'still running after 20 s' in r.stderr
  # The stuck worker's stack (pytest's fault handler, on SIGABRT): what it was waiting in.
  assert 'test_waits_forever_on_a_dead_peer' in r.stderr, r.stderr[-3000:]
  assert elapsed < 150, elapsed


def test_run_bounded_passes_the_status_through_and_refuses_a_bad_bound():
  script = os.path.join(ROOT, 'tests', 'run_bounded.py')
  ok = subprocess.run([sys.executable, script, '30', sys.executable, '-c', 'raise SystemExit(7)'],
                      capture_output=True, text=True, timeout=60)
  assert ok.returncode == 7, ok.stderr
  bad = subprocess.run([sys.executable, script, 'soon', 'true'], capture_output=True, text=True,
                       timeout=60)
  assert bad.returncode == 2 and 'SECONDS must be a positive number' in bad.stderr
