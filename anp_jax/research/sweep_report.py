"""Report of a batch-size sweep (`.venv/bin/python experiments/report.py DIR`) → DIR/report.md
+ PNGs.

Reads what `experiments/batch_size_sweep.py` (`anp_jax.research.sweep`) left in DIR
(``results.json``, one row per run, and each run's ``runs/<name>/metrics.jsonl``) and draws the
three classic views of large-batch synchronous SGD:

1. ``accuracy_vs_batch.png`` — final ANP top-1 against the global batch (log2 axis), one line per
   scaling rule / warmup arm: Goyal et al. 2017's figure (flat up to the batch where the linear
   rule with warmup stops working, lower without warmup).
2. ``steps_vs_batch.png`` — steps to the target accuracy against the batch on log-log axes with
   the perfect-scaling line S ∝ 1/B through the smallest batch: Shallue et al. 2018's figure
   (perfect scaling, then diminishing returns, then a plateau).
3. ``noise_scale_fit.png`` — the fit S = S_min (1 + B_crit / B) of McCandlish et al. 2018 and the
   matching steps–examples trade-off (S/S_min − 1)(E/E_min − 1) = 1, with B_crit next to the
   gradient noise scale B_simple measured during training.
4. ``training_curves.png`` — evaluation top-1 against epochs, one line per batch size.

Each batch size is shown at its learning rate chosen on validation (`aggregate`; Shallue et al.'s
protocol when ``--lr_search`` tried several) with statistics over seeds: means with 95 %
intervals, and seeds that missed the target or diverged counted (`anp_jax.research.stats`).
Everything here is numpy + matplotlib (Agg), importable without JAX.
"""

import json
import math
import os
from typing import Dict, List, Sequence, Tuple

import numpy as np

from anp_jax import plotting  # numpy and matplotlib only; no JAX
from anp_jax.metrics_io import read_metrics
from anp_jax.research import planner as plan
from anp_jax.research import registration, stats, study_report, study_results

# ----------------------------------------------------------------------------------------------
# Reading runs.


def load_results(out_dir: str) -> List[Dict]:
  path = os.path.join(out_dir, 'results.json')
  if not os.path.exists(path):
    raise FileNotFoundError(f'{path} does not exist: run experiments/batch_size_sweep.py '
                            f'--out {out_dir} first.')
  with open(path) as f:
    rows = json.load(f)
  return plan.check_rows(rows, path, 'sweep')  # PlanError (a ValueError): another experiment's.


def arm_label(rule: str, warmup: str) -> str:
  return f'{rule} rule, ' + ('warmup' if warmup == 'on' else 'no warmup')


def _arms(rows) -> List[Tuple[str, str]]:
  order = {'linear': 0, 'sqrt': 1, 'none': 2}
  arms = {(r['rule'], r['warmup']) for r in rows}
  return sorted(arms, key=lambda a: (order.get(a[0], 9), a[1] != 'on'))


def normalized(row: Dict) -> Dict:
  """A results row in the runner's terms: rows of the first sweeps (no ``point``, ``outcome``,
  ``eval/anp_top1``) get them from their own columns, and a diverged or unfinished run has no
  steps to the target (the first version counted a crossing before the divergence)."""
  r = dict(row)
  r.setdefault('point', f"b{int(r['batch']):05d}-{r['rule']}-"
                        f"{'warmup' if r['warmup'] in ('on', True) else 'nowarmup'}")
  r['fields'] = r.get('fields') or {}
  r.setdefault('lr_mult', 1.0)
  r.setdefault('eval/anp_top1', r.get('final_top1'))
  r.setdefault('has_test', False)
  if r.get('b_simple_window') != 'to_target':
    # Rows from before B_simple had two windows: their one figure is the late window.
    r['b_simple_window'] = 'late'
    r['b_simple_late'], r['b_simple'] = r.get('b_simple'), None
  if study_results.outcome_of(r) != 'reached':
    r['steps_to_target'] = r['examples_to_target'] = r['b_simple'] = None
  return r


