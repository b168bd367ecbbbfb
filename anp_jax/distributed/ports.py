"""The coordinator's port: process 0 refuses one that is taken (`check_coordinator_port`), the
other processes wait for the coordinator for a bounded time (`_wait_for_coordinator`), and a
script that starts a job on this host holds a free port for it (`reserve_port`)."""

import errno
import os
import socket
import time
from typing import Optional

from anp_jax.errors import ConfigError


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
