"""Figures the docs quote are the committed results they come from (docs/studies.md)."""

import csv
import os

from anp_jax.research import sweep_report as report
from conftest import ROOT


def _flat(text):
  return ' '.join(text.split())


def test_quoted_sweep_figures_match_the_committed_results():
  results = os.path.join(ROOT, 'experiments', 'results', 'bs_sweep_cpu')
  with open(os.path.join(results, 'results.csv')) as f:
    rows = {(int(r['batch']), r['rule'], r['warmup']): r for r in csv.DictReader(f)}
  pct = lambda b, rule='linear', warm='on': f'{100 * float(rows[(b, rule, warm)]["final_top1"]):.1f}'
  # Steps to target are interpolated (floats in results.csv); the report and README round them.
  steps = lambda b, warm: f"{float(rows[(b, 'linear', warm)]['steps_to_target']):.0f}"
  readme = _flat(open(os.path.join(ROOT, 'README.md')).read())
  quoted = [
      f'final ANP top-1 falls from {pct(32)} % (B=32) and {pct(64)} % (64) to {pct(128)} % (128), '
      f'{pct(256)} % (256), {pct(512)} % (512) and {pct(1024)} % (1024)',
      f'({steps(32, "off")} → {steps(64, "off")} → {steps(128, "off")} without warmup), then '
      f'{steps(256, "off")}, {steps(512, "off")}, {steps(1024, "off")}',
      f'({pct(32, "none")} % at B=32)',
  ]
  fits = report.fit_arms(report.aggregate(report.load_results(results)))
  b_crit = {w: fits[('linear', w)]['b_crit'] for w in ('on', 'off')}
  b_simple = {w: fits[('linear', w)]['b_simple_median'] for w in ('on', 'off')}
  quoted.append(f'B_crit = {b_crit["on"]:.0f} (warmup) / {b_crit["off"]:.0f} (no warmup) against a '
                f'measured B_simple of {b_simple["on"]:.0f} / {b_simple["off"]:.0f}')
  for text in quoted:
    assert text in readme, text
  r256, r1024 = rows[(256, 'linear', 'on')], rows[(1024, 'linear', 'on')]
  docstring = _flat(open(os.path.join(ROOT, 'anp_jax', 'configs', 'sweep_cpu.py')).read())
  assert (f'B=256 reaches it after {float(r256["steps_to_target"]):.0f} steps '
          f'({float(r256["epochs_to_target"]):.1f} epochs) and ends at {pct(256)} %; B=1024 (lr '
          f'{float(r1024["lr"]):g}) after {float(r1024["steps_to_target"]):.0f} steps '
          f'({float(r1024["epochs_to_target"]):.1f} epochs), ending at {pct(1024)} %') in docstring


