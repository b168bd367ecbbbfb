"""A SPRINT-style performance model of data-parallel ResNet training on a GPU cluster.

SPRINT (Oyama et al., IEEE BigData 2016; docs/references.md) predicts the time per step, the
throughput and, for asynchronous SGD, the distribution of gradient staleness and of the effective
mini-batch size from a handful of hardware and model parameters. This package does the same for
the training strategies compared in the seed paper (Campos et al., ICCS 2017 and CCGrid 2017:
ResNet-50 on MinoTauro, synchronous vs. asynchronous vs. mixed-asynchronous), so that
configurations can be compared, and a cluster sized, before anyone queues a job. One module per
concern, every public name re-exported here (``from anp_jax.research import perfmodel as pm``):

* `hardware`: `Device`, `Interconnect`, `Cluster`, `Workload`, validated on construction;
* `presets`: the workloads, devices and clusters with their sources (`WORKLOADS`, `DEVICES`,
  `CLUSTERS`);
* `costs`: bandwidth-latency (alpha-beta) all-reduce times (`ring_allreduce_time`,
  `hierarchical_allreduce_time`; `node_axis_allreduce_time`: local SGD's parameter average as the
  trainer does it) and `compute_time` of one forward+backward pass on one device;
* `analytic_async`: the closed form of asynchronous SGD's throughput and staleness distribution;
* `prediction`: `predict(cluster, workload, per_device_batch, method=...)`, a `Prediction` with
  step time, images/s, epoch time, speed-ups and, for the asynchronous methods, staleness
  statistics from the event simulation `anp_jax.staleness.simulate_async`;
* `input_stage`: `InputPipeline` (host core-seconds per image; presets `INPUT_PIPELINES` from
  the input benchmark's measurements, `from_benchmark` for any of its JSONs), what a node's
  cores can feed (`node_feed_rate`, `input_step_time`), the cores a device needs
  (`cores_per_device_needed`) and the planner's `input_warnings`;
* `search`: `rank_configurations` / `best_configuration`, nodes x devices per node x per-device
  batch for a target global batch, fastest epoch first;
* `workloads`: `workload_from_flax`, FLOPs and parameter bytes of a Flax model from XLA's cost
  analysis;
* `cluster_file`: `load_cluster`, a cluster preset or a JSON/YAML cluster file (the planner's
  ``--cluster`` too);
* `report`: `prediction_report`, what the command line
  ``.venv/bin/python -m anp_jax.research.perfmodel``
  (`__main__`) prints.

Units are SI throughout: bytes, seconds, FLOP (one multiply-add = 2 FLOP), bytes/s. The package is
pure Python + numpy; JAX is imported only inside `workload_from_flax`, and TensorFlow never.

What the model leaves out, so that its numbers are read as what they are: the input stage unless
asked for (`predict(..., input_pipeline=...)`), framework overheads beyond a fixed per-step cost (`Device.step_overhead_s`), network contention
with other jobs, and the convergence cost of large or stale batches (time to *accuracy* is
epochs-to-accuracy, from experiments, times the epoch time predicted here; the planner,
`anp_jax.research.planner`, joins the two).
"""

from anp_jax.research.perfmodel.analytic_async import AsyncAnalytic, analytic_async, total_variation
from anp_jax.research.perfmodel.cluster_file import ClusterFileError, load_cluster
from anp_jax.research.perfmodel.costs import (check_memory, compute_time, device_step_time,
                                              hierarchical_allreduce_time,
                                              node_axis_allreduce_time, ring_allreduce_time,
                                              ring_reduce_scatter_time)
from anp_jax.research.perfmodel.hardware import Cluster, Device, Interconnect, Workload
from anp_jax.research.perfmodel.input_stage import (DEFAULT_INPUT_PIPELINE, INPUT_PIPELINES,
                                                    InputPipeline, cores_per_device_needed,
                                                    from_benchmark, input_pipeline,
                                                    input_step_time, input_warnings,
                                                    node_feed_rate, synthetic_png64, tf_jpeg224)
from anp_jax.research.perfmodel.prediction import METHODS, Prediction, predict
from anp_jax.research.perfmodel.presets import (CIFAR10_TRAIN_IMAGES, CLUSTER_DATASETS, CLUSTERS,
                                                DEVICES, IMAGENET_TRAIN_IMAGES,
                                                MUSA2_TRAIN_IMAGES, WORKLOADS, cpu, dgx_h200, h200,
                                                k80, minotauro, minotauro_interconnect, resnet20,
                                                resnet50, v100)
from anp_jax.research.perfmodel.report import (format_duration, format_table, prediction_report,
                                               recalibrated_device)
from anp_jax.research.perfmodel.search import best_configuration, rank_configurations
from anp_jax.research.perfmodel.workloads import flax_workload, workload_from_flax
# The event simulation behind the asynchronous predictions lives in the core (the async executor
# samples its staleness too); re-exported because the model's users call it next to `predict`.
from anp_jax.staleness import AsyncSimResult, simulate_async, staleness_sampler

__all__ = [
    'AsyncAnalytic', 'AsyncSimResult', 'CIFAR10_TRAIN_IMAGES', 'CLUSTERS', 'CLUSTER_DATASETS',
    'Cluster', 'ClusterFileError', 'DEFAULT_INPUT_PIPELINE', 'DEVICES', 'Device', 'IMAGENET_TRAIN_IMAGES',
    'INPUT_PIPELINES', 'InputPipeline', 'Interconnect', 'METHODS', 'MUSA2_TRAIN_IMAGES',
    'Prediction', 'WORKLOADS', 'Workload', 'analytic_async', 'best_configuration',
    'check_memory', 'compute_time', 'cores_per_device_needed', 'cpu', 'device_step_time',
    'dgx_h200', 'flax_workload', 'format_duration', 'format_table', 'from_benchmark', 'h200',
    'hierarchical_allreduce_time', 'input_pipeline', 'input_step_time', 'input_warnings', 'k80',
    'load_cluster', 'minotauro', 'minotauro_interconnect', 'node_axis_allreduce_time', 'node_feed_rate',
    'predict', 'prediction_report', 'rank_configurations', 'recalibrated_device', 'resnet20',
    'resnet50', 'ring_allreduce_time', 'ring_reduce_scatter_time', 'simulate_async',
    'staleness_sampler', 'synthetic_png64', 'tf_jpeg224', 'total_variation', 'v100',
    'workload_from_flax',
]
