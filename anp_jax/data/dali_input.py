"""NVIDIA DALI decodes the windows (``config.input_backend='dali'``: on the GPU with nvJPEG,
and its hardware JPEG decoder where the GPU has one; ``'dali_cpu'``: DALI's CPU decoder).

Why DALI is fed by our own reader rather than DALI's TFRecord reader: everything but the decode
stays what tf.data already guarantees. tf.data (`anp_jax.data.pipeline`) reads each process's
examples of the global order by position, draws each window and flip bit from ``(seed,
position)`` (`anp_jax.data.windows`) and pads evaluation exactly; it hands DALI the encoded
bytes and the window. DALI decodes only the window (``fn.decoders.image_slice``: a region-of-
interest decode) and pads it into the ``box x box`` square, one pipeline per local device on
that device's examples; `anp_jax.data.device_input` then resizes, flips and normalises inside
the compiled step, as for 'tf_device'. So a step's examples, windows, flips, per-process
assignment and padded evaluation are those of 'tf' and 'tf_device' by construction, and
resuming needs nothing but the step. DALI's own readers and random ops would each need their
own sharding, shuffling and seeding to match.

The decode: DALI's CPU decoder with its fast integer IDCT is libjpeg-turbo as TensorFlow calls
it, so 'dali_cpu' gives the 'tf_device' images bit for bit (tested). nvJPEG on a GPU computes
its own IDCT: its pixels may differ from libjpeg's by a few levels (only measurable on a GPU;
``experiments/bench_gpu.sh`` reports it).

DALI is an optional dependency: ``pip install -r requirements-dali.txt``.
"""

import os
import threading
from typing import Any, Dict, Iterator, List

import jax
import numpy as np

from anp_jax.data import images
from anp_jax.errors import ConfigError

REQUIREMENTS = 'requirements-dali.txt'
# The decoder's settings that make its output libjpeg's as TensorFlow calls it: TensorFlow's
# default IDCT is libjpeg's fast integer one and it ignores EXIF orientation; fancy upsampling
# makes the GPU decoder upsample chroma as libjpeg does.
DECODER_OPTIONS = dict(output_type=None, axis_names='HW', normalized_anchor=False,
                       normalized_shape=False, use_fast_idct=True, adjust_orientation=False,
                       jpeg_fancy_upsampling=True)
# Batches each DALI pipeline decodes ahead.
PREFETCH = 2


def import_dali(backend: str):
  """The `nvidia.dali` module, or an ImportError saying how to install it."""
  try:
    import nvidia.dali  # noqa: F401
    from nvidia.dali import fn, pipeline_def, types  # noqa: F401
  except ImportError as e:
    raise ImportError(
        f'config.input_backend={backend!r} needs NVIDIA DALI, which is not installed here '
        f'({e}): pip install -r {REQUIREMENTS} (or use config.input_backend=\'tf_device\', '
        'which decodes on the host).') from e
  return nvidia.dali


def check_gpu(backend: str) -> None:
  """'dali' decodes on the GPU: refuse it (ConfigError) on a machine whose JAX has no GPU,
  naming the explicit CPU mode."""
  if backend == 'dali' and jax.local_devices()[0].platform != 'gpu':
    raise ConfigError(
        "config.input_backend='dali' decodes JPEGs on the GPU, and JAX sees no GPU here "
        f'(devices: {jax.local_devices()[0].platform}); use input_backend=\'dali_cpu\' for '
        "DALI's CPU decoder, or 'tf_device'.")


class _SharedBatches:
  """The host reader's batches in order, shared by the per-device DALI pipelines and the
  consumer: batch i is read when first asked for and dropped once each of its ``users`` has
  taken it (DALI asks ahead, from the thread that runs the pipelines)."""

  def __init__(self, iterator: Iterator[Dict[str, np.ndarray]], users: int):
    self._it, self._users = iterator, users
    self._lock = threading.Lock()
    self._held: Dict[int, List[Any]] = {}
    self._read = 0

  def take(self, i: int) -> Dict[str, np.ndarray]:
    with self._lock:
      while self._read <= i:
        self._held[self._read] = [next(self._it), self._users]  # StopIteration: the end.
        self._read += 1
      entry = self._held[i]
      entry[1] -= 1
      if not entry[1]:
        del self._held[i]
      return entry[0]


