"""Input-pipeline benchmark at 224 px: is the input the bottleneck?

  python experiments/input_benchmark.py [--data_dir DIR --config_name NAME] [--batches 30]

Without ``--data_dir`` it first writes a folder of photo-like JPEGs (``--images`` of 400x300 px
over 20 ANPs) and prepares it with the `anp` builder (shorter side 256, like a real preparation),
then times the *training* pipeline of the paper config (JPEG decode + Inception random-resized
crop + flip + normalisation in the tf.data graph, AUTOTUNE) for one process, after a warm-up.
It reports images/s, the CPU cores the process may use, and compares with how fast a model
consumes images: ResNet-50 training measured here on this CPU, and the performance model's
predictions for K80, V100 and H200 devices (8 per node), so the ratio says whether a node's CPUs
can keep its accelerators fed.
"""

import json
import os
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

from anp_jax import cli, runtime

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', None, 'A prepared `anp` dataset (default: generate a folder of '
                    'JPEGs and prepare it in a temporary directory).')
flags.DEFINE_string('config_name', None, 'The `anp` builder config of --data_dir.')
flags.DEFINE_integer('images', 600, 'Generated JPEGs (without --data_dir).')
flags.DEFINE_integer('batch', 64, 'Images per batch.')
flags.DEFINE_integer('batches', 30, 'Timed batches.')
flags.DEFINE_integer('warmup', 5, 'Untimed batches first.')
flags.DEFINE_bool('skip_model', False, 'Do not time ResNet-50 training on this CPU.')
flags.DEFINE_string('out', None, 'Also write the JSON result to this file (stdout also carries '
                    "the dataset preparation's messages).")


ANPS = 20  # ANP folders of the generated dataset.


def _write_folder(root: str, images: int, anps: int = ANPS):
  from PIL import Image
  rng = np.random.default_rng(0)
  names = [f'adj{a}_noun{a % 7}' for a in range(anps)]
  yy, xx = np.mgrid[0:300, 0:400] / 300.0
  for i in range(images):
    folder = os.path.join(root, names[i % anps])
    os.makedirs(folder, exist_ok=True)
    base = rng.uniform(0, 1, 3)
    img = (base + 0.4 * np.sin(xx[..., None] * rng.uniform(2, 9, 3) + yy[..., None] *
                               rng.uniform(2, 9, 3)) + rng.normal(0, 0.08, (300, 400, 3)))
    Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8)).save(
        os.path.join(folder, f'{i:05d}.jpg'), quality=90)


def pipeline_rate(data_dir: str, config_name: str, batch: int, batches: int, warmup: int):
  from anp_jax.configs import musa2_resnet50
  from anp_jax.data import pipeline
  config = musa2_resnet50.get_config()
  config.data_dir, config.anp.config_name = data_dir, config_name
  config.cache = True
  builder = pipeline.get_builder(config)
  ds = pipeline.train_dataset(builder, config, per_device_batch=batch, num_shards=1, shards=[0])
  it = iter(ds.as_numpy_iterator())
  for _ in range(warmup):
    next(it)
  t0 = time.perf_counter()
  for _ in range(batches):
    out = next(it)
  elapsed = time.perf_counter() - t0
  assert out['image'].shape == (batch, 224, 224, 3)
  return batches * batch / elapsed


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


def main(argv):
  runtime.configure()  # XLA:CPU flags before JAX starts, TensorFlow off the GPU.
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  args = FLAGS
  message = ''
  for flag, low in (('images', ANPS), ('batch', 1), ('batches', 1), ('warmup', 0)):
    if getattr(args, flag) < low:
      message = (f'--{flag}={getattr(args, flag)} is out of range: use an integer >= {low}'
                 + (f' (one image per each of the {ANPS} generated ANPs).' if flag == 'images'
                    else '.'))
      break
  if not message and args.out is not None:  # Before minutes of timing, not after.
    message = cli.output_file_error('--out', args.out, 'JSON file', 'input_pipeline.json')
  if not message and args.data_dir is not None:
    from anp_jax.data import anp
    if not args.data_dir:
      message = ('--data_dir is empty: give a prepared `anp` dataset (or leave the flag out to '
                 'generate one).')
    else:
      try:  # Before any timing: the folder exists and holds the prepared config.
        args.data_dir = os.path.expanduser(args.data_dir)
        anp.dataset_dir(args.data_dir, args.config_name)
      except (OSError, ValueError) as e:
        message = f'--data_dir: {e}'
  if message:
    print(f'ERROR: {message}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  cores = len(os.sched_getaffinity(0))
  try:
    with tempfile.TemporaryDirectory() as tmp:
      data_dir, name = args.data_dir, args.config_name
      if not data_dir:
        from anp_jax.data import anp
        manual, data_dir = os.path.join(tmp, 'manual'), os.path.join(tmp, 'tfds')
        _write_folder(manual, args.images)
        name = anp.prepare(manual, data_dir, layout='folder', resize=256).builder_config.name
      rate = pipeline_rate(data_dir, name, args.batch, args.batches, args.warmup)
  except (OSError, ValueError) as e:  # The dataset could not be read or prepared.
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  result = {'pipeline_images_per_s': rate, 'cpu_cores': cores,
            'pipeline_images_per_s_per_core': rate / cores, 'batch': args.batch}
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
  print(json.dumps(result, indent=2))
  if args.out:
    with open(os.path.expanduser(args.out), 'w') as f:
      json.dump(result, f, indent=2)
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
