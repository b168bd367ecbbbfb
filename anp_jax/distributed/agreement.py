"""Every process of a job runs the same software, config and flags (`check_same_everywhere`):
processes that differ hang or train wrong, and processes of two jobs merged through a shared
coordinator port show up here, before anything is written."""

import json
import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from anp_jax.distributed.coordination import _process, coordination_client, exchange
from anp_jax.errors import ConfigError


def differences(by_process: Mapping[int, Mapping[str, Any]], limit: int = 10) -> List[str]:
  """What the processes' `values` disagree on, against the lowest process id's: one line each."""
  first = min(by_process)
  ref = by_process[first]
  lines = []
  for pid in sorted(by_process):
    other = by_process[pid]
    for key in sorted(set(ref) | set(other)):
      if ref.get(key, '<unset>') != other.get(key, '<unset>'):
        lines.append(f'{key}: process {first} has {ref.get(key, "<unset>")!r}, process {pid} '
                     f'has {other.get(key, "<unset>")!r}')
  if len(lines) > limit:
    lines = lines[:limit] + [f'... and {len(lines) - limit} more']
  return lines


# The distributions whose versions every process of a job must share (collectives, checkpoint
# formats, input pipeline, numerics).
SOFTWARE = ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'numpy', 'tensorflow-cpu',
            'tensorflow', 'tensorflow-datasets')
SAME_SOFTWARE_HINT = ('Every process must run the same code and packages: one anp_jax checkout '
                      '(on a shared filesystem) and a venv built from its requirements.txt '
                      '(./run.sh) on every node.')


def software_identity(package_root: Optional[str] = None) -> Dict[str, str]:
  """Python's and `SOFTWARE`'s versions, and a digest of anp_jax's own sources (``*.py`` under
  `package_root`, default the whole anp_jax package): a node with another checkout or venv shows
  up here."""
  import hashlib
  import platform
  from importlib import metadata
  out = {'python': platform.python_version()}
  for name in SOFTWARE:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      continue
  # anp_jax/, the folder above this package.
  root = package_root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  digest = hashlib.sha1()
  for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d != '__pycache__')
    for name in sorted(f for f in files if f.endswith('.py')):
      path = os.path.join(folder, name)
      digest.update(os.path.relpath(path, root).encode() + b'\0')
      with open(path, 'rb') as f:
        digest.update(f.read() + b'\0')
  out['anp_jax_sources_sha1'] = digest.hexdigest()[:16]
  return out


SAME_FLAGS_HINT = ('Every process must be started with the same flags. Different workdirs can '
                   'also mean that two jobs were given the same coordinator address and their '
                   'processes merged.')


def check_same_everywhere(what: str, values: Union[Mapping[str, Any],
                                                   Callable[[], Mapping[str, Any]]],
                          hint: str = SAME_FLAGS_HINT, process: Optional[Tuple[int, int]] = None,
                          timeout_env: str = 'ANP_BARRIER_TIMEOUT') -> None:
  """Raises ConfigError on every process unless all processes passed equal `values` (flat,
  JSON-able; compared as JSON; a function returning them is only called with several
  processes). A no-op for one process. `process` and `timeout_env`: see `exchange`.

  Processes that run different configs hang or train wrong: they disagree on which steps fetch
  metrics or save, on batch shapes, on the checkpoint to resume. A node launched with other
  flags, and processes of two jobs merged through a shared coordinator port, both show up here,
  before anything is written. Every process must call it with the same `what`, in the same order."""
  _, count = _process(process)
  if count == 1:
    return
  if coordination_client() is None:  # pragma: no cover - processes without jax.distributed.
    logging.warning('Not checking that the processes run the same %s: no coordination client.',
                    what)
    return
  if callable(values):
    values = values()
  mine = json.dumps(dict(values), sort_keys=True, default=repr)
  by_process = exchange('same/' + what, mine, what, process, timeout_env)
  lines = differences({pid: json.loads(value) for pid, value in by_process.items()})
  if lines:
    raise ConfigError(
        f'The processes of this job run different {what}:\n  ' + '\n  '.join(lines) +
        f'\n{hint}')
