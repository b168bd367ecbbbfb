"""Predict data-parallel training performance (SPRINT-style model) from the command line.

  .venv/bin/python -m anp_jax.research.perfmodel --model=resnet50 --cluster=minotauro --device=k80 \
      --per_device_batch=32 --sweep_nodes=1,2,4,8,16
  .venv/bin/python -m anp_jax.research.perfmodel --cluster=my_cluster.yaml --per_device_batch=64
  .venv/bin/python -m anp_jax.research.perfmodel --flax_model=resnet20 --image_size=16 --width=0.5 \
      --device=cpu --step_time_ms=100 --measured_batch=64 --nodes=1 --gpus_per_node=1

Prints the workload, the cluster, the method and a table of predictions (seconds to the epoch,
speed-ups, staleness); impossible configurations exit 2 with the reason. The model and the table
are `anp_jax.research.perfmodel` (`report.prediction_report`); this file only maps flags onto it,
each flag the argument of the same name. Reference page: docs/performance-model.md.
"""

import inspect
import sys

from absl import app, flags

from anp_jax import cli, runtime
from anp_jax.research import perfmodel as pm

FLAGS = flags.FLAGS
flags.DEFINE_enum('model', 'resnet50', sorted(pm.WORKLOADS), 'Workload preset.')
flags.DEFINE_string('flax_model', None, 'Instead of --model: count FLOPs and parameters of '
                    'anp_jax.models ARCH (resnet8 ... resnet152) with XLA cost analysis '
                    '(imports JAX).')
flags.DEFINE_integer('image_size', 224, 'With --flax_model.')
flags.DEFINE_float('width', 1.0, 'With --flax_model: channel multiplier.')
flags.DEFINE_integer('num_classes', 553, "With --flax_model: ANP classes (553: MUSA2's ANPs).")
flags.DEFINE_integer('dataset_size', None, "Training images per epoch (default: the preset's "
                     'dataset).')
flags.DEFINE_string('cluster', 'minotauro', f'A cluster preset ({", ".join(sorted(pm.CLUSTERS))}: '
                    'its links) or a JSON/YAML cluster file, as the planner takes '
                    '(docs/planner.md: its device, devices per node and node counts).')
flags.DEFINE_integer('nodes', None, 'Nodes (default: 16, or the cluster file\'s).')
flags.DEFINE_integer('gpus_per_node', None, 'Devices per node (default: 4, or the cluster '
                     "file's).")
flags.DEFINE_enum('device', None, sorted(pm.DEVICES), "Device preset (default: k80, or the "
                  "cluster file's device).")
flags.DEFINE_float('peak_tflops', None, "Override the device's peak, TFLOP/s (with --efficiency).")
flags.DEFINE_float('efficiency', None, "Override the device's achieved fraction of peak, in "
                   '(0, 1].')
flags.DEFINE_float('step_time_ms', None, 'Calibrate the device with a measured training step '
                   'time (ms) of --model at --measured_batch images on one device (replaces '
                   'peak/efficiency).')
flags.DEFINE_integer('measured_batch', None, 'Images per step of --step_time_ms.')
flags.DEFINE_float('step_overhead_ms', None, "Fixed per-step cost in ms (default: the preset's; "
                   '0 with --step_time_ms).')
flags.DEFINE_integer('devices_per_compute_pool', 1, 'Devices that share one pool of cores '
                     '(simulated CPU devices: all of them).')
flags.DEFINE_integer('per_device_batch', 32, 'Images per device per step.')
flags.DEFINE_enum('method', 'sync', pm.METHODS, 'Training method.')
flags.DEFINE_enum('sync_comm', 'allreduce', ('allreduce', 'ps'), 'Synchronous communication.')
flags.DEFINE_enum('async_worker', 'device', ('device', 'node'), 'What one async worker is.')
flags.DEFINE_enum('mixed_mode', 'async', ('async', 'local_sgd'), 'Across nodes, for mixed.')
flags.DEFINE_integer('local_steps', 1, 'Local steps between averages (local SGD).')
flags.DEFINE_float('intra_bw', None, 'Intra-node bandwidth, GB/s.')
flags.DEFINE_float('inter_bw', None, 'Inter-node bandwidth per node, GB/s.')
flags.DEFINE_float('intra_lat', None, 'Intra-node latency, microseconds.')
flags.DEFINE_float('inter_lat', None, 'Inter-node latency, microseconds.')
flags.DEFINE_float('overlap', 0.0, 'Fraction of communication hidden behind the backward pass.')
flags.DEFINE_integer('num_ps', 1, 'Parameter servers.')
flags.DEFINE_bool('ps_merge', False, "SPRINT's gradient-merging server.")
flags.DEFINE_float('compute_cv', 0.1, 'Coefficient of variation of a worker step time (async).')
cli.define_positive_ints('sweep_nodes', None, 'N1,N2,...: predict for each node count (default: '
                         'just --nodes).')
flags.DEFINE_integer('target_global_batch', None, 'Search nodes x devices x per-device batch for '
                     'this global batch.')
flags.DEFINE_bool('exact', False, 'With --target_global_batch: the global batch must equal the '
                  'target.')
flags.DEFINE_integer('seed', 0, 'Seed of the asynchronous simulation.')
flags.DEFINE_string('input_pipeline', 'none', 'The input stage: a preset (tf_jpeg224: the paper '
                    'pipeline on tf.data as measured on the H200 machine; synthetic_png64), an '
                    'experiments/input_benchmark.py JSON (PATH.json[:BACKEND], e.g. '
                    ':tf_device), or none (the input is free).')
flags.DEFINE_integer('host_cores_per_node', None, "CPU cores per node preparing the input "
                     "(default: the cluster preset's).")


def main(argv) -> int:
  runtime.configure(tensorflow=False)  # XLA:CPU flags before JAX starts.
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  # Every argument of `prediction_report` is the flag of the same name.
  options = {name: FLAGS[name].value
             for name in inspect.signature(pm.prediction_report).parameters}
  try:
    print(pm.prediction_report(**options))
  except ValueError as e:
    print(f'ERROR: {e}', file=sys.stderr)
    return cli.EXIT_USAGE
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
