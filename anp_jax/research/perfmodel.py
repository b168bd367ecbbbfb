"""A SPRINT-style performance model of data-parallel ResNet training on a GPU cluster.

SPRINT (Oyama et al., "Predicting statistics of asynchronous SGD parameters for a large-scale
distributed deep learning system on GPU supercomputers", IEEE BigData 2016) predicts the time per
step, the throughput and, for asynchronous SGD, the distribution of gradient staleness and of the
effective mini-batch size from a handful of hardware and model parameters. This module does the
same for the training strategies compared in the seed paper (Campos et al., ICCS 2017: ResNet-50
on MinoTauro, synchronous vs. asynchronous vs. mixed-asynchronous), so that configurations can be
compared, and a cluster sized, before anyone queues a job:

* `ring_allreduce_time` / `hierarchical_allreduce_time`: bandwidth-latency (alpha-beta) cost of the
  gradient all-reduce; `node_axis_allreduce_time`: local SGD's parameter average as the trainer
  does it; `compute_time`: time of one forward+backward pass on one device.
* `predict(cluster, workload, per_device_batch, method=...)`: a `Prediction` with step time,
  images/s, epoch time, speed-ups and, for the asynchronous methods, staleness statistics.
* `simulate_async`: a discrete-event simulation of workers and parameter servers, the source of
  the staleness and effective-batch distributions; `staleness_sampler` exposes its staleness
  samples to an SGD simulator.
* `best_configuration`: enumerate nodes x devices per node x per-device batch for a target global
  batch and return the fastest configuration by epoch time.
* `workload_from_flax`: FLOPs and parameter bytes of a Flax model from XLA's cost analysis.
* `prediction_report`: what ``experiments/perfmodel.py`` (the command line) prints.

Units are SI throughout: bytes, seconds, FLOP (one multiply-add = 2 FLOP), bytes/s. The module is
pure Python + numpy; JAX is imported only inside `workload_from_flax`, and TensorFlow never.

What the model leaves out, so that its numbers are read as what they are: input-pipeline stalls,
framework overheads beyond a fixed per-step cost (`Device.step_overhead_s`), network contention
with other jobs, and the convergence cost of large or stale batches (time to *accuracy* is
epochs-to-accuracy, from experiments, times the epoch time predicted here).
"""

import dataclasses
import math
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from anp_jax.research.async_sim import (AsyncSimResult, require_non_negative,  # noqa: F401
                                        require_positive, simulate_async, staleness_sampler)

# ImageNet-1k training images; the default dataset size of the ImageNet-style presets.
IMAGENET_TRAIN_IMAGES = 1_281_167
CIFAR10_TRAIN_IMAGES = 50_000
# The seed paper's (MUSA2) MVSO-style ANP set: 384,258 images, stratified 80/20 -> 307,406 for
# training (shared/REFERENCES.md). The epoch of the `minotauro` preset.
MUSA2_TRAIN_IMAGES = 307_406

METHODS = ('sync', 'async', 'mixed')


# ----------------------------------------------------------------------------------------------
# Hardware and workload descriptions.

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
  """
  nodes: int
  devices_per_node: int
  device: Device
  interconnect: Interconnect
  max_devices_per_node: Optional[int] = None
  name: str = 'cluster'
  devices_per_compute_pool: int = 1

  def __post_init__(self):
    require_positive('Cluster', 'nodes', self.nodes, integer=True)
    require_positive('Cluster', 'devices_per_node', self.devices_per_node, integer=True)
    require_positive('Cluster', 'devices_per_compute_pool', self.devices_per_compute_pool,
                      integer=True)
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
  """
  name: str
  flops_per_image_fwd: float
  param_bytes: float
  dataset_size: int
  train_flops_factor: float = 3.0
  gradient_bytes: Optional[float] = None
  activation_bytes_per_image: float = 0.0
  training_state_factor: float = 3.0

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


# ----------------------------------------------------------------------------------------------
# Presets. Every number below is an assumption with a stated source; override them freely.

def resnet50(dataset_size: int = IMAGENET_TRAIN_IMAGES) -> Workload:
  """ResNet-50 (v1.5) at 224x224, float32 parameters and gradients.

  4.1e9 multiply-adds = 8.2e9 FLOP forward per image (the commonly quoted 4.1 GMACs; XLA's cost
  analysis of `anp_jax.models` ResNet-50 gives 8.0e9, see the tests). 25,557,032 parameters
  (torchvision's count for 1000 classes) x 4 bytes. Activation memory: 27.7 M float32 module
  outputs per image in training mode (measured with Flax ``capture_intermediates``), ~111 MB.
  ``dataset_size`` defaults to ImageNet-1k; pass the ANP dataset's size for its epochs.
  """
  return Workload(name='resnet50', flops_per_image_fwd=8.2e9, param_bytes=25_557_032 * 4,
                  dataset_size=dataset_size, activation_bytes_per_image=27.7e6 * 4)


def resnet20(dataset_size: int = CIFAR10_TRAIN_IMAGES) -> Workload:
  """CIFAR ResNet-20 (He et al. 2016, section 4.2) at 32x32 with 10 classes, float32.

  7.6e7 FLOP forward per image and 272,474 parameters: XLA's cost analysis and the parameter tree
  of `anp_jax.models` ResNet-20 (the tests check `workload_from_flax` against these). Activation
  memory: 0.49 M float32 module outputs per image in training mode.
  """
  return Workload(name='resnet20', flops_per_image_fwd=7.6e7, param_bytes=272_474 * 4,
                  dataset_size=dataset_size, activation_bytes_per_image=0.49e6 * 4)


