"""Joining the job: `preflight` (the checks that need neither JAX nor the other processes),
`initialize` (`jax.distributed.initialize` with the job's topology, time-outs, port checks and
core pinning) and `identity_line` (who this process is, once it has joined)."""

import logging
import os
import socket
from typing import Optional

from anp_jax.distributed import cores
from anp_jax.distributed.cores import share_host_cores
from anp_jax.distributed.env import TIMEOUT_DEFAULTS, _seconds_env
from anp_jax.distributed.ports import (SLURM_PORT_REMEDY, _slurm_coordinator_address,
                                       _wait_for_coordinator, check_coordinator_port)
from anp_jax.distributed.topology import Topology, detect_topology

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


def identity_line() -> str:
  """One line per process: who am I, where, with which devices."""
  import jax
  local = jax.local_devices()
  pinned = f', pinned to cores {cores._cores}' if cores._cores is not None else ''  # noqa: SLF001
  return (f'process {jax.process_index()}/{jax.process_count()} on {socket.gethostname()} '
          f'(pid {os.getpid()}{pinned}): {len(local)} local / {jax.device_count()} global '
          f'{local[0].platform} devices {[d.id for d in local]}')
