"""Entry point: `python -m anp_jax.main --config=anp_jax/configs/default.py --workdir=DIR`.

Thin on purpose: flags → `distributed.initialize()` (before any other JAX call) →
`trainer.train_and_evaluate(config, workdir)`. Exit codes (`anp_jax.errors`): 0 done, 2 bad
config/input, 3 diverged (NaN/Inf loss), 75 preempted (checkpoint written; requeue).
"""

import os
import sys

from absl import app, flags, logging

from anp_jax import cli, distributed, preemption, runtime

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'Directory for logs, metrics and checkpoints.')
flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (explicit multi-process '
                    'mode; else ANP_COORDINATOR_ADDRESS or SLURM).')
flags.DEFINE_integer('num_processes', None, 'Processes of the job (explicit mode).')
flags.DEFINE_integer('process_id', None, 'This process (explicit mode).')
DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), 'configs', 'default.py')
cli.define_config_file('config', DEFAULT_CONFIG,
                                'Config file (ml_collections); override with --config.x=y.',
                                lock_config=True)
flags.mark_flags_as_required(['workdir'])


def main(argv):
  # First: a signal during the imports, the wait for the other processes or compilation still
  # gives a checkpoint (or, before step 1, a stop at step 1) and exit 75, not a killed process.
  preemption.install()
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  if not FLAGS.workdir.strip():  # '' would be the current directory (e.g. --workdir=$UNSET).
    print('ERROR: --workdir is empty: give the directory for the logs and checkpoints.',
          file=sys.stderr, flush=True)
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
  from anp_jax import errors, evaluators, trainer
  logging.info(distributed.identity_line())
  print(distributed.identity_line(), flush=True)
  try:
    result = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except errors.NonFiniteLossError as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return errors.EXIT_DIVERGED
  except (ValueError, OSError) as e:  # Bad config/input, unwritable workdir, disk full.
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return errors.EXIT_CONFIG
  if jax.process_index() == 0 and result.final_eval:
    print(f'Done in {result.wall_time_s / 60:.1f} min: '
          f'{evaluators.summary(FLAGS.config, result.final_eval)}. ' +
          (f'Results: {FLAGS.workdir}/eval_only_metrics.json' if FLAGS.config.eval_only else
           f'Logs: {FLAGS.workdir} (curves.png, metrics.jsonl, TensorBoard events, config.json, '
           'checkpoints/)'), flush=True)
  return 0


def run():
  # Flag errors (unknown or mistyped --config.x, missing config file) exit 2 with the fix.
  app.run(main,
          flags_parser=cli.absl_flags_parser('config', DEFAULT_CONFIG))


if __name__ == '__main__':
  run()
