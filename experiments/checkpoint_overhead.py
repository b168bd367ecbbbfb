#!/usr/bin/env python3
"""Checkpoint save cost: time the training loop is blocked vs. the background write, per model.

  .venv/bin/python experiments/checkpoint_overhead.py --models resnet20,resnet50 --repeats 3

Builds the real `TrainState` (params, SGD momentum, BN statistics) of each model, saves it with
the same `Checkpointer` the trainer uses (async orbax), and reports the blocking time (what a
training step pays), the total time until the checkpoint is committed (the first save apart, and
the medians), and the size on disk. The state is replicated over this process's devices, e.g.
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` for 8 CPU devices.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

import json
import tempfile
import time

from absl import app, flags

from anp_jax import cli, models, runtime
from anp_jax.configs import default

FLAGS = flags.FLAGS
flags.DEFINE_list('models', ['resnet20', 'resnet50'], 'Models to checkpoint (anp_jax.models names).')
flags.DEFINE_integer('repeats', 3, 'Saves per model (the medians are reported).')


def measure(name: str, repeats: int, image_size: int, num_anps: int):
  import jax  # Here, not at the top: the flags are checked before these imports (seconds).
  from anp_jax import checkpointing, optim, steps
  config = default.get_config()
  config.model.name = name
  config.image_size = image_size
  config.optimizer = 'sgd'
  model = models.create_model(config, models.Heads(num_anps, 8, 8))
  tx = optim.create_optimizer(config, optim.create_lr_schedule(config, 10, 100))
  replicated = jax.sharding.NamedSharding(jax.make_mesh((jax.device_count(),), ('data',)),
                                          jax.sharding.PartitionSpec())  # As the trainer's.
  state = jax.jit(lambda: steps.init_state(model, tx, image_size, 0),
                  out_shardings=replicated)()
  jax.block_until_ready(state)
  rows = []
  with tempfile.TemporaryDirectory() as workdir:
    ckpt = checkpointing.Checkpointer(workdir, config)
    for step in range(1, repeats + 1):
      t0 = time.perf_counter()
      ckpt.save(step, state)
      blocking = time.perf_counter() - t0
      ckpt.wait()
      total = time.perf_counter() - t0
      rows.append((blocking, total))
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in
               os.walk(os.path.join(workdir, 'checkpoints', str(repeats))) for f in fs)
    ckpt.close()
  params = sum(x.size for x in jax.tree.leaves(state.params))
  return {'model': name, 'params': int(params), 'bytes_on_disk': size,
          'devices': jax.device_count(),
          # The first save of a process also pays for whatever orbax compiles (see
          # `checkpointing.single_writer_arrays`): reported apart from the medians.
          'first_blocking_s': rows[0][0], 'first_total_s': rows[0][1],
          'blocking_s_median': sorted(r[0] for r in rows)[len(rows) // 2],
          'total_s_median': sorted(r[1] for r in rows)[len(rows) // 2]}


def main(argv):
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  message = ''
  names = [n.strip() for n in FLAGS.models if n.strip()]
  unknown = [n for n in names if n not in models.NAMES]
  if not names:
    message = ('--models is empty: give comma-separated model names, one or more of '
               f'{", ".join(models.names())}.')
  elif unknown:
    message = (f'--models: unknown model(s) {", ".join(unknown)}; choose from '
               f'{", ".join(models.names())}.')
  elif FLAGS.repeats < 1:
    message = f'--repeats={FLAGS.repeats} is out of range: use an integer >= 1.'
  if message:
    print(f'ERROR: {message}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  runtime.configure()  # XLA:CPU flags before JAX starts, TensorFlow off the GPU.
  for name in names:
    size = models.spec(name).image_size  # The size the model is designed for.
    num = 553 if size >= 224 else 32
    print(json.dumps(measure(name, FLAGS.repeats, size, num)))
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
