"""Checkpoint identity: the fields a resume must keep, the batch, numerics (issue 13) and
data-shaping ones (issue 31, item 7) included, the one registry of fields added later that
older checkpoints are read with (issue 33, item 6), and the BatchNorm statistics batch (issue
42, item 2)."""

import json
import os
import re
import subprocess

import pytest

from anp_jax import checkpointing, models, trainer
from anp_jax.configs import default
from conftest import ROOT, main_cmd, subprocess_env, tiny_config


@pytest.fixture(scope='module')
def three_steps(data_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp('three_steps')
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=3, checkpoint_every_steps=3),
                             str(workdir))
  return workdir


@pytest.mark.parametrize('field,value,saved', [
    ('synthetic.seed', 5, 0),  # Other generated images.
    ('augment', 'flip', "'cifar'"),  # Other augmentations.
    ('crop_padding', 2, 4),
    ('synthetic.label_noise', 0.25, 0.0),  # Another generated dataset, same classes.
])
def test_a_resume_that_changes_the_data_is_refused_by_name(data_dir, three_steps, field,
                                                           value, saved):
  """Before, these resumed silently and continued on other data."""
  before = sorted(os.listdir(three_steps / 'checkpoints'))
  with pytest.raises(ValueError, match=re.escape(f'{field}: checkpoint {saved} vs config ')):
    trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=6, **{field: value}),
                               str(three_steps))
  assert sorted(os.listdir(three_steps / 'checkpoints')) == before


def test_an_evaluation_may_choose_its_own_preprocessing(data_dir, three_steps):
  result = trainer.train_and_evaluate(
      tiny_config(data_dir, num_train_steps=3, eval_only=True, seed=7, augment='flip',
                  crop_padding=2), str(three_steps))
  assert result.step == 3


def test_only_the_fields_of_the_configs_dataset_and_augmentation_count(tmp_path):
  cifar = checkpointing.identity(tiny_config(tmp_path))
  assert {'crop_padding', 'synthetic.seed', 'synthetic.num_pairs'} <= set(cifar)
  assert 'crop_fraction' not in cifar and 'anp.config_name' not in cifar
  real = checkpointing.identity(tiny_config(tmp_path, dataset='anp', augment='inception'))
  assert {'crop_fraction', 'anp.config_name'} <= set(real)
  assert not any(k.startswith('synthetic.') for k in real) and 'crop_padding' not in real
  # A synthetic section's change does not matter to a run on a prepared dataset.
  other = checkpointing.identity(tiny_config(tmp_path, dataset='anp', augment='inception',
                                             **{'synthetic.seed': 3}))
  assert checkpointing.identity_diff(real, other) == {}


@pytest.mark.parametrize('field', ['init_from', 'method', 'model.adjective_head'])
def test_an_entry_an_older_checkpoint_lacks_is_compared_with_its_added_fields_value(
    tmp_path, field):
  """The registry's value is what every run had before the field existed."""
  current = checkpointing.identity(tiny_config(tmp_path))
  old = {k: v for k, v in current.items() if k != field}
  assert checkpointing.identity_diff(old, current) == {}  # The registry's value: accepted.
  changed = {'init_from': '/w', 'method': 'async', 'model.adjective_head': False}[field]
  assert checkpointing.identity_diff(old, dict(current, **{field: changed})) == {
      field: (default.ADDED_FIELDS[field], changed)}


@pytest.mark.parametrize('field', ['augment', 'synthetic.seed', 'batch_size', 'num_anps'])
def test_an_entry_recorded_later_is_not_compared_for_older_checkpoints(tmp_path, field):
  """The field existed before the identity recorded it: an older checkpoint's value is unknown."""
  current = checkpointing.identity(tiny_config(tmp_path), {'num_anps': 8})
  old = {k: v for k, v in current.items() if k != field}
  assert field not in default.ADDED_FIELDS
  assert checkpointing.identity_diff(old, dict(current, **{field: 12345})) == {}


def test_resume_with_another_batch_size_is_refused_by_name(data_dir, tmp_path):
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=2), str(tmp_path))
  with pytest.raises(ValueError, match=r'batch_size: checkpoint 32 vs config 64'):
    trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=4, batch_size=64),
                             str(tmp_path))


@pytest.mark.parametrize('field,value', [('batch_size', 64), ('grad_accum_steps', 2),
                                         ('bn_mode', 'global'), ('model.dtype', 'bfloat16')])
def test_checkpoint_identity_covers_the_batch_and_numerics(tmp_path, field, value):
  saved = tiny_config(tmp_path)
  meta = {'identity': checkpointing.identity(saved)}
  current = tiny_config(tmp_path, **{field: value})
  ckpt = checkpointing.Checkpointer(str(tmp_path), current)
  try:
    with pytest.raises(ValueError, match=re.escape(f'{field}: checkpoint')):
      ckpt._check_identity(meta, 7)
    ckpt._check_identity({'identity': checkpointing.identity(current)}, 7)  # Same: accepted.
    # Checkpoints written before these fields were recorded are not refused for lacking them
    # (the fields existed: their value is unknown, none is in the added-fields registry).
    assert field not in default.ADDED_FIELDS
    old = {k: v for k, v in checkpointing.identity(current).items() if k != field}
    ckpt._check_identity({'identity': old}, 7)
  finally:
    ckpt.close()


# ----------------------------------------------------------------------------------------------
# Issue 42, item 2: the BatchNorm statistics batch (the examples each BatchNorm normalises over)
# is part of the identity: a resume that changes it continues another computation.


