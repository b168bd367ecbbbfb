"""Entry point: `.venv/bin/python -m anp_jax.main --config=anp_jax/configs/default.py
--workdir=DIR` (what ./run.sh runs).

Thin on purpose: flags → the GPU check (`anp_jax.accelerator`: a node with NVIDIA GPUs and a
CPU-only JAX exits 2 with the fix) → `distributed.initialize()` (before any other JAX call) →
`trainer.train_and_evaluate(config, workdir)`; ``--config.eval_only=True`` evaluates the latest
checkpoint instead, with the run's recorded config and the evaluation's own ``--config`` flags
(`trainer.recorded_evaluation_config`), printing the metrics (and writing them to
``--eval_output``). Exit codes (`anp_jax.errors`): 0 done, 2 bad config/input (or a workdir
another training job holds), 3 diverged (NaN/Inf loss or state), 75 preempted or stopped by
Ctrl-C (checkpoint written; requeue or rerun), 130 a second Ctrl-C (no checkpoint).
"""

import json
import os
import sys
import time

from absl import app, flags, logging

from anp_jax import accelerator, cli, distributed, preemption, runtime

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'Directory for logs, metrics and checkpoints.')
flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (explicit multi-process '
                    'mode; else ANP_COORDINATOR_ADDRESS or SLURM).')
flags.DEFINE_integer('num_processes', None, 'Processes of the job (explicit mode).')
flags.DEFINE_integer('process_id', None, 'This process (explicit mode).')
flags.DEFINE_string('eval_output', None, 'With --config.eval_only=True: also write the metrics '
                    'to this JSON file (the evaluation only reads the workdir; it writes nothing '
                    'there).')
DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), 'configs', 'default.py')
cli.define_config_file('config', DEFAULT_CONFIG,
                                'Config file (ml_collections); override with --config.x=y.',
                                lock_config=True)
flags.mark_flags_as_required(['workdir'])


def main(argv):
  # First: a signal during the imports, the wait for the other processes or compilation still
  # gives a checkpoint (or, before step 1, a stop at step 1) and exit 75, not a killed process.
  # Ctrl-C too (said as such, not as a preemption); a second one stops at once (`run`).
  preemption.install(ctrl_c=True)
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  if not FLAGS.workdir.strip():  # '' would be the current directory (e.g. --workdir=$UNSET).
    print('ERROR: --workdir is empty: give the directory for the logs and checkpoints.',
          file=sys.stderr, flush=True)
    return 2
  if FLAGS.eval_output is not None:  # Before any work: a bad path never costs the results.
    error = ('--eval_output needs --config.eval_only=True (a training run writes its metrics '
             'into --workdir).' if not FLAGS.config.eval_only else
             cli.output_file_error('--eval_output', FLAGS.eval_output, 'metrics file',
                                   'eval_metrics.json'))
    if error:
      print(f'ERROR: {error}', file=sys.stderr, flush=True)
      return 2
  # A GPU node whose environment has no CUDA JAX would train on its CPU without a word.
  if error := accelerator.unused_gpus_error():
    print(f'ERROR: {error}', file=sys.stderr, flush=True)
    return 2
  try:  # In a fraction of a second, before TensorFlow's import: bad topology, port taken.
    distributed.preflight(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  except (ValueError, RuntimeError) as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return 2
  runtime.configure()  # Before JAX starts its backend and TensorFlow runs anything.
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # orbax/TFDS INFO lines drown the progress bar.
  try:
    distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  except (ValueError, RuntimeError) as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return 2
  import jax  # noqa: F401  (after initialize)
  # CUDA JAX installed, but its backend did not start (a driver too old for it): JAX fell back
  # to the CPU with a warning that scrolls away.
  if error := accelerator.unused_gpus_error(jax.default_backend()):
    print(f'ERROR: {error}', file=sys.stderr, flush=True)
    return 2
  from anp_jax import errors, evaluators, reporting, trainer
  logging.info(distributed.identity_line())
  print(distributed.identity_line(), flush=True)
  config = FLAGS.config
  try:
    if config.eval_only:  # The run's recorded config, and the evaluation's own flags.
      config, line = trainer.recorded_evaluation_config(
          os.path.expanduser(FLAGS.workdir), config, FLAGS['config'].override_values)
      if line:
        reporting.say(line)
    result = trainer.train_and_evaluate(config, FLAGS.workdir)
  except errors.NonFiniteLossError as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return errors.EXIT_DIVERGED
  except (ValueError, OSError) as e:  # Bad config/input, unwritable workdir, disk full.
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return errors.EXIT_CONFIG
  if jax.process_index() == 0 and config.eval_only:
    metrics = {'workdir': os.path.abspath(os.path.expanduser(FLAGS.workdir)),
               'step': result.step, 'time': time.time(), **result.final_eval}
    print(f'Evaluated the checkpoint of step {result.step} in {FLAGS.workdir} in '
          f'{result.wall_time_s / 60:.1f} min: '
          f'{evaluators.summary(config, result.final_eval)}.\nResults: '
          f'{json.dumps(metrics, sort_keys=True)}', flush=True)
    if FLAGS.eval_output:
      reporting.write_json_atomic(os.path.expanduser(FLAGS.eval_output), metrics)
  elif jax.process_index() == 0 and result.final_eval:
    print(f'Done in {result.wall_time_s / 60:.1f} min: '
          f'{evaluators.summary(config, result.final_eval)}. Logs: {FLAGS.workdir} '
          '(curves.png, metrics.jsonl, TensorBoard events, config.json, checkpoints/)',
          flush=True)
  return 0


def run():
  # Flag errors (unknown or mistyped --config.x, missing config file) exit 2 with the fix.
  try:
    app.run(main,
            flags_parser=cli.absl_flags_parser('config', DEFAULT_CONFIG))
  except KeyboardInterrupt:  # A second Ctrl-C: no traceback, what it means.
    print('\nStopped at once (Ctrl-C twice), without a checkpoint of the last steps. Rerun the '
          'same command to resume from the latest checkpoint.', file=sys.stderr, flush=True)
    sys.exit(130)


if __name__ == '__main__':
  run()
