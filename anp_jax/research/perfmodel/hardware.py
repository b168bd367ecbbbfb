"""What the performance model is given: a device, its links, a cluster of them, and a workload.

Frozen dataclasses that validate their fields on construction (every error names the field); the
presets in `perfmodel.presets` build them from stated assumptions. Units are SI: bytes, seconds,
FLOP (one multiply-add = 2 FLOP), bytes/s.
"""

import dataclasses
from typing import Optional

from anp_jax.staleness import require_non_negative, require_positive


@dataclasses.dataclass(frozen=True)
class Device:
  """One accelerator (one GPU die, or one CPU socket), characterised in one of two ways.

  * From its datasheet: ``peak_flops`` (FLOP/s at the training precision) times ``efficiency``
    (the fraction of peak a convolutional network's training step actually achieves) is the
    sustained rate; a step on b images then takes ``step_overhead_s + b * FLOP/image / rate``.
  * From a measurement: ``step_time_s`` seconds for one training step at ``measured_batch``
    images, scaled linearly in the batch around the fixed ``step_overhead_s``. A measurement
    belongs to one model: set ``measured_workload`` to its `Workload.name` and `compute_time`
    refuses to apply it to another model.

  ``memory_bytes`` (0: unknown) bounds the per-device batch through `check_memory`.
  """
  name: str
  peak_flops: Optional[float] = None
  efficiency: Optional[float] = None
  memory_bytes: float = 0.0
  step_time_s: Optional[float] = None
  measured_batch: Optional[int] = None
  measured_workload: Optional[str] = None
  step_overhead_s: float = 0.0

  def __post_init__(self):
    owner = f'Device({self.name!r})'
    require_non_negative(owner, 'memory_bytes', self.memory_bytes)
    require_non_negative(owner, 'step_overhead_s', self.step_overhead_s)
    if self.step_time_s is None:
      if self.peak_flops is None or self.efficiency is None:
        raise ValueError(f'{owner}: give either peak_flops and efficiency, or a measured '
                         'step_time_s with measured_batch.')
      require_positive(owner, 'peak_flops', self.peak_flops)
      require_positive(owner, 'efficiency', self.efficiency)
      if self.efficiency > 1:
        raise ValueError(f'{owner}.efficiency is the achieved fraction of peak_flops and must be '
                         f'in (0, 1], got {self.efficiency!r}.')
    else:
      require_positive(owner, 'step_time_s', self.step_time_s)
      if self.measured_batch is None:
        raise ValueError(f'{owner}.measured_batch is required with step_time_s.')
      require_positive(owner, 'measured_batch', self.measured_batch, integer=True)
      if self.step_overhead_s >= self.step_time_s:
        raise ValueError(f'{owner}.step_overhead_s={self.step_overhead_s!r} must be smaller than '
                         f'step_time_s={self.step_time_s!r}.')

  @property
  def sustained_flops(self) -> Optional[float]:
    """Achieved FLOP/s (None for a device given by a measured step time)."""
    if self.step_time_s is not None:
      return None
    return self.peak_flops * self.efficiency


@dataclasses.dataclass(frozen=True)
class Interconnect:
  """Links between devices: alpha-beta (latency + bytes/bandwidth) parameters.

  ``intra_node_bandwidth`` is the per-direction bandwidth a device achieves to its ring neighbour
  inside a node (PCIe, NVLink). ``inter_node_bandwidth`` is the per-direction bandwidth of one
  node's network interface; every transfer leaving a node shares it. Both are *effective*
  (achieved by the communication library), not signalling rates.
  """
  intra_node_bandwidth: float
  intra_node_latency: float
  inter_node_bandwidth: float
  inter_node_latency: float

  def __post_init__(self):
    require_positive('Interconnect', 'intra_node_bandwidth', self.intra_node_bandwidth)
    require_positive('Interconnect', 'inter_node_bandwidth', self.inter_node_bandwidth)
    require_non_negative('Interconnect', 'intra_node_latency', self.intra_node_latency)
    require_non_negative('Interconnect', 'inter_node_latency', self.inter_node_latency)


