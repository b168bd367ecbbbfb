"""Time-to-accuracy planner: which batch size, sync or async, how many nodes.

  python -m anp_jax.plan --pilot workdirs/pilot --target 0.25 --cluster minotauro --out plan/
  python -m anp_jax.plan --sweep workdirs/bs_sweep --cluster my_cluster.yaml --out plan/

The command line only: the planner is `anp_jax.research.plan` (`build_plan`, `write_plan`).
Prints the plan; ``--out`` also writes plan.md, plan.json and the PNGs. Bad input exits 2.
"""

import argparse
import os
import sys
from typing import List, Optional, Sequence

from anp_jax.research import perfmodel as pm
from anp_jax.research import plan as planner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ints(text: str) -> List[int]:
  try:
    return [int(x) for x in text.split(',') if x.strip()]
  except ValueError as e:
    raise argparse.ArgumentTypeError(f'expected comma-separated integers, got {text!r}') from e


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog='python -m anp_jax.plan', description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument('--pilot', help='A pilot run\'s workdir (metrics.jsonl with noise-scale logs).')
  src.add_argument('--sweep', help='A finished batch_size_sweep.py directory (results.json).')
  p.add_argument('--metric', default='eval/anp_top1')
  p.add_argument('--target', type=float, help='Target value of --metric (default: the pilot\'s '
                 'config.stop_at_value, or the sweep\'s target).')
  p.add_argument('--rule', help='Sweep arm: scaling rule (linear, none, ...).')
  p.add_argument('--warmup', help='Sweep arm: on or off.')
  p.add_argument('--use', choices=('fit', 'b_simple'), default='fit',
                 help='Sweep only: the fitted B_crit, or the measured B_simple.')
  p.add_argument('--cluster', default='minotauro', help='Preset or JSON/YAML cluster file.')
  p.add_argument('--nodes', type=_ints, help='Node counts (default 1, 2, 4, ... up to the cluster).')
  p.add_argument('--batches', type=_ints, help='Global batch sizes (default: the pilot batch x '
                 '1/4 ... 32, or the sweep\'s batches).')
  p.add_argument('--methods', default='sync,mixed')
  p.add_argument('--sync_periods', type=_ints, default=[4], help='H for local_sgd.')
  p.add_argument('--penalty_results',
                 default=os.path.join(ROOT, 'experiments', 'results', 'sync_async_mixed_cpu',
                                      'results.json'),
                 help='sync_async_mixed.py results.json for the asynchrony penalty.')
  p.add_argument('--workload', default='resnet50',
                 help=f'{sorted(pm.WORKLOADS)}, or "pilot" (the pilot model\'s FLOPs from XLA).')
  p.add_argument('--dataset_size', type=int, default=307_406,
                 help='Training images (for epoch times; default: the ANP recipe\'s 80 %% split).')
  p.add_argument('--sprint_batch', type=int, help='SPRINT\'s target global batch (default: pilot).')
  p.add_argument('--out', help='Directory for plan.md, plan.json and the PNGs.')
  return p


def run(argv: Optional[Sequence[str]] = None) -> planner.Plan:
  """Parses `argv`, prints the plan and writes it to ``--out``; raises `PlanError` on bad input."""
  args = vars(_parser().parse_args(argv))
  out = args.pop('out')
  plan = planner.build_plan(**args)
  print(planner.format_plan(plan))
  if out:
    planner.write_plan(plan, out)
  return plan


def main(argv: Optional[Sequence[str]] = None) -> int:
  try:
    run(argv)
  except planner.PlanError as e:
    print(f'ERROR: {e}', file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  sys.exit(main())
