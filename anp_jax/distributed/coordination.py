"""The coordination service of `jax.distributed` (its key-value store and barriers), not device
collectives: named barriers bounded by ``ANP_BARRIER_TIMEOUT`` (`barrier`), work done by process
0 only with its failure raised on every process (`on_process_0`), and every process's value of a
string (`exchange`)."""

import re
from typing import Any, Callable, Dict, Optional, Tuple

from anp_jax.distributed.env import _seconds_env


def coordination_client():
  """jax.distributed's coordination-service client (key-value store, barriers); None without
  `jax.distributed.initialize`."""
  from jax._src import distributed as jax_distributed
  return jax_distributed.global_state.client


_barrier_uses: Dict[str, int] = {}


def _next_barrier_id(name: str) -> str:
  """'anp_jax/<name>/<use>': a name used again (a sweep's runs) is a new barrier."""
  use = _barrier_uses.get(name, 0)
  _barrier_uses[name] = use + 1
  return f'anp_jax/{name}/{use}'


# A failure of process 0's work keeps its kind on the other processes, so that every process
# exits with the same code (the entry points map ValueError and OSError to 2).
_FAILURE_KINDS = {'ValueError': ValueError, 'OSError': OSError}


def on_process_0(name: str, work: Callable[[], Any], what: str) -> None:
  """Runs `work()` on process 0 only, then every process waits at barrier `name` (the shared-
  files discipline). If `work` fails on process 0, process 0 still reaches the barrier, leaving
  its error in the coordination service's key-value store, and then raises it; every other
  process raises it too (``Process 0 failed to <what>: ...``, same kind), so the job exits at
  once with the cause in every log, instead of the others waiting at the barrier until the job
  is aborted. One process: just `work()`."""
  import jax
  if jax.process_count() == 1:
    work()
    return
  key = _next_barrier_id(f'failed/{name}') + '/'  # The same on every process (same order).
  client = coordination_client()
  failure = None
  if jax.process_index() == 0:
    try:
      work()
    except Exception as e:  # pylint: disable=broad-except  # Re-raised after the barrier.
      failure = e
      if client is not None:
        kind = next((k for k, cls in _FAILURE_KINDS.items() if isinstance(e, cls)),
                    'RuntimeError')
        client.key_value_set(f'{key}0', f'{kind}\n{type(e).__name__}: {e}')
  barrier(name)
  if failure is not None:
    raise failure
  for _, value in (client.key_value_dir_get(key) if client is not None else []):
    kind, message = value.split('\n', 1)
    raise _FAILURE_KINDS.get(kind, RuntimeError)(
        f"Process 0 failed to {what}: {message} (see process 0's log).")


def barrier_timeout_s() -> int:
  """How long a process waits for the others' long work: ``ANP_BARRIER_TIMEOUT`` (default 3600 s).
  Bounds the coordination barriers and the dataset-preparation lock."""
  return _seconds_env('ANP_BARRIER_TIMEOUT')


def _process(process: Optional[Tuple[int, int]]) -> Tuple[int, int]:
  """(this process's index, the number of processes): `process`, else JAX's (which starts
  JAX's backend: the start-up code that must not, `share_host_cores`, passes them)."""
  if process is not None:
    return process
  import jax
  return jax.process_index(), jax.process_count()


def wait_at_barrier(client, barrier_id: str, what: str,
                    timeout_env: str = 'ANP_BARRIER_TIMEOUT') -> None:
  """Waits at the coordination service's barrier `barrier_id` for at most the seconds of
  `timeout_env` (`TIMEOUT_DEFAULTS`). Its failure (the time-out, or a process that ended or
  failed meanwhile) is raised as a RuntimeError that says what the processes were waiting for,
  how long, and which setting bounds it, with JAX's own message (which names the missing
  processes)."""
  timeout_s = _seconds_env(timeout_env)
  try:
    client.wait_at_barrier(barrier_id, 1000 * timeout_s)
  except Exception as e:  # pylint: disable=broad-except  (jaxlib's error types vary)
    raise RuntimeError(
        f'Waiting for the other processes of the job {what} (barrier {barrier_id}, at most '
        f'{timeout_s} s, {timeout_env}) failed: {" ".join(str(e).split())[:1000]}. If a process '
        'ended or failed, its log says why; if one is only slow, raise ' + timeout_env + '.'
    ) from e


def barrier(name: str):
  """Waits until every process gets here (no-op for one process).

  A barrier of jax.distributed's coordination service, not a device collective: the first
  collective of a job also sets up gloo's context, which gives up after 30 s (not configurable
  in jaxlib), and a barrier is typically where one process waits for another's long work
  (process 0 generating the dataset, writing reports). The coordination barrier waits up to
  ``ANP_BARRIER_TIMEOUT`` seconds (default 3600), then fails saying which barrier; a process
  that died is still detected within the heartbeat time-out. Every process must pass the same
  names in the same order.
  """
  import jax
  if jax.process_count() == 1:
    return
  client = coordination_client()
  if client is None:  # Processes set up without jax.distributed's client: a device collective.
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)
    return
  wait_at_barrier(client, _next_barrier_id(name), f'at {name!r}')


def exchange(name: str, mine: str, what: str, process: Optional[Tuple[int, int]] = None,
             timeout_env: str = 'ANP_BARRIER_TIMEOUT') -> Dict[int, str]:
  """Every process's `mine` (`what` it is, for the messages), by process id (needs
  jax.distributed's client and several processes). Each process leaves its value in the
  coordination service's key-value store under the id of a new barrier `name`, waits at that
  barrier (bounded by `timeout_env`), then reads all of them: no device collective. Every
  process must call it with the same `name`, in the same order; `process`: see `_process`."""
  index, count = _process(process)
  client = coordination_client()
  barrier_id = _next_barrier_id(re.sub(r'[^A-Za-z0-9_/]+', '_', name))
  prefix = f'{barrier_id}/'  # Each process's value, under the barrier's own id.
  client.key_value_set(f'{prefix}{index}', mine)
  wait_at_barrier(client, barrier_id, f'to exchange their {what}', timeout_env)
  by_process = {int(key.rsplit('/', 1)[1]): value
                for key, value in client.key_value_dir_get(prefix)}
  if len(by_process) != count:
    raise RuntimeError(f'Expected {count} processes to report their {what}, got '
                       f'{sorted(by_process)}.')
  return by_process