def k80() -> Device:
  """One GK210 die of a Tesla K80 board (a K80 board is two such devices), float32.

  Peak: 2496 CUDA cores x 2 FLOP x 875 MHz boost = 4.37 TFLOP/s per die (half of the board's
  8.74 TFLOP/s; at the 560 MHz base clock it is 2.8 TFLOP/s, which a power-capped board may
  approach under sustained load). Efficiency and per-step overhead are calibrated on TensorFlow's
  published benchmark (tensorflow.org/performance/benchmarks, Google Compute Engine, one K80 die,
  ResNet-50, synthetic data): 49.5 images/s at batch 32 and 52 images/s at batch 64. A line
  through the two step times gives 18.3 ms/image (1.35 TFLOP/s sustained = 30.8 % of boost
  peak) plus 62 ms per step. Memory: 12 GB GDDR5 per die.
  """
  return Device(name='k80', peak_flops=4.37e12, efficiency=0.308, memory_bytes=12e9,
                step_overhead_s=0.062)


def v100() -> Device:
  """Tesla V100 SXM2 16 GB with mixed precision (tensor cores), as used with ResNet-50 from 2018.

  Peak 125 TFLOP/s (fp16 tensor cores). Efficiency 0.2 assumes ~1,000 ResNet-50 training images/s
  per GPU, the middle of the 800-1,400 images/s that NVIDIA's published mixed-precision
  ResNet-50 results span across frameworks; not measured here.
  """
  return Device(name='v100', peak_flops=125e12, efficiency=0.2, memory_bytes=16e9)


def h200() -> Device:
  """NVIDIA H200 SXM (141 GB HBM3e) in bfloat16, calibrated on anp_jax's ResNet-50 step.

  Peak 989 TFLOP/s dense bf16 (the H100 SXM tensor-core figure; H200 has the same compute and
  more, faster memory; an 8192^3 bf16 matmul measured 772-798 TFLOP/s on it). Efficiency and
  per-step overhead are a line through two measured step times of anp_jax's bare ResNet-50 step
  (224 px, bf16, one H200, jax 0.11.2 with CUDA 13, 2026-12-04,
  `experiments/results/bench_gpu_h200/`): 25.34 ms at 128 images and 44.85 ms at 256, i.e.
  0.1524 ms per image (24.6 GFLOP per training image / 0.1524 ms = 161 TFLOP/s = 16.3 % of peak)
  plus 5.8 ms per step. That is 5.05k / 5.71k images/s at 128 / 256 per GPU; MLPerf Training
  v4.0's MXNet + DALI fp16 submission reaches ~7.9k per H200 at 400 per GPU.
  """
  return Device(name='h200', peak_flops=989e12, efficiency=0.1632, memory_bytes=141e9,
                step_overhead_s=0.0058)


def cpu(cores: int = 16, clock_hz: float = 2.5e9, flops_per_cycle: int = 32,
        efficiency: float = 0.3, memory_bytes: float = 128e9) -> Device:
  """A CPU socket in float32: cores x clock x FLOP/cycle (32 = two AVX2 FMA units on 8 lanes).

  The defaults (a 16-core AVX2 socket at 2.5 GHz = 1.28 TFLOP/s) and the 30 % efficiency of
  oneDNN-style convolutions are assumptions; set them for the machine at hand.
  """
  return Device(name=f'cpu{cores}', peak_flops=cores * clock_hz * flops_per_cycle,
                efficiency=efficiency, memory_bytes=memory_bytes)


def minotauro_interconnect() -> Interconnect:
  """MinoTauro's links (BSC; K80 partition), effective rates assumed for a tuned library.

  Intra-node: PCIe 3.0 x16 per K80 board (15.75 GB/s signalling, ~12 GB/s achieved by DMA); the two
  dies of a board share it through an on-board PCIe switch and the two boards hang off different
  sockets, so a ring through all four dies is assumed to achieve 10 GB/s per direction, 10 us per
  hop (CUDA copy launch + PCIe). Inter-node: one InfiniBand FDR 4x HCA per node (56 Gb/s, 6.8 GB/s
  of data), ~6 GB/s effective with verbs/MPI, 2 us latency. A gRPC-over-IPoIB stack (TensorFlow
  1.x of the seed paper) achieves far less; lower ``inter_node_bandwidth`` to model it.
  """
  return Interconnect(intra_node_bandwidth=10e9, intra_node_latency=10e-6,
                      inter_node_bandwidth=6e9, inter_node_latency=2e-6)


def minotauro(nodes: int = 16, devices_per_node: int = 4,
              device: Optional[Device] = None) -> Cluster:
  """BSC MinoTauro's K80 nodes: two K80 boards (= 4 GK210 devices) per node, FDR InfiniBand.

  See `k80` and `minotauro_interconnect` for the assumptions. The seed paper used up to 16 nodes.
  """
  return Cluster(nodes=nodes, devices_per_node=devices_per_node, device=device or k80(),
                 interconnect=minotauro_interconnect(), max_devices_per_node=4, name='minotauro')


def dgx_h200(nodes: int = 4, devices_per_node: int = 8,
             device: Optional[Device] = None) -> Cluster:
  """DGX/HGX-H200-class nodes: 8 GPUs on NVLink/NVSwitch, 8 x 400 Gb/s InfiniBand NDR per node.

  Assumptions (not measured here): intra-node 350 GB/s per direction, the all-reduce bus
  bandwidth NCCL typically reaches on NVLink 4 (450 GB/s signalling per direction), 5 us per
  step; inter-node 8 NICs x ~45 GB/s achieved = 360 GB/s per node, 5 us. For one GPU
  (`devices_per_node` below 8) the NICs are assumed to stay shared by the node.
  """
  return Cluster(nodes=nodes, devices_per_node=devices_per_node, device=device or h200(),
                 interconnect=Interconnect(intra_node_bandwidth=350e9, intra_node_latency=5e-6,
                                           inter_node_bandwidth=360e9, inter_node_latency=5e-6),
                 max_devices_per_node=8, name='dgx_h200')


WORKLOADS = {'resnet50': resnet50, 'resnet20': resnet20}
DEVICES = {'k80': k80, 'v100': v100, 'h200': h200, 'cpu': cpu}
CLUSTERS = {'minotauro': minotauro, 'dgx_h200': dgx_h200}
# A cluster preset's own dataset (its epoch when --dataset-size is not given), with its source.
CLUSTER_DATASETS = {'minotauro': (MUSA2_TRAIN_IMAGES,
                                  "the seed paper's ANP training set, the minotauro preset's epoch")}


