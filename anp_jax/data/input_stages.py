"""The training input pipeline as separate stages, and what each costs in CPU time per image.

`experiments/input_benchmark.py` uses this to say where the host's time goes in the 224 px
Inception pipeline (`pipeline.train_dataset` with ``augment='inception'``), stage by stage:

  read             the encoded example, from its TFRecord file at its byte offset (the
                   ``config.cache=False`` path: each process reads only its own examples)
  decode           the whole JPEG (for reference: training decodes only the crop window)
  crop             the crop window sampled and cut out of the decoded image
  decode_and_crop  the window sampled from the JPEG header and only it decoded (what training
                   does instead of decode + crop)
  resize           bicubic to ``image_size`` x ``image_size``
  flip             left-right with probability 1/2
  normalise        (x / 255 - mean) / std, in the model's dtype
  batch            ``batch`` images into one array

and, side by side, the host's stages with ``config.input_backend='tf_device'`` (the device
resizes, flips and normalises; `anp_jax.data.windows`):

  read             as above
  window           the crop window, flip bit and geometry, from the JPEG header only
  decode_window    only the window decoded (``decode_and_crop_jpeg``)
  batch_box        ``batch`` windows into one uint8 array of ``box x box`` (zero padded)

Each stage is timed as the difference between two single-threaded tf.data pipelines that run
the same ops as training (the functions of `anp_jax.data.pipeline`), one ending before the stage
and one after it, in CPU seconds of the whole process (`time.process_time`), so the figure is
core-seconds per image whatever threads TensorFlow uses; ``images_per_s_per_core`` is its
inverse. A difference at or below zero (a stage cheaper than the timer's noise) is reported
as such (no rate). The ops run in graph mode end to end (`tf.data.Dataset.reduce`): no Python
per image and no copy out to numpy is counted.
"""

import io
import os
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

import ml_collections
import numpy as np
from anp_jax.tf_import import tf

from anp_jax.data import pipeline, windows

# Stage -> the stage whose pipeline it extends ('' = the positions alone).
STAGES = {'read': '', 'decode': 'read', 'crop': 'decode', 'decode_and_crop': 'read',
          'resize': 'decode_and_crop', 'flip': 'resize', 'normalise': 'flip',
          'batch': 'normalise'}
# The stages a training image passes through, in order (decode and crop are the reference
# for decode_and_crop).
TRAINING_STAGES = ('read', 'decode_and_crop', 'resize', 'flip', 'normalise', 'batch')
# The host's stages with ``config.input_backend='tf_device'`` (`anp_jax.data.windows`): read;
# the window, flip bit and geometry drawn from the JPEG header; the window decoded; the windows
# batched into the uint8 box. The rest is the device's.
DEVICE_STAGES = {'read': '', 'window': 'read', 'decode_window': 'window',
                 'batch_box': 'decode_window'}
DEVICE_TRAINING_STAGES = tuple(DEVICE_STAGES)
# The stage graph of each backend whose host stages are timed.
STAGE_GRAPHS = {'tf': STAGES, 'tf_device': DEVICE_STAGES}


def photo_like(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
  """An RGB uint8 image with a photo's kind of content for a JPEG coder: a smooth colour
  field, a few sharp-edged shapes, and texture whose power falls as 1/f² (as in natural
  images), so it compresses about as a photo does (a flat or purely random image would not)."""
  yy, xx = np.mgrid[0:height, 0:width] / max(height, width)
  corners = rng.uniform(0, 255, (2, 2, 3))
  img = ((1 - yy)[..., None] * ((1 - xx)[..., None] * corners[0, 0] + xx[..., None] *
                                corners[0, 1]) +
         yy[..., None] * ((1 - xx)[..., None] * corners[1, 0] + xx[..., None] * corners[1, 1]))
  for _ in range(rng.integers(3, 8)):
    cy, cx, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3)
    if rng.uniform() < 0.5:
      mask = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
    else:
      mask = (np.abs(yy - cy) < r) & (np.abs(xx - cx) < r * rng.uniform(0.3, 1.5))
    img[mask] = img[mask] * 0.3 + rng.uniform(0, 255, 3) * 0.7
  fy = np.fft.fftfreq(height)[:, None]
  fx = np.fft.rfftfreq(width)[None, :]
  amplitude = 1.0 / np.maximum(np.sqrt(fy * fy + fx * fx), 1.0 / max(height, width))
  for c in range(3):
    phase = rng.uniform(0, 2 * np.pi, amplitude.shape)
    texture = np.fft.irfft2(amplitude * np.exp(1j * phase), s=(height, width))
    img[..., c] += 18.0 * texture / (texture.std() + 1e-9)
  return np.clip(img, 0, 255).round().astype(np.uint8)


