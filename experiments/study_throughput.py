#!/usr/bin/env python3
"""Where a study's time goes, before and after issue 44's changes, measured side by side.

  .venv/bin/python experiments/study_throughput.py --preset plan_validation:a --repeats 2 \
      --out experiments/results/study_throughput/plan_validation_a --stop_at_target

Runs the study preset ``--repeats`` times in each of two modes, interleaved (before, after,
after, before, ...: a drift of the machine's load falls on both), each a fresh
``experiments/study.py`` process in its own scratch folder (``--work``, deleted afterwards
unless ``--keep``), with ``ANP_PROFILE`` (`anp_jax.phases`) recording its phases:

* **before**: the persistent compilation cache off (``ANP_COMPILATION_CACHE=0``) and decoded
  evaluation batches not kept (``ANP_EVAL_BATCH_CACHE=0``): every run compiles and decodes
  afresh, as before issue 44. (The evaluation's in-program accumulation has no switch: it is in
  both modes. ``--before_tree DIR`` runs the ``before`` studies from another checkout instead,
  e.g. ``git worktree add /tmp/anp_before fbac83a``, the commit before issue 44: the whole
  change, but without phases for ``before``, only its wall time.)
* **after**: the defaults, with a compilation cache of its own, empty at the start of each
  study (``--warm_cache``: one cache for every ``after`` study, as a user's second study).

Arguments this script does not know (or any after ``--``) go to ``study.py``
(``--stop_at_target``, ``--seeds 0,1``, ``--config.x=y``). Writes ``throughput.json`` (every
measurement: wall time, phases, compilation, cache hits) and ``README.md`` (a table of the
median seconds per phase in each mode and the ratio after / before) into ``--out``.

Phases (docs/performance.md, "Where a study's time goes"): ``start + imports`` (the process
until the runner's first phase), ``runner`` (planning, bookkeeping between runs, results and
report), per run ``run set-up`` (config checks, the work folder, building the model, executor
and evaluators, the final metrics), ``dataset`` (opening it), ``init`` (the state, a restore),
``compile: <phase>`` (tracing, lowering and XLA's compilation or a load from the cache, charged
to the phase that asked), ``train steps``, ``evaluations``, ``checkpoints``, and ``exit``.
Timing claims belong to a quiet machine: this script measures what it is given.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Dict, List  # noqa: E402

ROOT = _venv.ROOT
MODES = ('before', 'after')
# Environment of the `before` mode: every switch of issue 44 off.
BEFORE_ENV = {'ANP_COMPILATION_CACHE': '0', 'ANP_EVAL_BATCH_CACHE': '0'}
COMPILE_KEYS = ('trace_s', 'lower_s', 'compile_s')  # cache_read_s is inside compile_s.
# The table's rows, in order (`categories`).
ROWS = ('start + imports', 'runner', 'run set-up', 'dataset', 'init', 'compile: train',
        'compile: evaluations', 'compile: other', 'train steps', 'evaluations', 'checkpoints',
        'exit', 'unaccounted', 'total')


def parse(argv):
  p = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter,
      allow_abbrev=False,
      epilog='Other arguments (or any after --) go to experiments/study.py, e.g. '
      '--stop_at_target --seeds 0,1 --config.num_epochs=2.')
  p.add_argument('--preset', required=True, help='A study preset (e.g. plan_validation:a).')
  p.add_argument('--repeats', type=int, default=1, help='Studies per mode (interleaved).')
  p.add_argument('--out', default=None, help='Results folder (default: experiments/results/'
                 'study_throughput/<preset>).')
  p.add_argument('--work', default=None, help='Scratch folder for the studies (default: a '
                 'temporary one).')
  p.add_argument('--keep', action='store_true', help='Keep the scratch folder.')
  p.add_argument('--warm_cache', action='store_true',
                 help='One compilation cache for every "after" study (default: empty each).')
  p.add_argument('--before_tree', default=None,
                 help='Run the "before" studies from this checkout (the code before issue 44).')
  p.add_argument('--timeout', type=float, default=6 * 3600, help='Seconds per study.')
  args, study_args = p.parse_known_args(argv)
  study_args = [a for a in study_args if a != '--']
  if args.repeats < 1:
    p.error('--repeats must be >= 1')
  return args, study_args


def _child_env(mode: str, cache_dir: str, profile: str, tree: str) -> Dict[str, str]:
  env = dict(os.environ, ANP_PROFILE=profile, PYTHONPATH=tree)
  # The caller's (e.g. the test suite's) cache would serve both modes: each mode decides.
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  for name in BEFORE_ENV:
    env.pop(name, None)
  if mode == 'before':
    env.update(BEFORE_ENV)
  else:
    env['ANP_COMPILATION_CACHE_DIR'] = cache_dir
  return env


def measure(mode: str, index: int, args, study_args: List[str], work: str) -> Dict:
  """One study in a fresh process; its wall time and profile."""
  tree = args.before_tree if (mode == 'before' and args.before_tree) else ROOT
  folder = os.path.join(work, f'{mode}_{index}')
  cache = os.path.join(work, 'cache_after' if args.warm_cache else f'cache_{mode}_{index}')
  profile = os.path.join(work, f'{mode}_{index}_profile.json')
  cmd = [sys.executable, os.path.join(tree, 'experiments', 'study.py'), '--preset', args.preset,
         '--out', folder, *study_args]
  print(f'[{mode} {index}] {" ".join(cmd)}', flush=True)
  launched = time.time()
  out = subprocess.run(cmd, env=_child_env(mode, cache, profile, tree), cwd=tree,
                       capture_output=True, text=True, timeout=args.timeout)
  ended = time.time()
  with open(os.path.join(work, f'{mode}_{index}.log'), 'w') as f:
    f.write(out.stdout + out.stderr)
  if out.returncode != 0:
    raise SystemExit(f'{mode} study {index} failed (exit {out.returncode}):\n'
                     f'{(out.stdout + out.stderr)[-3000:]}')
  prof = None
  if os.path.exists(profile):
    with open(profile) as f:
      prof = json.load(f)
  if tree == ROOT and not (prof and prof.get('first_phase_time')):  # e.g. study.py --help.
    raise SystemExit(f'{mode} study {index} ran no study (no phases in its profile): nothing '
                     f'is written. Its output:\n{(out.stdout + out.stderr)[-2000:]}')
  record = {'mode': mode, 'index': index, 'wall_s': ended - launched, 'launched': launched,
            'profile': prof}
  record['categories'] = categories(record)
  print(f'[{mode} {index}] {record["wall_s"]:.1f} s', flush=True)
  return record


def _compile_s(entry: Dict) -> float:
  return sum(entry.get(k, 0.0) for k in COMPILE_KEYS)


def categories(record: Dict) -> Dict[str, float]:
  """A measurement's seconds per table row (`ROWS`); only the total without a profile."""
  wall = record['wall_s']
  prof = record.get('profile')
  if not prof or prof.get('first_phase_time') is None:
    return {'total': wall}
  ph = prof['phases']
  get = lambda name, key='seconds': ph.get(name, {}).get(key, 0.0)  # noqa: E731
  evals = [n for n in ph if n.startswith('eval:')]
  cats = {
      'start + imports': prof['first_phase_time'] - record['launched'],
      'runner': sum(get(n) for n in ('runner', 'plan', 'report')),
      'run set-up': sum(get(n) for n in ('start', 'build', 'finish')),
      'dataset': get('dataset'),
      'init': get('init'),
      'checkpoints': get('checkpoint'),
      'exit': record['launched'] + wall - prof['end_time'],
  }
  compiles = {n: _compile_s(e) for n, e in ph.items()}
  cats['compile: train'] = compiles.get('train', 0.0)
  cats['compile: evaluations'] = sum(compiles.get(n, 0.0) for n in evals)
  cats['compile: other'] = sum(v for n, v in compiles.items() if n != 'train' and n not in evals)
  cats['train steps'] = get('train') - cats['compile: train']
  cats['evaluations'] = sum(get(n) for n in evals) - cats['compile: evaluations']
  # Compilation outside those phases was inside the others' seconds: taken out of them.
  for name, row in (('init', 'init'), ('dataset', 'dataset'), ('checkpoint', 'checkpoints')):
    cats[row] -= compiles.get(name, 0.0)
  for name in ('start', 'build', 'finish'):
    cats['run set-up'] -= compiles.get(name, 0.0)
  for name in ('runner', 'plan', 'report'):
    cats['runner'] -= compiles.get(name, 0.0)
  cats['total'] = wall
  cats['unaccounted'] = wall - sum(v for k, v in cats.items() if k != 'total')
  return cats