# ----------------------------------------------------------------------------------------------
# Communication and computation costs.

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


@dataclasses.dataclass(frozen=True)
class AsyncAnalytic:
  """Closed-form approximation of what `simulate_async` measures (no merging server).

  ``server_bound``: the servers' serialised link time, not the workers, sets the throughput; the
  mean-value formulas ignore queueing near that point, where the simulation is the reference.
  """
  gradients_per_s: float
  images_per_s: float
  mean_staleness: float
  staleness_variance: float
  staleness_pmf: Dict[int, float]
  effective_batch_pmf: Dict[int, float]
  server_bound: bool


def analytic_async(num_workers: int, compute_time_mean: float, compute_time_cv: float = 0.0,
                   comm_time: float = 0.0, *, server_time: float = 0.0,
                   push_fraction: float = 0.5, worker_batch: int = 1) -> AsyncAnalytic:
  """Throughput and staleness distribution of asynchronous SGD, without the simulation.

  Same inputs as `simulate_async` (identical workers, non-merging server). Derivation:

  * A worker's cycle is compute + pull + max(push, server time): N / cycle gradients per second,
    capped at 1 / ``server_time`` when the servers' links saturate (``server_bound``).
  * Mean staleness N - 1 (exact: between a worker's read and its next update, every other worker
    updates once on average).
  * Variance: N (N - 1) c^2 + (N - 1) c (1 - c) sqrt(2/pi) with c the cycle's coefficient
    of variation (compute jitter over the whole cycle; transfers are deterministic). The first
    term is exact for exponential cycles (c = 1: every update comes from a uniformly random
    worker, so staleness is geometric with mean N - 1), and 0 for lock-step workers (c = 0:
    staleness exactly N - 1); the second, the rounding of other workers' phase drift, is an
    empirical fit to `simulate_async` for c in [0.1, 1] and N in [4, 16] (gamma step times).
  * Shape: a negative binomial with that mean and variance when the variance exceeds the mean
    (geometric at c = 1), otherwise a normal density rounded to the integers >= 0.

  The tests hold the pmf to the simulation's within a total-variation distance of 0.15 for
  servers below saturation. A saturated server queues the gradients and serves them nearly
  round-robin, which narrows the distribution: there the simulation is the reference.
  """
  require_positive('analytic_async', 'num_workers', num_workers, integer=True)
  require_positive('analytic_async', 'compute_time_mean', compute_time_mean)
  require_positive('analytic_async', 'worker_batch', worker_batch, integer=True)
  for field, value in (('compute_time_cv', compute_time_cv), ('comm_time', comm_time),
                       ('server_time', server_time)):
    require_non_negative('analytic_async', field, value)
  if not 0 <= push_fraction <= 1:
    raise ValueError(f'analytic_async.push_fraction must be in [0, 1], got {push_fraction!r}.')
  n = num_workers
  push = push_fraction * comm_time
  cycle = compute_time_mean + (comm_time - push) + max(push, server_time)
  rate = n / cycle
  server_bound = server_time > 0 and 1.0 / server_time < rate
  if server_bound:
    rate = 1.0 / server_time
  c = min(compute_time_cv * compute_time_mean / cycle, 1.0)
  mean = float(n - 1)
  var = n * (n - 1) * c**2 + (n - 1) * c * (1 - c) * math.sqrt(2 / math.pi)
  pmf = _count_pmf(mean, var)
  return AsyncAnalytic(gradients_per_s=rate, images_per_s=rate * worker_batch,
                       mean_staleness=mean, staleness_variance=var, staleness_pmf=pmf,
                       effective_batch_pmf={worker_batch: 1.0}, server_bound=server_bound)


def _count_pmf(mean: float, var: float, tail: float = 1e-4) -> Dict[int, float]:
  """A distribution over integers >= 0 with the given mean and variance (see `analytic_async`)."""
  if mean == 0 or var <= 1e-12:
    return {int(round(mean)): 1.0}
  hi = int(math.ceil(mean + 12 * math.sqrt(var) + 10))
  k = np.arange(hi + 1)
  if var > mean:
    r = mean**2 / (var - mean)
    p = r / (r + mean)
    logpmf = (np.array([math.lgamma(x + r) - math.lgamma(r) - math.lgamma(x + 1) for x in k]) +
              r * math.log(p) + k * math.log1p(-p))
    w = np.exp(logpmf)
  else:
    w = np.exp(-0.5 * (k - mean)**2 / var)
  w = np.where(w / w.sum() >= tail, w, 0.0)  # Drop the far tail, then renormalise.
  w = w / w.sum()
  return {int(x): float(v) for x, v in zip(k, w) if v > 0}


def total_variation(p: Dict[int, float], q: Dict[int, float]) -> float:
  """Total-variation distance between two pmfs given as value -> probability dicts."""
  keys = set(p) | set(q)
  return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


# ----------------------------------------------------------------------------------------------
# Whole-system prediction.

@dataclasses.dataclass(frozen=True)
class Prediction:
  """Predicted performance of one configuration.

  ``step_time`` is the wall time of one training step: of the synchronous global step for
  'sync' and local-SGD, of one worker's local step (mean) for the asynchronous methods.
  ``compute_time`` is a device's forward+backward time of one step, ``comm_time`` the
  communication time per step before overlap (amortised over the local steps), and
  ``exposed_comm_time`` what of it is not hidden behind the backward pass (or, asynchronously,
  what the worker waits for its transfers and the server).

  ``global_batch`` is images per step summed over all devices; asynchronously each update carries
  only one worker's share, whose distribution is ``effective_batch_distribution`` (images per
  update -> probability). ``staleness_distribution`` maps staleness (updates applied between a
  worker's read of the parameters and the update applying its gradient) to probability; local
  SGD reports the local steps since the last global average instead. Speed-ups compare images/s
  with one device training alone (no communication) and with one node of the same method.
  ``analytic_images_per_s`` / ``analytic_staleness_distribution``: the closed form of
  `analytic_async` for the same asynchronous configuration (None where it does not apply:
  synchronous methods, merging servers), next to the simulated values as a cross-check.
  """
  method: str
  nodes: int
  devices_per_node: int
  per_device_batch: int
  global_batch: int
  compute_time: float
  comm_time: float
  exposed_comm_time: float
  step_time: float
  images_per_s: float
  epoch_time: float
  speedup_vs_one_device: float
  speedup_vs_one_node: float
  efficiency: float
  num_workers: int
  worker_batch: int
  updates_per_s: float
  mean_staleness: float
  staleness_distribution: Dict[int, float]
  effective_batch_distribution: Dict[int, float]
  description: str = ''
  cluster: Optional[Cluster] = dataclasses.field(default=None, repr=False, compare=False)
  analytic_images_per_s: Optional[float] = None
  analytic_staleness_distribution: Optional[Dict[int, float]] = None

  @property
  def num_devices(self) -> int:
    return self.nodes * self.devices_per_node