def aggregate(rows: Sequence[Dict], method: str = 't') -> Dict[Tuple[str, str], List[Dict]]:
  """Per arm, per batch size: the statistics over seeds at the batch size's reported rate.

  The rate is `study_results.choose_rates`' choice on validation (a rate with a diverged or
  unfinished seed is never chosen); with no choice, a batch size that tried a single rate is
  reported at it (its diverged seeds then show), one that tried several at none. Statistics
  come from `study_results.point_statistics`: a missed or diverged seed is counted, never
  dropped. Each entry: batch, point, lr (None: no rate), lr_chosen, lr_edge, seeds (at the
  reported rate), n (those that finished without diverging), runs / diverged / unfinished
  (counts at the reported rate, or over every run of the batch size without one), reached /
  not_reached (finished seeds that reached / missed the target), top1 (mean final top-1 when
  every seed finished, else None) with top1_summary (`stats.value_summary`), best_top1, steps /
  examples (mean to the target when every seed reached it, else None: such entries stay out of
  the B_crit fit) with steps_summary / examples_summary (`stats.censored_summary`: the lower
  bound and counts otherwise), published_split; steps_each (the published split's steps of each
  seed when every seed reached the target, for the fit's bootstrap); b_simple (mean over the
  seeds that reached the target of the window up to their crossing) with b_simple_summary
  (`stats.mean_interval`) and b_simple_each, b_simple_late (the second half of what each
  finished seed trained) with b_simple_late_summary.
  """
  rows = [normalized(r) for r in rows]
  choices = study_results.choose_rates(rows, lambda r: r['point'],
                                       lambda r: r.get('eval/anp_top1'))
  out = {}
  for arm in _arms(rows):
    entries = []
    arm_rows = [r for r in rows if (r['rule'], r['warmup']) == arm]
    for batch in sorted({r['batch'] for r in arm_rows}):
      runs = [r for r in arm_rows if r['batch'] == batch]
      choice = choices[runs[0]['point']]
      shown = study_results.reported_rows(runs, choice)
      counted = [study_results.outcome_of(r) for r in (shown or runs)]
      finished = [r for r in shown if study_results.outcome_of(r) in ('reached', 'missed')]
      entry = {'batch': batch, 'point': runs[0]['point'], 'seeds': len(shown),
               'n': len(finished), 'runs': len(counted), 'diverged': counted.count('diverged'),
               'unfinished': counted.count('unfinished'), 'reached': counted.count('reached'),
               'not_reached': counted.count('missed'),
               'lr': shown[0]['lr'] if shown else None, 'lr_mult': choice['lr_mult'],
               'lr_chosen': choice['lr_mult'] is not None, 'lr_edge': choice['edge'],
               'total_steps': runs[0]['total_steps'], 'published_split': 'validation',
               'top1': None, 'top1_summary': None, 'best_top1': None, 'steps': None,
               'steps_summary': None, 'examples': None, 'examples_summary': None,
               'steps_each': None}
      if shown:
        st = study_results.point_statistics(shown, 'eval/anp_top1', ('anp_top1',),
                                            method=method)
        top1 = next(iter(st['final'].values()))
        # Published figures on test when every seed evaluated it (the rate was chosen on
        # validation above); best top-1 is a validation figure (the runs' best evaluation).
        split = 'test_' if st['published_split'] == 'test' else ''
        steps, examples = st[f'{split}steps_to_target'], st[f'{split}examples_to_target']
        entry.update(published_split=st['published_split'], top1_summary=top1,
                     steps_summary=steps, examples_summary=examples)
        if top1['kind'] == 'complete':
          entry['top1'] = top1['mean']
          best = [r['best_top1'] for r in shown]
          entry['best_top1'] = float(np.mean(best)) if None not in best else None
        if steps['kind'] == 'complete':
          entry['steps'] = steps['mean']
          entry['examples'] = examples['mean']
          entry['steps_each'] = [float(r[f'{split}steps_to_target']) for r in shown]
      entry['b_simple_window'] = ('late' if any(r['b_simple_window'] == 'late' for r in runs)
                                  else 'to_target')
      for key in ('b_simple', 'b_simple_late'):
        values = [float(r[key]) for r in finished if r.get(key) is not None]
        entry[f'{key}_each'] = values
        entry[key] = float(np.mean(values)) if values else None
        entry[f'{key}_summary'] = (stats.mean_interval(values, method=method) if values
                                   else None)
      entries.append(entry)
    out[arm] = entries
  return out


# ----------------------------------------------------------------------------------------------
# The critical-batch fit.


# The fit lives in the library (the planner uses it too).
fit_steps_to_target = plan.fit_steps_to_target


# Resamples of the fit's bootstrap over seeds (`bootstrap_fit`).
FIT_RESAMPLES = 2000


