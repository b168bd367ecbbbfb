"""Processes of one job on one host: each its own share of the host's cores (`share_host_cores`,
after `jax.distributed.initialize`; ``ANP_PIN_CORES=0`` turns it off)."""

import logging
import os
import socket
from typing import Dict, List, Optional, Tuple

from anp_jax.distributed.agreement import check_same_everywhere
from anp_jax.distributed.coordination import exchange

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
