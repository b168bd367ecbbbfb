"""JAX's persistent compilation cache, on by default, safe under several processes.

A study trains its runs one after another, each in a fresh `trainer.train_and_evaluate`, and
without a persistent cache every run compiled its steps afresh (a point's seeds differ only in
their numbers, not in their programs): compilation was most of a short run's time
(docs/performance.md, "Where a study's time goes"). `configure` (from
`anp_jax.runtime.configure`, every entry point) turns JAX's persistent cache on:

* **Where**: ``JAX_COMPILATION_CACHE_DIR`` when set (yours, or the tests', which keep their own),
  else ``ANP_COMPILATION_CACHE_DIR``, else ``$XDG_CACHE_HOME/anp_jax/xla`` (``~/.cache/...``),
  in a folder per host CPU (`host_key`): XLA:CPU's executables are machine code for the CPU
  that compiled them, JAX's cache key does not name that CPU, and a home folder shared by a
  cluster's nodes of two CPU generations would otherwise hand one node's code to the other.
* **Off**: ``ANP_COMPILATION_CACHE=0`` (also inherited by subprocesses): anp_jax sets no cache
  (a ``JAX_COMPILATION_CACHE_DIR`` you set yourself still holds: JAX's own switch).
* **What**: programs that took at least `MIN_COMPILE_TIME_S` to compile (JAX's default is 1 s,
  which left out the evaluation and initialisation programs of the small CPU models).
* **Several processes**: JAX 0.10 writes an entry in place (``Path.write_bytes``), so another
  process may read half of it (JAX then warns and compiles again), and a process killed while
  writing leaves a truncated entry that every later process warns about and never replaces
  (JAX skips a key whose file exists). `use_atomic_writes` (called by the trainer before it
  compiles) gives JAX's cache an entry writer that writes a temporary file and renames it
  (``os.replace``, atomic on POSIX): a reader sees no entry or a whole one. Concurrent writers
  of one key write the same program; the last rename wins. In a multi-process job JAX writes
  from process 0 only and every process reads.

Environment variables set here (``JAX_COMPILATION_CACHE_DIR``, the minimum compile time) are
read by JAX when it is imported; if JAX is already imported, its config is updated too.
"""

import hashlib
import logging
import os
import platform
import sys
import tempfile
from typing import MutableMapping, Optional

SWITCH = 'ANP_COMPILATION_CACHE'  # '0' / 'false' / 'no' / 'off': no persistent cache.
DIR_ENV = 'ANP_COMPILATION_CACHE_DIR'  # The cache's parent folder (a folder per host CPU in it).
JAX_DIR_ENV = 'JAX_COMPILATION_CACHE_DIR'
MIN_COMPILE_TIME_S = 0.2
_MIN_TIME_ENV = 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'
_OFF = ('0', 'false', 'no', 'off')


def enabled(environ: MutableMapping[str, str] = os.environ) -> bool:
  """Whether the persistent cache is wanted (``ANP_COMPILATION_CACHE`` not 0)."""
  return environ.get(SWITCH, '1').strip().lower() not in _OFF


def host_key() -> str:
  """A short digest of this host's CPU (model, instruction-set flags, architecture): the cache
  folder's name, so that hosts of other CPUs sharing a home folder never share machine code."""
  text = platform.machine()
  try:
    with open('/proc/cpuinfo') as f:
      lines = f.read().splitlines()
    fields = {}
    for line in lines:
      key, _, value = line.partition(':')
      key = key.strip()
      if key in ('model name', 'flags', 'Features', 'CPU part', 'CPU implementer'):
        fields.setdefault(key, value.strip())
    text += '|' + '|'.join(f'{k}={v}' for k, v in sorted(fields.items()))
  except OSError:
    text += '|' + platform.processor()
  return f'{platform.machine()}-{hashlib.sha1(text.encode()).hexdigest()[:12]}'


