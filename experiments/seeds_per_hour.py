#!/usr/bin/env python3
"""Seeds per hour of a committed study before and after issue 44, from runs it already holds.

  .venv/bin/python experiments/seeds_per_hour.py experiments/results/sync_async_mixed_cpu \
      --out experiments/results/study_throughput/sync_async_mixed_cpu

A study directory with a fresh-seed confirmation (``confirmation/``) holds the same
configurations twice: the selection's runs at each arm's chosen rate, and the confirmation's
(other seeds, the same arm, rate, budget and stopping rule), each with the ``wall_time_s`` and
``final_step`` its run recorded. When the selection ran before a change and the confirmation
after it (``--before`` / ``--after`` name them), the two are a before/after of the same work,
with two caveats this script prints beside its table: the runs are not interleaved (the machine's
load at the two times is not the same) and the seeds differ (a run that stops at its target
trains as many steps as its seed needs: seconds per 1,000 steps are shown beside seconds per
run). Writes ``seeds_per_hour.json`` and ``README.md`` into ``--out``; reads nothing else and
trains nothing.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
from typing import Dict, List  # noqa: E402


def parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], allow_abbrev=False)
  p.add_argument('study', help='A sync/async/mixed study directory with confirmation/.')
  p.add_argument('--out', required=True, help='Results folder.')
  p.add_argument('--before', default='the selection runs (before issue 44: no compilation '
                 'cache, evaluations decoded every time)', help='What the selection ran with.')
  p.add_argument('--after', default='the fresh-seed confirmation (issue 44\'s defaults: '
                 'compilation cache, in-program evaluation, seeds separately on CPU)',
                 help='What the confirmation ran with.')
  return p.parse_args(argv)


def _runs(study: str) -> Dict[str, List[Dict]]:
  """Per mode, the runs at each arm's chosen rate with their wall time and steps."""
  def load(path):
    with open(path) as f:
      return json.load(f)
  chosen = {r['name']: r['lr_mult'] for r in load(os.path.join(study, 'results.json'))
            if r.get('lr_chosen')}
  out = {}
  for mode, folder in (('before', study), ('after', os.path.join(study, 'confirmation'))):
    rows = [g for g in load(os.path.join(folder, 'grid.json'))
            if g['arm'] in chosen and float(g['lr_mult']) == float(chosen[g['arm']])
            and g.get('wall_time_s') and g.get('final_step')]
    out[mode] = rows
  return out


def measure(study: str) -> Dict:
  runs = _runs(study)
  if not runs['before'] or not runs['after']:
    raise ValueError(f'{study}: no runs at the chosen rates in both the selection and '
                     'confirmation/ (run --confirm_seeds first).')
  per_arm = []
  for arm in sorted({g['arm'] for g in runs['before']} & {g['arm'] for g in runs['after']}):
    row = {'arm': arm}
    for mode in ('before', 'after'):
      rs = [g for g in runs[mode] if g['arm'] == arm]
      row[mode] = {'runs': len(rs), 'steps': [g['final_step'] for g in rs],
                   's_per_run': statistics.mean(g['wall_time_s'] for g in rs),
                   's_per_1000_steps': 1000 * sum(g['wall_time_s'] for g in rs)
                                       / sum(g['final_step'] for g in rs)}
    row['ratio_per_run'] = row['after']['s_per_run'] / row['before']['s_per_run']
    per_arm.append(row)
  total = {}
  for mode in ('before', 'after'):
    rs = runs[mode]
    wall = sum(g['wall_time_s'] for g in rs)
    total[mode] = {'runs': len(rs), 'wall_s': wall, 'steps': sum(g['final_step'] for g in rs),
                   'seeds_per_hour': 3600 * len(rs) / wall,
                   's_per_1000_steps': 1000 * wall / sum(g['final_step'] for g in rs)}
  return {'study': study, 'arms': per_arm, 'total': total,
          'seeds_per_hour_ratio': total['after']['seeds_per_hour']
                                  / total['before']['seeds_per_hour']}


def markdown(result: Dict, before: str, after: str) -> str:
  t = result['total']
  lines = [f'# Seeds per hour: `{result["study"]}`', '',
           f'`experiments/seeds_per_hour.py {result["study"]} --out ...`: every run at its arm\'s '
           f'chosen rate, **before**: {before}; **after**: {after}. Seconds are each run\'s own '
           '`wall_time_s` on the 2-core machine (the whole machine per run: these are seeds '
           'per machine-hour).', '',
           '| arm | runs before / after | steps before | steps after | s per run before | '
           's per run after | after / before | s per 1,000 steps before | after |',
           '|---|---|---|---|---:|---:|---:|---:|---:|']
  for r in result['arms']:
    b, a = r['before'], r['after']
    lines.append(f'| {r["arm"]} | {b["runs"]} / {a["runs"]} | {b["steps"]} | {a["steps"]} | '
                 f'{b["s_per_run"]:.1f} | {a["s_per_run"]:.1f} | {r["ratio_per_run"]:.2f} | '
                 f'{b["s_per_1000_steps"]:.1f} | {a["s_per_1000_steps"]:.1f} |')
  lines += ['', f'All: {t["before"]["runs"]} runs in {t["before"]["wall_s"]:.0f} s before, '
            f'{t["after"]["runs"]} in {t["after"]["wall_s"]:.0f} s after: '
            f'**{t["before"]["seeds_per_hour"]:.1f} -> {t["after"]["seeds_per_hour"]:.1f} seeds '
            f'per hour ({result["seeds_per_hour_ratio"]:.2f}x)**; per 1,000 training steps '
            f'{t["before"]["s_per_1000_steps"]:.1f} -> {t["after"]["s_per_1000_steps"]:.1f} s.',
            '', 'Caveats: the two sets ran at different times (not interleaved; the machine was '
            'shared with test runs both times), with different seeds (runs stop at their '
            'target, so their steps differ). One set each: no interval on the ratio.', '']
  return '\n'.join(lines)


def main(argv=None) -> int:
  args = parse(sys.argv[1:] if argv is None else argv)
  try:
    result = measure(os.path.normpath(args.study))
  except (OSError, ValueError, KeyError) as e:
    print(f'ERROR: {e}', file=sys.stderr)
    return 2
  from anp_jax.research import study_results
  text = markdown(result, args.before, args.after)
  study_results.write_measurement(args.out, 'seeds_per_hour.json', result, text)
  print(text)
  return 0


if __name__ == '__main__':
  sys.exit(main())