@dataclasses.dataclass(frozen=True)
class _Core:
  """What `_predict_core` computes; `predict` adds the speed-ups against reference runs."""
  compute_time: float
  comm_time: float
  exposed_comm_time: float
  step_time: float
  images_per_s: float
  num_workers: int
  worker_batch: int
  updates_per_s: float
  staleness: Dict[int, float]
  effective_batch: Dict[int, float]
  description: str
  analytic_images_per_s: Optional[float] = None
  analytic_staleness: Optional[Dict[int, float]] = None


def _exposed(comm: float, overlap: float, backward: float) -> float:
  """Communication left after hiding ``overlap`` of it behind (at most) the backward pass."""
  return comm - min(overlap * comm, backward)


def _ps_transfer_time(nbytes: float, senders: int, num_ps: int, ic: Interconnect) -> float:
  """Time for ``senders`` nodes to each move ``nbytes`` to (or from) ``num_ps`` servers at once.

  Each server link carries senders * nbytes / num_ps; each sender's link carries nbytes; the
  slower of the two bounds the phase. Servers sit on their own network links (dedicated nodes).
  """
  bw = ic.inter_node_bandwidth
  return max(senders * nbytes / (num_ps * bw), nbytes / bw) + ic.inter_node_latency


def _predict_core(cluster: Cluster, workload: Workload, b: int, method: str, overlap: float,
                  num_ps: int, local_steps: int, async_worker: str, mixed_mode: str,
                  sync_comm: str, ps_merge: bool, ps_apply_time: float, compute_cv: float,
                  sim_updates: int, seed: int) -> _Core:
  ic = cluster.interconnect
  n, d = cluster.nodes, cluster.devices_per_node
  t_c = device_step_time(cluster, workload, b)
  backward = (t_c - cluster.device.step_overhead_s) * workload.backward_fraction
  grad, params = workload.grad_bytes, workload.param_bytes
  intra = ring_allreduce_time(grad, d, ic.intra_node_bandwidth, ic.intra_node_latency)
  global_batch = n * d * b

  if method == 'sync':
    if sync_comm == 'allreduce':
      comm = hierarchical_allreduce_time(grad, n, d, ic)
      how = f'hierarchical ring all-reduce over {n}x{d}'
    else:
      # Reduce to a leader per node, push to / pull from the servers, broadcast inside the node.
      comm = (intra + ring_allreduce_time(params, d, ic.intra_node_bandwidth,
                                          ic.intra_node_latency) +
              _ps_transfer_time(grad, n, num_ps, ic) + _ps_transfer_time(params, n, num_ps, ic))
      how = f'{num_ps} parameter server(s), node-level aggregation'
    exposed = _exposed(comm, overlap, backward)
    step = t_c + exposed
    return _Core(t_c, comm, exposed, step, global_batch / step, 1, global_batch, 1 / step,
                 {0: 1.0}, {global_batch: 1.0}, f'synchronous SGD, {how}')

  if method == 'mixed' and mixed_mode == 'local_sgd':
    node_step = t_c + _exposed(intra, overlap, backward)
    # Parameters (and BN statistics, ignored: tiny) averaged as the trainer does: `pmean` over
    # the node axis of every device's full replica.
    average = node_axis_allreduce_time(params, n, d, ic)
    step = node_step + average / local_steps
    comm = intra + average / local_steps
    stale = {j: 1.0 / local_steps for j in range(local_steps)} if n > 1 else {0: 1.0}
    return _Core(t_c, comm, step - t_c, step, global_batch / step, n, d * b, 1 / step, stale,
                 {d * b: 1.0},
                 f'local SGD: synchronous inside each node, parameters averaged over {n} nodes '
                 f'every {local_steps} step(s)')

  # Asynchronous parameter-server training: 'async' (workers = devices or nodes) or the seed
  # paper's mixed-asynchronous (workers = nodes, synchronous inside each node).
  worker_is_node = method == 'mixed' or async_worker == 'node'
  if worker_is_node:
    num_workers, worker_batch, sharing = n, d * b, 1
    worker_compute = t_c + _exposed(intra, overlap, backward)
  else:
    num_workers, worker_batch, sharing = n * d, b, d
    worker_compute = t_c
  worker_bw = ic.inter_node_bandwidth / sharing  # devices of a node share its interface
  # A worker pushes a gradient / pulls parameters once per `local_steps` local steps.
  push = grad / worker_bw + ic.inter_node_latency
  pull = params / worker_bw + ic.inter_node_latency
  server = grad / (num_ps * ic.inter_node_bandwidth) + ic.inter_node_latency
  sim = simulate_async(num_workers, local_steps * worker_compute, compute_cv, push + pull,
                       sim_updates, seed, server_time=server, apply_time=ps_apply_time,
                       push_fraction=push / (push + pull), merge=ps_merge,
                       worker_batch=local_steps * worker_batch)
  analytic = None
  if not ps_merge and ps_apply_time == 0:  # The closed form covers the non-merging server.
    analytic = analytic_async(num_workers, local_steps * worker_compute, compute_cv, push + pull,
                              server_time=server, push_fraction=push / (push + pull),
                              worker_batch=local_steps * worker_batch)
  images_per_s = sim.images_per_s
  step = num_workers * worker_batch / images_per_s
  comm = (push + pull) / local_steps + (intra if worker_is_node else 0.0)
  who = f'{num_workers} node workers (synchronous inside)' if worker_is_node else (
      f'{num_workers} device workers')
  name = 'mixed-asynchronous' if method == 'mixed' else 'asynchronous'
  return _Core(t_c, comm, step - t_c, step, images_per_s, num_workers, worker_batch,
               sim.updates_per_s, sim.staleness_pmf(), sim.effective_batch_pmf(),
               f'{name} SGD, {who}, {num_ps} parameter server(s)'
               f'{", merging" if ps_merge else ""}'
               f'{f", {local_steps} local steps per push" if local_steps > 1 else ""}',
               analytic_images_per_s=analytic and analytic.images_per_s,
               analytic_staleness=analytic and analytic.staleness_pmf)


