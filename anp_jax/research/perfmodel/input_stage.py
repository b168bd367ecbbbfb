"""The input stage: whether a node's host cores can prepare images as fast as its devices train.

A training input pipeline costs the host a fixed number of CPU core-seconds per image (read,
decode, crop, resize, ..., what `experiments/input_benchmark.py` measures as process CPU time
per image). A node with ``host_cores_per_node`` cores (`hardware.Cluster`) can therefore feed at
most ``host_cores_per_node / core_seconds_per_image`` images/s, shared by its devices; the input
runs ahead of the step (prefetch), so a step takes the longer of the device's step and the host's
time to prepare its images (`input_step_time`; `prediction.predict` applies it when given an
`InputPipeline`). `cores_per_device_needed` is the inverse question: how many cores each device
needs for a given step time. `input_warnings` is what the planner prints.

Presets (`INPUT_PIPELINES`) are measurements, each with its source; `from_benchmark` reads any
``input_benchmark.py`` JSON (e.g. a measurement of ``input_backend='tf_device'``, not yet made on
a quiet machine: see docs/input-pipeline.md).
"""

import dataclasses
import json
from typing import Dict, Iterable, List, Optional, Tuple

from anp_jax.research.perfmodel.hardware import Cluster
from anp_jax.staleness import require_positive


@dataclasses.dataclass(frozen=True)
class InputPipeline:
  """A training input pipeline's host cost: ``core_seconds_per_image`` CPU core-seconds per
  training image (all of its stages, as the whole pipeline runs them). ``image_size`` (None:
  unknown): the side of the images it produced, the workloads it applies to."""
  name: str
  core_seconds_per_image: float
  source: str = ''
  image_size: Optional[int] = None

  def __post_init__(self):
    require_positive(f'InputPipeline({self.name!r})', 'core_seconds_per_image',
                     self.core_seconds_per_image)

  @property
  def images_per_s_per_core(self) -> float:
    return 1.0 / self.core_seconds_per_image


def tf_jpeg224() -> InputPipeline:
  """The paper config's training input on tf.data, ``input_backend='tf'``: 224 px random-resized
  crop + flip of JPEGs, decoded, resized and normalised on the host.

  234 images/s per core: 3,744 images/s on the 16 vCPUs of the H200 machine, one process, 1,000
  photo-like 400 x 300 JPEGs prepared at shorter side 256, batch 128
  (`experiments/results/bench_gpu_h200/input_pipeline.json`, 2026-12-04: images/s over the
  machine's cores, every core busy). It predates the pipeline's bfloat16 cast (+15 % per core on
  the 2-core CPU machine), which makes it conservative for a bfloat16 model.
  """
  return InputPipeline(name='tf_jpeg224', core_seconds_per_image=16 / 3744.2094630586994,
                       source='experiments/results/bench_gpu_h200/input_pipeline.json',
                       image_size=224)


def synthetic_png64() -> InputPipeline:
  """The generated ``synthetic_anp`` set's pipeline as `experiments/bench_gpu.sh`'s training
  loop ran it: 64 px PNGs resized to 224 px with the cifar augmentation, batch 256. 302 images/s
  per core on the H200 machine's 16 vCPUs
  (`experiments/results/bench_gpu_h200/synthetic_pipeline.json`)."""
  return InputPipeline(name='synthetic_png64', core_seconds_per_image=1 / 302.0,
                       source='experiments/results/bench_gpu_h200/synthetic_pipeline.json',
                       image_size=224)


INPUT_PIPELINES = {'tf_jpeg224': tf_jpeg224, 'synthetic_png64': synthetic_png64}
# What the planner checks a cluster against: the paper's pipeline as measured.
DEFAULT_INPUT_PIPELINE = 'tf_jpeg224'


