"""Presets of the performance model: workloads, devices and clusters, each with its sources.

Every number below is an assumption with a stated source; override them freely (the command
line's flags, or `dataclasses.replace`). `WORKLOADS`, `DEVICES` and `CLUSTERS` name them for the
command line and the planner's cluster files.
"""

from typing import Optional

from anp_jax.research.perfmodel.hardware import Cluster, Device, Interconnect, Workload

# ImageNet-1k training images; the default dataset size of the ImageNet-style presets.
IMAGENET_TRAIN_IMAGES = 1_281_167
CIFAR10_TRAIN_IMAGES = 50_000
# The training split of the seed paper's MVSO-style ANP set as MUSA2 published it (Fernández et
# al. 2017, docs/references.md: 384,258 images, 307,185 train / 77,073 test). The epoch of the
# `minotauro` preset and the planner's default dataset.
MUSA2_TRAIN_IMAGES = 307_185


def resnet50(dataset_size: int = IMAGENET_TRAIN_IMAGES) -> Workload:
  """ResNet-50 (v1.5) at 224x224, float32 parameters and gradients.

  4.1e9 multiply-adds = 8.2e9 FLOP forward per image (the commonly quoted 4.1 GMACs; XLA's cost
  analysis of `anp_jax.models` ResNet-50 gives 8.0e9, see the tests). 25,557,032 parameters
  (torchvision's count for 1000 classes) x 4 bytes. Activation memory: 27.7 M float32 module
  outputs per image in training mode (measured with Flax ``capture_intermediates``), ~111 MB.
  ``dataset_size`` defaults to ImageNet-1k; pass the ANP dataset's size for its epochs.
  """
  return Workload(name='resnet50', flops_per_image_fwd=8.2e9, param_bytes=25_557_032 * 4,
                  dataset_size=dataset_size, activation_bytes_per_image=27.7e6 * 4,
                  image_size=224)


def resnet20(dataset_size: int = CIFAR10_TRAIN_IMAGES) -> Workload:
  """CIFAR ResNet-20 (He et al. 2016, section 4.2) at 32x32 with 10 classes, float32.

  7.6e7 FLOP forward per image and 272,474 parameters: XLA's cost analysis and the parameter tree
  of `anp_jax.models` ResNet-20 (the tests check `workload_from_flax` against these). Activation
  memory: 0.49 M float32 module outputs per image in training mode.
  """
  return Workload(name='resnet20', flops_per_image_fwd=7.6e7, param_bytes=272_474 * 4,
                  dataset_size=dataset_size, activation_bytes_per_image=0.49e6 * 4,
                  image_size=32)


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
  Host: two 8-core Intel Xeon E5-2630 v3 per node, 16 cores (BSC's MinoTauro user guide).
  """
  return Cluster(nodes=nodes, devices_per_node=devices_per_node, device=device or k80(),
                 interconnect=minotauro_interconnect(), max_devices_per_node=4, name='minotauro',
                 host_cores_per_node=16)


def dgx_h200(nodes: int = 4, devices_per_node: int = 8,
             device: Optional[Device] = None) -> Cluster:
  """DGX/HGX-H200-class nodes: 8 GPUs on NVLink/NVSwitch, 8 x 400 Gb/s InfiniBand NDR per node.

  Assumptions (not measured here): intra-node 350 GB/s per direction, the all-reduce bus
  bandwidth NCCL typically reaches on NVLink 4 (450 GB/s signalling per direction), 5 us per
  step; inter-node 8 NICs x ~45 GB/s achieved = 360 GB/s per node, 5 us. For one GPU
  (`devices_per_node` below 8) the NICs are assumed to stay shared by the node. Host: two
  56-core Intel Xeon Platinum 8480C, 112 cores per node (NVIDIA's DGX H200 datasheet).
  """
  return Cluster(nodes=nodes, devices_per_node=devices_per_node, device=device or h200(),
                 interconnect=Interconnect(intra_node_bandwidth=350e9, intra_node_latency=5e-6,
                                           inter_node_bandwidth=360e9, inter_node_latency=5e-6),
                 max_devices_per_node=8, name='dgx_h200', host_cores_per_node=112)


WORKLOADS = {'resnet50': resnet50, 'resnet20': resnet20}
DEVICES = {'k80': k80, 'v100': v100, 'h200': h200, 'cpu': cpu}
CLUSTERS = {'minotauro': minotauro, 'dgx_h200': dgx_h200}
# A cluster preset's own dataset (its epoch when --dataset_size is not given), with its source.
CLUSTER_DATASETS = {'minotauro': (MUSA2_TRAIN_IMAGES,
                                  "the seed paper's ANP training set, the minotauro preset's epoch")}
