"""What the command line (``.venv/bin/python -m anp_jax.research.perfmodel``) prints:
`prediction_report`
maps its flags onto presets, recalibration and `predict` / `rank_configurations`, and formats the
table."""

import dataclasses
import math
import os
import re
from typing import Optional, Sequence

from anp_jax.research.perfmodel.analytic_async import total_variation
from anp_jax.research.perfmodel.cluster_file import load_cluster
from anp_jax.research.perfmodel.hardware import Device, Interconnect, Workload
from anp_jax.research.perfmodel.input_stage import input_pipeline as parse_input_pipeline
from anp_jax.research.perfmodel.prediction import Prediction, predict
from anp_jax.research.perfmodel.presets import CLUSTER_DATASETS, CLUSTERS, DEVICES, WORKLOADS
from anp_jax.research.perfmodel.search import rank_configurations
from anp_jax.research.perfmodel.workloads import flax_workload


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
  """A fixed-width text table of predictions, one row each ('comm' is the exposed part; with
  the input stage modelled, 'input [ms]' is the hosts' time per step and 'bound' what sets the
  step)."""
  with_input = any(p.bound != 'unmodelled' for p in predictions)
  header = ('nodes', 'devices', 'global batch', 'step [ms]', 'comm [ms]', 'img/s', 'epoch',
            'x 1 node', 'x 1 dev', 'efficiency', 'staleness') + (
                ('input [ms]', 'bound') if with_input else ())
  rows = [header]
  for p in predictions:
    rows.append((str(p.nodes), str(p.num_devices), str(p.global_batch),
                 f'{1e3 * p.step_time:,.2f}', f'{1e3 * p.exposed_comm_time:,.2f}',
                 f'{p.images_per_s:,.1f}',
                 format_duration(p.epoch_time), f'{p.speedup_vs_one_node:.2f}',
                 f'{p.speedup_vs_one_device:.2f}', f'{100 * p.efficiency:.1f} %',
                 f'{p.mean_staleness:.2f}') + (
                     (f'{1e3 * p.input_time:,.2f}', p.bound) if with_input else ()))
  widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
  lines = ['  '.join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
  lines.insert(1, '  '.join('-' * w for w in widths))
  return '\n'.join(lines)


def recalibrated_device(device, workload: Workload, *, peak_tflops: Optional[float] = None,
                        efficiency: Optional[float] = None, step_time_ms: Optional[float] = None,
                        measured_batch: Optional[int] = None,
                        step_overhead_ms: Optional[float] = None) -> Device:
  """The `DEVICES` preset ``device`` (or a `Device`, e.g. a cluster file's), recalibrated by a
  datasheet peak/efficiency or a measured step time of ``workload`` (``--step_time_ms`` at
  ``--measured_batch``), not both."""
  preset = DEVICES[device]() if isinstance(device, str) else device
  device = device if isinstance(device, str) else preset.name
  if step_time_ms is not None or measured_batch is not None:
    if step_time_ms is None or measured_batch is None:
      raise ValueError('--step_time_ms and --measured_batch go together: give the measured step '
                       'time and the batch it was measured at.')
    if peak_tflops is not None or efficiency is not None:
      raise ValueError('--step_time_ms replaces --peak_tflops/--efficiency; give one or the other.')
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
                      nodes: Optional[int] = None, gpus_per_node: Optional[int] = None,
                      device: Optional[str] = None,
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
                      seed: int = 0, input_pipeline: str = 'none',
                      host_cores_per_node: Optional[int] = None) -> str:
  """The prediction table ``.venv/bin/python -m anp_jax.research.perfmodel`` prints, with its
  header lines.

  The arguments are the command line's flags (bandwidths in GB/s, latencies in microseconds,
  times in ms). ``cluster`` is a preset (its links, with 16 nodes of 4 k80 devices unless
  ``nodes``, ``gpus_per_node``, ``device`` say otherwise) or a JSON/YAML cluster file, the
  planner's (`cluster_file.load_cluster`: its device, devices per node and node counts unless
  those arguments say otherwise). `predict` for each of ``sweep_nodes`` (default: ``nodes``, or
  a cluster file's node counts), or with ``target_global_batch`` the ten best of
  `rank_configurations`. ``input_pipeline`` (a preset
  of `input_stage.INPUT_PIPELINES`, an input_benchmark.py JSON[:BACKEND], or 'none') models the
  input stage on ``host_cores_per_node`` cores per node (default: the cluster preset's). Raises
  ValueError for unknown presets and impossible configurations.
  """
  for name, value, known in (('model', model, WORKLOADS), ('device', device, DEVICES)):
    if value is not None and value not in known:
      raise ValueError(f'--{name} {value!r} is unknown; choose one of {sorted(known)}.')
  from_file = cluster not in CLUSTERS
  if from_file and not os.path.isfile(os.path.expanduser(cluster)):
    raise ValueError(f'--cluster {cluster!r} is neither a preset ({sorted(CLUSTERS)}) nor a '
                     'JSON/YAML cluster file.')
  if from_file:
    file_cluster, file_counts = load_cluster(os.path.expanduser(cluster))
    nodes = file_cluster.nodes if nodes is None else nodes
    gpus_per_node = file_cluster.devices_per_node if gpus_per_node is None else gpus_per_node
    sweep_nodes = sweep_nodes or (None if nodes != file_cluster.nodes else file_counts)
  nodes = 16 if nodes is None else nodes
  gpus_per_node = 4 if gpus_per_node is None else gpus_per_node
  dataset_source = '--dataset_size'
  if dataset_size is None and cluster in CLUSTER_DATASETS:
    dataset_size, dataset_source = CLUSTER_DATASETS[cluster]
  kwargs = {} if dataset_size is None else {'dataset_size': dataset_size}
  if dataset_size is None:
    dataset_source = f'the {flax_model or model} default; set --dataset_size'
  workload = (flax_workload(flax_model, image_size, width, num_classes, **kwargs) if flax_model
              else WORKLOADS[model](**kwargs))
  calibration = dict(peak_tflops=peak_tflops, efficiency=efficiency,
                     step_time_ms=step_time_ms, measured_batch=measured_batch,
                     step_overhead_ms=step_overhead_ms)
  if from_file:
    base = dataclasses.replace(file_cluster, device=recalibrated_device(
        file_cluster.device if device is None else device, workload, **calibration))
  else:
    base = CLUSTERS[cluster](device=recalibrated_device(device or 'k80', workload, **calibration))
  ic = base.interconnect
  ic = Interconnect(
      intra_node_bandwidth=ic.intra_node_bandwidth if intra_bw is None else intra_bw * 1e9,
      intra_node_latency=ic.intra_node_latency if intra_lat is None else intra_lat * 1e-6,
      inter_node_bandwidth=ic.inter_node_bandwidth if inter_bw is None else inter_bw * 1e9,
      inter_node_latency=ic.inter_node_latency if inter_lat is None else inter_lat * 1e-6)
  node_counts = list(sweep_nodes or [nodes])
  the_cluster = dataclasses.replace(
      base, nodes=max(node_counts), devices_per_node=gpus_per_node, interconnect=ic,
      devices_per_compute_pool=devices_per_compute_pool,
      host_cores_per_node=host_cores_per_node or base.host_cores_per_node)
  pipeline = parse_input_pipeline(input_pipeline)
  predict_kwargs = dict(method=method, overlap=overlap, num_ps=num_ps, local_steps=local_steps,
                        async_worker=async_worker, mixed_mode=mixed_mode, sync_comm=sync_comm,
                        ps_merge=ps_merge, compute_cv=compute_cv, seed=seed,
                        input_pipeline=pipeline)
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
  native = file_cluster.device.name if from_file else CLUSTERS[cluster]().device.name
  device = device or (native if from_file else 'k80')
  where = (the_cluster.name if device == native and step_time_ms is None else
           f"{the_cluster.name}'s links with {device} devices")
  lines = [
      f'{workload.name}: {workload.flops_per_image_fwd / 1e9:.3g} GFLOP/image forward, '
      f'{workload.param_bytes / 1e6:.1f} MB parameters, {workload.dataset_size:,} images/epoch '
      f'({dataset_source})',
      f'{where}: {the_cluster.device.name} x {gpus_per_node}/node; intra '
      f'{ic.intra_node_bandwidth / 1e9:.1f} GB/s, {ic.intra_node_latency * 1e6:.1f} us; inter '
      f'{ic.inter_node_bandwidth / 1e9:.1f} GB/s, {ic.inter_node_latency * 1e6:.1f} us',
      f'method: {_method_line(predictions, widest)}; overlap {overlap:g}']
  if pipeline is not None:
    cores = the_cluster.host_cores_per_node
    lines.append(f'input: {pipeline.name}, {pipeline.images_per_s_per_core:,.0f} images/s per '
                 f'core ({pipeline.source}); {cores} host cores per node feed '
                 f'{cores * pipeline.images_per_s_per_core:,.0f} images/s per node, '
                 f'{cores / gpus_per_node:.3g} cores per device')
  lines.append(format_table(predictions))
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
