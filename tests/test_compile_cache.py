"""JAX's persistent compilation cache, on by default (issue 44, item 2; `anp_jax.compile_cache`):
where it goes, the off switch, and whole entries when several processes compile the same
program at once. The suite's own cache is a temporary folder (tests/conftest.py), never
~/.cache; these tests give each child process its own folders."""

import json
import os
import subprocess
import sys

import pytest

from anp_jax import compile_cache
from conftest import ROOT, subprocess_env

# A child process: anp_jax's set-up, then one program compiled (and run) after waiting for the
# file argv[1] (when given) to exist, so that two children compile it at the same moment. It
# prints the cache folder, whether the writer is anp_jax's, and the cache hits and misses.
CHILD = r'''
import json, os, sys, time
from anp_jax import compile_cache, phases, runtime
runtime.configure(tensorflow=False)
import jax, jax.numpy as jnp
phases.watch_compiles()
atomic = compile_cache.use_atomic_writes()
if len(sys.argv) > 1:
  while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
def f(x):  # Big enough to take a while to compile (the minimum compile time is set to 0).
  for i in range(40):
    x = jnp.tanh(x @ x.T + i) * 0.5
  return x.sum()
with phases.phase('compile'):
  value = float(jax.jit(f)(jnp.ones((8, 8))))
got = phases.totals()['compile']
print(json.dumps({'dir': jax.config.jax_compilation_cache_dir, 'atomic': atomic,
                  'value': value, 'hits': got.get('cache_hits', 0),
                  'misses': got.get('cache_misses', 0)}))
'''


def _env(tmp_path, **extra):
  env = subprocess_env(1, XDG_CACHE_HOME=str(tmp_path / 'xdg'), HOME=str(tmp_path / 'home'),
                       JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0', **extra)
  for name in ('JAX_COMPILATION_CACHE_DIR', compile_cache.SWITCH, compile_cache.DIR_ENV):
    if name not in extra:
      env.pop(name, None)
  return env


def _child(env, *args):
  out = subprocess.run([sys.executable, '-c', CHILD, *map(str, args)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _entries(folder):
  return sorted(p for p in os.listdir(folder) if p.endswith('-cache')) if os.path.isdir(
      folder) else []


@pytest.mark.slow(15)
def test_on_by_default_in_a_folder_per_host_cpu_and_reused(tmp_path):
  env = _env(tmp_path)
  first, _ = _child(env)
  folder = os.path.join(tmp_path, 'xdg', 'anp_jax', 'xla', compile_cache.host_key())
  assert first['dir'] == folder and first['atomic']
  assert first['misses'] >= 1 and first['hits'] == 0
  assert _entries(folder)
  second, _ = _child(env)  # A later process loads the program instead of compiling it.
  assert second['hits'] >= 1 and second['misses'] == 0 and second['value'] == first['value']
  assert not os.path.exists(tmp_path / 'home' / '.cache')


@pytest.mark.slow(15)
def test_the_parent_folder_can_be_moved(tmp_path):
  got, _ = _child(_env(tmp_path, ANP_COMPILATION_CACHE_DIR=str(tmp_path / 'mine')))
  assert got['dir'] == os.path.join(tmp_path, 'mine', compile_cache.host_key())
  assert _entries(got['dir'])


@pytest.mark.slow(15)
def test_off_switch(tmp_path):
  got, _ = _child(_env(tmp_path, ANP_COMPILATION_CACHE='0'))
  assert got['dir'] is None and not got['atomic']
  assert not os.path.exists(tmp_path / 'xdg') and not os.path.exists(tmp_path / 'home')


@pytest.mark.slow(15)
def test_a_folder_set_for_jax_is_kept(tmp_path):
  mine = tmp_path / 'jax_own'
  got, _ = _child(_env(tmp_path, JAX_COMPILATION_CACHE_DIR=str(mine)))
  assert got['dir'] == str(mine) and _entries(mine)
  assert not os.path.exists(tmp_path / 'xdg')


@pytest.mark.slow(15)
def test_two_processes_compiling_the_same_program_leave_one_whole_entry(tmp_path):
  env = _env(tmp_path)
  go = tmp_path / 'go'
  procs = [subprocess.Popen([sys.executable, '-c', CHILD, str(go)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(2)]
  go.write_text('')
  results = []
  for p in procs:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    results.append(json.loads(out.strip().splitlines()[-1]))
  folder = results[0]['dir']
  assert all(r['atomic'] for r in results)
  assert results[0]['value'] == results[1]['value']
  entries = _entries(folder)
  assert entries and not [p for p in os.listdir(folder) if p.endswith('.tmp')]
  # A third process reads the entry whole: a hit, no warning about a corrupt entry.
  third, stderr = _child(env)
  assert third['hits'] >= 1 and third['misses'] == 0, stderr[-2000:]
  assert 'Error reading persistent compilation cache entry' not in stderr
  assert third['value'] == results[0]['value']


def test_a_write_cut_short_leaves_no_entry(tmp_path, monkeypatch):
  """JAX's own writer (``Path.write_bytes``) leaves a truncated entry behind when the process
  dies mid-write, which every later process then reads and never replaces; here a failed write
  leaves nothing, so the next process writes the entry."""
  cache = compile_cache.AtomicFileCache(str(tmp_path))

  def cut_short(src, dst):
    raise OSError('killed while writing')
  monkeypatch.setattr(os, 'replace', cut_short)
  with pytest.raises(OSError):
    cache.put('key1', b'x' * 1000)
  assert os.listdir(tmp_path) == []
  monkeypatch.undo()
  cache.put('key1', b'x' * 1000)
  assert cache.get('key1') == b'x' * 1000 and os.listdir(tmp_path) == ['key1-cache']
  cache.put('key1', b'y')  # A key already written keeps its entry (as JAX's cache).
  assert cache.get('key1') == b'x' * 1000
  assert cache.get('other') is None


def test_switch_values(monkeypatch):
  assert compile_cache.enabled({})
  for off in ('0', 'false', 'No', 'off '):
    assert not compile_cache.enabled({compile_cache.SWITCH: off})
  assert compile_cache.enabled({compile_cache.SWITCH: '1'})
  updated = []
  monkeypatch.setattr(compile_cache, '_update_jax', lambda *a: updated.append(a))
  environ = {compile_cache.SWITCH: '0'}
  assert compile_cache.configure(environ) is None and environ == {compile_cache.SWITCH: '0'}
  assert updated == []
