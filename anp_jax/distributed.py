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
coordinator fails after ``ANP_INIT_TIMEOUT`` seconds (default 120).
"""

import dataclasses
import logging
import os
import re
import socket
import time
from typing import Dict, List, Optional, Tuple


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


def _slurm_tasks_per_node() -> Optional[int]:
  """Tasks on this node: SLURM_NTASKS_PER_NODE, else the first entry of SLURM_*TASKS_PER_NODE."""
  direct = _int_env('SLURM_NTASKS_PER_NODE')
  if direct:
    return direct
  for var in ('SLURM_STEP_TASKS_PER_NODE', 'SLURM_TASKS_PER_NODE'):
    value = os.environ.get(var)
    if value:
      match = re.match(r'(\d+)', value)
      if match:
        return int(match.group(1))
  return None


def _node_gpu_ids() -> Optional[List[int]]:
  """GPUs that this node gives the task, from CUDA_VISIBLE_DEVICES or SLURM's GPU variables."""
  visible = os.environ.get('CUDA_VISIBLE_DEVICES')
  if visible not in (None, ''):
    return list(range(len([v for v in visible.split(',') if v.strip()])))
  count = _int_env('SLURM_GPUS_ON_NODE')
  if count:
    return list(range(count))
  return None


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
  local_device_ids = [int(x) for x in local_ids.split(',')] if local_ids else None

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
    return Topology('explicit', coordinator_address, num_processes, process_id, local_device_ids)

  ntasks = _int_env('SLURM_NTASKS') or _int_env('SLURM_NPROCS')
  if os.environ.get('SLURM_STEP_ID') is not None and os.environ.get('SLURM_PROCID') is not None \
      and ntasks and ntasks > 1:
    procid = _int_env('SLURM_PROCID')
    if not 0 <= procid < ntasks:
      raise ValueError(f'SLURM_PROCID={procid} is not in [0, SLURM_NTASKS={ntasks}).')
    if local_device_ids is None and _slurm_tasks_per_node() == 1:
      local_device_ids = _node_gpu_ids()
    return Topology('slurm', None, ntasks, procid, local_device_ids)
  return Topology('single', local_device_ids=local_device_ids)


_initialized = False


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
      initialization_timeout=_int_env('ANP_INIT_TIMEOUT') or 120,
      heartbeat_timeout_seconds=_int_env('ANP_HEARTBEAT_TIMEOUT') or 30,
      shutdown_timeout_seconds=_int_env('ANP_SHUTDOWN_TIMEOUT') or 60)
  if topo.mode == 'explicit':
    kwargs.update(coordinator_address=topo.coordinator_address,
                  num_processes=topo.num_processes, process_id=topo.process_id)
  else:
    kwargs.update(cluster_detection_method='slurm')
  if topo.local_device_ids is not None:
    kwargs['local_device_ids'] = topo.local_device_ids
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
  share_host_cores(topo.process_id, topo.num_processes)
  return topo


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


def share_host_cores(process_id: int, num_processes: int) -> Optional[List[int]]:
  """After `jax.distributed.initialize`, before JAX starts its backend: pins this process (all
  its threads, and every thread created later: XLA's and TensorFlow's pools are then sized to
  its share, see `core_share`) to its part of the host's cores. Several processes of a job on
  one host otherwise each run thread pools as large as the whole host: two processes x 1 device
  on 2 cores trained 16 % slower than pinned (`experiments/results/mp_profile/`).
  ``ANP_PIN_CORES=0`` turns it off."""
  global _cores
  if os.environ.get(PIN_OPT_OUT, '1').strip().lower() in ('0', 'false', 'no', 'off'):
    return None
  if not hasattr(os, 'sched_getaffinity'):  # pragma: no cover - not Linux.
    return None
  from jax._src import distributed as jax_distributed
  client = jax_distributed.global_state.client
  mask = tuple(sorted(os.sched_getaffinity(0)))
  prefix = 'anp_jax/host_cores/'
  client.key_value_set(f'{prefix}{process_id}',
                       f'{socket.gethostname()}|{",".join(map(str, mask))}')
  timeout_ms = 1000 * (_int_env('ANP_INIT_TIMEOUT') or 120)
  client.wait_at_barrier('anp_jax_host_cores', timeout_ms)
  hosts = {}
  for key, value in client.key_value_dir_get(prefix):
    host, cores = value.split('|')
    hosts[int(key.rsplit('/', 1)[1])] = (host, tuple(int(c) for c in cores.split(',') if c))
  if len(hosts) != num_processes:
    raise RuntimeError(f'Expected {num_processes} processes in the core census, got '
                       f'{sorted(hosts)}.')
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


def identity_line() -> str:
  """One line per process: who am I, where, with which devices."""
  import jax
  local = jax.local_devices()
  pinned = f', pinned to cores {_cores}' if _cores is not None else ''
  return (f'process {jax.process_index()}/{jax.process_count()} on {socket.gethostname()} '
          f'(pid {os.getpid()}{pinned}): {len(local)} local / {jax.device_count()} global '
          f'{local[0].platform} devices {[d.id for d in local]}')


_barrier_uses: Dict[str, int] = {}


def barrier_timeout_s() -> int:
  """How long a process waits for the others' long work: ``ANP_BARRIER_TIMEOUT`` (default 3600 s).
  Bounds the coordination barriers and the dataset-preparation lock."""
  return _int_env('ANP_BARRIER_TIMEOUT') or 3600


def barrier(name: str):
  """Waits until every process gets here (no-op for one process).

  A barrier of jax.distributed's coordination service, not a device collective: the first
  collective of a job also sets up gloo's context, which gives up after 30 s (not configurable
  in jaxlib), and a barrier is typically where one process waits for another's long work
  (process 0 generating the dataset, writing reports). The coordination barrier waits up to
  ``ANP_BARRIER_TIMEOUT`` seconds (default 3600); a process that died is still detected within
  the heartbeat time-out. Every process must pass the same names in the same order.
  """
  import jax
  if jax.process_count() == 1:
    return
  from jax._src import distributed as jax_distributed
  client = jax_distributed.global_state.client
  if client is None:  # Processes set up without jax.distributed's client: a device collective.
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)
    return
  use = _barrier_uses.get(name, 0)  # A name used again (a sweep's runs) is a new barrier.
  _barrier_uses[name] = use + 1
  timeout_ms = 1000 * barrier_timeout_s()
  client.wait_at_barrier(f'anp_jax/{name}/{use}', timeout_ms)