def _s_min_vanishes(s_min: float, steps: Sequence[float]) -> bool:
  """Whether a fit's S_min is ≈ 0 next to the steps it fits: every point in the perfect-scaling
  regime, B_crit beyond every batch (the same judgement for the fit and its bootstrap)."""
  return s_min <= 1e-6 * max(steps)


def _crit_of(s_min: float, b_crit: float, steps: Sequence[float]) -> float:
  """A fit's B_crit on a line: +inf when S_min ≈ 0 (`_s_min_vanishes`: perfect scaling over the
  whole range), 0 when B_crit <= 0 (steps do not fall with the batch)."""
  if _s_min_vanishes(s_min, steps) or not math.isfinite(b_crit):
    return math.inf
  return max(b_crit, 0.0)


def bootstrap_fit(batches: Sequence[float], steps_each: Sequence[Sequence[float]],
                  simple_each: Sequence[Sequence[float]], level: float = stats.LEVEL,
                  resamples: int = FIT_RESAMPLES, seed: int = 0) -> Dict:
  """Percentile-bootstrap intervals over seeds of B_crit, of B_simple (median over batch sizes
  of each batch size's mean over seeds) and of their ratio B_crit / B_simple.

  Each resample draws, within every batch size, its seeds with replacement (steps and B_simple
  independently: one run's two figures are weakly tied), refits S = S_min (1 + B_crit / B) on
  the means and takes the median of the B_simple means. A fit with S_min <= 0 counts as
  B_crit = +inf (perfect scaling across the range), one with B_crit <= 0 as 0; ``unbounded``
  is the fraction at +inf (an interval whose upper end is inf says the data cannot bound
  B_crit from above). Few seeds make the percentile interval optimistic (it cannot be wider
  than the seeds' own range), as the report says. Keys: b_crit, b_simple, ratio (each
  {'low', 'high'} or None), unbounded, resamples, level.
  """
  rng = np.random.default_rng(seed)
  b = np.asarray(batches, np.float64)
  crit, simple, ratio = [], [], []
  for _ in range(resamples):
    means = [float(np.mean(rng.choice(np.asarray(v), len(v)))) for v in steps_each]
    c = _crit_of(*fit_steps_to_target(b, means), means) if len(set(batches)) >= 2 else None
    draws = [float(np.mean(rng.choice(np.asarray(v), len(v)))) for v in simple_each if v]
    s = float(np.median(draws)) if draws else None
    if c is not None:
      crit.append(c)
    if s is not None:
      simple.append(s)
    if c is not None and s:
      ratio.append(c / s)

  def interval(values):
    if not values:
      return None
    ordered = np.sort(np.asarray(values, np.float64))
    tail = (1.0 - level) / 2.0
    lo = ordered[int(math.floor(tail * (len(ordered) - 1)))]
    hi = ordered[int(math.ceil((1.0 - tail) * (len(ordered) - 1)))]
    return {'low': float(lo), 'high': float(hi)}

  return {'b_crit': interval(crit), 'b_simple': interval(simple), 'ratio': interval(ratio),
          'unbounded': (sum(math.isinf(c) for c in crit) / len(crit)) if crit else None,
          'resamples': resamples, 'level': level}


def fit_arms(agg) -> Dict[Tuple[str, str], Dict]:
  """Per arm: the fit on the batch sizes whose finished seeds all reached the target, B_simple
  (median over batch sizes of their means over seeds, window up to the crossing; the late
  window's beside it) and `bootstrap_fit`'s intervals over seeds (``ci``)."""
  fits = {}
  for arm, entries in agg.items():
    pts = [(e['batch'], e['steps']) for e in entries if e['steps'] is not None]
    noise = [e['b_simple'] for e in entries if e['b_simple'] is not None]
    late = [e['b_simple_late'] for e in entries if e.get('b_simple_late') is not None]
    fit = {'points': len(pts), 'b_simple_median': float(np.median(noise)) if noise else None,
           'b_simple_late_median': float(np.median(late)) if late else None, 'ratio': None,
           's_min': None, 'b_crit': None, 'e_min': None, 'valid': False, 'ci': None,
           'note': 'fewer than two batch sizes reached the target'}
    if len({p[0] for p in pts}) >= 2:
      batch, steps = [p[0] for p in pts], [p[1] for p in pts]
      s_min, b_crit = fit_steps_to_target(batch, steps)
      fit.update(s_min=s_min, b_crit=b_crit, e_min=s_min * b_crit, note='')
      if _s_min_vanishes(s_min, steps):
        fit['note'] = ('S_min ≈ 0: every point is in the perfect-scaling regime, so B_crit is '
                       'far beyond the largest batch and not determined')
      elif not 0 < b_crit < math.inf:
        fit['note'] = 'B_crit ≤ 0: steps do not fall with the batch size here'
      else:
        fit['valid'] = True
        if b_crit > 4 * max(batch):
          fit['note'] = 'extrapolated far beyond the largest batch: read as a lower bound'
        if fit['b_simple_median']:
          fit['ratio'] = b_crit / fit['b_simple_median']
      fitted = [e for e in entries if e['steps'] is not None]
      if all(e.get('steps_each') for e in fitted):
        fit['ci'] = bootstrap_fit([e['batch'] for e in fitted],
                                  [e['steps_each'] for e in fitted],
                                  [e.get('b_simple_each') or [] for e in entries])
    fits[arm] = fit
  return fits


