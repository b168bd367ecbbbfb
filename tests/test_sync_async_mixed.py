"""experiments/sync_async_mixed.py end to end (tiny preset): results, plots, summary, skip on
rerun, predicted times per method, bad input."""

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'experiments'))

import sync_async_mixed as sam  # noqa: E402


def test_tiny_preset_end_to_end_and_resume(data_dir, tmp_path, capsys):
  out = tmp_path / 'sam'
  argv = ['--preset', 'tiny', '--out', str(out), f'--config.data_dir={data_dir}']
  assert sam.main(argv) == 0
  rows = json.load(open(out / 'results.json'))
  assert [r['name'] for r in rows] == ['sync', 'async-04', 'local-n2-h02']
  for r in rows:
    assert r['curve'] and 0.0 <= r['final_top1'] <= 1.0 and not r['diverged']
    assert r['curve'][-1]['hours'] == pytest.approx(
        r['curve'][-1]['epoch'] * r['predicted_epoch_s'] / 3600)
  by_name = {r['name']: r for r in rows}
  assert 'asynchronous SGD' in by_name['async-04']['predicted_cluster']
  assert 'local SGD' in by_name['local-n2-h02']['predicted_cluster']
  assert by_name['sync']['final_loss'] != by_name['async-04']['final_loss']
  for name in ('accuracy_vs_epochs.png', 'accuracy_vs_time.png'):
    assert (out / name).stat().st_size > 1000
  summary = (out / 'summary.md').read_text()
  assert '| async-04 |' in summary and 'predicted epoch' in summary
  capsys.readouterr()
  assert sam.main(argv) == 0  # Everything finished: nothing retrained.
  assert capsys.readouterr().out.count('finished earlier, skipped') == 3


@pytest.mark.parametrize('extra,message', [
    (['--workers', '0'], 'must be >= 1'),
    (['--config.method=async'], 'set per run'),
    (['--nodes', '3'], 'does not divide the 8 devices'),
    (['--config.no_such_field=1'], 'Unknown config field --config.no_such_field'),
])
def test_bad_input_is_reported_before_training(data_dir, tmp_path, capsys, extra, message):
  argv = ['--preset', 'tiny', '--out', str(tmp_path), f'--config.data_dir={data_dir}'] + extra
  assert sam.main(argv) == 2
  assert message in capsys.readouterr().err
  assert not os.path.exists(tmp_path / 'runs')
