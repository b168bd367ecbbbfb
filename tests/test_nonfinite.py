"""A result comes only from a finite state: no evaluation, checkpoint, best checkpoint or "target
reached" from a diverged one (issue 31, item 1)."""

import json
import os

import jax
import numpy as np
import pytest

from anp_jax import errors, evaluators, trainer
from conftest import tiny_config

# 8 steps per epoch (256 examples, batch 32): an evaluation after every step.
EVERY_STEP = dict(eval_every_epochs=0.125, log_every_steps=100)
DIVERGING = dict(base_lr=1e8, num_train_steps=12, **EVERY_STEP)


def _checkpoints_finite(directory):
  """{step: whether every array of its saved state is finite} for the checkpoints in
  `directory` (``checkpoints`` or ``checkpoints_best``)."""
  import orbax.checkpoint as ocp
  out = {}
  if not os.path.isdir(directory):
    return out
  for name in sorted(n for n in os.listdir(directory) if n.isdigit()):
    path = os.path.join(directory, name, 'state')
    with ocp.StandardCheckpointer() as checkpointer:
      device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
      target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                            checkpointer.metadata(path).item_metadata)
      state = checkpointer.restore(path, target)
    out[int(name)] = all(bool(np.all(np.isfinite(np.asarray(x))))
                         for x in jax.tree.leaves(state))
  return out


def _logged_evals(workdir):
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return []
  return [r for r in map(json.loads, open(path)) if any(k.startswith('eval/') for k in r)]


def _snapshot(directory):
  """Every file under `directory` with its size and modification time."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      st = os.stat(path)
      out[os.path.relpath(path, directory)] = (st.st_size, st.st_mtime_ns)
  return out


def _final(workdir):
  path = os.path.join(workdir, 'final_metrics.json')
  return open(path).read() if os.path.exists(path) else None


def _assert_diverged_cleanly(workdir, final_before=None):
  """No new final result, no non-finite checkpoint and no evaluation of a non-finite state
  logged."""
  assert _final(workdir) == final_before
  for sub in ('checkpoints', 'checkpoints_best'):
    finite = _checkpoints_finite(os.path.join(workdir, sub))
    assert all(finite.values()), (sub, finite)
  for record in _logged_evals(workdir):
    values = [v for k, v in record.items() if k != 'step']
    assert all(np.isfinite(values)), record


def test_a_diverged_state_never_reaches_the_target(data_dir, tmp_path):
  """The issue's reproduction: a NaN model scores chance accuracy (1/8 for 8 ANPs), above a low
  target; the run used to stop there 'at the target', exit 0 and keep a NaN checkpoint."""
  config = tiny_config(data_dir, target_value=0.1, stop_at_target=True, **DIVERGING)
  with pytest.raises(errors.NonFiniteLossError, match='not finite|loss is (nan|inf)'):
    trainer.train_and_evaluate(config, str(tmp_path))
  _assert_diverged_cleanly(str(tmp_path))


@pytest.mark.parametrize('metric', ['eval/loss', 'eval/anp_top1'])
def test_a_diverged_state_never_replaces_the_best_checkpoint(data_dir, tmp_path, metric):
  """Three healthy steps keep a best checkpoint; the run resumed with a diverging learning rate
  stops with exit 3 and leaves the best checkpoint as it was (orbax's best-N ordering treats NaN
  as equal and keeps the newest: a NaN state used to replace it)."""
  healthy = dict(keep_best_metric=metric, checkpoint_every_steps=3, **EVERY_STEP)
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=3, **healthy), str(tmp_path))
  best = tmp_path / 'checkpoints_best'
  before, final = _snapshot(best), _final(str(tmp_path))
  assert [n for n in os.listdir(best) if n.isdigit()] and final
  config = tiny_config(data_dir, **dict(healthy, **DIVERGING))
  with pytest.raises(errors.NonFiniteLossError):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert _snapshot(best) == before
  _assert_diverged_cleanly(str(tmp_path), final)


@evaluators.register('test_nan_from_step_2')
class NanFromStep2(evaluators.Evaluator):
  """An evaluation whose own loss is NaN from the second step on (the state stays finite)."""

  @classmethod
  def metrics(cls, config, options):
    return {'loss': evaluators.Goal('min', 0.0)}

  def evaluate(self, state):
    step = int(np.asarray(jax.device_get(self.run.executor.unreplicate(state).step)))
    return {f'{self.prefix}/loss': float('nan') if step >= 2 else 1.0}


def test_an_evaluation_with_a_nan_loss_is_a_divergence(data_dir, tmp_path):
  config = tiny_config(data_dir, num_train_steps=4, keep_best_metric='eval/anp_top1',
                       checkpoint_every_steps=1, **EVERY_STEP)
  config.evals.nan = dict(kind='test_nan_from_step_2')
  with pytest.raises(errors.NonFiniteLossError, match=r'the evaluation at step 2 is not finite '
                     r'\(nan/loss = nan\)'):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert [r['step'] for r in _logged_evals(str(tmp_path))] == [1]
  assert sorted(n for n in os.listdir(tmp_path / 'checkpoints') if n.isdigit()) == ['1']
  assert [n for n in os.listdir(tmp_path / 'checkpoints_best') if n.isdigit()] == ['1']
  _assert_diverged_cleanly(str(tmp_path))


def test_a_non_finite_checkpoint_is_never_resumed_nor_evaluated(data_dir, tmp_path):
  """A NaN state that an older version saved: resuming from it moves it aside (the rerun then
  resumes from the healthy one before); evaluating it is a divergence (exit 3) that changes
  nothing in the workdir."""
  config = tiny_config(data_dir, num_train_steps=3, checkpoint_every_steps=3)
  trainer.train_and_evaluate(config, str(tmp_path))
  run = trainer.build(config)
  ckpt = trainer._checkpointer(run, str(tmp_path))
  state, step = ckpt.restore_latest(run.executor.restore_target(run.executor.init()))
  assert step == 3
  nan = jax.tree.map(lambda x: x * np.nan if np.issubdtype(x.dtype, np.floating) else x,
                     run.executor.to_checkpoint(state))
  ckpt.save(6, nan)
  ckpt.close()

  before = _snapshot(tmp_path)
  with pytest.raises(errors.NonFiniteLossError, match='state after step 6 is not finite'):
    trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=6, eval_only=True),
                               str(tmp_path))
  assert _snapshot(tmp_path) == before

  with pytest.raises(errors.NonFiniteLossError, match=r'state after step 6 is not finite.*'
                     r'checkpoint of step 6 holds the state this came from and was moved aside'):
    trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=6), str(tmp_path))
  assert '6.diverged' in os.listdir(tmp_path / 'checkpoints')
  result = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=6), str(tmp_path))
  assert int(jax.device_get(result.state.step)) == 6 and np.isfinite(result.final_eval['eval/loss'])