# ----------------------------------------------------------------------------------------------
# Figures.


def _styles(n):
  markers = ['o', 's', '^', 'D', 'v', 'P', 'X', '*']
  return [markers[i % len(markers)] for i in range(n)]


def _arm_points(agg, key: str):
  """A figure and, per arm with a known `key` somewhere, (arm, entries, those entries, marker)."""
  fig, ax = plotting.pyplot().subplots(figsize=(6.4, 4.2))
  arms = []
  for (arm, entries), marker in zip(agg.items(), _styles(len(agg))):
    pts = [e for e in entries if e[key] is not None]
    if pts:
      arms.append((arm, entries, pts, marker))
  return fig, ax, arms


def plot_accuracy(agg, path: str) -> str:
  """Final top-1 (mean and its 95 % interval over seeds) against the batch, log2 x axis
  (Goyal-style); a batch size with a diverged seed has no mean and no point."""
  fig, ax, arms = _arm_points(agg, 'top1')
  for arm, _, pts, marker in arms:
    means, bars = study_report.error_bars([e['top1_summary'] for e in pts], 100)
    ax.errorbar([e['batch'] for e in pts], means, yerr=bars, marker=marker, capsize=3,
                label=arm_label(*arm))
  ax.set_xscale('log', base=2)
  ax.set(xlabel='global batch size B', ylabel='final ANP top-1 (%)',
         title='Accuracy at a fixed epoch budget (95 % CI over seeds)')
  return _finish(fig, ax, path)


def _finish(fig, ax, path: str) -> str:
  """Grid, legend, tight layout; writes the PNG and frees the figure."""
  ax.grid(alpha=0.3, which='both')
  ax.legend(fontsize=8)
  return plotting.save_figure(fig, path)


def plot_steps(agg, target: float, path: str) -> str:
  """Steps to the target against the batch, log-log, with perfect scaling (Shallue-style): the
  mean and its interval where every seed reached the target, the lower bound (▽ marker: the
  mean is at least this) where some missed or diverged."""
  fig, ax, arms = _arm_points(agg, 'steps')
  for arm, entries, pts, marker in arms:
    means, bars = study_report.error_bars([e['steps_summary'] for e in pts])
    line = ax.errorbar([e['batch'] for e in pts], means, yerr=bars, marker=marker, capsize=3,
                       label=arm_label(*arm)).lines[0]
    b0, s0 = pts[0]['batch'], pts[0]['steps']
    bs = np.array([e['batch'] for e in entries], np.float64)
    ax.plot(bs, s0 * b0 / bs, ':', color=line.get_color(), alpha=0.6)
    bounds = [e for e in entries if e['steps_summary'] and
              e['steps_summary']['kind'] == 'censored']
    if bounds:
      ax.plot([e['batch'] for e in bounds], [e['steps_summary']['lower_bound'] for e in bounds],
              '^', color=line.get_color(), alpha=0.7)
  if any(e['steps_summary'] and e['steps_summary']['kind'] == 'censored'
         for entries in agg.values() for e in entries):
    ax.plot([], [], 'k^', label='lower bound (a seed missed or diverged)')
  ax.plot([], [], 'k:', label='perfect scaling S ∝ 1/B')
  missed = _missed(agg)
  if missed:  # Named on the figure: a missing point is a result, not a gap.
    ax.text(0.02, 0.02, 'did not reach the target with every seed:\n' + '\n'.join(missed),
            transform=ax.transAxes, fontsize=7, va='bottom')
  ax.set_xscale('log', base=2)
  if any(line.get_xydata().size for line in ax.lines):  # Log scale needs positive data.
    ax.set_yscale('log')
  ax.set(xlabel='global batch size B', ylabel=f'steps to {100 * target:g} % top-1',
         title='Steps to target (95 % CI over seeds)')
  return _finish(fig, ax, path)