@pytest.mark.parametrize('mode,devices,accum,want', [
    ('ghost', 8, 1, 4), ('ghost', 1, 2, 4),  # bn_group_size, whatever the devices.
    ('global', 8, 1, 32), ('global', 2, 1, 32), ('global', 1, 2, 16),  # batch / accumulation.
    ('per_device', 8, 1, 4), ('per_device', 2, 1, 16), ('per_device', 2, 2, 8),  # Per device.
])
def test_the_statistics_batch_of_each_bn_mode(mode, devices, accum, want):
  config = tiny_config('/nonexistent', bn_mode=mode, grad_accum_steps=accum)  # Batch 32.
  micro = 32 // devices // accum
  assert models.statistics_batch(config, micro, devices) == want


def test_global_bn_under_local_sgd_averages_over_a_nodes_devices():
  config = tiny_config('/nonexistent', bn_mode='global', method='local_sgd')
  assert models.statistics_batch(config, 4, 8 // 2) == 16  # 2 nodes of 4 devices, 4 each.


def _finished(data_dir, workdir, **overrides):
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=3, checkpoint_every_steps=3,
                                         **overrides), str(workdir))
  return {n: open(workdir / n).read() for n in ('config.json', 'metrics.jsonl')}


def test_a_resume_with_another_ghost_group_is_refused_by_name(data_dir, tmp_path):
  """Repro A (8 devices of 4 examples here: groups of 2 instead of 4). Before: rc 0,
  "Resumed", config.json rewritten to the new group size while the steps so far used 4."""
  workdir = tmp_path / 'w'
  before = _finished(data_dir, workdir)
  with pytest.raises(ValueError, match=re.escape('bn_statistics_batch: checkpoint 4 vs config 2')):
    trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=6, bn_group_size=2),
                               str(workdir))
  assert {n: open(workdir / n).read() for n in before} == before
  assert json.loads(before['config.json'])['bn_group_size'] == 4
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['3']


@pytest.mark.slow(20)
def test_a_per_device_resume_on_other_devices_exits_2_naming_the_statistics_batch(data_dir,
                                                                                  tmp_path):
  """Repro B: per-device BatchNorm, 8 devices (4 examples each) to step 3, resumed on 4 (8
  each). Before: resumed silently, the statistics batch doubled."""
  workdir = tmp_path / 'w'
  before = _finished(data_dir, workdir, bn_mode='per_device')
  out = subprocess.run(main_cmd(data_dir, workdir, num_train_steps=6, checkpoint_every_steps=3,
                                bn_mode='per_device'),
                       env=subprocess_env(4), capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
  assert out.returncode == 2, out.stderr[-3000:]
  errors = [line for line in out.stderr.splitlines() if line.startswith('ERROR')]
  assert len(errors) == 1 and 'bn_statistics_batch: checkpoint 4 vs config 8' in errors[0]
  assert {n: open(workdir / n).read() for n in before} == before


def test_bn_modes_whose_statistics_batch_is_the_same_stay_resumable(tmp_path):
  """Ghost and global BatchNorm do not depend on the device count: their identities on 8 and on
  2 devices (or 2 processes) are equal, so the resumes across device and process counts go on."""
  for mode in ('ghost', 'global'):
    config = tiny_config(tmp_path, bn_mode=mode)
    on = lambda devices: checkpointing.identity(  # noqa: E731
        config, {'bn_statistics_batch': models.statistics_batch(config, 32 // devices, devices)})
    assert checkpointing.identity_diff(on(8), on(2)) == {}
  # A changed group size with global BN changes nothing that BN computes: accepted.
  glob = lambda group: checkpointing.identity(  # noqa: E731
      tiny_config(tmp_path, bn_mode='global', bn_group_size=group),
      {'bn_statistics_batch': 32})
  assert checkpointing.identity_diff(glob(4), glob(8)) == {}


def test_a_checkpoint_that_does_not_record_the_statistics_batch_still_restores(tmp_path):
  """Older checkpoints lack the entry; the field existed, its value is unknown: not compared."""
  assert 'bn_statistics_batch' not in default.ADDED_FIELDS
  current = checkpointing.identity(tiny_config(tmp_path), {'bn_statistics_batch': 8})
  old = {k: v for k, v in current.items() if k != 'bn_statistics_batch'}
  assert checkpointing.identity_diff(old, current) == {}


def test_an_evaluation_ignores_the_statistics_batch(data_dir, tmp_path):
  """In evaluation BatchNorm normalises with its running statistics: another group size (or
  device count with per-device BN) evaluates the same model."""
  assert 'bn_statistics_batch' in checkpointing.IDENTITY_TRAINING_ONLY
  workdir = tmp_path / 'w'
  _finished(data_dir, workdir)
  result = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=3, eval_only=True,
                                                  bn_group_size=2), str(workdir))
  assert result.step == 3
  saved = {'bn_statistics_batch': 4}
  assert checkpointing.identity_diff(saved, {'bn_statistics_batch': 8}, eval_only=True) == {}
  assert checkpointing.identity_diff(saved, {'bn_statistics_batch': 8}) == {
      'bn_statistics_batch': (4, 8)}


def test_the_optax_function_is_part_of_the_identity(tmp_path):
  """Was: `optimizer='optax'` was the whole identity, so a resume from adam's state with
  ``--config.optax_name=adamw`` (the same state structure) trained on silently with another
  optimizer. The function counts only where the optimizer is 'optax'."""
  adam = checkpointing.identity(tiny_config(tmp_path, optimizer='optax', optax_name='adam'))
  adamw = checkpointing.identity(tiny_config(tmp_path, optimizer='optax', optax_name='adamw'))
  assert checkpointing.identity_diff(adam, adamw) == {'optax_name': ('adam', 'adamw')}
  assert 'optax_name' not in checkpointing.identity(tiny_config(tmp_path, optimizer='sgd'))
