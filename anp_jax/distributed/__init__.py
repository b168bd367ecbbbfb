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

Modules, one concern each (the names below are re-exported here, so callers write
``distributed.barrier(...)``):

* `anp_jax.distributed.topology`: the topology from flags, ``ANP_*``, SLURM and the node's GPUs
  (``detect_topology``).
* `anp_jax.distributed.launch`: ``preflight``, ``initialize`` and ``identity_line``.
* `anp_jax.distributed.ports`: the coordinator's port (``check_coordinator_port``,
  ``reserve_port``).
* `anp_jax.distributed.cores`: each process's share of its host's cores (``share_host_cores``).
* `anp_jax.distributed.coordination`: barriers, process-0 work and key-value exchanges through
  the coordination service (``barrier``, ``on_process_0``, ``exchange``).
* `anp_jax.distributed.agreement`: every process runs the same software and config
  (``check_same_everywhere``, ``software_identity``).
* `anp_jax.distributed.env`: integers and time-outs from the environment (``TIMEOUT_DEFAULTS``).

A test that replaces one of these functions patches it in the module that calls it (e.g.
``launch.share_host_cores`` for `initialize`): the names here are only references.
"""

from anp_jax.distributed.agreement import (SAME_FLAGS_HINT, SAME_SOFTWARE_HINT,  # noqa: F401
                                           check_same_everywhere, differences, software_identity)
from anp_jax.distributed.coordination import (barrier, barrier_timeout_s,  # noqa: F401
                                              coordination_client, exchange, on_process_0,
                                              wait_at_barrier)
from anp_jax.distributed.cores import core_share, share_host_cores  # noqa: F401
from anp_jax.distributed.env import TIMEOUT_DEFAULTS  # noqa: F401
from anp_jax.distributed.launch import identity_line, initialize, preflight  # noqa: F401
from anp_jax.distributed.ports import check_coordinator_port, reserve_port  # noqa: F401
from anp_jax.distributed.topology import Topology, detect_topology  # noqa: F401
