"""Checkpoint identity: the fields a resume must keep, the batch, numerics (issue 13) and
data-shaping ones (issue 31, item 7) included, and the one registry of fields added later that
older checkpoints are read with (issue 33, item 6)."""

import os
import re

import pytest

from anp_jax import checkpointing, trainer
from anp_jax.configs import default
from conftest import tiny_config


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
