"""anp_jax/reporting.py: a progress bar that moves, with honest rates, and JSON files written
atomically."""

import io
import json
import logging
import os
import sys

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


class _Terminal(io.StringIO):
  """A terminal for the bar: what it shows is `screen` (carriage returns overwrite)."""

  def isatty(self):
    return True

  def screen(self):
    lines = []
    for raw in self.getvalue().split('\n'):
      shown = ''
      for part in raw.split('\r'):
        shown = part + shown[len(part):]
      lines.append(shown.rstrip())
    return lines


def _bar_on(terminal, monkeypatch):
  now = [0.0]
  monkeypatch.setattr(reporting.time, 'time', lambda: now[0])
  bar = reporting.ProgressBar(100, images_per_step=10, stream=terminal)
  for step in range(1, 26):
    now[0] += 1.0
    bar.update(step, {'loss': 5.406, 'top1': 0.0759} if step == 25 else None, force=step == 25)
  now[0] += 1.0
  bar.update(26)
  return bar


def test_a_log_line_or_a_say_line_while_the_bar_is_drawn_starts_on_its_own_line(monkeypatch):
  """Was: '[███···] 4/30 13.3% | ... | ETA 0m49s | W1205 20:59:28.48 trainer.py:251] ...' on one
  terminal line (the bar is redrawn in place, without a newline)."""
  terminal = _Terminal()
  handler = logging.StreamHandler(terminal)
  logging.getLogger().addHandler(handler)
  monkeypatch.setattr(sys, 'stdout', terminal)
  try:
    bar = _bar_on(terminal, monkeypatch)
    logging.getLogger('orbax').warning('a library warning')
    bar.update(27, force=True)
    reporting.say('eval @ step 27: ...')
    bar.update(28, force=True)
    bar.close()
  finally:
    logging.getLogger().removeHandler(handler)
  screen = terminal.screen()
  assert 'a library warning' in screen and 'eval @ step 27: ...' in screen, screen
  assert screen[-2].startswith('[') and '28/100' in screen[-2] and screen[-1] == '', screen
  assert len([line for line in screen if '/100' in line]) == 1, screen  # Erased, redrawn.


def test_the_bar_shows_the_last_logged_loss_until_the_next(monkeypatch):
  """Was: the loss / top-1 field blank on every update but the logged steps'."""
  terminal = _Terminal()
  _bar_on(terminal, monkeypatch)
  assert terminal.screen()[-1].endswith('| loss 5.406 top1 0.0759'), terminal.screen()
  assert '26/100' in terminal.screen()[-1]


def test_say_prints_a_warning_once(capsys, monkeypatch):
  """Process 0 prints what it says; its log record must not reach the terminal as a second
  copy (absl's handler writes WARNING records to stderr: 'W1205 ... trainer.py:251] ...')."""
  from absl import logging as absl_logging
  monkeypatch.setattr(absl_logging.get_absl_handler().python_handler, 'stream', sys.stderr)
  logging.getLogger().addHandler(absl_logging.get_absl_handler())
  try:
    reporting.say('WARNING: something to know', logging.WARNING)
  finally:
    logging.getLogger().removeHandler(absl_logging.get_absl_handler())
  out, err = capsys.readouterr()
  assert (out + err).count('something to know') == 1, (out, err)
