#!/usr/bin/env python3
"""Training throughput, MFU and side-by-side ratios for a config (logic: anp_jax/benchmarking/;
the PyTorch contender: experiments/torch_reference.py).

  .venv/bin/python experiments/benchmark.py --config=anp_jax/configs/default.py \
      [--config.batch_size=128 --config.model.name=resnet18 ...] [--noloop] [--notorch]

Prints progress and a table and writes every figure as JSON (`--out`, default
``workdirs/benchmark.json`` in the checkout, git-ignored). anp_jax's XLA:CPU defaults
(`anp_jax/xla_flags.py`) apply as in training; `--nocpu_flags` times without them (the JSON's
`environment.xla_flags` says which flags were in effect).
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

from absl import app, flags

from anp_jax import cli, runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS
DEFAULT_CONFIG = os.path.join(ROOT, 'anp_jax', 'configs', 'default.py')
cli.define_config_file('config', DEFAULT_CONFIG,
                                'Config file; override fields with --config.x=y.',
                                lock_config=False)
flags.DEFINE_string('out', os.path.join(ROOT, 'workdirs', 'benchmark.json'),
                    'Where to write the JSON result.')
flags.DEFINE_integer('warmup', 2, 'Untimed steps per contender after compilation.')
flags.DEFINE_integer('windows', 5, 'Timed windows per contender (alternating contenders).')
flags.DEFINE_integer('steps_per_window', 3, 'Steps per timed window (dispatched asynchronously).')
flags.DEFINE_integer('loop_steps', 0, 'Timed steps of the full training loop (0: windows x '
                     'steps_per_window).')
flags.DEFINE_bool('loop', True, 'Also time trainer.train_and_evaluate (real input pipeline).')
flags.DEFINE_bool('reference', True, 'Also time a plain jax.jit + optax loop of the same model.')
flags.DEFINE_bool('torch', True, 'Also time PyTorch (CPU, float32) when it is installed.')
flags.DEFINE_bool('cpu_flags', True, "anp_jax's XLA:CPU defaults (anp_jax/xla_flags.py: "
                  'convolutions through Eigen instead of YNNPACK); --nocpu_flags: without them.')
flags.DEFINE_integer('peak_n', 0, 'Matmul size for the peak FLOP/s (0: 2048 CPU, 8192 GPU).')
flags.DEFINE_string('workdir', None, 'Workdir of the timed training loop (default: a temp '
                    'dir); must not hold a run already (the trainer would resume it): exit 2.')
flags.DEFINE_bool('flops_only', False, 'Instead: only count the FLOPs per image of the train '
                  'step (as written, and by XLA:CPU) and the forward pass; nothing is timed.')
flags.DEFINE_bool('scaling', False, 'Instead: run the bare step as 1 process x 1 device, 1 x 2 '
                  'simulated devices and 2 processes x 1 device (127.0.0.1), same global batch; '
                  'JSON per layout next to --out.')


def _progress(message: str):
  import jax
  if jax.process_index() == 0:
    print(f'benchmark | {message}', flush=True)


def _usage_error() -> str:
  """What is wrong with the flags (one line), or '' -- before anything is compiled or timed."""
  for name, low in (('windows', 1), ('steps_per_window', 1), ('warmup', 0), ('loop_steps', 0),
                    ('peak_n', 0)):
    if getattr(FLAGS, name) < low:
      return (f'--{name}={getattr(FLAGS, name)} is out of range: use an integer >= {low}'
              + (' (0: the default).' if name in ('loop_steps', 'peak_n') else '.'))
  if not FLAGS.out:  # Before FLAGS.out becomes an absolute path: '' would be the cwd.
    return '--out is empty: give the path of the JSON file to write.'
  if FLAGS.loop and FLAGS.workdir is not None:
    if not FLAGS.workdir:
      return ('--workdir is empty: give a directory for the training loop (or leave the flag '
              'out: a temporary directory).')
    workdir = os.path.expanduser(FLAGS.workdir)
    if os.path.exists(workdir) and not os.path.isdir(workdir):
      return f'--workdir={FLAGS.workdir} is a file, not a directory: pass a new or empty directory.'
  return ''


def main(argv):
  # The flags are checked before TensorFlow and JAX's modules are imported (seconds): a bad flag
  # is answered at once.
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  message = _usage_error()
  if message:
    print(f'ERROR: {message}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  FLAGS.out = os.path.abspath(os.path.expanduser(FLAGS.out))
  from anp_jax import benchmarking
  try:  # Before minutes of compiling and timing, not after: an --out folder that cannot be
    # made (e.g. under a file), a loop workdir that holds a run, a bad config.
    message = cli.output_file_error('--out', FLAGS.out, 'JSON file', 'benchmark.json')
    if message:
      raise ValueError(message)
    benchmarking.check_loop_workdir(FLAGS.workdir if FLAGS.loop else None)
    runtime.configure()  # XLA:CPU flags before JAX starts, TensorFlow off the GPU.
    if not FLAGS.cpu_flags:
      from anp_jax import xla_flags
      xla_flags.disable_cpu_defaults()  # Before JAX starts; inherited by --scaling's children.
    from anp_jax import setup
    setup.validate_config(FLAGS.config)
  except (ValueError, OSError) as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  from anp_jax import distributed
  import torch_reference  # This directory's PyTorch contender (imports anp_jax.models).
  if FLAGS.scaling:
    # scaling_runs drops --out and --scaling in every spelling (--out PATH with its value too).
    rows = benchmarking.scaling_runs(os.path.abspath(__file__), sys.argv[1:],
                                     os.path.splitext(FLAGS.out)[0] + '_scaling')
    benchmarking.write_json(rows, FLAGS.out)
    for name, r in rows.items():
      print(f"{name:14s} {r['images_per_s']:8.1f} images/s  step {1e3 * r['step_time_median_s']:7.1f}"
            f" ms  speed-up {r['speedup']:.2f}  efficiency {r['efficiency']:.2f}", flush=True)
    return 0
  distributed.initialize()  # Multi-process runs (ANP_* environment); nothing for one process.
  if FLAGS.flops_only:
    counts = benchmarking.flop_counts(FLAGS.config)
    benchmarking.write_json(counts, FLAGS.out)
    for key, value in counts.items():
      print(f'{key:34s} {value / 1e9:.3f} GFLOP' if 'flops' in key else f'{key:34s} {value}',
            flush=True)
    print(f'JSON: {FLAGS.out}', flush=True)
    return 0
  result = benchmarking.run_benchmark(
      FLAGS.config, warmup_steps=FLAGS.warmup, windows=FLAGS.windows,
      steps_per_window=FLAGS.steps_per_window, loop=FLAGS.loop,
      loop_steps=FLAGS.loop_steps or None, reference=FLAGS.reference,
      torch_compare=FLAGS.torch, torch_reference=torch_reference, peak_n=FLAGS.peak_n or None, workdir=FLAGS.workdir,
      progress=_progress)
  result['command'] = ' '.join(sys.argv)
  import jax
  if jax.process_index() > 0:  # Every process measured the same global step; one file each.
    FLAGS.out = f'{FLAGS.out}.process{jax.process_index()}'
  benchmarking.write_json(result, FLAGS.out)
  print(benchmarking.table(result), flush=True)
  print(f'JSON: {FLAGS.out}', flush=True)
  return 0


if __name__ == '__main__':
  app.run(main,
          flags_parser=cli.absl_flags_parser('config', DEFAULT_CONFIG))