def default_dir(environ: MutableMapping[str, str] = os.environ) -> str:
  """``$ANP_COMPILATION_CACHE_DIR`` or ``$XDG_CACHE_HOME/anp_jax/xla`` (``~/.cache/...``), with
  this host's CPU folder (`host_key`) inside."""
  parent = environ.get(DIR_ENV) or os.path.join(
      environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache'),
      'anp_jax', 'xla')
  return os.path.join(os.path.expanduser(parent), host_key())


def configure(environ: MutableMapping[str, str] = os.environ) -> Optional[str]:
  """Turns the persistent cache on (see the module docstring); returns its folder (None: off).
  A ``JAX_COMPILATION_CACHE_DIR`` already set wins (with JAX's own minimum compile time unless
  set too)."""
  if not enabled(environ):
    return environ.get(JAX_DIR_ENV) or None  # Yours, if you set one; anp_jax sets none.
  path = environ.get(JAX_DIR_ENV)
  if not path:
    path = default_dir(environ)
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as e:  # An unwritable home: no cache, with a warning (never a failure).
      logging.warning('No persistent compilation cache: cannot create %s (%s).', path, e)
      return None
    environ[JAX_DIR_ENV] = path
    environ.setdefault(_MIN_TIME_ENV, str(MIN_COMPILE_TIME_S))
    _update_jax('jax_persistent_cache_min_compile_time_secs', float(environ[_MIN_TIME_ENV]))
  _update_jax('jax_compilation_cache_dir', path)
  return path


def _update_jax(name: str, value) -> None:
  """Sets JAX's config `name` if JAX is already imported (else it reads the environment)."""
  if 'jax' in sys.modules:
    sys.modules['jax'].config.update(name, value)


class AtomicFileCache:
  """JAX's file cache (the ``CacheInterface`` of ``jax._src.compilation_cache``: get, put) with
  whole-entry writes: a temporary file in the same folder, then ``os.replace``. Same file names
  as JAX's own (``<key>-cache``), so either reads the other's entries; no size cap (JAX's
  default)."""

  SUFFIX = '-cache'

  def __init__(self, path: str):
    self.path = self._path = path
    os.makedirs(path, exist_ok=True)

  def _file(self, key: str) -> str:
    if not key:
      raise ValueError('key cannot be empty')
    return os.path.join(self.path, key + self.SUFFIX)

  def get(self, key: str) -> Optional[bytes]:
    try:
      with open(self._file(key), 'rb') as f:
        return f.read()
    except FileNotFoundError:
      return None

  def put(self, key: str, value: bytes) -> None:
    path = self._file(key)
    if os.path.exists(path):
      return
    fd, tmp = tempfile.mkstemp(prefix=f'.{key[:40]}-', suffix='.tmp', dir=self.path)
    try:
      with os.fdopen(fd, 'wb') as f:
        f.write(value)
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)

  def clear(self) -> None:
    raise NotImplementedError('AtomicFileCache.clear: delete the folder instead.')


def use_atomic_writes() -> bool:
  """Gives JAX's persistent cache `AtomicFileCache`'s writer (see the module docstring); a no-op
  when the cache is off, already atomic, capped (JAX's LRU cache locks its files) or when this
  JAX has no such internals (then JAX's own cache stays). Returns whether the writer is ours."""
  import jax
  try:
    from jax._src import compilation_cache as cc
    from jax._src import lru_cache
  except ImportError:  # pragma: no cover - another JAX.
    return False
  path = jax.config.jax_compilation_cache_dir
  if not path or not jax.config.jax_enable_compilation_cache or '://' in str(path):
    return False
  if jax.config.jax_compilation_cache_max_size != -1:
    return False
  with cc._cache_initialized_mutex:  # pylint: disable=protected-access
    current = getattr(cc, '_cache', None)
    if isinstance(current, AtomicFileCache) and current.path == str(path):
      return True
    if current is not None and type(current) is not lru_cache.LRUCache:
      return False  # JAX's verification cache, or one the user installed: theirs.
    cc._cache = AtomicFileCache(str(path))  # pylint: disable=protected-access
    cc._cache_initialized = True  # pylint: disable=protected-access
  return True