def from_benchmark(path: str, backend: str = 'tf') -> InputPipeline:
  """The `InputPipeline` an ``experiments/input_benchmark.py`` JSON measured for
  ``config.input_backend=backend`` on its reference dataset: its process CPU time per image; a
  JSON of the older format (images/s on all cores only) counts every core as busy."""
  with open(path) as f:
    result = json.load(f)
  variant = result.get('variants', {}).get(result.get('reference'), {})
  measured = variant.get('pipelines', {}).get(backend, {})
  if 'cpu_us_per_image' in measured:
    seconds = measured['cpu_us_per_image'] * 1e-6
  elif backend == 'tf' and 'pipeline_images_per_s' in result and 'cpu_cores' in result:
    seconds = result['cpu_cores'] / result['pipeline_images_per_s']
  else:
    raise ValueError(f'{path} has no measurement of input_backend={backend!r} '
                     f'(it has: {sorted(variant.get("pipelines", {})) or ["tf"]}).')
  return InputPipeline(name=f'{backend} ({path})', core_seconds_per_image=seconds, source=path)


def input_pipeline(spec: str) -> Optional[InputPipeline]:
  """A preset name, ``PATH.json`` or ``PATH.json:BACKEND`` (`from_benchmark`), or 'none'."""
  if spec in ('', 'none'):
    return None
  if spec in INPUT_PIPELINES:
    return INPUT_PIPELINES[spec]()
  path, _, backend = spec.partition(':') if not spec.endswith('.json') else (spec, '', '')
  if not path.endswith('.json'):
    raise ValueError(f'input pipeline {spec!r}: give a preset ({sorted(INPUT_PIPELINES)}), an '
                     'input_benchmark.py JSON (PATH.json[:BACKEND]) or none.')
  return from_benchmark(path, backend or 'tf')


def node_feed_rate(cluster: Cluster, pipeline: InputPipeline) -> Optional[float]:
  """Images/s one node's host cores can prepare (None: the cluster's cores are unknown)."""
  if cluster.host_cores_per_node is None:
    return None
  return cluster.host_cores_per_node * pipeline.images_per_s_per_core


def input_step_time(cluster: Cluster, pipeline: InputPipeline,
                    per_device_batch: int) -> Optional[float]:
  """Seconds a node's cores need to prepare one step's images for all of its devices."""
  rate = node_feed_rate(cluster, pipeline)
  return None if rate is None else cluster.devices_per_node * per_device_batch / rate


def cores_per_device_needed(pipeline: InputPipeline, images_per_s_per_device: float) -> float:
  """Host cores each device needs to be fed ``images_per_s_per_device``."""
  return images_per_s_per_device * pipeline.core_seconds_per_image


def input_warnings(cluster: Cluster, configurations: Iterable[Tuple[str, float]],
                   pipeline: Optional[InputPipeline] = None,
                   image_size: Optional[int] = None) -> List[str]:
  """One line when the cluster's cores per device cannot feed some configurations'
  ``(label, images/s per device)`` with `pipeline` (default: `DEFAULT_INPUT_PIPELINE`); [] when
  they all can, when the cluster's host cores are unknown, or when the workload's images
  (`image_size`, e.g. a 16 px pilot's) are not those the pipeline was measured on: its cost per
  image says nothing about them."""
  pipeline = pipeline or INPUT_PIPELINES[DEFAULT_INPUT_PIPELINE]()
  if cluster.host_cores_per_node is None:
    return []
  if image_size and pipeline.image_size and image_size != pipeline.image_size:
    return []
  have = cluster.host_cores_per_node / cluster.devices_per_node
  short: Dict[str, float] = {}
  for label, rate in configurations:
    need = cores_per_device_needed(pipeline, rate)
    if need > have:
      short[label] = need
  if not short:
    return []
  worst = max(short, key=short.get)
  return [f'{cluster.name}: {cluster.host_cores_per_node} host cores per node = {have:.3g} per '
          f'device cannot feed {len(short)} configuration(s) with the {pipeline.name} input '
          f'({pipeline.images_per_s_per_core:.0f} images/s per core): their step times assume '
          f'up to {short[worst]:.3g} cores per device ({worst}), so the input, not the device, '
          'bounds them. Decode on the device (config.input_backend=\'tf_device\' or \'dali\'), '
          'store smaller photos (prepare --resize_short_side), or give fewer devices per node.']