def _run_counts(e) -> str:
  """'2 diverged', '1 diverged, 1 unfinished': what the runs of an entry without a result did
  (finished ones too: a searched rate with one diverged seed is not chosen, its other seeds
  may have finished)."""
  finished = e['runs'] - e['diverged'] - e['unfinished']
  counts = (('diverged', e['diverged']), ('unfinished', e['unfinished']), ('finished', finished))
  return ', '.join(f'{n} {what}' for what, n in counts if n)


def _missed(agg) -> List[str]:
  """Per arm, the batch sizes where not every seed reached the target (how many did, and what
  the others did), and those with no reported rate (every rate tried had a diverged or
  unfinished seed)."""
  out = []
  for arm, entries in agg.items():
    batches = []
    for e in entries:
      if e['steps'] is not None:
        continue
      if e['seeds']:
        others = ', '.join(f'{e[k]} {w}' for k, w in (('not_reached', 'missed'),
                                                     ('diverged', 'diverged'),
                                                     ('unfinished', 'unfinished')) if e[k])
        batches.append(f"{e['batch']} ({e['reached']} of {e['seeds']} seeds; {others})")
      elif e['runs']:
        batches.append(f"{e['batch']} (no result: {_run_counts(e)})")
    if batches:
      out.append(f'{arm_label(*arm)}: B = {", ".join(batches)}')
  return out


def plot_fit(agg, fits, path: str) -> str:
  """S(B) with the fitted S_min(1 + B_crit/B), and E against S with its hyperbola."""
  plt = plotting.pyplot()
  fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2))
  for (arm, entries), marker in zip(agg.items(), _styles(len(agg))):
    pts = [e for e in entries if e['steps'] is not None]
    if not pts:
      continue
    fit = fits[arm]
    b = np.array([e['batch'] for e in pts], np.float64)
    s = np.array([e['steps'] for e in pts], np.float64)
    line, = ax_s.plot(b, s, marker, label=arm_label(*arm))
    ax_e.plot(s, s * b, marker, color=line.get_color(), label=arm_label(*arm))
    if fit['valid']:
      s_min, b_crit, e_min = fit['s_min'], fit['b_crit'], fit['e_min']
      grid = np.geomspace(b.min() / 2, b.max() * 2, 100)
      noise = fit['b_simple_median']
      extra = f', B_simple≈{noise:.0f}' if noise is not None else ''
      ax_s.plot(grid, s_min * (1 + b_crit / grid), '-', color=line.get_color(), alpha=0.6,
                label=f'fit: S_min={s_min:.0f}, B_crit={b_crit:.0f}{extra}')
      # (S/S_min - 1)(E/E_min - 1) = 1  <=>  E = E_min S / (S - S_min), for S > S_min.
      ss = np.geomspace(s_min * 1.02, max(s.max(), s_min * 1.05) * 2, 100)
      ax_e.plot(ss, e_min * ss / (ss - s_min), '-', color=line.get_color(), alpha=0.6)
      if noise is not None:
        ax_s.axvline(noise, color=line.get_color(), ls='--', alpha=0.4)
  ax_s.set_xscale('log', base=2)
  ax_e.set_xscale('log')
  for ax in (ax_s, ax_e):
    if ax.lines:
      ax.set_yscale('log')
      ax.legend(fontsize=7)
    else:
      ax.text(0.5, 0.5, 'no run reached the target', transform=ax.transAxes, ha='center')
    ax.grid(alpha=0.3, which='both')
  ax_s.set(xlabel='global batch size B', ylabel='steps to target S',
           title='S = S_min (1 + B_crit / B); dashed: measured B_simple')
  ax_e.set(xlabel='steps to target S', ylabel='examples to target E = S·B',
           title='(S/S_min − 1)(E/E_min − 1) = 1')
  return plotting.save_figure(fig, path)