def predict(cluster: Cluster, workload: Workload, per_device_batch: int, method: str = 'sync', *,
            overlap: float = 0.0, num_ps: int = 1, local_steps: int = 1,
            async_worker: str = 'device', mixed_mode: str = 'async',
            sync_comm: str = 'allreduce', ps_merge: bool = False, ps_apply_time: float = 0.0,
            compute_cv: float = 0.1, sim_updates: int = 20_000, seed: int = 0) -> Prediction:
  """Predict step time, throughput, epoch time and speed-ups of one training configuration.

  Methods:

  * ``'sync'``: synchronous data parallelism. ``sync_comm='allreduce'`` (default) sums the
    gradients with `hierarchical_allreduce_time`; ``'ps'`` as TensorFlow 1.x's replicated
    parameter servers do: each node reduces its gradients, pushes them to ``num_ps`` servers and
    pulls the parameters back (`_ps_transfer_time`), then broadcasts them inside the node.
    ``overlap`` in [0, 1] is the fraction of the communication hidden behind the backward pass
    (bucketed all-reduce), never more than the backward pass itself.
  * ``'async'``: asynchronous SGD against ``num_ps`` parameter servers, simulated by
    `simulate_async`. ``async_worker='device'`` makes every device a worker (the devices of a
    node then share its network interface); ``'node'`` makes every node one worker that is
    synchronous inside (then identical to ``'mixed'``). Gradient bytes are split evenly over
    the servers, each of which has an inter-node link of its own. ``compute_cv`` is the
    coefficient of variation of a worker's step time: it shapes the staleness distribution,
    not its mean. ``ps_merge`` switches to SPRINT's merging server (see `simulate_async`), with
    ``ps_apply_time`` seconds per update.
  * ``'mixed'`` with ``mixed_mode='async'`` (default): the seed paper's *mixed-asynchronous*
    scheme: synchronous all-reduce inside each node, asynchronous parameter servers across nodes;
    ``local_steps`` > 1 lets a node take that many synchronous steps between pushes.
    ``mixed_mode='local_sgd'``: synchronous inside each node, and every ``local_steps`` steps a
    synchronous all-reduce averages the parameters across nodes (local SGD / periodic model
    averaging), costed as `anp_jax.executors.local_sgd` does it (`node_axis_allreduce_time`: every device's
    full replica over the node axis); there is no staleness, and the reported 'staleness' is
    the local steps since the last average.
  """
  if method not in METHODS:
    raise ValueError(f'method={method!r}; choose one of {METHODS}.')
  if not isinstance(cluster, Cluster):
    raise ValueError(f'cluster must be a Cluster, got {type(cluster).__name__}.')
  if not isinstance(workload, Workload):
    raise ValueError(f'workload must be a Workload, got {type(workload).__name__}.')
  require_positive('predict', 'per_device_batch', per_device_batch, integer=True)
  require_non_negative('predict', 'overlap', overlap)
  if overlap > 1:
    raise ValueError(f'predict.overlap is a fraction in [0, 1], got {overlap!r}.')
  require_positive('predict', 'num_ps', num_ps, integer=True)
  require_positive('predict', 'local_steps', local_steps, integer=True)
  require_non_negative('predict', 'ps_apply_time', ps_apply_time)
  require_non_negative('predict', 'compute_cv', compute_cv)
  require_positive('predict', 'sim_updates', sim_updates, integer=True)
  if async_worker not in ('device', 'node'):
    raise ValueError(f"predict.async_worker={async_worker!r}; choose 'device' or 'node'.")
  if mixed_mode not in ('async', 'local_sgd'):
    raise ValueError(f"predict.mixed_mode={mixed_mode!r}; choose 'async' or 'local_sgd'.")
  if sync_comm not in ('allreduce', 'ps'):
    raise ValueError(f"predict.sync_comm={sync_comm!r}; choose 'allreduce' or 'ps'.")
  if method == 'sync' and local_steps != 1:
    raise ValueError("predict.local_steps applies to method='mixed' (and 'async'); synchronous "
                     'SGD communicates every step.')

  args = (workload, per_device_batch, method, overlap, num_ps, local_steps, async_worker,
          mixed_mode, sync_comm, ps_merge, ps_apply_time, compute_cv, sim_updates, seed)
  core = _predict_core(cluster, *args)
  one_node = core if cluster.nodes == 1 else _predict_core(cluster.resized(nodes=1), *args)
  one_device_rate = per_device_batch / compute_time(workload, cluster.device, per_device_batch)
  speedup_device = core.images_per_s / one_device_rate
  mean_staleness = sum(k * p for k, p in core.staleness.items())
  return Prediction(
      method=method, nodes=cluster.nodes, devices_per_node=cluster.devices_per_node,
      per_device_batch=per_device_batch, global_batch=cluster.num_devices * per_device_batch,
      compute_time=core.compute_time, comm_time=core.comm_time,
      exposed_comm_time=core.exposed_comm_time, step_time=core.step_time,
      images_per_s=core.images_per_s, epoch_time=workload.dataset_size / core.images_per_s,
      speedup_vs_one_device=speedup_device,
      speedup_vs_one_node=core.images_per_s / one_node.images_per_s,
      efficiency=speedup_device / cluster.num_devices, num_workers=core.num_workers,
      worker_batch=core.worker_batch, updates_per_s=core.updates_per_s,
      mean_staleness=mean_staleness, staleness_distribution=core.staleness,
      effective_batch_distribution=core.effective_batch, description=core.description,
      cluster=cluster, analytic_images_per_s=core.analytic_images_per_s,
      analytic_staleness_distribution=core.analytic_staleness)


