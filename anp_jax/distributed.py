"""Multi-process set-up: `jax.distributed.initialize()` before any other JAX call.

Three ways a job gets its process topology, tried in this order:

1. **Explicit**: ``ANP_COORDINATOR_ADDRESS`` (host:port of process 0), ``ANP_NUM_PROCESSES`` and
   ``ANP_PROCESS_ID`` (or the equivalent `main.py` flags), for clusters without SLURM and for
   tests on 127.0.0.1. ``ANP_LOCAL_DEVICE_IDS`` (e.g. ``0,1,2,3``) optionally pins devices.
2. **SLURM**: detected from ``SLURM_*`` variables of an ``srun`` step with more than one task.
   With one task per node we pass *all* the node's GPUs as local devices (JAX's own SLURM
   detection would give each process one device, ``SLURM_LOCALID``).
3. **Single process**: nothing is set up at all.

Processes of the job that share a host with the same CPU affinity split its cores
(`share_host_cores`; ``ANP_PIN_CORES=0`` turns it off). On CPU the collectives go through gloo.
Missing heartbeats make the survivors of a crashed
process exit (``ANP_HEARTBEAT_TIMEOUT``, default 30 s) instead of hanging; an unreachable
coordinator fails after ``ANP_INIT_TIMEOUT`` seconds (default 120). Process 0 refuses a
coordinator port that is already taken (`check_coordinator_port`), and the trainer checks that
every process got the same config, workdir and dataset (`check_same_everywhere`): processes of
two jobs that share a port would otherwise form one job.
"""

import dataclasses
import errno
import json
import logging
import os
import re
import socket
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from anp_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Topology:
  mode: str  # 'single', 'explicit' or 'slurm'
  coordinator_address: Optional[str] = None
  num_processes: int = 1
  process_id: int = 0
  local_device_ids: Optional[List[int]] = None


def _int_env(name: str) -> Optional[int]:
  value = os.environ.get(name)
  if value in (None, ''):
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f'Environment variable {name}={value!r} must be an integer.') from None


# The time-outs a user may set (seconds) and their defaults.
TIMEOUT_DEFAULTS = {'ANP_INIT_TIMEOUT': 120, 'ANP_HEARTBEAT_TIMEOUT': 30,
                    'ANP_SHUTDOWN_TIMEOUT': 60, 'ANP_BARRIER_TIMEOUT': 3600}


def _seconds_env(name: str) -> int:
  """A time-out from the environment (`TIMEOUT_DEFAULTS` when unset); 0 or a negative number is
  an error, not the default (0 silently meant the default, a negative one went to JAX)."""
  value = _int_env(name)
  if value is None:
    return TIMEOUT_DEFAULTS[name]
  if value <= 0:
    raise ValueError(f'Environment variable {name}={value} must be a positive number of seconds '
                     f'(unset: {TIMEOUT_DEFAULTS[name]}).')
  return value


def _expand_counts(value: str) -> Optional[List[int]]:
  """SLURM's compressed per-node list, '2(x3),1' -> [2, 2, 2, 1] (None if malformed)."""
  out = []
  for part in value.split(','):
    match = re.fullmatch(r'\s*(\d+)(?:\(x(\d+)\))?\s*', part)
    if not match:
      return None
    out += [int(match.group(1))] * int(match.group(2) or 1)
  return out


def _slurm_tasks_per_node() -> Optional[int]:
  """Tasks of this step on this node: this node's entry (SLURM_NODEID) of the step's
  SLURM_STEP_TASKS_PER_NODE (else the job's SLURM_TASKS_PER_NODE), else SLURM_NTASKS_PER_NODE
  (the job's request, which a step may not follow). An uneven step ('1,3') differs per node."""
  node = _int_env('SLURM_NODEID') or 0
  for var in ('SLURM_STEP_TASKS_PER_NODE', 'SLURM_TASKS_PER_NODE'):
    counts = _expand_counts(os.environ.get(var) or '')
    if counts and node < len(counts):
      return counts[node]
  return _int_env('SLURM_NTASKS_PER_NODE')


