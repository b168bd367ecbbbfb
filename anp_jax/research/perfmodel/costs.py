"""Communication and computation costs: alpha-beta all-reduce times, compute time, memory check.

The building blocks of `perfmodel.prediction`: how long a ring, hierarchical or node-axis
all-reduce of a buffer takes on an `Interconnect`, and how long one device (or a pool of simulated
devices sharing cores) needs for a forward+backward pass of a batch.
"""

from anp_jax.research.perfmodel.hardware import Cluster, Device, Interconnect, Workload
from anp_jax.staleness import require_non_negative, require_positive


def _check_transfer_args(nbytes, n, bandwidth, latency):
  require_non_negative('allreduce', 'bytes', nbytes)
  require_positive('allreduce', 'n', n, integer=True)
  require_positive('allreduce', 'bandwidth', bandwidth)
  require_non_negative('allreduce', 'latency', latency)


def ring_allreduce_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
  """Bandwidth-optimal ring all-reduce of ``nbytes`` over ``n`` participants.

  A reduce-scatter then an all-gather, each of n-1 steps moving nbytes/n per link:
  2(n-1)/n * nbytes / bandwidth + 2(n-1) * latency. One participant communicates nothing.
  """
  _check_transfer_args(nbytes, n, bandwidth, latency)
  if n == 1:
    return 0.0
  return 2.0 * (n - 1) / n * nbytes / bandwidth + 2.0 * (n - 1) * latency


def ring_reduce_scatter_time(nbytes: float, n: int, bandwidth: float, latency: float) -> float:
  """Half of a ring all-reduce: (n-1)/n * nbytes / bandwidth + (n-1) * latency (also all-gather)."""
  _check_transfer_args(nbytes, n, bandwidth, latency)
  if n == 1:
    return 0.0
  return (n - 1) / n * nbytes / bandwidth + (n - 1) * latency


def hierarchical_allreduce_time(nbytes: float, nodes: int, devices_per_node: int,
                                interconnect: Interconnect) -> float:
  """Two-level all-reduce: intra-node reduce-scatter, inter-node ring, intra-node all-gather.

  After the reduce-scatter each of the d devices of a node owns 1/d of the sum; d concurrent rings
  over the nodes (one per shard) all-reduce the shards. Those d rings share the node's one network
  interface, so together they move 2(N-1)/N * nbytes through it, as one ring of the whole buffer
  would; their latencies overlap. One node reduces to a plain intra-node ring, one device per node
  to a plain inter-node ring.
  """
  ic = interconnect
  if nodes == 1:
    return ring_allreduce_time(nbytes, devices_per_node, ic.intra_node_bandwidth,
                               ic.intra_node_latency)
  inter = ring_allreduce_time(nbytes, nodes, ic.inter_node_bandwidth, ic.inter_node_latency)
  if devices_per_node == 1:
    return inter
  intra = ring_reduce_scatter_time(nbytes, devices_per_node, ic.intra_node_bandwidth,
                                   ic.intra_node_latency)
  return 2.0 * intra + inter


def node_axis_allreduce_time(nbytes: float, nodes: int, devices_per_node: int,
                             interconnect: Interconnect) -> float:
  """All-reduce over the node axis of replicated buffers: what local SGD's averaging does.

  Every device of a node holds the node's whole replica, and the local-SGD executor's step (`anp_jax.executors.local_sgd`)
  averages it with ``pmean`` over the ``node`` mesh axis: d concurrent ring all-reduces of the
  full ``nbytes``, one per device position, each over the N nodes. There is no intra-node
  reduce-scatter first (unlike `hierarchical_allreduce_time`); the d rings share the node's one
  network interface, which therefore moves d x 2(N-1)/N x nbytes; their latencies overlap. So
  it costs a ring all-reduce of d x nbytes over the nodes (zero for one node).
  """
  require_positive('node_axis_allreduce', 'devices_per_node', devices_per_node, integer=True)
  ic = interconnect
  return ring_allreduce_time(devices_per_node * nbytes, nodes, ic.inter_node_bandwidth,
                             ic.inter_node_latency)


def check_memory(workload: Workload, device: Device, per_device_batch: int):
  """Raise ValueError when parameters, optimizer state and activations exceed device memory.

  Counts ``training_state_factor`` copies of the parameters plus the activations of
  ``per_device_batch`` images; workspace and fragmentation are not counted, so passing is
  necessary, not sufficient. Skipped when the device memory or activation size is unknown (0).
  """
  require_positive('predict', 'per_device_batch', per_device_batch, integer=True)
  if not device.memory_bytes or not workload.activation_bytes_per_image:
    return
  need = (workload.training_state_factor * workload.param_bytes +
          per_device_batch * workload.activation_bytes_per_image)
  if need > device.memory_bytes:
    fit = int((device.memory_bytes - workload.training_state_factor * workload.param_bytes) //
              workload.activation_bytes_per_image)
    raise ValueError(
        f'per_device_batch={per_device_batch} of {workload.name} needs ~{need / 1e9:.1f} GB on '
        f'{device.name}, which has {device.memory_bytes / 1e9:.1f} GB '
        f'(at most ~{max(fit, 0)} images fit).')


def compute_time(workload: Workload, device: Device, per_device_batch: int) -> float:
  """Seconds of one forward+backward pass of ``per_device_batch`` images on one device."""
  check_memory(workload, device, per_device_batch)
  if device.step_time_s is not None:
    if device.measured_workload is not None and device.measured_workload != workload.name:
      raise ValueError(f'Device({device.name!r}).step_time_s was measured for '
                       f'{device.measured_workload!r}, not for workload {workload.name!r}.')
    per_image = (device.step_time_s - device.step_overhead_s) / device.measured_batch
    return device.step_overhead_s + per_device_batch * per_image
  return (device.step_overhead_s +
          per_device_batch * workload.flops_per_image_train / device.sustained_flops)


def device_step_time(cluster: Cluster, workload: Workload, per_device_batch: int) -> float:
  """Forward+backward time of one step on one device of ``cluster``, compute-pool sharing included.

  The devices that share a pool (`Cluster.devices_per_compute_pool`) run their steps at the same
  time on the same cores, so each step lasts as long as the pool takes for all of their images.
  """
  check_memory(workload, cluster.device, per_device_batch)
  return compute_time(workload, cluster.device, cluster.pool_sharing * per_device_batch)