# ----------------------------------------------------------------------------------------------
# Configuration search.

def rank_configurations(cluster_options: Union[Cluster, Iterable[Cluster]], workload: Workload,
                        target_global_batch: int, *, match: str = 'at_least',
                        per_device_batches: Optional[Sequence[int]] = None,
                        node_counts: Optional[Sequence[int]] = None,
                        device_counts: Optional[Sequence[int]] = None,
                        **predict_kwargs) -> List[Prediction]:
  """All feasible configurations for a target global batch, fastest epoch first.

  For every cluster option (its ``nodes`` and ``max_devices_per_node`` — or ``devices_per_node``
  when unconstrained — are the upper bounds), every node count ``node_counts`` (default
  1..nodes) and devices per node ``device_counts`` (default 1..max) is tried with the per-device
  batch that meets the target: with ``match='exact'`` the global batch must equal the target;
  with ``'at_least'`` the smallest per-device batch whose global batch reaches the target. Given
  ``per_device_batches``, only those candidates are tried (with 'at_least', every one that
  reaches the target). Configurations whose batch does not fit in device memory are skipped.
  ``predict_kwargs`` (method, overlap, ...) go to `predict`.
  """
  require_positive('best_configuration', 'target_global_batch', target_global_batch,
                    integer=True)
  if match not in ('exact', 'at_least'):
    raise ValueError(f"best_configuration.match={match!r}; choose 'exact' or 'at_least'.")
  options = [cluster_options] if isinstance(cluster_options, Cluster) else list(cluster_options)
  if not options:
    raise ValueError('best_configuration.cluster_options is empty.')
  results, rejected = [], []
  for option in options:
    max_d = option.max_devices_per_node or option.devices_per_node
    for n in (node_counts or range(1, option.nodes + 1)):
      if n > option.nodes:
        continue
      for d in (device_counts or range(1, max_d + 1)):
        if d > max_d:
          continue
        devices = n * d
        if per_device_batches is None:
          if match == 'exact':
            batches = [target_global_batch // devices] if (
                target_global_batch % devices == 0) else []
          else:
            batches = [-(-target_global_batch // devices)]
        else:
          batches = [b for b in per_device_batches
                     if (devices * b == target_global_batch if match == 'exact'
                         else devices * b >= target_global_batch)]
        for b in batches:
          try:
            results.append(predict(option.resized(n, d), workload, b, **predict_kwargs))
          except ValueError as e:
            rejected.append(f'{option.name} {n}x{d} batch {b}: {e}')
  if not results:
    why = '; '.join(rejected[:3]) if rejected else 'no node/device/batch combination matches'
    raise ValueError(f'No configuration reaches global batch {target_global_batch} '
                     f'({match}): {why}.')
  return sorted(results, key=lambda p: (p.epoch_time, p.num_devices))


def best_configuration(cluster_options: Union[Cluster, Iterable[Cluster]], workload: Workload,
                       target_global_batch: int, **kwargs) -> Prediction:
  """The fastest configuration (by epoch time) for the target global batch, SPRINT-style.

  See `rank_configurations` for the search space and options; ties go to fewer devices.
  """
  return rank_configurations(cluster_options, workload, target_global_batch, **kwargs)[0]


# ----------------------------------------------------------------------------------------------
# Workloads measured from a Flax model.

def program_flops(lowered) -> float:
  """FLOPs of one execution of a lowered JAX computation (``jax.jit(f).lower(...)``) as written,
  or NaN where this backend cannot analyse a program before compiling it.

  XLA's cost analysis of the program before optimisation: every convolution, matmul and
  elementwise op counted (the "model FLOPs" of MFU). The *compiled* program's count is not that
  on GPU: XLA:GPU hands convolutions and matmuls to cuDNN and cuBLAS as custom calls, which its
  cost analysis does not count (ResNet-50 at 224 px came out at 0.58 GFLOP per training image
  on an H200 instead of ~24, MFU 0.4 %). JAX analyses a lowered program only on backends without
  the PJRT C API (the CPU in jax 0.10): on a CUDA plugin this is NaN, and `cpu_flops` counts
  instead. For a `shard_map` step the program is one device's share.
  """
  try:
    return _flops(lowered.cost_analysis())
  except NotImplementedError:  # Older JAX raised where newer returns None.
    return float('nan')


def cpu_flops(fn, *args) -> float:
  """FLOPs of ``fn(*args)`` counted by XLA:CPU, whatever the default backend: `fn` is compiled
  (never run) for the host's CPU, where convolutions and matmuls stay XLA operations that its
  cost analysis counts. `args` may be arrays or ``jax.ShapeDtypeStruct``s (pytrees of them);
  only their shapes and dtypes are used. NaN if XLA:CPU reports no count."""
  import jax  # Lazily: the rest of this module runs without JAX.
  # This process's CPU (in a multi-process job jax.devices('cpu') lists every process's).
  cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend='cpu')[0])
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=cpu), args)
  return _flops(jax.jit(fn).lower(*abstract).compile().cost_analysis())


def _flops(cost) -> float:
  """The 'flops' of an XLA cost analysis (a dict, a list of one per device program in older JAX,
  or None), NaN where it has none or reports -1 ("unknown")."""
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  flops = float(cost.get('flops', float('nan'))) if cost else float('nan')
  return flops if flops >= 0 else float('nan')


def count_flops(fn, *args) -> float:
  """FLOPs of ``fn(*args)`` as written: the lowered program's count (`program_flops`, free, no
  compilation) where the default backend gives one, else XLA:CPU's (`cpu_flops`)."""
  import jax
  flops = program_flops(jax.jit(fn).lower(*args))
  return flops if math.isfinite(flops) else cpu_flops(fn, *args)


