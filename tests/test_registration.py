"""Pre-registration as a mechanism (`anp_jax.research.registration`): a study's registration is
recorded in its directory before the first run, a change after that run is refused, a study that
differs from its registration is refused, and reports print both times."""

import json
import subprocess
import sys
import types

import pytest

from anp_jax.research import registration
from anp_jax.research.study import StudyError
from conftest import ROOT, subprocess_env


def _study(path, points=(('p1', {'batch_size': 32}),), seeds=(0, 1), target=0.3):
  return types.SimpleNamespace(registration=str(path), points=points, seeds=seeds,
                               target_value=target)


def _write(path, **content):
  path.write_text(json.dumps(content))
  return path


def _start_run(out, name='p1-lrx1-s0', time=2.0e9):
  run = out / 'runs' / name
  run.mkdir(parents=True)
  (run / 'metrics.jsonl').write_text(json.dumps({'step': 1, 'time': time}) + '\n')


def test_a_registration_is_recorded_before_the_first_run_and_refused_changed_after(tmp_path):
  reg = _write(tmp_path / 'reg.json', rule='lowest median')
  out = tmp_path / 'study'
  record = registration.check(_study(reg), str(out), write=True)
  kept = json.loads((out / registration.REGISTRATION_FILE).read_text())
  assert kept['sha256'] == registration.file_hash(str(reg)) == record['sha256']
  assert kept['content'] == {'rule': 'lowest median'} and kept['source'] == str(reg)
  # The same file again: passes, the record is kept (its time too).
  assert registration.check(_study(reg), str(out), write=True)['recorded_at'] == kept[
      'recorded_at']
  # Changed before any run: recorded again.
  _write(reg, rule='lowest worst')
  assert registration.check(_study(reg), str(out), write=True)['content'] == {
      'rule': 'lowest worst'}
  # Once a run has started, a change is refused, dry run or not.
  _start_run(out)
  _write(reg, rule='whatever wins')
  for write in (False, True):
    with pytest.raises(StudyError, match='changed .* after the study\'s first run'):
      registration.check(_study(reg), str(out), write=write)
  # Restored: passes again.
  _write(reg, rule='lowest worst')
  assert registration.check(_study(reg), str(out), write=False)


def test_runs_without_a_registration_cannot_be_registered_afterwards(tmp_path):
  reg = _write(tmp_path / 'reg.json', rule='x')
  out = tmp_path / 'study'
  _start_run(out)
  with pytest.raises(StudyError, match='recorded no registration'):
    registration.check(_study(reg), str(out), write=True)
  assert not (out / registration.REGISTRATION_FILE).exists()
  # A study without a registration in a directory that recorded one: refused too.
  other = tmp_path / 'other'
  registration.check(_study(reg), str(other), write=True)
  with pytest.raises(StudyError, match='no longer names'):
    registration.check(_study(''), str(other), write=False)
  assert registration.check(_study(''), str(tmp_path / 'none'), write=True) is None


def test_a_study_must_be_the_one_registered(tmp_path):
  points = {'p1': {'batch_size': 32}}
  reg = _write(tmp_path / 'reg.json', studies={
      'preset:a': {'points': points, 'seeds': [0, 1], 'target_value': 0.3}})
  out = str(tmp_path / 'study')
  assert registration.check(_study(reg), out, 'preset:a', write=False)
  with pytest.raises(StudyError, match="not 'preset:b'"):
    registration.check(_study(reg), out, 'preset:b', write=False)
  with pytest.raises(StudyError, match=r"differs from its registration in \['seeds'\]"):
    registration.check(_study(reg, seeds=(0,)), out, 'preset:a', write=False)
  with pytest.raises(StudyError, match='points'):
    registration.check(_study(reg, points=(('p1', {'batch_size': 64}),)), out, 'preset:a',
                       write=False)


def test_reports_print_the_registrations_time_beside_the_first_runs(tmp_path):
  reg = _write(tmp_path / 'reg.json', rule='x')
  out = tmp_path / 'study'
  assert 'none recorded' in registration.describe(str(out))
  registration.check(_study(reg), str(out), write=True)
  recorded = json.loads((out / registration.REGISTRATION_FILE).read_text())['recorded_at']
  _start_run(out, time=recorded + 60)
  line = registration.describe(str(out))
  assert 'sha256 ' + registration.file_hash(str(reg))[:12] in line
  assert 'first run started' in line and 'recorded before the first run' in line
  assert registration.first_run_time(str(out)) == recorded + 60
  assert registration.verify(str(out), str(reg))['first_run'] == recorded + 60
  # A run logged before the record (files edited by hand): the report and the scoring say so.
  _start_run(out, 'p1-lrx1-s1', time=recorded - 60)
  assert 'recorded after the first run' in registration.describe(str(out))
  with pytest.raises(ValueError, match='after its first run'):
    registration.verify(str(out), str(reg))
  _write(reg, rule='y')
  with pytest.raises(ValueError, match='score with the registration it recorded'):
    registration.verify(str(out), str(reg))


def test_the_study_command_refuses_a_registration_changed_after_the_first_run(tmp_path):
  """Through `experiments/study.py` (the tiny preset, registered): a directory whose record
  holds another hash and which has a started run is refused before anything trains (exit 2);
  the registered new tasks list exactly the presets' points, seeds and targets."""
  out = tmp_path / 'study'
  _start_run(out, 'b00016-lrx1-s0')
  (out / registration.REGISTRATION_FILE).write_text(json.dumps(
      {'source': 'experiments/registrations/plan_heldout_tiny.json', 'sha256': '0' * 64,
       'recorded_at': 1.0e9, 'content': {}}))
  r = subprocess.run([sys.executable, 'experiments/study.py', '--preset', 'plan_validation:tiny',
                      '--out', str(out), '--dry_run'], env=subprocess_env(2), cwd=ROOT,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 2 and 'changed' in r.stderr and 'Traceback' not in r.stderr
  from anp_jax.configs import study_plan_validation as spv
  from anp_jax.research import study_cli
  content = registration.load(spv.REGISTRATION)
  assert sorted(content['studies']) == [f'plan_validation:{t}' for t in sorted(spv.NEW_TASKS)]
  for t in spv.NEW_TASKS:
    config, sweep = study_cli.load_preset('study', f'plan_validation:{t}')
    entry = content['studies'][f'plan_validation:{t}']
    assert entry['seeds'] == [0, 1, 2, 3, 4] == list(sweep['seeds'])
    assert entry['points'] == {name: fields for name, fields in sweep['points']}
    assert entry['target_value'] == config.target_value
    assert sweep['registration'] == spv.REGISTRATION


def test_the_registered_studies_not_scored_are_named(tmp_path):
  """A score over some of a registration's studies is an interim one: the scoring script names
  the others and refuses --apply_decision (the rule is registered for all of them)."""
  content = {'studies': {'plan_validation:g': {}, 'plan_validation:h': {}}}
  (tmp_path / 'g').mkdir()
  (tmp_path / 'g' / 'study.json').write_text(json.dumps({'preset': 'plan_validation:g'}))
  assert registration.unscored(content, [str(tmp_path / 'g')]) == ['plan_validation:h']
  (tmp_path / 'h').mkdir()
  (tmp_path / 'h' / 'study.json').write_text(json.dumps({'preset': 'plan_validation:h'}))
  assert registration.unscored(content, [str(tmp_path / 'g'), str(tmp_path / 'h')]) == []
  assert registration.unscored(content, [str(tmp_path / 'missing')]) == sorted(content['studies'])
