"""experiments/study_throughput.py (issue 44): a study preset measured before (compilation cache
and kept evaluation batches off) and after, interleaved, each study's phases from its
``ANP_PROFILE``; here on the tiny ghost-BN preset, for its plumbing only (no timing claims)."""

import json

import pytest

from conftest import run_experiment


@pytest.mark.slow(150)
def test_a_tiny_preset_is_measured_before_and_after(data_dir, tmp_path):
  out, work = tmp_path / 'result', tmp_path / 'work'
  r = run_experiment('study_throughput.py', '--preset', 'ghost_bn:tiny', '--out', str(out),
                     '--work', str(work), '--', f'--config.data_dir={data_dir}', '--no_report',
                     timeout=900)
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  result = json.loads((out / 'throughput.json').read_text())
  assert [m['mode'] for m in result['measurements']] == ['before', 'after']
  by_mode = {m['mode']: m for m in result['measurements']}
  for mode, m in by_mode.items():
    prof = m['profile']
    assert [s['label'] for s in prof['sections']] == [
        'g0002-lrx1-s0', 'g0002-lrx1-s1', 'global-lrx1-s0', 'global-lrx1-s1'], mode
    cats = m['categories']
    for row in ('start + imports', 'runner', 'dataset', 'compile: train', 'train steps',
                'evaluations', 'total'):
      assert cats[row] > 0, (mode, row)
    assert abs(cats['unaccounted']) < 0.1 * cats['total'], (mode, cats)
  hits = lambda m: sum(e.get('cache_hits', 0) for e in m['profile']['phases'].values())
  # Before: no persistent cache at all; after: the second seed of a point loads its programs.
  assert hits(by_mode['before']) == 0 and hits(by_mode['after']) > 0
  # The "after" cache was the study's own, in the scratch folder.
  assert (work / 'cache_after_0').is_dir() and not (work / 'cache_before_0').exists()
  summary = result['summary']
  assert summary['ratio_after_before']['total'] == pytest.approx(
      by_mode['after']['wall_s'] / by_mode['before']['wall_s'])
  table = (out / 'README.md').read_text()
  assert '| compile: train |' in table and '| total |' in table


def test_a_study_that_ran_nothing_writes_no_results(tmp_path):
  """Was: ``-- --help`` reached study.py, which printed its help and ran no study, and a table of
  four such non-runs was written as a measurement."""
  out = tmp_path / 'result'
  r = run_experiment('study_throughput.py', '--preset', 'ghost_bn:tiny', '--out', str(out),
                     '--work', str(tmp_path / 'work'), '--', '--help', timeout=600)
  assert r.returncode != 0, (r.stdout + r.stderr)[-3000:]
  assert 'Traceback' not in r.stderr, r.stderr[-3000:]
  assert not out.exists()
