"""metrics.jsonl read back as the trainer meant it, the step where its evaluations cross a target
(`target_crossing`); the process set-up is explicit."""

import json
import os
import subprocess
import sys

import pytest

from anp_jax import metrics_io, xla_flags
from anp_jax.research import sweep
from conftest import ROOT


def test_read_metrics_keeps_the_last_record_per_step_and_kind(tmp_path):
  lines = [{'step': 2, 'train/loss': 3.0}, {'step': 4, 'train/loss': 2.0},
           {'step': 4, 'eval/anp_top1': 0.1},
           # Resumed from the checkpoint of step 2: steps 3-4 are logged again (exact resume).
           {'step': 4, 'train/loss': 2.5}, {'step': 4, 'eval/anp_top1': 0.2}]
  text = ''.join(json.dumps(l) + '\n' for l in lines) + '{"step": 6, "train/lo'  # Killed.
  (tmp_path / metrics_io.METRICS_FILE).write_text(text + '\n\n')
  records = metrics_io.read_metrics(str(tmp_path))
  assert records == [lines[0], lines[3], lines[4]]
  assert metrics_io.read_metrics(str(tmp_path), kind='eval') == [lines[4]]
  assert metrics_io.read_metrics(str(tmp_path), kind='train') == [lines[0], lines[3]]
  assert metrics_io.read_metrics(str(tmp_path / 'nothing')) == []


def test_read_metrics_orders_by_step_then_train_before_eval(tmp_path):
  """Whatever order the lines came in, and with the last line cut mid-write (no newline)."""
  lines = [{'step': 8, 'eval/anp_top1': 0.3, 'time': 5.0}, {'step': 8, 'train/loss': 1.0},
           {'step': 3, 'eval/anp_top1': 0.2}, {'step': 3, 'train/loss': 2.0},
           {'step': 1, 'train/loss': 4.0}]
  text = ''.join(json.dumps(l) + '\n' for l in lines) + '{"step": 9, "train/loss": 0.'
  (tmp_path / metrics_io.METRICS_FILE).write_text(text)
  assert metrics_io.read_metrics(str(tmp_path)) == [lines[4], lines[3], lines[2], lines[1],
                                                    lines[0]]
  assert [metrics_io.record_kind(r) for r in lines] == ['eval', 'train', 'eval', 'train', 'train']


def test_importing_anp_jax_leaves_xla_flags_alone_and_configure_sets_them():
  code = ('import os, anp_jax.trainer, anp_jax.runtime; before = os.environ["XLA_FLAGS"]; '
          'anp_jax.runtime.configure(); print(repr(before)); print(repr(os.environ["XLA_FLAGS"]))')
  env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS='--xla_force_host_platform_device_count=2')
  env.pop(xla_flags.OPT_OUT, None)
  out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  before, after = out.stdout.split('\n')[:2]
  assert before == repr('--xla_force_host_platform_device_count=2')
  assert after == repr(xla_flags.apply_cpu_defaults(
      {'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}))
  assert after != before  # This jaxlib is a tested one: the defaults are added.


def _evals(points):
  return [{'step': s, 'eval/anp_top1': a} for s, a in points]


def test_target_crossing_interpolates_between_evaluations():
  evals = _evals([(4, 0.10), (8, 0.30), (12, 0.50), (16, 0.45)])
  hit = sweep.target_crossing(evals, 0.2)
  assert hit == {'step': pytest.approx(6.0), 'eval_step': 8, 'interpolated': True}
  assert sweep.target_crossing(evals, 0.45)['step'] == pytest.approx(11.0)
  assert sweep.target_crossing(evals, 0.30)['step'] == pytest.approx(8.0)
  first = sweep.target_crossing(evals, 0.05)  # Already the first evaluation: an upper bound.
  assert first == {'step': 4.0, 'eval_step': 4, 'interpolated': False}
  assert sweep.target_crossing(evals, 0.6) is None