def write_photo_folder(root: str, images: int, anps: int, height: int, width: int,
                       quality: int, seed: int = 0) -> Dict[str, float]:
  """Writes `images` photo-like JPEGs (`height` x `width`, `quality`) into `anps` class folders
  ``root/adj<k>_noun<k % 7>/`` (the `anp` folder layout); returns their count and mean size."""
  from PIL import Image
  rng = np.random.default_rng(seed)
  names = [f'adj{a}_noun{a % 7}' for a in range(anps)]
  total = 0
  for i in range(images):
    folder = os.path.join(root, names[i % anps])
    os.makedirs(folder, exist_ok=True)
    out = io.BytesIO()
    Image.fromarray(photo_like(rng, height, width)).save(out, format='JPEG', quality=quality)
    with open(os.path.join(folder, f'{i:05d}.jpg'), 'wb') as f:
      f.write(out.getvalue())
    total += out.tell()
  return {'images': images, 'mean_bytes': total / images}


def _single_core_options() -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True
  options.threading.private_threadpool_size = 1
  options.threading.max_intra_op_parallelism = 1
  options.autotune.enabled = False
  options.experimental_optimization.map_parallelization = False
  options.experimental_optimization.inject_prefetch = False
  return options


def stage_datasets(builder, config, images: int, batch: int,
                   backend: str = 'tf') -> Dict[str, tf.data.Dataset]:
  """One single-threaded dataset per stage of `backend` (`STAGE_GRAPHS`; and '' for the
  positions alone), each running the training pipeline's ops up to and including that stage on
  the first `images` positions of the training stream (its global order: random access, as in
  training)."""
  records = pipeline.TrainRecords(builder, cache=False)
  size, seed = records.size, int(config.seed)
  dtype = pipeline.image_dtype(config)

  def locate(p):
    return p, pipeline.epoch_order(p // size, p % size, size=size, seed=seed)

  def seed_of(p):
    return pipeline.example_seed(p, seed)

  def then(ds, fn):
    return ds.map(pipeline._plain(fn))  # Sequential: one core.

  out = {'': tf.data.Dataset.range(images).map(pipeline._plain(locate))}
  out['read'] = then(records.read(out['']), lambda p, ex: (p, ex['image']))
  if backend == 'tf_device':
    box = pipeline.device_box(builder, config)
    out['window'] = then(out['read'], lambda p, data: (p, windows.train_plan(
        data, seed_of(p), size=config.image_size, box=box)))
    out['decode_window'] = then(out['read'], lambda p, data: windows.device_example(
        {'image': data, **{k: 0 for k in pipeline.LABEL_KEYS}}, train=True, config=config,
        box=box, seed=seed_of(p)))
    out['batch_box'] = windows.batch(out['decode_window'], batch, box)
    return {k: ds.with_options(_single_core_options()) for k, ds in out.items()}
  if backend != 'tf':
    raise ValueError(f'No stage graph for input_backend={backend!r}; one of {list(STAGE_GRAPHS)}.')
  out['decode'] = then(out['read'], lambda p, data: (
      p, tf.io.decode_image(data, channels=3, expand_animations=False)))
  out['crop'] = then(out['decode'], lambda p, image: (
      p, tf.slice(image, *pipeline.crop_window(tf.shape(image), seed_of(p)))))
  out['decode_and_crop'] = then(out['read'],
                                lambda p, data: (p, pipeline.decode_crop(data, seed_of(p))))
  out['resize'] = then(out['decode_and_crop'],
                       lambda p, image: (p, pipeline.resize_square(image, config.image_size)))
  out['flip'] = then(out['resize'], lambda p, image: (p, pipeline.flip(image, seed_of(p))))
  out['normalise'] = then(out['flip'], lambda p, image: (p, pipeline.normalize(image, dtype)))
  out['batch'] = out['normalise'].map(pipeline._plain(lambda p, image: image)).batch(
      batch, drop_remainder=True)
  return {k: ds.with_options(_single_core_options()) for k, ds in out.items()}


def cpu_seconds(ds: tf.data.Dataset) -> Tuple[float, float, int]:
  """Runs `ds` to its end in graph mode; returns (process CPU s, wall s, elements)."""
  def count(n, *_):
    return n + 1
  ds.reduce(tf.constant(0, tf.int64), count)  # Traced and run once first, untimed.
  cpu, wall = time.process_time(), time.perf_counter()
  n = int(ds.reduce(tf.constant(0, tf.int64), count))
  return time.process_time() - cpu, time.perf_counter() - wall, n


def stage_costs(builder, config, images: int, batch: int,
                timer: Callable[[tf.data.Dataset], Tuple[float, float, int]] = cpu_seconds,
                backend: str = 'tf') -> Dict[str, Dict[str, Optional[float]]]:
  """Per stage of `backend`'s host path: ``cpu_us_per_image`` (its pipeline's CPU time less the
  one it extends, per image) and ``images_per_s_per_core`` (its inverse; None when not above
  zero); also the ``cumulative_cpu_us_per_image`` of each stage's whole pipeline. Every
  pipeline runs twice (`timer`): the first pass traces it and warms the file cache, the second
  is timed."""
  if images < batch:
    raise ValueError(f'{images} images make no batch of {batch}.')
  graph = STAGE_GRAPHS[backend]
  batched = [stage for stage in graph if stage.startswith('batch')]
  per_image = {}
  for stage, ds in stage_datasets(builder, config, images, batch, backend).items():
    cpu, _, n = timer(ds)
    counted = n * batch if stage in batched else n
    if counted != (images // batch * batch if stage in batched else images):
      raise RuntimeError(f'The {stage or "positions"} pipeline gave {n} elements.')
    per_image[stage] = 1e6 * cpu / counted
  out = {}
  for stage, before in graph.items():
    cost = per_image[stage] - per_image[before]
    out[stage] = {'cpu_us_per_image': cost,
                  'images_per_s_per_core': 1e6 / cost if cost > 0 else None,
                  'cumulative_cpu_us_per_image': per_image[stage]}
  return out


def host_to_device_cost(batches: Sequence[np.ndarray], to_device: Callable,
                        ) -> Dict[str, Optional[float]]:
  """CPU time per image of handing host batches to the devices with `to_device` (the trainer's
  transfer, waited for), in the same units as `stage_costs`."""
  import jax
  jax.block_until_ready(to_device(batches[0]))  # Compiles / allocates once, untimed.
  cpu = time.process_time()
  for b in batches:
    jax.block_until_ready(to_device(b))
  cost = 1e6 * (time.process_time() - cpu) / sum(len(b) for b in batches)
  return {'cpu_us_per_image': cost, 'images_per_s_per_core': 1e6 / cost if cost > 0 else None}


def pipeline_cost(builder, config, batch: int, batches: int, warmup: int,
                  backend: str = 'tf') -> Dict[str, float]:
  """The training pipeline itself (`pipeline.train_dataset` with ``input_backend=backend``,
  all cores, AUTOTUNE) on one device: images/s, CPU core-seconds per image (process CPU time
  over the timed batches: DALI's threads included) and the bytes per image it hands over.

  'tf' yields finished images in the model's dtype; 'tf_device' uint8 windows in the box, left
  to the device; 'dali_cpu' the same, decoded by DALI's CPU decoder."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.input_backend = backend
  ds = pipeline.train_dataset(builder, config, per_device_batch=batch, num_shards=1, shards=[0])
  it = pipeline.global_batches(ds, lambda b: b) if backend.startswith('dali') else iter(ds)
  for _ in range(warmup):
    next(it)
  cpu, wall = time.process_time(), time.perf_counter()
  for _ in range(batches):
    out = next(it)
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
  image = np.asarray(out['image'])
  side = config.image_size if backend == 'tf' else pipeline.device_box(builder, config)
  if image.shape != (batch, side, side, 3):
    raise RuntimeError(f'The {backend} training pipeline gave batches of {image.shape}.')
  return {'images_per_s': batches * batch / wall,
          'cpu_us_per_image': 1e6 * cpu / (batches * batch),
          'images_per_s_per_core': batches * batch / cpu if cpu > 0 else None,
          'bytes_per_image': image.nbytes / batch, 'dtype': str(image.dtype)}
