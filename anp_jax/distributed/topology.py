"""The process topology of a job, worked out without touching JAX: explicit (``ANP_*``
variables or flags), SLURM (an ``srun`` step with several tasks; one task per node gets all of
the node's GPUs), or a single process (see the package docstring)."""

import dataclasses
import os
import re
from typing import List, Optional

from anp_jax.distributed.env import _int_env


@dataclasses.dataclass(frozen=True)
class Topology:
  mode: str  # 'single', 'explicit' or 'slurm'
  coordinator_address: Optional[str] = None
  num_processes: int = 1
  process_id: int = 0
  local_device_ids: Optional[List[int]] = None


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
