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


def _plotted(monkeypatch, records):
  """{panel title: [line labels]} of `reporting.plot_curves(records)`."""
  from anp_jax import plotting
  figures = []
  monkeypatch.setattr(plotting, 'save_figure', lambda fig, path: figures.append(fig) or path)
  reporting.plot_curves(records, 'unused.png')
  (fig,) = figures
  out = {ax.get_title(): [line.get_label() for line in ax.get_lines()] for ax in fig.axes}
  plotting.pyplot().close(fig)
  return out


def _eval_record(step, prefixes=('eval',), **extra):
  record = {'step': step, 'eval/epoch': step / 4, 'eval/examples_seen': 32 * step, **extra}
  for p in prefixes:
    record.update({f'{p}/anp_top1': 0.1 * step, f'{p}/anp_top5': 0.3, f'{p}/adjective_top1': 0.4,
                   f'{p}/noun_top1': 0.5, f'{p}/loss': 2.0 / step, f'{p}/anp_loss': 1.0})
  return record


def test_curves_show_every_evaluators_metrics(monkeypatch):
  """Issue 42, item 5. Before: only ``eval/*`` was drawn, so a run whose evaluator logs under
  another prefix (``val/``) had an empty accuracy panel; other kinds' metrics were never drawn."""
  train = [{'step': s, 'train/epoch': s / 4, 'train/loss': 3.0 / s} for s in (1, 2, 3)]
  evals = [_eval_record(s, ('val', 'test'), **{'norm/l2': 10.0 + s}) for s in (2, 3)]
  panels = _plotted(monkeypatch, train + evals)
  assert panels['Evaluation accuracy'] == [
      f'{p}: {m}' for p in ('test', 'val')
      for m in ('anp top-1', 'adjective top-1', 'noun top-1', 'anp top-5')]
  assert panels['Loss'] == ['train', 'test', 'val']
  assert panels['Other evaluation metrics'] == ['norm/l2']


def test_curves_of_the_default_evaluation_are_unchanged(monkeypatch):
  panels = _plotted(monkeypatch, [{'step': 1, 'train/epoch': 0.25, 'train/loss': 3.0},
                                  _eval_record(2)])
  assert panels == {'Loss': ['train', 'eval'],
                    'Evaluation accuracy': ['eval: anp top-1', 'eval: adjective top-1',
                                            'eval: noun top-1', 'eval: anp top-5']}