class DaliBatches:
  """The batches of a device-format tf.data reader (``encoded`` + ``window`` per example),
  decoded by DALI into uint8 boxes on each local device; iterate with `device_batches`
  (`pipeline.global_batches` does)."""

  def __init__(self, ds, config, *, box: int):
    self.backend = images.backend(config)
    import_dali(self.backend)
    check_gpu(self.backend)
    self.ds, self.box = ds, box

  def _pipeline(self, source, batch: int, device, threads: int):
    from nvidia.dali import fn, pipeline_def, types
    gpu = self.backend == 'dali'
    options = dict(DECODER_OPTIONS, output_type=types.RGB)

    @pipeline_def(batch_size=batch, num_threads=threads, prefetch_queue_depth=PREFETCH,
                  device_id=device.local_hardware_id if gpu else None)
    def decode():
      encoded, anchor, shape = fn.external_source(
          source=source, num_outputs=3, batch=True, batch_info=True,
          dtype=[types.UINT8, types.INT32, types.INT32])
      image = fn.decoders.image_slice(encoded, anchor, shape, device='mixed' if gpu else 'cpu',
                                      **options)
      return fn.pad(image, axis_names='HW', shape=[self.box, self.box], fill_value=0)

    pipe = decode()
    pipe.build()
    return pipe

  @staticmethod
  def _to_jax(output, device, copy: bool) -> jax.Array:
    """One pipeline's output batch as a JAX array on `device`, through DLPack: on a GPU the
    pipeline's own buffer on that GPU (copied when DALI may reuse it: its older executor), on
    the CPU the host buffer, then put on the (simulated) device."""
    array = jax.dlpack.from_dlpack(output.as_tensor())
    if copy:
      array = array.copy()
    return array if array.devices() == {device} else jax.device_put(array, device)

  def device_batches(self, to_device, prefetch: int = 2) -> Iterator[Dict[str, Any]]:
    """Global batches: the host reader's fields through `to_device` (the executor's
    transfer), the images from each device's DALI pipeline assembled into one array with the
    same sharding (`jax.make_array_from_single_device_arrays`). With the pmap executor (its
    `to_device` keeps host arrays; 'dali_cpu' only) the images are stacked on the host."""
    import tensorflow_datasets as tfds
    del prefetch  # DALI decodes PREFETCH batches ahead itself.
    host = iter(tfds.as_numpy(self.ds))
    try:
      first = next(host)
    except StopIteration:
      return
    n = len(first['mask'])
    fields = lambda b: {k: v for k, v in b.items() if k not in ('encoded', 'window')}  # noqa
    placed = to_device(fields(first))
    sharding = getattr(placed['mask'], 'sharding', None)
    if isinstance(sharding, jax.sharding.NamedSharding):
      devices = [d for d in sharding.mesh.devices.flat if d.process_index == jax.process_index()]
    else:  # pmap: the host batch is split over the local devices in the step.
      devices = jax.local_devices()
    if n % len(devices):
      raise ValueError(f'A batch of {n} examples does not split over {len(devices)} devices.')
    per_device = n // len(devices)

    def chained():
      yield first
      yield from host
    shared = _SharedBatches(chained(), users=len(devices) + 1)

    def source_for(d: int):
      def source(info):
        part = shared.take(info.iteration)
        rows = slice(d * per_device, (d + 1) * per_device)
        windows = part['window'][rows]
        return ([np.frombuffer(b, np.uint8) for b in part['encoded'][rows]],
                [np.ascontiguousarray(w[:2]) for w in windows],
                [np.ascontiguousarray(w[2:]) for w in windows])
      return source

    threads = max(1, min(8, len(os.sched_getaffinity(0)) // len(devices)))
    pipes = [self._pipeline(source_for(d), per_device, dev, threads)
             for d, dev in enumerate(devices)]
    mesh_arrays = isinstance(sharding, jax.sharding.NamedSharding)
    copy = not all(getattr(p, 'exec_dynamic', False) for p in pipes)
    i = 0
    while True:
      try:
        outputs = [pipe.run()[0] for pipe in pipes]
      except StopIteration:
        return
      meta = fields(shared.take(i))
      images = [self._to_jax(out, dev, copy) for out, dev in zip(outputs, devices, strict=True)]
      if mesh_arrays:
        batch = placed if i == 0 else to_device(meta)
        batch['image'] = jax.make_array_from_single_device_arrays(
            (per_device * sharding.mesh.size,) + images[0].shape[1:], batch['mask'].sharding,
            images)
      else:
        batch = to_device({**meta, 'image': np.concatenate([np.asarray(x) for x in images])})
      yield batch
      i += 1