def summarize(records: List[Dict]) -> Dict:
  """Medians per mode and row, and the ratio after / before of each."""
  medians = {}
  for mode in MODES:
    rows = [r['categories'] for r in records if r['mode'] == mode]
    medians[mode] = {k: statistics.median(r.get(k, 0.0) for r in rows)
                     for k in ROWS if any(k in r for r in rows)}
  ratio = {k: medians['after'][k] / medians['before'][k]
           for k in ROWS if medians['before'].get(k) and k in medians['after']}
  extra = {}
  for mode in MODES:
    profs = [r['profile'] for r in records if r['mode'] == mode and r['profile']]
    if profs:
      extra[mode] = {
          'cache_hits': statistics.median(sum(e.get('cache_hits', 0) for e in p['phases'].values())
                                          for p in profs),
          'cache_misses': statistics.median(
              sum(e.get('cache_misses', 0) for e in p['phases'].values()) for p in profs),
          'runs': statistics.median(len(p['sections']) for p in profs)}
  return {'median_s': medians, 'ratio_after_before': ratio, 'counts': extra}


def markdown(result: Dict) -> str:
  s = result['summary']
  lines = [f'# Study throughput: `{result["preset"]}`', '',
           f'`{result["command"]}`', '',
           f'{result["repeats"]} studies per mode, interleaved; {result["host"]}; '
           f'{result["date"]}. Median seconds per phase (docs/performance.md, "Where a study\'s '
           'time goes"); `before`: ' + result['before'] + '.', '',
           '| phase | before (s) | after (s) | after / before |', '|---|---:|---:|---:|']
  for row in ROWS:
    b, a = s['median_s']['before'].get(row), s['median_s']['after'].get(row)
    if b is None and a is None:
      continue
    r = s['ratio_after_before'].get(row)
    fmt = lambda v: '' if v is None else f'{v:.1f}'  # noqa: E731
    lines.append(f'| {row} | {fmt(b)} | {fmt(a)} | {"" if r is None else f"{r:.2f}"} |')
  for mode, c in s['counts'].items():
    lines.append('')
    lines.append(f'{mode}: {c["runs"]:g} runs per study, {c["cache_hits"]:g} compilation cache '
                 f'hits, {c["cache_misses"]:g} misses (medians).')
  return '\n'.join(lines) + '\n'