# Where the NVIDIA driver lists the node's GPUs (one folder each), for nodes whose SLURM set-up
# exports no GPU variables (no GRES): without ids, JAX's SLURM detection would give the one task
# of a node only GPU SLURM_LOCALID = 0.
NVIDIA_GPUS_DIR = '/proc/driver/nvidia/gpus'


def _node_gpu_ids() -> Optional[List[int]]:
  """GPUs that this node gives the task: CUDA_VISIBLE_DEVICES, SLURM's GPU count, else every GPU
  the NVIDIA driver lists (None on a machine without one)."""
  visible = os.environ.get('CUDA_VISIBLE_DEVICES')
  if visible not in (None, ''):
    return list(range(len([v for v in visible.split(',') if v.strip()])))
  count = _int_env('SLURM_GPUS_ON_NODE')
  if count:
    return list(range(count))
  try:
    count = len(os.listdir(NVIDIA_GPUS_DIR))
  except OSError:
    return None
  return list(range(count)) if count else None


def _check_address(address: str) -> None:
  """Raises unless `address` is host:port with a non-empty host and a port in 1..65535."""
  host, _, port = address.rpartition(':')
  if not host.strip('[]') or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f'The coordinator address {address!r} must be host:port (e.g. '
                     '10.0.0.1:12345), with a port in 1..65535.')


def detect_topology(coordinator_address: Optional[str] = None,
                    num_processes: Optional[int] = None,
                    process_id: Optional[int] = None) -> Topology:
  """Works out the process topology without touching JAX (see the module docstring)."""
  coordinator_address = coordinator_address or os.environ.get('ANP_COORDINATOR_ADDRESS')
  num_processes = num_processes if num_processes is not None else _int_env('ANP_NUM_PROCESSES')
  process_id = process_id if process_id is not None else _int_env('ANP_PROCESS_ID')
  local_ids = os.environ.get('ANP_LOCAL_DEVICE_IDS')
  try:
    local_device_ids = [int(x) for x in local_ids.split(',')] if local_ids else None
  except ValueError:
    raise ValueError(f'ANP_LOCAL_DEVICE_IDS={local_ids!r} must be comma-separated device ids, '
                     'e.g. 0,1,2,3.') from None

  explicit = [coordinator_address, num_processes, process_id]
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise ValueError('Explicit multi-process mode needs all three of coordinator address, '
                       'number of processes and process id (ANP_COORDINATOR_ADDRESS, '
                       f'ANP_NUM_PROCESSES, ANP_PROCESS_ID); got {coordinator_address!r}, '
                       f'{num_processes!r}, {process_id!r}.')
    if num_processes < 1:
      raise ValueError(f'The number of processes must be >= 1, got {num_processes}.')
    if not 0 <= process_id < num_processes:
      raise ValueError(f'The process id {process_id} is not in [0, {num_processes}): '
                       'inconsistent process counts.')
    _check_address(coordinator_address)
    if num_processes == 1:
      return Topology('single', local_device_ids=local_device_ids)
    # Explicit addresses inside an srun step: JAX still detects SLURM for what is unset and
    # would pin the node's one task to GPU SLURM_LOCALID; it gets the node's GPUs instead.
    return Topology('explicit', coordinator_address, num_processes, process_id,
                    _one_task_node_gpus(local_device_ids))

  ntasks = _int_env('SLURM_NTASKS') or _int_env('SLURM_NPROCS')
  if os.environ.get('SLURM_STEP_ID') is not None and os.environ.get('SLURM_PROCID') is not None \
      and ntasks and ntasks > 1:
    procid = _int_env('SLURM_PROCID')
    if not 0 <= procid < ntasks:
      raise ValueError(f'SLURM_PROCID={procid} is not in [0, SLURM_NTASKS={ntasks}).')
    return Topology('slurm', None, ntasks, procid, _one_task_node_gpus(local_device_ids))
  return Topology('single', local_device_ids=local_device_ids)


