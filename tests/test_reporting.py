"""anp_jax/reporting.py: a progress bar that moves, with honest rates, and JSON files written
atomically."""

import json
import os

import pytest

from anp_jax import reporting


def test_rates_after_an_evaluation_exclude_it(monkeypatch):
  from anp_jax import reporting
  now = [100.0]
  monkeypatch.setattr(reporting.time, 'time', lambda: now[0])
  bar = reporting.ProgressBar(100, images_per_step=10, enabled=False)
  bar.reset_clock(0)
  now[0] += 10.0  # 10 steps of training in 10 s ...
  now[0] += 30.0  # ... then a 30 s evaluation.
  bar.exclude(30.0)
  assert bar.rates(10) == pytest.approx((1.0, 10.0))


def test_progress_bar_in_a_log_writes_plain_lines_every_few_seconds(monkeypatch):
  import io
  from anp_jax import reporting
  now = [0.0]
  monkeypatch.setattr(reporting.time, 'time', lambda: now[0])
  stream = io.StringIO()
  bar = reporting.ProgressBar(100, images_per_step=10, stream=stream)
  for step in range(1, 31):
    now[0] += 1.0
    bar.update(step)
  lines = stream.getvalue().splitlines()
  assert 5 <= len(lines) <= 7 and '\r' not in stream.getvalue()


def test_write_json_atomic_never_leaves_a_partial_file(tmp_path):
  path = str(tmp_path / 'final_metrics.json')
  reporting.write_json_atomic(path, {'step': 3})
  with pytest.raises(TypeError):
    reporting.write_json_atomic(path, {'step': object()})  # Fails mid-serialisation.
  with open(path) as f:
    assert json.load(f) == {'step': 3}  # The previous complete file is intact.
  assert os.listdir(tmp_path) == ['final_metrics.json']  # No temporary left behind.