def plot_curves(rows, agg, out_dir: str, target: float, path: str) -> str:
  """Evaluation top-1 against epochs, one panel per arm, one line per batch size (its first
  seed at its reported rate)."""
  plt = plotting.pyplot()
  arms = _arms(rows)
  fig, axes = plt.subplots(1, max(1, len(arms)), figsize=(4.6 * max(1, len(arms)), 3.8),
                           squeeze=False)
  cmap = plt.get_cmap('viridis')
  batches = sorted({r['batch'] for r in rows})
  colour = {b: cmap(i / max(1, len(batches) - 1)) for i, b in enumerate(batches)}
  for ax, arm in zip(axes[0], arms):
    rate = {e['batch']: e['lr_mult'] for e in agg[arm]}  # None: the batch's only rate.
    shown = {e['batch'] for e in agg[arm] if e['seeds']}
    arm_rows = [r for r in rows if (r['rule'], r['warmup']) == arm and r['batch'] in shown
                and (rate[r['batch']] is None or float(r['lr_mult']) == rate[r['batch']])]
    seed = min((r['seed'] for r in arm_rows), default=0)
    for r in sorted((r for r in arm_rows if r['seed'] == seed), key=lambda r: r['batch']):
      evals = [m for m in read_metrics(os.path.join(out_dir, 'runs', r['name']))
               if 'eval/anp_top1' in m]
      if not evals:
        continue
      epochs = [m.get('eval/passes', m.get('eval/epoch', m['step'] / r['steps_per_epoch']))
                for m in evals]
      ax.plot(epochs, [100 * m['eval/anp_top1'] for m in evals], '-', color=colour[r['batch']],
              label=f'B={r["batch"]}' + (' (diverged)' if r['status'] == 'diverged' else ''))
    ax.axhline(100 * target, color='grey', ls='--', lw=0.8)
    ax.set(xlabel='epoch', ylabel='eval ANP top-1 (%)', title=arm_label(*arm), ylim=(0, 100))
    ax.grid(alpha=0.3)
    if ax.lines[1:]:  # Besides the target line.
      ax.legend(fontsize=7)
  return plotting.save_figure(fig, path)


# ----------------------------------------------------------------------------------------------
# The report.


def _fmt(x, spec='.0f', none='—'):
  return none if x is None else format(x, spec)


def _pct(x):
  return '—' if x is None else f'{100 * x:.2f}'


def _with_interval(x, interval, spec) -> str:
  """'167 [120, 240]' (an interval from `bootstrap_fit`), or the value alone."""
  if x is None:
    return '—'
  if not interval:
    return format(x, spec)
  return f'{format(x, spec)} [{format(interval["low"], spec)}, {format(interval["high"], spec)}]'


def _b_simple_cell(e, key: str) -> str:
  """Mean over seeds [95 % CI] of one B_simple window, with how many seeds measured it when
  not all did (a seed that missed the target has no window up to its crossing)."""
  summary = e.get(f'{key}_summary')
  if summary is None:
    return '—'
  text = stats.format_summary(dict(summary, kind='complete'), '.1f')
  return text if summary['n'] == e['seeds'] else f'{text} ({summary["n"]}/{e["seeds"]} seeds)'


def entries_of(agg):
  return [e for entries in agg.values() for e in entries]


def _steps_cell(e) -> str:
  if e['steps_summary'] is None:
    return '—'
  return stats.format_summary(e['steps_summary'])


def _top1_cell(e) -> str:
  if e['seeds'] == 0:  # No reported rate: what its runs did.
    if e['runs'] > 1:
      return f'{e["runs"]} runs: {_run_counts(e)}'
    return 'diverged' if e['diverged'] else 'unfinished'
  return stats.format_summary(e['top1_summary'], '.2f', 100)