def _one_task_node_gpus(local_device_ids: Optional[List[int]]) -> Optional[List[int]]:
  """`local_device_ids`, or, when none were given and this process is the only task of its node
  in an srun step, all of the node's GPUs (`_node_gpu_ids`)."""
  if (local_device_ids is None and os.environ.get('SLURM_STEP_ID') is not None
      and _slurm_tasks_per_node() == 1):
    return _node_gpu_ids()
  return local_device_ids


_initialized = False


def preflight(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
              process_id: Optional[int] = None) -> Topology:
  """The checks of `initialize` that need neither JAX nor the other processes (the topology,
  process 0's port), for entry points to run before their slow imports."""
  topo = detect_topology(coordinator_address, num_processes, process_id)
  for name in TIMEOUT_DEFAULTS:
    _seconds_env(name)  # A bad value now, not after the imports.
  if topo.mode == 'explicit' and topo.process_id == 0:
    check_coordinator_port(topo.coordinator_address)
  return topo


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None) -> Topology:
  """Initialises `jax.distributed` when the job has several processes. Call before any JAX use."""
  global _initialized
  topo = detect_topology(coordinator_address, num_processes, process_id)
  if topo.mode == 'single' or _initialized:
    return topo
  import jax  # Imported here so that detection stays free of JAX.
  try:
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  except Exception:  # pragma: no cover - older/newer JAX without this option.
    logging.warning('Could not select gloo CPU collectives.')
  kwargs = dict(
      initialization_timeout=_seconds_env('ANP_INIT_TIMEOUT'),
      heartbeat_timeout_seconds=_seconds_env('ANP_HEARTBEAT_TIMEOUT'),
      shutdown_timeout_seconds=_seconds_env('ANP_SHUTDOWN_TIMEOUT'))
  if topo.mode == 'explicit':
    kwargs.update(coordinator_address=topo.coordinator_address,
                  num_processes=topo.num_processes, process_id=topo.process_id)
  else:
    kwargs.update(cluster_detection_method='slurm')
  if topo.local_device_ids is not None:
    kwargs['local_device_ids'] = topo.local_device_ids
  if topo.mode == 'explicit' and topo.process_id == 0:
    check_coordinator_port(topo.coordinator_address)
  if topo.mode == 'slurm' and topo.process_id == 0:
    address = _slurm_coordinator_address()
    if address:  # Another job on this node whose id is the same modulo 4096 has it.
      check_coordinator_port(address, remedy=SLURM_PORT_REMEDY)
  if topo.mode == 'explicit' and topo.process_id != 0:
    # JAX's client aborts the whole process on a connection time-out; check first, so that the
    # user gets a message that says what is wrong.
    _wait_for_coordinator(topo.coordinator_address, kwargs['initialization_timeout'])
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:
    raise RuntimeError(
        f'jax.distributed.initialize failed for process {topo.process_id}/{topo.num_processes} '
        f'({topo.mode} mode, coordinator {topo.coordinator_address or "from SLURM"}): {e}. '
        'Check that the coordinator (process 0) is running and reachable, and that every '
        'process was given the same number of processes.') from e
  _initialized = True
  _restore_python_signal_handlers()
  share_host_cores(topo.process_id, topo.num_processes)
  return topo


def _restore_python_signal_handlers() -> None:
  """jax.distributed's client installs its own SIGTERM handler (C++, for its preemption
  notifier), which replaces the one `anp_jax.preemption` installed before it, at the start of
  the entry points: re-registering the Python handlers puts them back."""
  import signal
  for sig in (signal.SIGTERM, signal.SIGUSR1):
    handler = signal.getsignal(sig)
    if callable(handler):
      signal.signal(sig, handler)


# ----------------------------------------------------------------------------------------------
# Processes of one job on one host: each its own share of the cores.

PIN_OPT_OUT = 'ANP_PIN_CORES'  # '0': leave the CPU affinity as the launcher set it.
_cores: Optional[List[int]] = None  # The cores this process was given (None: not changed).