@dataclasses.dataclass(frozen=True)
class Cluster:
  """``nodes`` identical nodes of ``devices_per_node`` devices each.

  ``max_devices_per_node`` is what the node physically holds (None: unconstrained); asking for
  more devices per node than that is an error rather than a silent extrapolation.

  ``devices_per_compute_pool`` is how many of the job's devices run on one shared pool of compute
  units; ``device`` then describes the whole pool. 1 (default) is a real accelerator per
  device. N > 1 models N simulated XLA CPU devices (``--xla_force_host_platform_device_count``),
  or N single-device processes, on one host's cores: they do not add compute, they split it, so
  a step with per-device batch b costs what the pool needs for min(N, devices) x b images (see
  `device_step_time`). Without it the model would credit simulated devices with a linear
  speed-up that the cores cannot deliver.

  ``host_cores_per_node`` (None: unknown) is the CPU cores of one node that prepare its
  devices' input; with an input pipeline's cost per image (`input_stage`) it says whether the
  host or the devices bound the step.
  """
  nodes: int
  devices_per_node: int
  device: Device
  interconnect: Interconnect
  max_devices_per_node: Optional[int] = None
  name: str = 'cluster'
  devices_per_compute_pool: int = 1
  host_cores_per_node: Optional[int] = None

  def __post_init__(self):
    require_positive('Cluster', 'nodes', self.nodes, integer=True)
    require_positive('Cluster', 'devices_per_node', self.devices_per_node, integer=True)
    require_positive('Cluster', 'devices_per_compute_pool', self.devices_per_compute_pool,
                      integer=True)
    if self.host_cores_per_node is not None:
      require_positive('Cluster', 'host_cores_per_node', self.host_cores_per_node, integer=True)
    if self.max_devices_per_node is not None:
      require_positive('Cluster', 'max_devices_per_node', self.max_devices_per_node,
                        integer=True)
      if self.devices_per_node > self.max_devices_per_node:
        raise ValueError(
            f'Cluster({self.name!r}).devices_per_node={self.devices_per_node} exceeds '
            f'max_devices_per_node={self.max_devices_per_node}: a node of this cluster holds '
            f'at most {self.max_devices_per_node} {self.device.name} devices.')
    if not isinstance(self.device, Device):
      raise ValueError(f'Cluster.device must be a Device, got {type(self.device).__name__}.')
    if not isinstance(self.interconnect, Interconnect):
      raise ValueError('Cluster.interconnect must be an Interconnect, got '
                       f'{type(self.interconnect).__name__}.')

  @property
  def num_devices(self) -> int:
    return self.nodes * self.devices_per_node

  @property
  def pool_sharing(self) -> int:
    """Devices of this job that share one compute pool (at most all of them)."""
    return min(self.devices_per_compute_pool, self.num_devices)

  def resized(self, nodes: Optional[int] = None,
              devices_per_node: Optional[int] = None) -> 'Cluster':
    """The same hardware with another number of nodes and/or devices per node (validated)."""
    return dataclasses.replace(
        self, nodes=self.nodes if nodes is None else nodes,
        devices_per_node=self.devices_per_node if devices_per_node is None else devices_per_node)


@dataclasses.dataclass(frozen=True)
class Workload:
  """What one training image costs, and what one update moves.

  ``flops_per_image_fwd`` is the forward pass (2 FLOP per multiply-add); a training step costs
  ``train_flops_factor`` times that (3: the backward pass computes gradients with respect to both
  activations and weights, each about one forward). ``param_bytes`` is what a parameter pull
  moves; ``gradient_bytes`` (default: ``param_bytes``) what a gradient push or all-reduce moves.
  ``activation_bytes_per_image`` (0: unknown) and ``training_state_factor`` (copies of the
  parameters a device keeps: weights, gradients, momentum) feed `check_memory`.
  ``image_size`` (None: unknown): the side of the training images, which says whether an input
  pipeline's measurement applies (`input_stage.input_warnings`).
  """
  name: str
  flops_per_image_fwd: float
  param_bytes: float
  dataset_size: int
  train_flops_factor: float = 3.0
  gradient_bytes: Optional[float] = None
  activation_bytes_per_image: float = 0.0
  training_state_factor: float = 3.0
  image_size: Optional[int] = None

  def __post_init__(self):
    owner = f'Workload({self.name!r})'
    require_positive(owner, 'flops_per_image_fwd', self.flops_per_image_fwd)
    require_positive(owner, 'param_bytes', self.param_bytes)
    require_positive(owner, 'dataset_size', self.dataset_size, integer=True)
    require_positive(owner, 'train_flops_factor', self.train_flops_factor)
    if self.gradient_bytes is not None:
      require_positive(owner, 'gradient_bytes', self.gradient_bytes)
    require_non_negative(owner, 'activation_bytes_per_image', self.activation_bytes_per_image)
    require_positive(owner, 'training_state_factor', self.training_state_factor)

  @property
  def flops_per_image_train(self) -> float:
    return self.flops_per_image_fwd * self.train_flops_factor

  @property
  def grad_bytes(self) -> float:
    return self.param_bytes if self.gradient_bytes is None else self.gradient_bytes

  @property
  def backward_fraction(self) -> float:
    """Share of a training step spent in the backward pass (what communication can hide behind)."""
    return (self.train_flops_factor - 1.0) / self.train_flops_factor