def make_report(out_dir: str) -> str:
  """Writes DIR/report.md and the four PNGs next to it; returns the report's path."""
  rows = load_results(out_dir)
  if not rows:
    raise ValueError(f'{out_dir}/results.json has no runs.')
  target = rows[0]['target_top1']
  meta = {}
  if os.path.exists(os.path.join(out_dir, 'sweep.json')):
    with open(os.path.join(out_dir, 'sweep.json')) as f:
      meta = json.load(f)
  method = meta.get('ci', 't')
  agg = aggregate(rows, method)
  fits = fit_arms(agg)
  plot_accuracy(agg, os.path.join(out_dir, 'accuracy_vs_batch.png'))
  plot_steps(agg, target, os.path.join(out_dir, 'steps_vs_batch.png'))
  plot_fit(agg, fits, os.path.join(out_dir, 'noise_scale_fit.png'))
  plot_curves(rows, agg, out_dir, target, os.path.join(out_dir, 'training_curves.png'))
  # Rates given per batch size (--lr_from: another sweep's choices) are not a search here.
  given = bool(meta.get('point_lr')) and all(len(m) == 1 for m in meta['point_lr'].values())
  searched = len({r['lr_mult'] for r in rows}) > 1 and not given
  status = {}
  for r in rows:
    status[r['status']] = status.get(r['status'], 0) + 1
  seeds = sorted({r['seed'] for r in rows})
  split = {e['published_split'] for entries in agg.values() for e in entries if e['seeds']}

  lines = ['# Batch-size sweep: synchronous batch size vs accuracy', '']
  if meta:
    lines += [f'Preset `{meta.get("preset")}`, {meta.get("devices")} device(s), '
              f'{meta.get("epochs")} epochs per run, model `{meta.get("model")}` at '
              f'{meta.get("image_size")} px on `{meta.get("dataset")}`.', '']
  lines += [registration.describe(out_dir), '']
  lines += [f'{len(rows)} runs (' + ', '.join(f'{n} {s}' for s, n in sorted(status.items())) +
            f'), seeds {seeds}; target ANP top-1 {100 * target:g} % on validation.' +
            (' Learning rates were searched: each batch size is shown at the rate chosen on '
             'validation (a rate with a diverged seed is never chosen; fewest mean steps to the '
             'target over seeds that all reached it, else best mean final top-1).'
             if searched else
             ' Each batch size at the one rate given for it (`--lr_from`: the rate another sweep '
             'chose on validation), not tuned here.' if given else
             ' One learning rate per batch size (not tuned).'), '',
            stats.describe_method(method) + ' A batch size reaches the target only if every '
            'seed reached it; otherwise its steps read "≥ X (k/n reached, ...)": a lower bound '
            'of the mean (a miss counted at its budget), never the mean of the seeds that got '
            'there. A diverged seed leaves no mean final accuracy.', '']
  if split != {'test'}:
    lines += ['Figures on the validation split (the runs evaluated no test split): the split '
              'the learning rates were chosen on.', '']
  else:
    lines += ['Learning rates chosen on validation, published figures on the test split: '
              'final top-1 and steps / examples to the target are those of the test '
              'evaluations (the same target on test); best top-1 and B_simple come from '
              'training and validation.', '']

  lines += ['## Final accuracy vs batch size (Goyal et al. 2017)', '']
  stopped = sum(r['status'] == 'finished' and r.get('final_step') is not None
                and r['final_step'] < r['total_steps'] for r in rows)
  if stopped:
    lines += [f'{stopped} of {len(rows)} runs stopped at the target (`--stop_at_target`): '
              'their final top-1 is where each stopped, not an accuracy at a fixed budget '
              '(for that curve run the same batches for a fixed number of epochs, e.g. the '
              '`cpu:goyal` variant).', '']
  lines += ['![accuracy](accuracy_vs_batch.png)', '',
            '| arm | batch | peak lr | seeds | final top-1 % [95 % CI] | best top-1 % | '
            'steps to target [95 % CI] | examples to target | B_simple to target [95 % CI] | '
            'B_simple late |',
            '|---|---:|---:|---|---:|---:|---:|---:|---:|---:|']
  for arm, entries in agg.items():
    for e in entries:
      lr = _fmt(e['lr'], '.4g') + (', edge' if e['lr_chosen'] and e['lr_edge'] else '')
      seeds_cell = (f'{e["seeds"]}: ' + ', '.join(
          f'{e[k]} {w}' for k, w in (('reached', 'reached'), ('not_reached', 'missed'),
                                     ('diverged', 'diverged'), ('unfinished', 'unfinished'))
          if e[k])) if e['seeds'] else '—'
      examples = (stats.format_summary(e['examples_summary'])
                  if e['examples_summary'] else '—')
      lines.append(f'| {arm_label(*arm)} | {e["batch"]} | {lr} | {seeds_cell} | '
                   f'{_top1_cell(e)} | {_pct(e["best_top1"])} | {_steps_cell(e)} | {examples} | '
                   f'{_b_simple_cell(e, "b_simple")} | {_b_simple_cell(e, "b_simple_late")} |')
  lines.append('')
  for arm, entries in agg.items():
    done = [e for e in entries if e['top1'] is not None]
    if len(done) >= 2:
      small, large = done[0], done[-1]
      lines.append(f'- {arm_label(*arm)}: top-1 {_pct(small["top1"])} % at B={small["batch"]} '
                   f'→ {_pct(large["top1"])} % at B={large["batch"]} '
                   f'({100 * (large["top1"] - small["top1"]):+.2f} points).')
  lines.append('')

  lines += ['## Steps to target vs batch size (Shallue et al. 2018)', '',
            '![steps](steps_vs_batch.png)', '',
            'Dotted lines: perfect scaling (half the steps per doubling) through the smallest '
            'batch that reached the target. Steps to target are interpolated linearly between '
            'the two evaluations around the first crossing; a batch size whose seeds did not all '
            'reach the target is drawn at its lower bound and left out of the fit below.', '']
  missed = _missed(agg)
  if missed:
    lines += [f'Batch sizes that did not reach {100 * target:g} % top-1 with every seed:', '']
    lines += [f'- {m}' for m in missed] + ['']
  lines += ['## Critical batch size (McCandlish et al. 2018)', '',
            '![fit](noise_scale_fit.png)', '',
            'Fit of S = S_min (1 + B_crit / B) by least squares on relative residuals (S is '
            'linear in 1/B) over the batch sizes whose every seed reached the target; '
            'E_min = S_min·B_crit. B_simple = tr(Σ)/|G|² of a run is the ratio '
            'of the means of its logged tr(Σ) and |G|² estimates over a window of its steps '
            '(not a statistic of the per-step ratios, which is biased). Two windows: **up to '
            'the run\'s crossing of the target** on validation (the steps that the steps to '
            'target count; a run that never reached it has none), and **late**, the second half '
            'of what the run trained (up to where it stopped). The table above shows the mean '
            'over seeds with its 95 % interval, this one the median over batch sizes of those '
            'means. Intervals of B_crit, B_simple and their ratio: percentile bootstrap over '
            f'seeds ({FIT_RESAMPLES:,} resamples, seeds drawn with replacement within each '
            'batch size, refitted; optimistic for few seeds; ∞ where resampled fits put '
            'S_min ≤ 0, i.e. perfect scaling over the whole range).', '']
  if any(e['b_simple_window'] == 'late' for e in entries_of(agg)):
    lines += ['Rows written before B_simple had two windows carry the late window only.', '']
  lines += ['| arm | points | S_min | B_crit [95 % CI] | E_min | B_simple to target [95 % CI] '
            '| B_simple late | B_crit / B_simple [95 % CI] | note |',
            '|---|---:|---:|---:|---:|---:|---:|---:|---|']
  for arm, fit in fits.items():
    ci = fit['ci'] or {}
    cells = [_fmt(fit['s_min'], '.4g') if fit['valid'] else '—',
             _with_interval(fit['b_crit'], ci.get('b_crit'), '.4g') if fit['valid'] else '—',
             _fmt(fit['e_min'], '.4g') if fit['valid'] else '—',
             _with_interval(fit['b_simple_median'], ci.get('b_simple'), '.1f'),
             _fmt(fit['b_simple_late_median'], '.1f'),
             _with_interval(fit['ratio'], ci.get('ratio'), '.2f') if fit['valid'] else '—']
    lines.append(f'| {arm_label(*arm)} | {fit["points"]} | {" | ".join(cells)} | '
                 f'{fit["note"]} |')
  lines += [''] + study_report.confirmation_section(out_dir, (
      ('steps to the target', lambda p: study_report.published(p, 'steps_to_target'), '.0f',
       1.0),
      ('examples to the target', lambda p: study_report.published(p, 'examples_to_target'),
       ',.0f', 1.0),
      ('final top-1 (%)', lambda p: study_report.published_final(p), '.1f', 100.0)),
      name='batch size (point)')
  lines += ['## Training curves', '', '![curves](training_curves.png)', '']
  bad = [r for r in rows if r['status'] != 'finished']
  if bad:
    lines += ['## Runs that did not finish', '']
    lines += [f'- `{r["name"]}`: {r["status"]}' + (f' — {r["error"]}' if r.get('error') else '')
              for r in bad]
    lines.append('')
  path = os.path.join(out_dir, 'report.md')
  study_results.write_text_atomic(path, '\n'.join(lines))
  return path
