#!/usr/bin/env python3
"""Validate the performance model: measured vs. predicted here, and the seed paper's cluster.

  .venv/bin/python experiments/perfmodel_validation.py --out workdirs/perfval       # full, <= 10 min
  .venv/bin/python experiments/perfmodel_validation.py --out /tmp/perfval --quick   # CI-sized, < 1 min
  .venv/bin/python experiments/perfmodel_validation.py --out DIR --parts paper      # model only, seconds

Experiment 1 ('cpu') times real `anp_jax.trainer` steps on 1, 2, 4 simulated CPU devices and on 2
processes over 127.0.0.1 (gloo), measures the all-reduce with a psum micro-benchmark, calibrates
the CPU device on ONE measured point and predicts every other point. Experiment 2 ('paper') puts
the seed paper's MinoTauro (4 K80 dies per node) into the model and compares with the published
speed-ups and times, with the presets and after fitting one stated knob. Writes DIR/results.json,
DIR/report.md, DIR/cpu_measured_vs_predicted.png and DIR/paper_speedup.png. See
`anp_jax.research.perfvalidation` for what is measured and assumed, and
`perfmodel_validation_lib.py` (next to this file) for this machine's jobs and the report.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

from absl import app, flags

import perfmodel_validation_lib as validation
from anp_jax import cli, runtime
from anp_jax.research import perfvalidation

FLAGS = flags.FLAGS
flags.DEFINE_string('out', None, 'Output directory.', required=True)
flags.DEFINE_bool('quick', False, 'Tiny model, 2 batches, 1-2 devices.')
flags.DEFINE_string('parts', 'cpu,paper', 'cpu, paper or both (comma-separated).')
cli.define_positive_ints('batches', None, 'Global batches to measure.')
cli.define_positive_ints('devices', None, 'Simulated device counts (must include 1).')
flags.DEFINE_integer('processes', None, 'Processes of the loopback job (0 or 1: none).')
flags.DEFINE_integer('calibration_batch', None, '1-device batch that calibrates the device '
                     '(default 128; quick 16).')
flags.DEFINE_integer('num_ps', 1, 'Parameter servers in experiment 2.')
flags.DEFINE_enum('fit_method', 'mixed', perfvalidation.FIT_METHODS,
                  "Method whose 16-node speed-up the transport-efficiency fit matches.")
flags.DEFINE_float('timeout', 900.0, 'Seconds per measuring job.')
flags.DEFINE_float('budget', None, 'Start no further measuring job after this many seconds.')
flags.DEFINE_bool('reuse', False, 'Keep earlier measure_*.json in --out taken with the same '
                  'settings.')


def main(argv) -> int:
  # XLA:CPU flags for the measuring jobs (they inherit the environment). This process only
  # launches them and writes the report: it never imports TensorFlow (a bad setting fails in
  # well under a second, not after TensorFlow's ~5 s import).
  runtime.configure(tensorflow=False)
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  try:
    results = validation.run_validation(
        FLAGS.out, quick=FLAGS.quick, parts=[x for x in FLAGS.parts.split(',') if x],
        batches=FLAGS.batches, devices=FLAGS.devices,
        processes=FLAGS.processes, calibration_batch=FLAGS.calibration_batch,
        num_ps=FLAGS.num_ps, fit_method=FLAGS.fit_method,
        timeout_s=FLAGS.timeout, reuse=FLAGS.reuse, budget_s=FLAGS.budget)
  except (ValueError, OSError) as e:  # Bad flags, or an --out that cannot be written.
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  for name, path in results['files'].items():
    print(f'{name}: {path}')
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.absl_flags_parser())
