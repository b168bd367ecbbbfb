#!/usr/bin/env python3
"""The constants of the studies' time estimate (`anp_jax.research.run_costs`), measured.

  .venv/bin/python experiments/measure_costs.py \
      --study "--preset ghost_bn:tiny" \
      --study "--preset ghost_bn --seeds 0,1 --lr_grid 1 --lr_extensions 0 --config.num_epochs=0.5" \
      --out experiments/results/study_throughput/costs.json

Runs each ``--study`` (arguments of experiments/study.py) as a fresh process in a scratch folder
with an empty compilation cache of its own (so the first run of each program compiles, as in a
user's first study) and ``ANP_PROFILE``, then fits the cost model on every run of every study:
the per-run costs from the runs' own phases (``runs/<name>/phases.json``), the process start and
the runner's time from the launcher's clock and the profile. Writes ``--out`` (default the
committed experiments/results/study_throughput/costs.json, which ``--dry_run`` reads) with the
commands, each study's wall time and what the fitted model says it should have taken.
Measure on a quiet machine: the constants are this machine's, under its load at the time.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from anp_jax.research import run_costs  # noqa: E402

ROOT = _venv.ROOT
run_study = run_costs.measure_study  # The package's (tests use it too).


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--study', action='append', default=[],
                 help='Arguments of experiments/study.py (one study; repeat for more).')
  p.add_argument('--refit', nargs='*', default=[],
                 help='Fit again on studies measured before (their --work folders: '
                 'WORK/study<i>), running nothing.')
  p.add_argument('--out', default=os.path.join(ROOT, run_costs.COSTS_FILE))
  p.add_argument('--work', default=None, help='Scratch folder (default: temporary, deleted).')
  args = p.parse_args(argv)
  if not args.study and not args.refit:
    p.error('give --study (or --refit)')
  work = args.work or tempfile.mkdtemp(prefix='anp_costs_')
  try:
    studies = []
    for folder in args.refit:
      with open(os.path.join(folder, 'clock.json')) as f:
        clock = json.load(f)
      with open(os.path.join(folder, 'profile.json')) as f:
        m = run_costs.study_measurement(os.path.join(folder, 'out'), json.load(f),
                                        clock['launch'], clock['exit'])
      studies.append((shlex.join(clock['args']), m))
    for i, study in enumerate(args.study):
      print(f'study {i + 1}/{len(args.study)}: {study}', flush=True)
      m = run_study(shlex.split(study), os.path.join(work, f'study{i}'))
      studies.append((study, m))
      print(f'  {m["runs"]} runs, {m["wall_s"]:.0f} s', flush=True)
    costs = run_costs.fit_studies([m for _, m in studies],
                                  source='experiments/measure_costs.py')
    costs.machine = f'{platform.machine()}, {os.cpu_count()} CPUs ({platform.node()})'
    record = costs.to_json()
    record['sources'] = {}
    record['measured'] = [
        {'study': s, 'runs': m['runs'], 'wall_s': round(m['wall_s'], 1),
         'fitted_s': round(run_costs.estimate([x for x, _ in m['samples']], costs).seconds, 1)}
        for s, m in studies]
    record['command'] = 'experiments/measure_costs.py ' + ' '.join(
        f'--study {shlex.quote(s)}' for s, _ in studies)
    record['when'] = time.strftime('%Y-%m-%d')
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
      json.dump(record, f, indent=2)
      f.write('\n')
    for row in record['measured']:
      print(f'{row["study"]}: {row["wall_s"]:.0f} s measured, {row["fitted_s"]:.0f} s by the '
            'fitted model', flush=True)
    print(f'Wrote {args.out}', flush=True)
  finally:
    if args.work is None:
      shutil.rmtree(work, ignore_errors=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
