"""Fine-tuning vs training from scratch over several seeds: statistics and the report of
``experiments/finetune.py`` (the runs are `anp_jax.transfer`).

`aggregate` takes `anp_jax.transfer.run`'s summary of each seed and gives, on the **test**
split of task B (published figures; the tasks and budgets are fixed, nothing is chosen on
either split):

* the final test top-1 of the fine-tuned and the from-scratch runs, mean and 95 % interval over
  seeds (`stats.value_summary`), and their paired difference (fine-tuned minus scratch of the
  same seed: one t interval of the per-seed differences);
* steps to targets that are fractions of the mean final test top-1 of the scratch runs, per arm
  (the first evaluated step at or above the target on the test curve; `stats.censored_summary`:
  a seed that never reaches it counts at the budget as a lower bound, never dropped).

`write_report` writes ``summary.md`` (the command, the settings, the tables), ``curves.png``
(test top-1 against steps, every seed) and ``results.json`` (every seed's summary and the
statistics). No JAX.
"""

import json
import math
import os
from typing import Dict, List, Mapping, Sequence

from anp_jax import plotting, transfer
from anp_jax.research import stats, study_results

ARMS = ('finetune', 'scratch')

def aggregate(per_seed: Sequence[Mapping], method: str = 't') -> Dict:
  """The statistics over seeds of `anp_jax.transfer.run` summaries (one per seed)."""
  if not per_seed:
    raise ValueError('aggregate needs the summary of at least one seed.')
  seeds = [s['seed'] for s in per_seed]
  finished = ['reached'] * len(per_seed)  # Every run here trained its whole budget.
  final = {arm: [s['runs'][arm]['final']['test/anp_top1'] for s in per_seed] for arm in ARMS}
  out = {'seeds': seeds, 'ci': stats.describe_method(method),
         'final_test_top1': {arm: stats.value_summary(final[arm], finished, method=method)
                             for arm in ARMS},
         'pretrain_test_top1': stats.value_summary(
             [s['runs']['pretrain']['final']['test/anp_top1'] for s in per_seed], finished,
             method=method)}
  diffs = [a - b for a, b in zip(final['finetune'], final['scratch'])]
  out['paired_difference'] = stats.mean_interval(diffs, method=method)
  reference = math.fsum(final['scratch']) / len(per_seed)
  budget = per_seed[0]['preset']['finetune_steps']
  first_eval = per_seed[0]['preset']['eval_every_steps']  # No seed can record fewer steps.
  rows = []
  for fraction in transfer.TARGET_FRACTIONS:
    target = fraction * reference
    row = {'fraction': fraction, 'target': target}
    for arm in ARMS:
      steps = [transfer.steps_to_target(s['runs'][arm]['test_curve'], target) for s in per_seed]
      row[arm] = stats.censored_summary(
          steps, ['missed' if v is None else 'reached' for v in steps],
          [budget] * len(steps), method=method, floor=first_eval)
      row[f'{arm}_per_seed'] = steps
    rows.append(row)
  out['steps_to_target'] = rows
  out['reference_test_top1'] = reference
  return out


def plot_curves(per_seed: Sequence[Mapping], path: str) -> str:
  """Test top-1 of task B against steps, fine-tuned and from scratch, one line per seed."""
  plt = plotting.pyplot()
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  styles = {'finetune': ('C0', 'fine-tuned from task A'), 'scratch': ('C1', 'from scratch')}
  for i, summary in enumerate(per_seed):
    for arm, (colour, label) in styles.items():
      steps, accs = zip(*summary['runs'][arm]['test_curve'])
      ax.plot(steps, [100 * a for a in accs], 'o-', color=colour, ms=2, lw=1, alpha=0.7,
              label=label if i == 0 else None)
  ax.set(xlabel='training steps on task B', ylabel='ANP top-1 on task B test (%)',
         title=f'{len(per_seed)} seed(s)')
  ax.grid(alpha=0.3)
  ax.legend()
  return plotting.save_figure(fig, path)


def write_report(per_seed: Sequence[Mapping], out_dir: str, command: str = '',
                 method: str = 't') -> List[str]:
  """``curves.png``, ``summary.md`` and ``results.json`` in `out_dir`; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  agg = aggregate(per_seed, method)
  png = plot_curves(per_seed, os.path.join(out_dir, 'curves.png'))
  p = per_seed[0]['preset']
  pct = lambda s: stats.format_summary(s, '.1f', 100)
  lines = ['# Fine-tuning vs training from scratch (generated ANP tasks, CPU)', '']
  if command:
    lines += ['```', command, '```', '']
  wall = sum(r['wall_s'] for s in per_seed for r in s['runs'].values())
  lines += [f'Seeds {agg["seeds"]} (each: pre-training on task A, then task B fine-tuned from '
            'that seed\'s pre-training and from scratch; the seed sets initialisation, data '
            f'order and augmentation). {p["model"]} x{p["width"]} at {p["image_size"]} px, batch '
            f'{p["batch"]}, lr {p["lr"]}: {p["pretrain_steps"]} steps on task A, '
            f'{p["finetune_steps"]} on task B, evaluation every {p["eval_every_steps"]} steps. '
            f'Training time of the {3 * len(per_seed)} runs: {wall / 60:.1f} min.', '',
            'Figures on the test split of each task (nothing is chosen: tasks, budgets and rates '
            'are fixed). ' + agg['ci'], '',
            '| | final test ANP top-1 % |', '|---|---|',
            f'| pre-training, task A | {pct(agg["pretrain_test_top1"])} |',
            f'| task B fine-tuned | {pct(agg["final_test_top1"]["finetune"])} |',
            f'| task B from scratch | {pct(agg["final_test_top1"]["scratch"])} |',
            f'| fine-tuned − scratch, paired by seed (points) | '
            f'{stats.format_summary(agg["paired_difference"] | {"kind": "complete"}, "+.1f", 100)}'
            ' |', '',
            f'Steps to a target on task B\'s test split, targets as fractions of the mean final '
            f'test top-1 from scratch ({100 * agg["reference_test_top1"]:.1f} %); first '
            f'evaluated step at or above it (evaluations every {p["eval_every_steps"]} steps), '
            f'a seed that never reaches it counts at the {p["finetune_steps"]}-step budget '
            '(a lower bound). An interval is cut at the first evaluation '
            f'({p["eval_every_steps"]} steps), below which no seed can record a crossing.', '',
            '| target (x scratch final) | ANP top-1 | steps fine-tuned | steps from scratch | '
            'per seed (fine-tuned; scratch) |', '|---|---|---|---|---|']
  for r in agg['steps_to_target']:
    per = lambda arm: ', '.join('—' if v is None else str(v) for v in r[f'{arm}_per_seed'])
    lines.append(f'| {r["fraction"]:.1f} | {100 * r["target"]:.1f} % | '
                 f'{stats.format_summary(r["finetune"])} | {stats.format_summary(r["scratch"])} '
                 f'| {per("finetune")}; {per("scratch")} |')
  lines += ['', f'Fine-tune start-up (seed {agg["seeds"][0]}): '
            f'`{per_seed[0]["runs"]["finetune"]["init_report"]}`', '', '![curves](curves.png)',
            '']
  md = os.path.join(out_dir, 'summary.md')
  study_results.write_text_atomic(md, '\n'.join(lines))
  js = os.path.join(out_dir, 'results.json')
  study_results.write_text_atomic(js, json.dumps({'seeds': list(per_seed), 'statistics': agg},
                                                 indent=1, default=str))
  return [png, md, js]
