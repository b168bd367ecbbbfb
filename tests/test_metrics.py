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


# A training process's imports and logs, in a fresh process: the events it writes, and whether
# Keras (which anp_jax never uses) was imported on the way.
WRITER = """
import json, sys
import anp_jax.runtime; anp_jax.runtime.configure()
import anp_jax.trainer
from anp_jax import metrics
writer = metrics.MetricWriter(sys.argv[1])
writer.write(2, {'train/loss': 3.5, 'train/anp_top1': 0.25})
writer.write(4, {'eval/anp_top1': 0.5})
writer.close()
metrics.MetricWriter(sys.argv[2], enabled=False).close()  # Another process than process 0.
keras = sorted(m for m in sys.modules if m == 'keras' or m.startswith(('keras.', 'tf_keras')))
import keras as k  # Still importable, as usual, once TensorFlow is.
print(json.dumps({'keras': keras, 'sgd': k.optimizers.SGD.__name__}))
"""


def test_the_writer_logs_tensorboard_scalars_and_a_training_process_imports_no_keras(tmp_path):
  """The events hold every scalar at its step (read with TensorBoard's own reader). Was: clu's
  writer imported Keras through TensorBoard's hparams plugin, and TensorFlow's own import loaded
  ``keras.src`` (0.7 s more CPU at import, `anp_jax.tf_import`)."""
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.util import tensor_util
  (tmp_path / 'w0').mkdir()
  (tmp_path / 'w1').mkdir()
  out = subprocess.run([sys.executable, '-c', WRITER, str(tmp_path / 'w0'), str(tmp_path / 'w1')],
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                       timeout=300, cwd=str(tmp_path))
  assert out.returncode == 0, out.stderr[-3000:]
  got = json.loads(out.stdout.strip().splitlines()[-1])
  assert got == {'keras': [], 'sgd': 'SGD'}
  events = event_accumulator.EventAccumulator(str(tmp_path / 'w0'),
                                              size_guidance={event_accumulator.TENSORS: 0})
  events.Reload()
  scalars = {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                   for e in events.Tensors(tag)] for tag in events.Tags()['tensors']}
  assert scalars == {'train/loss': [(2, 3.5)], 'train/anp_top1': [(2, 0.25)],
                     'eval/anp_top1': [(4, 0.5)]}
  assert [json.loads(l)['step'] for l in open(tmp_path / 'w0' / 'metrics.jsonl')] == [2, 4]
  assert os.listdir(tmp_path / 'w1') == []  # Only process 0 writes logs.


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
