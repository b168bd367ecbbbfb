#!/usr/bin/env python3
"""Input-pipeline benchmark on photo-like JPEGs: what each stage costs per core, and whether the
host can feed the model.

  .venv/bin/python experiments/input_benchmark.py [--images 600] [--short_sides 256,160] \\
      [--out FILE]
  .venv/bin/python experiments/input_benchmark.py --data_dir DIR --config_name NAME  # prepared

Without ``--data_dir`` it writes ``--images`` photo-like JPEGs of ``--width`` x ``--height`` px
at ``--quality`` (default 500 x 375 at 90, as the Flickr photos of MVSO), over 20 ANPs, and
prepares them with the `anp` builder three ways: as they are (``source``) and with the shorter
side at most each of ``--short_sides`` (``prepare --resize_short_side``). For every prepared
dataset it reports, with the paper config's 224 px Inception pipeline (random-resized crop +
flip + normalisation to bfloat16):

* per stage (read, decode, crop, decode_and_crop, resize, flip, normalise, batch,
  host_to_device): CPU microseconds per image and images/s per core, each stage timed alone on
  one core (`anp_jax.data.input_stages`);
* the training pipeline itself (`pipeline.train_dataset`, every core, AUTOTUNE): images/s and
  CPU core-seconds per image;
* the same, side by side, for each of ``--backends`` (``config.input_backend``): 'tf' (the host
  finishes the images), 'tf_device' (the host decodes only the crop window into a uint8 box, the
  device does the rest; its host stages read, window, decode_window, batch_box are timed too),
  'dali_cpu' (DALI's CPU decoder; needs requirements-dali.txt), and the host-cost ratio
  ``host_cost_ratio_tf_over_tf_device`` (core-seconds per image of 'tf' over 'tf_device').
  The device backends need a bounded stored size: the ``source`` copy (photos as they are) has
  none, and reports why.

Then, for the reference dataset (the first of ``--short_sides``, or ``--data_dir``), how fast a
model consumes images: ResNet-50 training on this CPU, and the performance model's predictions
for 8 K80, V100 and H200 devices per node, so the ratio says whether a node's CPUs can keep its
accelerators fed. The top-level ``pipeline_images_per_s`` / ``cpu_cores`` keys are those of the
reference dataset (`experiments/bench_gpu.sh` reads them).

Timings need a quiet machine: nothing else running, the files in the page cache (they are
written just before).
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

import json
import tempfile
import time

from absl import app, flags

from anp_jax import cli, runtime

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', None, 'A prepared `anp` dataset (default: generate photo-like '
                    'JPEGs and prepare them in a temporary directory).')
flags.DEFINE_string('config_name', None, 'The `anp` builder config of --data_dir.')
flags.DEFINE_integer('images', 600, 'Generated JPEGs (without --data_dir).')
flags.DEFINE_integer('stage_images', 1000, 'Images each stage is timed on (positions of the '
                     'training stream: more than the dataset holds read it again).')
flags.DEFINE_integer('width', 500, 'Width of the generated JPEGs.')
flags.DEFINE_integer('height', 375, 'Height of the generated JPEGs.')
flags.DEFINE_integer('quality', 90, 'JPEG quality of the generated photos (and of the '
                     'resized copies).')
flags.DEFINE_list('short_sides', ['256', '160'], 'Prepared copies with the shorter side at '
                  'most this many px, besides the photos as they are.')
flags.DEFINE_integer('batch', 64, 'Images per batch.')
flags.DEFINE_integer('batches', 30, 'Timed batches of the whole training pipeline.')
flags.DEFINE_integer('warmup', 5, 'Untimed batches first.')
flags.DEFINE_bool('stages', True, 'Time each stage alone (the per-core breakdown).')
flags.DEFINE_list('backends', ['tf', 'tf_device'], 'config.input_backend values whose training '
                  "pipelines are timed side by side ('tf', 'tf_device', 'dali_cpu').")
flags.DEFINE_bool('skip_model', False, 'Do not time ResNet-50 training on this CPU.')
flags.DEFINE_string('out', None, 'Also write the JSON result to this file (stdout also carries '
                    "the dataset preparation's messages).")


ANPS = 20  # ANP folders of the generated dataset.
# The input backends whose host cost the benchmark measures ('dali' decodes on a GPU: its host
# cost is the reader's, timed by bench_gpu.sh's loop, not here).
BACKENDS = ('tf', 'tf_device', 'dali_cpu')


def paper_config(data_dir: str, config_name: str):
  """The paper config's input settings on a prepared dataset, read by position from the files
  (``cache=False``, each process reading its own examples, as a real run on ~300k photos)."""
  from anp_jax.configs import musa2_resnet50
  config = musa2_resnet50.get_config()
  config.data_dir, config.anp.config_name = data_dir, config_name
  config.cache = False
  return config


def measure(data_dir: str, config_name: str, args, to_device) -> dict:
  """Stage costs, host-to-device cost and each backend's whole pipeline on one prepared
  dataset."""
  import numpy as np
  from anp_jax.data import input_stages, pipeline
  from anp_jax.data.anp import prepared
  from anp_jax.errors import ConfigError
  config = paper_config(data_dir, config_name)
  builder = pipeline.get_builder(config)
  split = builder.info.splits['train']
  out = {'config_name': builder.builder_config.name if builder.builder_config else config_name,
         'train_images': split.num_examples,
         'mean_stored_bytes': split.num_bytes / max(1, split.num_examples),
         'stored_short_side_max': prepared.stored_short_side(builder.data_dir)}
  try:
    box = pipeline.device_box(builder, config)
  except ConfigError as e:  # Photos at their source size: no device backend.
    box, out['device_backends_unavailable'] = None, str(e)
  out['box'] = box
  if args.stages:
    images = max(args.stage_images, args.batch)
    for backend, key, stages, total in (
        ('tf', 'stages', input_stages.TRAINING_STAGES, 'training_stages_cpu_us_per_image'),
        ('tf_device', 'device_stages', input_stages.DEVICE_TRAINING_STAGES,
         'device_training_stages_cpu_us_per_image')):
      if backend != 'tf' and (box is None or backend not in args.backends):
        continue
      out[key] = input_stages.stage_costs(builder, config, images, args.batch, backend=backend)
      batched = input_stages.stage_datasets(builder, config, min(images, 4 * args.batch),
                                            args.batch, backend)[stages[-1]]
      # The images' transfer: finished images ('tf') or uint8 boxes ('tf_device').
      batches = [np.asarray(b['image'] if isinstance(b, dict) else b) for b in batched]
      out[key]['host_to_device'] = input_stages.host_to_device_cost(batches, to_device)
      out[total] = sum(out[key][s]['cpu_us_per_image'] for s in (*stages, 'host_to_device'))
  out['pipelines'] = {}
  for backend in args.backends:
    if backend != 'tf' and box is None:
      out['pipelines'][backend] = {'unavailable': out['device_backends_unavailable']}
      continue
    out['pipelines'][backend] = input_stages.pipeline_cost(builder, config, args.batch,
                                                           args.batches, args.warmup, backend)
  out['pipeline'] = out['pipelines'].get('tf')
  both = [out['pipelines'].get(b, {}).get('cpu_us_per_image') for b in ('tf', 'tf_device')]
  if all(both):
    out['host_cost_ratio_tf_over_tf_device'] = both[0] / both[1]
  return out


def model_rate_cpu(batch: int = 8, steps: int = 3) -> float:
  """ResNet-50 training images/s on this CPU (jitted step, synthetic batch, after compile)."""
  import jax
  import jax.numpy as jnp
  from anp_jax import models, optim
  from anp_jax.steps import init_state, per_device_train_step
  from anp_jax.configs import musa2_resnet50
  config = musa2_resnet50.get_config()
  config.model.dtype = 'float32'
  config.bn_mode = 'global'
  model = models.create_model(config, models.Heads(553, 117, 167), axis_name=None)
  tx = optim.create_optimizer(config, optim.create_lr_schedule(config, 10, 100))
  state = init_state(model, tx, 224, 0)
  step = jax.jit(lambda s, b: per_device_train_step(
      s, b, model=model, tx=tx, config=config, accum_steps=1, num_devices=1, axis_name=None))
  b = {'image': jnp.zeros((batch, 224, 224, 3)), 'mask': jnp.ones(batch),
       **{k: jnp.zeros(batch, jnp.int32) for k in ('label_anp', 'label_adjective', 'label_noun')}}
  state, _ = step(state, b)
  jax.block_until_ready(state)
  t0 = time.perf_counter()
  for _ in range(steps):
    state, sums = step(state, b)
  jax.block_until_ready(sums)
  return steps * batch / (time.perf_counter() - t0)


def _usage_error(args) -> str:
  """What is wrong with the flags ('' if nothing), before any preparation or timing."""
  for flag, low in (('images', ANPS), ('batch', 1), ('batches', 1), ('warmup', 0),
                    ('width', 16), ('height', 16), ('stage_images', 1)):
    if getattr(args, flag) < low:
      return (f'--{flag}={getattr(args, flag)} is out of range: use an integer >= {low}'
              + (f' (one image per each of the {ANPS} generated ANPs).' if flag == 'images'
                 else '.'))
  if not 1 <= args.quality <= 100:
    return f'--quality={args.quality} is out of range: use an integer in [1, 100].'
  unknown = [b for b in args.backends or [] if b not in BACKENDS]
  if unknown or not args.backends:
    return (f'--backends={",".join(args.backends or [])}: give one or more of '
            f'{",".join(BACKENDS)}.')
  sides = args.short_sides or []
  if not all(s.isdigit() and int(s) >= 1 for s in sides):
    return f'--short_sides={",".join(sides)}: give whole numbers of pixels >= 1, e.g. 256,160.'
  if args.out is not None:
    message = cli.output_file_error('--out', args.out, 'JSON file', 'input_pipeline.json')
    if message:
      return message
  if args.data_dir is not None:
    if not args.data_dir:
      return ('--data_dir is empty: give a prepared `anp` dataset (or leave the flag out to '
              'generate one).')
    from anp_jax.data.anp import prepared
    try:  # The folder exists and holds the prepared config.
      args.data_dir = os.path.expanduser(args.data_dir)
      prepared.dataset_dir(args.data_dir, args.config_name)
    except (OSError, ValueError) as e:
      return f'--data_dir: {e}'
  return ''


def _table(variants: dict) -> str:
  """The per-core images/s of each stage of each backend's host path, and of each backend's
  whole pipeline, one column per prepared dataset."""
  names = list(variants)
  rate = lambda r: f"{r:10.0f}" if r else f"{'(<noise)':>10s}"  # noqa: E731
  lines = [f"{'images/s per core':24s}" + ''.join(f'{n:>10s}' for n in names)]
  for key, prefix in (('stages', ''), ('device_stages', 'tf_device: ')):
    stages = []
    for v in variants.values():
      stages += [s for s in v.get(key, {}) if s not in stages]
    for stage in stages:
      lines.append(f'{prefix + stage:24s}' + ''.join(
          rate(variants[n][key][stage]['images_per_s_per_core']) if stage in variants[n].get(
              key, {}) else f"{'-':>10s}" for n in names))
  backends = []
  for v in variants.values():
    backends += [b for b in v['pipelines'] if b not in backends]
  for backend in backends:
    lines.append(f"{'pipeline ' + backend:24s}" + ''.join(
        rate(variants[n]['pipelines'].get(backend, {}).get('images_per_s_per_core')) if
        'unavailable' not in variants[n]['pipelines'].get(backend, {}) else f"{'-':>10s}"
        for n in names))
  if any('host_cost_ratio_tf_over_tf_device' in v for v in variants.values()):
    lines.append(f"{'host cost tf / tf_device':24s}" + ''.join(
        f"{variants[n]['host_cost_ratio_tf_over_tf_device']:9.2f}x" if
        'host_cost_ratio_tf_over_tf_device' in variants[n] else f"{'-':>10s}" for n in names))
  return '\n'.join(lines)


def main(argv):
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  args = FLAGS
  message = _usage_error(args)  # Before TensorFlow and JAX are imported (seconds).
  if message:
    print(f'ERROR: {message}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  runtime.configure()  # XLA:CPU flags before JAX starts, TensorFlow off the GPU.
  import jax
  from anp_jax import executors
  from anp_jax.executors.common import MeshHelper
  # The trainer's transfer, to one device: the cost per image of a host's batch.
  to_device = MeshHelper(executors.make_mesh(jax.local_devices()[:1])).to_device
  cores = len(os.sched_getaffinity(0))
  variants = {}
  try:
    with tempfile.TemporaryDirectory() as tmp:
      if args.data_dir:
        variants['given'] = measure(args.data_dir, args.config_name, args, to_device)
      else:
        from anp_jax.data import anp, input_stages
        manual, data_dir = os.path.join(tmp, 'manual'), os.path.join(tmp, 'tfds')
        source = input_stages.write_photo_folder(manual, args.images, ANPS, args.height,
                                                 args.width, args.quality)
        for name, side in (('source', 0), *((s, int(s)) for s in args.short_sides)):
          prepared_name = anp.prepare(manual, data_dir, layout='folder', resize=side,
                                      jpeg_quality=args.quality).builder_config.name
          variants[name] = measure(data_dir, prepared_name, args, to_device)
          variants[name]['generated'] = dict(source, width=args.width, height=args.height,
                                             quality=args.quality)
  except (OSError, ValueError) as e:  # The dataset could not be read or prepared.
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  reference = 'given' if args.data_dir else (args.short_sides or ['source'])[0]
  first = variants[reference]['pipelines'][args.backends[0]]
  rate = first.get('images_per_s', float('nan'))
  result = {'pipeline_images_per_s': rate, 'pipeline_backend': args.backends[0],
            'cpu_cores': cores, 'pipeline_images_per_s_per_core': rate / cores,
            'batch': args.batch, 'reference': reference, 'variants': variants}
  for backend, cost in variants[reference]['pipelines'].items():
    if 'images_per_s' in cost:
      result[f'pipeline_images_per_s_{backend}'] = cost['images_per_s']
      result[f'cpu_us_per_image_{backend}'] = cost['cpu_us_per_image']
  if 'host_cost_ratio_tf_over_tf_device' in variants[reference]:
    result['host_cost_ratio_tf_over_tf_device'] = variants[reference][
        'host_cost_ratio_tf_over_tf_device']
  from anp_jax.research import perfmodel
  w = perfmodel.resnet50()
  for dev in ('k80', 'v100', 'h200'):
    cluster = perfmodel.Cluster(nodes=1, devices_per_node=8, device=perfmodel.DEVICES[dev](),
                                interconnect=perfmodel.minotauro_interconnect(),
                                max_devices_per_node=None)
    pred = perfmodel.predict(cluster, w, 32 if dev == 'k80' else 128)
    result[f'model_images_per_s_{dev}_x8_predicted'] = pred.images_per_s
    result[f'input_over_model_{dev}_x8'] = rate / pred.images_per_s
  if not args.skip_model:
    result['model_images_per_s_this_cpu'] = model_rate_cpu()
    result['input_over_model_this_cpu'] = rate / result['model_images_per_s_this_cpu']
  if args.stages:
    print(_table(variants))
  print(json.dumps(result, indent=2))
  if args.out:
    with open(os.path.expanduser(args.out), 'w') as f:
      json.dump(result, f, indent=2)
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
