"""The fast tier (`./test.sh -m fast`): what conftest puts in it, that every test file is in it, that
it fits its budget, and how tests/durations.json is recorded."""

import json
import os
import re
import subprocess
import sys
import types

import pytest

import conftest
from conftest import ROOT


class _Item:
  def __init__(self, nodeid, slow=None):
    self.nodeid = nodeid
    self._slow = slow

  def get_closest_marker(self, name):
    if name == 'slow' and self._slow is not None:
      return types.SimpleNamespace(args=(self._slow,), kwargs={})
    return None


def test_the_tier_takes_the_quick_tests_and_each_files_quickest():
  items = [_Item('tests/test_a.py::quick'), _Item('tests/test_a.py::slow'),
           _Item('tests/test_b.py::heavy'), _Item('tests/test_b.py::heavier'),
           _Item('tests/test_c.py::new'), _Item('tests/test_c.py::new_but_marked', slow=30)]
  recorded = {'tests/test_a.py::quick': 0.2, 'tests/test_a.py::slow': 9.0,
              'tests/test_b.py::heavy': 4.0, 'tests/test_b.py::heavier': 40.0}
  assert conftest.fast_tier(items, recorded) == {
      'tests/test_a.py::quick',  # Quick.
      'tests/test_b.py::heavy',  # Its file has no quick test: its quickest.
      'tests/test_c.py::new'}  # Not recorded yet, not marked slow.
  # Weights: recorded, else the slow mark, else 1 s.
  assert conftest.weight_of(items[1], recorded) == 9.0
  assert conftest.weight_of(items[5], recorded) == 30.0
  assert conftest.weight_of(items[4], recorded) == conftest.UNMARKED_SECONDS


@pytest.mark.slow(20)
def test_every_test_file_is_in_the_fast_tier_and_the_tier_fits_its_budget():
  r = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q', '-m', 'fast',
                      '-p', 'no:cacheprovider'], cwd=ROOT, capture_output=True, text=True,
                     timeout=600, env=conftest.subprocess_env())
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  selected = [line for line in r.stdout.splitlines() if '::' in line]
  files = {n.split('::', 1)[0] for n in selected}
  every = {f'tests/{name}' for name in os.listdir(os.path.join(ROOT, 'tests'))
           if name.startswith('test_') and name.endswith('.py')}
  assert every - files == set()
  recorded = conftest.recorded_durations()
  seconds = sum(float(recorded.get(n, 0.0)) for n in selected)
  assert seconds <= conftest.FAST_TIER_BUDGET_S, (
      f'the fast tier takes {seconds:.0f} s (recorded), over its {conftest.FAST_TIER_BUDGET_S} s')
  tally = re.search(r'(\d+)/(\d+) tests collected', r.stdout)
  assert tally and int(tally.group(1)) < int(tally.group(2)), r.stdout[-500:]  # A tier.


def test_recording_merges_this_runs_times_into_the_file(tmp_path, monkeypatch):
  path = tmp_path / 'durations.json'
  path.write_text(json.dumps({'tests/test_x.py::kept': 3.0, 'tests/test_x.py::rerun': 9.0,
                              'tests/test_x.py::renamed[a]': 4.0, 'tests/test_gone.py::t': 5.0}))
  (tmp_path / 'tests').mkdir()
  (tmp_path / 'tests' / 'test_x.py').write_text('def kept():\n  pass\n\n\ndef rerun():\n  pass\n')
  monkeypatch.setattr(conftest, 'ROOT', str(tmp_path))
  monkeypatch.setattr(conftest, 'DURATIONS_FILE', str(path))
  monkeypatch.setattr(conftest, '_RECORDED', {})
  monkeypatch.setenv('ANP_TEST_RECORD_DURATIONS', '1')
  for phase in (0.5, 1.25, 0.25):  # setup, call, teardown
    conftest.pytest_runtest_logreport(types.SimpleNamespace(nodeid='tests/test_x.py::rerun',
                                                            duration=phase))
  worker = types.SimpleNamespace(config=types.SimpleNamespace(workerinput={}))
  conftest.pytest_sessionfinish(worker, 0)  # An xdist worker writes nothing.
  assert json.loads(path.read_text())['tests/test_x.py::rerun'] == 9.0
  conftest.pytest_sessionfinish(types.SimpleNamespace(config=types.SimpleNamespace()), 0)
  # Merged with the tests not run; a test no longer defined (renamed, or its file deleted) gone.
  assert json.loads(path.read_text()) == {'tests/test_x.py::kept': 3.0,
                                          'tests/test_x.py::rerun': 2.0}


def test_every_recorded_test_still_exists():
  """tests/durations.json names only tests that are defined (its weights schedule the suite and
  select the fast tier)."""
  stale = [k for k in conftest.recorded_durations() if not conftest.still_defined(k)]
  assert not stale, stale[:5]