def workload_from_flax(model, image_size: int, *, name: Optional[str] = None,
                       dataset_size: int = IMAGENET_TRAIN_IMAGES, channels: int = 3,
                       batch_size: int = 1, train_flops_factor: float = 3.0,
                       input_dtype=None) -> Workload:
  """A `Workload` from a Flax linen model: XLA's FLOP count of its forward pass, its parameters.

  The forward pass ``model.apply(variables, x, train=False)`` on a ``batch_size`` x image_size x
  image_size x channels batch is counted without running it (parameters stay abstract);
  `count_flops` / batch_size is the forward FLOP per image. ``param_bytes`` sums the sizes of
  the 'params' collection in their own dtypes.
  """
  import jax  # Lazily: the rest of this module runs without JAX.
  import jax.numpy as jnp

  dtype = jnp.float32 if input_dtype is None else input_dtype
  x = jax.ShapeDtypeStruct((batch_size, image_size, image_size, channels), dtype)
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros(x.shape, dtype),
                                                train=False))
  flops = count_flops(lambda v, x: model.apply(v, x, train=False), variables, x)
  if not math.isfinite(flops):
    raise ValueError('XLA cost analysis reported no FLOP count for this backend.')
  param_bytes = sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
                    for leaf in jax.tree.leaves(variables['params']))
  return Workload(name=name or type(model).__name__.lower(),
                  flops_per_image_fwd=flops / batch_size,
                  param_bytes=float(param_bytes), dataset_size=dataset_size,
                  train_flops_factor=train_flops_factor)


# ----------------------------------------------------------------------------------------------
# What the command line (experiments/perfmodel.py) prints.

def format_duration(seconds: float) -> str:
  """An epoch time for the table: '1.82 h', '42.0 min', '12.3 s', '0.512 s' ('inf' if never)."""
  if not math.isfinite(seconds):
    return 'inf'
  if seconds >= 3600:
    return f'{seconds / 3600:.2f} h'
  if seconds >= 60:
    return f'{seconds / 60:.1f} min'
  return f'{seconds:.1f} s' if seconds >= 10 else f'{seconds:.3g} s'