def core_share(my_id: int, hosts: Dict[int, Tuple[str, Tuple[int, ...]]]) -> Optional[List[int]]:
  """The cores process `my_id` keeps, given every process's (host name, CPU affinity).

  The processes on `my_id`'s host that were started with the *same* affinity (nobody split the
  cores: a launch by hand, or SLURM without CPU binding) share them out in contiguous, nearly
  equal parts, in process-id order. None (change nothing) when `my_id` is alone with its
  affinity on its host, when a launcher already gave the processes different cores
  (``--cpus-per-task`` with task affinity, ``taskset``), or when there are fewer cores than
  processes (then no split is better than another).
  """
  host, mask = hosts[my_id]
  peers = sorted(i for i, (h, m) in hosts.items() if h == host and tuple(m) == tuple(mask))
  cores = sorted(mask)
  if len(peers) < 2 or len(cores) < len(peers):
    return None
  rank, n = peers.index(my_id), len(peers)
  return cores[rank * len(cores) // n:(rank + 1) * len(cores) // n]


def coordination_client():
  """jax.distributed's coordination-service client (key-value store, barriers); None without
  `jax.distributed.initialize`."""
  from jax._src import distributed as jax_distributed
  return jax_distributed.global_state.client


def pinning_wanted() -> bool:
  """Whether this process was started to pin its cores (``ANP_PIN_CORES`` unset or not off)."""
  return os.environ.get(PIN_OPT_OUT, '1').strip().lower() not in ('0', 'false', 'no', 'off')


def share_host_cores(process_id: int, num_processes: int) -> Optional[List[int]]:
  """After `jax.distributed.initialize`, before JAX starts its backend: pins this process (all
  its threads, and every thread created later: XLA's and TensorFlow's pools are then sized to
  its share, see `core_share`) to its part of the host's cores. Several processes of a job on
  one host otherwise each run thread pools as large as the whole host: two processes x 1 device
  on 2 cores trained 16 % slower than pinned (`experiments/results/mp_profile/`).
  ``ANP_PIN_CORES=0`` turns it off; every process must then have it (checked first: a process
  that pins would otherwise wait for the core census of one that does not, until
  ``ANP_INIT_TIMEOUT``)."""
  global _cores
  process = (process_id, num_processes)
  pin = pinning_wanted()
  check_same_everywhere(
      'core pinning', {PIN_OPT_OUT: 'on' if pin else 'off'}, process=process,
      timeout_env='ANP_INIT_TIMEOUT',
      hint=f'Set {PIN_OPT_OUT} the same way for every process of the job (unset or 1: each '
      f'process pins its share of its host\'s cores; 0: none does).')
  if not pin or not hasattr(os, 'sched_getaffinity'):  # (Not Linux: no affinity to split.)
    return None
  mask = tuple(sorted(os.sched_getaffinity(0)))
  census = exchange('host_cores', f'{socket.gethostname()}|{",".join(map(str, mask))}',
                    'host names and CPU affinities', process, timeout_env='ANP_INIT_TIMEOUT')
  hosts = {}
  for pid, value in census.items():
    host, cores = value.split('|')
    hosts[pid] = (host, tuple(int(c) for c in cores.split(',') if c))
  mine = core_share(process_id, hosts)
  if mine is None:
    return None
  for tid in os.listdir('/proc/self/task'):  # Threads that exist already (TensorFlow's).
    try:
      os.sched_setaffinity(int(tid), mine)
    except OSError:  # A thread that just ended.
      pass
  _cores = mine
  logging.info('Process %d shares host %s: pinned to cores %s of %s.', process_id,
               socket.gethostname(), mine, list(mask))
  return mine


def _wait_for_coordinator(address: str, timeout_s: float):
  host, port = address.rsplit(':', 1)
  deadline = time.time() + timeout_s
  last_error = None
  while time.time() < deadline:
    try:
      with socket.create_connection((host.strip('[]'), int(port)), timeout=5):
        return
    except OSError as e:
      last_error = e
      time.sleep(1)
  raise RuntimeError(f'The coordinator {address} (process 0) was not reachable within '
                     f'{timeout_s:.0f} s ({last_error}). Start process 0, or check the address, '
                     'port and firewall.')


EXPLICIT_PORT_REMEDY = 'pick a free port for ANP_COORDINATOR_ADDRESS / --coordinator_address'
SLURM_PORT_REMEDY = ('export JAX_COORDINATOR_PORT=<a free port> in the job script (the same for '
                     'every task; JAX derives the port from the job id otherwise)')


def _slurm_coordinator_address() -> Optional[str]:
  """The address JAX's SLURM detection gives the coordinator (its first node, a port from the
  job id or ``JAX_COORDINATOR_PORT``); None where this JAX cannot say."""
  try:
    from jax._src.clusters import slurm_cluster
    return slurm_cluster.SlurmCluster.get_coordinator_address(
        None, os.environ.get('JAX_COORDINATOR_PORT'))
  except Exception:  # pylint: disable=broad-except  (a private API; the check is a bonus)
    return None


def check_coordinator_port(address: str, remedy: str = EXPLICIT_PORT_REMEDY) -> None:
  """Process 0, before it starts the coordinator: raises ConfigError unless the port is free here.

  JAX's coordinator is a gRPC server bound to ``[::]:port`` with SO_REUSEPORT. On a port held
  by another program it crashes (a segmentation fault after gRPC's "Failed to add port to
  server"). On a port where another job's coordinator listens it binds *beside* it: the kernel
  then spreads the connections of both jobs over both coordinators, and processes of two jobs
  form one job that trains wrong or hangs. Closed or TIME_WAIT connections of an earlier job on
  the port are fine (the same rules as gRPC's own bind)."""
  host, _, port_text = address.rpartition(':')
  host, port = host.strip('[]'), int(port_text)
  try:
    with socket.create_connection((host, port), timeout=2):
      pass
  except OSError:
    pass
  else:
    raise ConfigError(
        f'Something already accepts connections at the coordinator address {address} '
        '(process 0 must start the coordinator there): most likely the coordinator of another '
        f'job on this host. Each job needs its own port: {remedy}.')
  for family, wildcard in ((socket.AF_INET6, '::'), (socket.AF_INET, '0.0.0.0')):
    try:
      probe = socket.socket(family, socket.SOCK_STREAM)
    except OSError:  # No IPv6 on this host: gRPC binds 0.0.0.0.
      continue
    with probe:
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      if hasattr(socket, 'SO_REUSEPORT'):
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
      try:
        probe.bind((wildcard, port))
      except OSError as e:
        if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
          continue
        raise ConfigError(
            f'The coordinator port {port} ({address}) cannot be bound on this host: '
            f'{e.strerror}. Another program holds it: {remedy}.') from None
    return


def reserve_port(host: str = '127.0.0.1') -> socket.socket:
  """A free port for the coordinator of a job that a script starts on this host, held until
  the caller closes the returned socket (after the job has started, or ended).

  The socket is bound with SO_REUSEPORT and does not listen, so the job's coordinator binds the
  port beside it (`check_coordinator_port` accepts it) while no other bind to port 0 on this
  host, another launcher's included, is handed the same port. Closing the socket at once and
  passing on the number (the usual free-port recipe) leaves seconds in which another job's
  coordinator can be given the same port and the two jobs merge."""
  sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  if hasattr(socket, 'SO_REUSEPORT'):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
  sock.bind((host, 0))
  return sock


def identity_line() -> str:
  """One line per process: who am I, where, with which devices."""
  import jax
  local = jax.local_devices()
  pinned = f', pinned to cores {_cores}' if _cores is not None else ''
  return (f'process {jax.process_index()}/{jax.process_count()} on {socket.gethostname()} '
          f'(pid {os.getpid()}{pinned}): {len(local)} local / {jax.device_count()} global '
          f'{local[0].platform} devices {[d.id for d in local]}')


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
  `package_root`, default this package): a node with another checkout or venv shows up here."""
  import hashlib
  import platform
  from importlib import metadata
  out = {'python': platform.python_version()}
  for name in SOFTWARE:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      continue
  root = package_root or os.path.dirname(os.path.abspath(__file__))
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
