"""Validate the performance model: measured vs. predicted here, and the seed paper's cluster.

  python experiments/perfmodel_validation.py --out workdirs/perfval           # full, <= 10 min
  python experiments/perfmodel_validation.py --out /tmp/perfval --quick       # CI-sized, < 1 min
  python experiments/perfmodel_validation.py --out DIR --parts paper          # model only, seconds

Experiment 1 ('cpu') times real `anp_jax.train` steps on 1, 2, 4 simulated CPU devices and on 2
processes over 127.0.0.1 (gloo), measures the all-reduce with a psum micro-benchmark, calibrates
the CPU device on ONE measured point and predicts every other point. Experiment 2 ('paper') puts
the seed paper's MinoTauro (4 K80 dies per node) into the model and compares with the published
speed-ups and times, with the presets and after fitting one stated knob. Writes DIR/results.json,
DIR/report.md, DIR/cpu_measured_vs_predicted.png and DIR/paper_speedup.png. See
`anp_jax.perfvalidation` for what is measured and assumed.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from anp_jax import perfvalidation, runtime  # noqa: E402


def _ints(text):
  try:
    values = [int(t) for t in text.split(',') if t.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f'expected comma-separated integers, got {text!r}') from None
  if not values or min(values) <= 0:
    raise argparse.ArgumentTypeError(f'expected positive integers, got {text!r}')
  return values


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--out', required=True, help='output directory')
  p.add_argument('--quick', action='store_true', help='tiny model, 2 batches, 1-2 devices')
  p.add_argument('--parts', default='cpu,paper', help='cpu, paper or both (comma-separated)')
  p.add_argument('--batches', type=_ints, help='global batches to measure')
  p.add_argument('--devices', type=_ints, help='simulated device counts (must include 1)')
  p.add_argument('--processes', type=int, help='processes of the loopback job (0 or 1: none)')
  p.add_argument('--calibration-batch', type=int,
                 help='1-device batch that calibrates the device (default 128; quick 32)')
  p.add_argument('--num-ps', type=int, default=1, help='parameter servers in experiment 2')
  p.add_argument('--fit-method', default='mixed',
                 choices=perfvalidation.FIT_METHODS,
                 help='method whose 16-node speed-up the transport-efficiency fit matches')
  p.add_argument('--timeout', type=float, default=900.0, help='seconds per measuring job')
  p.add_argument('--budget', type=float, default=None,
                 help='start no further measuring job after this many seconds')
  p.add_argument('--reuse', action='store_true',
                 help='keep earlier measure_*.json in --out taken with the same settings')
  args = p.parse_args(argv)
  try:
    results = perfvalidation.run_validation(
        args.out, quick=args.quick, parts=[x for x in args.parts.split(',') if x],
        batches=args.batches, devices=args.devices, processes=args.processes,
        calibration_batch=args.calibration_batch, num_ps=args.num_ps,
        fit_method=args.fit_method, timeout_s=args.timeout, reuse=args.reuse,
        budget_s=args.budget)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  for name, path in results['files'].items():
    print(f'{name}: {path}')
  return 0


if __name__ == '__main__':
  runtime.configure()
  sys.exit(main())