def format_table(predictions: Sequence[Prediction]) -> str:
  """A fixed-width text table of predictions, one row each ('comm' is the exposed part)."""
  header = ('nodes', 'devices', 'global batch', 'step [ms]', 'comm [ms]', 'img/s', 'epoch',
            'x 1 node', 'x 1 dev', 'efficiency', 'staleness')
  rows = [header]
  for p in predictions:
    rows.append((str(p.nodes), str(p.num_devices), str(p.global_batch),
                 f'{1e3 * p.step_time:,.2f}', f'{1e3 * p.exposed_comm_time:,.2f}',
                 f'{p.images_per_s:,.1f}',
                 format_duration(p.epoch_time), f'{p.speedup_vs_one_node:.2f}',
                 f'{p.speedup_vs_one_device:.2f}', f'{100 * p.efficiency:.1f} %',
                 f'{p.mean_staleness:.2f}'))
  widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
  lines = ['  '.join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
  lines.insert(1, '  '.join('-' * w for w in widths))
  return '\n'.join(lines)


def flax_workload(arch: str, image_size: int = 224, width: float = 1.0, num_classes: int = 553,
                  **kwargs) -> Workload:
  """The workload of one of anp_jax.models' ResNets (``--flax-model``), from XLA's cost analysis."""
  from anp_jax import models  # Lazily: imports JAX and Flax.
  from anp_jax.configs import default
  if arch not in models.NAMES:
    raise ValueError(f'--flax-model {arch!r} is unknown; choose one of '
                     f'{list(models.names())}.')
  require_positive('--flax-model', 'image_size', image_size, integer=True)
  require_positive('--flax-model', 'width', width)
  require_positive('--flax-model', 'num_classes', num_classes, integer=True)
  config = default.get_config()
  config.model.update(dict(name=arch, width=width))
  model = models.create_model(config, models.Heads(num_classes))
  name = arch + (f'_w{width:g}' if width != 1 else '')
  return workload_from_flax(model, image_size, name=name, **kwargs)


def recalibrated_device(device: str, workload: Workload, *, peak_tflops: Optional[float] = None,
                        efficiency: Optional[float] = None, step_time_ms: Optional[float] = None,
                        measured_batch: Optional[int] = None,
                        step_overhead_ms: Optional[float] = None) -> Device:
  """The `DEVICES` preset ``device``, recalibrated by a datasheet peak/efficiency or a measured
  step time of ``workload`` (``--step-time-ms`` at ``--measured-batch``), not both."""
  preset = DEVICES[device]()
  if step_time_ms is not None or measured_batch is not None:
    if step_time_ms is None or measured_batch is None:
      raise ValueError('--step-time-ms and --measured-batch go together: give the measured step '
                       'time and the batch it was measured at.')
    if peak_tflops is not None or efficiency is not None:
      raise ValueError('--step-time-ms replaces --peak-tflops/--efficiency; give one or the other.')
    overhead = 0.0 if step_overhead_ms is None else step_overhead_ms * 1e-3
    return Device(name=(f'{device} calibrated to {step_time_ms:g} ms per step of '
                        f'{measured_batch} images'), memory_bytes=preset.memory_bytes,
                  step_time_s=step_time_ms * 1e-3, measured_batch=measured_batch,
                  measured_workload=workload.name, step_overhead_s=overhead)
  changes = {}
  if peak_tflops is not None:
    changes['peak_flops'] = peak_tflops * 1e12
  if efficiency is not None:
    changes['efficiency'] = efficiency
  if step_overhead_ms is not None:
    changes['step_overhead_s'] = step_overhead_ms * 1e-3
  return dataclasses.replace(preset, **changes) if changes else preset


def prediction_report(*, model: str = 'resnet50', flax_model: Optional[str] = None,
                      image_size: int = 224, width: float = 1.0, num_classes: int = 553,
                      dataset_size: Optional[int] = None, cluster: str = 'minotauro',
                      nodes: int = 16, gpus_per_node: int = 4, device: str = 'k80',
                      peak_tflops: Optional[float] = None, efficiency: Optional[float] = None,
                      step_time_ms: Optional[float] = None, measured_batch: Optional[int] = None,
                      step_overhead_ms: Optional[float] = None, devices_per_compute_pool: int = 1,
                      per_device_batch: int = 32, method: str = 'sync',
                      sync_comm: str = 'allreduce', async_worker: str = 'device',
                      mixed_mode: str = 'async', local_steps: int = 1,
                      intra_bw: Optional[float] = None, inter_bw: Optional[float] = None,
                      intra_lat: Optional[float] = None, inter_lat: Optional[float] = None,
                      overlap: float = 0.0, num_ps: int = 1, ps_merge: bool = False,
                      compute_cv: float = 0.1, sweep_nodes: Optional[Sequence[int]] = None,
                      target_global_batch: Optional[int] = None, exact: bool = False,
                      seed: int = 0) -> str:
  """The prediction table ``experiments/perfmodel.py`` prints, with its header lines.

  The arguments are the command line's flags (bandwidths in GB/s, latencies in microseconds,
  times in ms); `predict` for each of ``sweep_nodes`` (default: ``nodes``), or with
  ``target_global_batch`` the ten best of `rank_configurations`. Raises ValueError for unknown
  presets and impossible configurations.
  """
  for name, value, known in (('model', model, WORKLOADS), ('cluster', cluster, CLUSTERS),
                             ('device', device, DEVICES)):
    if value not in known:
      raise ValueError(f'--{name} {value!r} is unknown; choose one of {sorted(known)}.')
  dataset_source = '--dataset-size'
  if dataset_size is None and cluster in CLUSTER_DATASETS:
    dataset_size, dataset_source = CLUSTER_DATASETS[cluster]
  kwargs = {} if dataset_size is None else {'dataset_size': dataset_size}
  if dataset_size is None:
    dataset_source = f'the {flax_model or model} default; set --dataset-size'
  workload = (flax_workload(flax_model, image_size, width, num_classes, **kwargs) if flax_model
              else WORKLOADS[model](**kwargs))
  base = CLUSTERS[cluster](device=recalibrated_device(
      device, workload, peak_tflops=peak_tflops, efficiency=efficiency,
      step_time_ms=step_time_ms, measured_batch=measured_batch,
      step_overhead_ms=step_overhead_ms))
  ic = base.interconnect
  ic = Interconnect(
      intra_node_bandwidth=ic.intra_node_bandwidth if intra_bw is None else intra_bw * 1e9,
      intra_node_latency=ic.intra_node_latency if intra_lat is None else intra_lat * 1e-6,
      inter_node_bandwidth=ic.inter_node_bandwidth if inter_bw is None else inter_bw * 1e9,
      inter_node_latency=ic.inter_node_latency if inter_lat is None else inter_lat * 1e-6)
  node_counts = list(sweep_nodes or [nodes])
  the_cluster = dataclasses.replace(base, nodes=max(node_counts), devices_per_node=gpus_per_node,
                                    interconnect=ic,
                                    devices_per_compute_pool=devices_per_compute_pool)
  predict_kwargs = dict(method=method, overlap=overlap, num_ps=num_ps, local_steps=local_steps,
                        async_worker=async_worker, mixed_mode=mixed_mode, sync_comm=sync_comm,
                        ps_merge=ps_merge, compute_cv=compute_cv, seed=seed)
  if target_global_batch is not None:
    ranked = rank_configurations(
        the_cluster.resized(devices_per_node=gpus_per_node), workload, target_global_batch,
        match='exact' if exact else 'at_least', node_counts=node_counts,
        device_counts=range(1, gpus_per_node + 1), **predict_kwargs)
    predictions = sorted(ranked[:10], key=lambda p: (p.nodes, p.num_devices))
  else:
    predictions = [predict(the_cluster.resized(nodes=n), workload, per_device_batch,
                           **predict_kwargs) for n in node_counts]
  widest = max(predictions, key=lambda p: p.num_devices)
  native = CLUSTERS[cluster]().device.name
  where = (the_cluster.name if device == native and step_time_ms is None else
           f"{the_cluster.name}'s links with {device} devices")
  lines = [
      f'{workload.name}: {workload.flops_per_image_fwd / 1e9:.3g} GFLOP/image forward, '
      f'{workload.param_bytes / 1e6:.1f} MB parameters, {workload.dataset_size:,} images/epoch '
      f'({dataset_source})',
      f'{where}: {the_cluster.device.name} x {gpus_per_node}/node; intra '
      f'{ic.intra_node_bandwidth / 1e9:.1f} GB/s, {ic.intra_node_latency * 1e6:.1f} us; inter '
      f'{ic.inter_node_bandwidth / 1e9:.1f} GB/s, {ic.inter_node_latency * 1e6:.1f} us',
      f'method: {_method_line(predictions, widest)}; overlap {overlap:g}',
      format_table(predictions)]
  if widest.analytic_images_per_s is not None:
    tv = total_variation(widest.analytic_staleness_distribution, widest.staleness_distribution)
    lines.append(f'closed form (analytic_async) for the widest row: '
                 f'{widest.analytic_images_per_s:,.1f} img/s (simulated '
                 f'{widest.images_per_s:,.1f}); staleness pmf total-variation distance to the '
                 f'simulation {tv:.3f}')
  if target_global_batch is not None:
    best = ranked[0]
    lines.append(f'best for global batch {target_global_batch}: {best.nodes} node(s) x '
                 f'{best.devices_per_node} device(s) x batch {best.per_device_batch} = '
                 f'{best.global_batch}, epoch {format_duration(best.epoch_time)} '
                 f'({workload.dataset_size:,} images)')
  return '\n'.join(lines)


def _method_line(predictions, widest) -> str:
  """The method of the table's rows: the counts that vary by row are not quoted as one."""
  if len({p.description for p in predictions}) == 1:
    return widest.description
  generic = re.sub(r'\b\d+ (node|device) workers', r'one worker per \1', widest.description)
  generic = re.sub(r' over \d+x\d+', ' over nodes x devices', generic)
  return generic if generic != widest.description else f'{widest.description} (widest row)'
