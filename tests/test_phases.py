"""Where a process's wall time goes (issue 44, item 1): `anp_jax.phases` counts named phases
exclusively (an inner phase's time leaves the outer one), credits JAX's compilation to the
innermost phase, collects a study run's phases in its own section, and writes everything to
``ANP_PROFILE`` at exit; a tiny run's phases cover its stages."""

import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import pytest

from anp_jax import phases, trainer
from conftest import ROOT, subprocess_env, tiny_config


@pytest.fixture(autouse=True)
def _fresh():
  phases.reset()
  yield
  phases.reset()


def test_phases_are_exclusive_and_add_up():
  with phases.phase('outer'):
    time.sleep(0.05)
    with phases.phase('inner'):
      time.sleep(0.1)
      assert phases.current() == 'inner'
    assert phases.current() == 'outer'
    time.sleep(0.05)
  assert phases.current() == ''
  got = phases.totals()
  assert got['inner']['count'] == 1 and got['outer']['count'] == 1
  assert 0.09 <= got['inner']['seconds'] < 0.5
  # The outer phase's own time only (0.1 s), not the 0.2 s the block took.
  assert 0.09 <= got['outer']['seconds'] < 0.19


def test_end_closes_the_phases_an_exception_left_open():
  token = phases.begin('run')
  phases.begin('train')  # Never closed: an exception left it.
  phases.begin('eval:eval')
  phases.end(token)
  assert phases.current() == ''
  phases.end(token)  # Again: nothing.
  assert set(phases.totals()) == {'run', 'train', 'eval:eval'}


def test_sections_collect_their_own_phases():
  with phases.section('a'):
    with phases.phase('train'):
      pass
  with phases.phase('report'):
    pass
  with phases.section('b') as record:
    with phases.phase('train'):
      pass
    with phases.phase('train'):
      pass
  assert record['label'] == 'b'
  got = phases.sections()
  assert [s['label'] for s in got] == ['a', 'b']
  assert got[0]['phases']['train']['count'] == 1 and got[1]['phases']['train']['count'] == 2
  assert 'report' not in got[1]['phases'] and phases.totals()['train']['count'] == 3
  assert all(s['wall_s'] >= 0 for s in got)


def test_compilation_is_credited_to_the_innermost_phase():
  phases.watch_compiles()
  f = jax.jit(lambda x: jnp.sin(x) * 3.0 + x.sum())  # A new function: compiled here.
  with phases.phase('outer'):
    with phases.phase('compiling'):
      f(jnp.arange(7.0)).block_until_ready()
    f(jnp.arange(7.0)).block_until_ready()  # Cached in memory: no compilation.
  got = phases.totals()
  assert got['compiling']['trace_s'] > 0 and got['compiling']['lower_s'] > 0
  # Compiled by XLA, or loaded from the tests' persistent cache (JAX_COMPILATION_CACHE_DIR).
  assert got['compiling'].get('compile_s', 0) + got['compiling'].get('cache_read_s', 0) > 0
  assert 'trace_s' not in got['outer'] and 'compile_s' not in got['outer']


def test_the_profile_is_written_at_exit(tmp_path):
  path = tmp_path / 'profile.json'
  code = ('from anp_jax import phases\n'
          'with phases.section("run1"):\n'
          '  with phases.phase("train"):\n'
          '    pass\n')
  subprocess.run([sys.executable, '-c', code], check=True, timeout=120,
                 env=dict(subprocess_env(1), ANP_PROFILE=str(path)), cwd=ROOT)
  profile = json.loads(path.read_text())
  assert profile['phases']['train']['count'] == 1
  assert [s['label'] for s in profile['sections']] == ['run1']
  assert profile['first_phase_time'] <= profile['end_time']
  assert not [p for p in os.listdir(tmp_path) if '.tmp' in p]  # Written whole, then renamed.


@pytest.mark.slow(20)
def test_a_runs_phases_cover_its_stages(data_dir, tmp_path):
  config = tiny_config(data_dir, num_train_steps=4, eval_every_epochs=0.25,
                       checkpoint_every_steps=2)
  with phases.section('tiny') as record:
    t0 = time.perf_counter()
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
    wall = time.perf_counter() - t0
  got = record['phases']
  for name in ('start', 'dataset', 'build', 'init', 'train', 'eval:eval', 'checkpoint',
               'finish'):
    assert got[name]['count'] >= 1, name
  assert got['eval:eval']['count'] == 2  # Steps 2 and 4.
  # Every program is traced inside a phase: the train step in 'train', the evaluation's in
  # 'eval:eval' (the tests' persistent cache may load rather than compile them).
  assert got['train']['trace_s'] > 0 and got['eval:eval']['trace_s'] > 0
  assert 'outside' not in got
  # Exclusive times add up to the run's wall time (nothing counted twice, little missed).
  covered = sum(p['seconds'] for p in got.values())
  assert 0.8 * wall <= covered <= wall * 1.001 + 0.01, (covered, wall)