def main(argv=None) -> int:
  args, study_args = parse(sys.argv[1:] if argv is None else argv)
  out = args.out or os.path.join(ROOT, 'experiments', 'results', 'study_throughput',
                                 re.sub(r'\W+', '_', args.preset))
  work = args.work or tempfile.mkdtemp(prefix='study_throughput_')
  os.makedirs(work, exist_ok=True)
  records = []
  try:
    for i in range(args.repeats):
      for mode in (MODES if i % 2 == 0 else MODES[::-1]):
        records.append(measure(mode, i, args, study_args, work))
  finally:
    if not args.keep and not args.work:
      shutil.rmtree(work, ignore_errors=True)
  before = (f'the checkout {args.before_tree}' if args.before_tree else
            ' '.join(f'{k}={v}' for k, v in BEFORE_ENV.items()))
  result = {'preset': args.preset, 'study_args': study_args, 'repeats': args.repeats,
            'command': ' '.join(['experiments/study_throughput.py'] + (
                sys.argv[1:] if argv is None else list(argv))),
            'before': before, 'warm_cache': args.warm_cache,
            'host': f'{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()})',
            'date': time.strftime('%Y-%m-%d %H:%M'), 'measurements': records}
  result['summary'] = summarize(records)
  from anp_jax.research import study_results
  text = markdown(result)
  study_results.write_measurement(out, 'throughput.json', result, text)
  print(text)
  print(f'Wrote {out}/throughput.json and README.md')
  return 0


if __name__ == '__main__':
  sys.exit(main())
