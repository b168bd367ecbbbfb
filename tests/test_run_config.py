"""A finished run's config.json read back in today's fields: fields added since it was recorded get
the value those runs used and replaced fields become their replacements (`default.ADDED_FIELDS`,
`default.REPLACED_FIELDS`), so readers use plain attribute access."""

import json
import os
import subprocess
import sys

import pytest

from anp_jax import cli, setup
from anp_jax.configs import default
from anp_jax.errors import ConfigError
from conftest import ROOT


def _write_old_config(workdir, drop=('method', 'evals', 'target_metric', 'target_value',
                                     'stop_at_target', 'model.conv_impl', 'init_from'),
                      **changed):
  """``workdir/config.json`` as the trainer writes it, without the `drop` fields."""
  recorded = json.loads(default.get_config().to_json_best_effort())
  for field in drop:
    *parents, name = field.split('.')
    node = recorded
    for part in parents:
      node = node[part]
    del node[name]
  recorded.update(changed)
  (workdir / 'config.json').write_text(json.dumps(recorded))
  return recorded


def test_read_run_config_fills_the_fields_added_since_and_keeps_the_recorded_ones(tmp_path):
  _write_old_config(tmp_path, model={'name': 'resnet8', 'width': 0.5}, batch_size=64)
  config = default.read_run_config(str(tmp_path))
  assert (config.method, config.init_from) == ('sync', '')
  assert (config.target_metric, config.target_value, config.stop_at_target) == (
      'eval/anp_top1', 0.0, False)
  assert config.evals.to_dict() == {'eval': {'kind': 'classification', 'split': 'validation'}}
  assert config.model.conv_impl == 'xla' and config.model.adjective_head is True
  assert (config.model.name, config.model.width, config.batch_size) == ('resnet8', 0.5, 64)


@pytest.mark.parametrize('old,new', [
    # Recorded before the target fields: an early-stopping run on top-5.
    (dict(stop_at_metric='eval/anp_top5', stop_at_value=0.3, eval_split='test'),
     dict(target_metric='eval/anp_top5', target_value=0.3, stop_at_target=True,
          evals={'eval': {'kind': 'classification', 'split': 'test'}})),
    # '' was "no target": the run trained its whole budget.
    # shuffle_buffer is read by no version since the global example order: dropped.
    (dict(stop_at_metric='', stop_at_value=0.0, eval_split='validation', shuffle_buffer=16384),
     dict(target_metric='eval/anp_top1', target_value=0.0, stop_at_target=False,
          evals={'eval': {'kind': 'classification', 'split': 'validation'}})),
])
def test_replaced_fields_of_a_recorded_config_are_read_as_their_replacements(tmp_path, old, new):
  _write_old_config(tmp_path, **old)
  config = default.read_run_config(str(tmp_path))
  got = {k: config[k].to_dict() if k == 'evals' else config[k] for k in new}
  assert got == new
  assert not set(default.REPLACED_FIELDS) & set(config.keys())


def test_a_recorded_config_with_the_new_fields_is_read_as_it_is(tmp_path):
  evals = {'eval': {'kind': 'classification', 'split': 'validation'},
           'test': {'kind': 'classification', 'split': 'test'}}
  _write_old_config(tmp_path, drop=(), evals=evals, target_metric='test/anp_top1',
                    target_value=0.4, stop_at_target=True)
  config = default.read_run_config(str(tmp_path))
  assert config.evals.to_dict() == evals
  assert (config.target_metric, config.target_value, config.stop_at_target) == (
      'test/anp_top1', 0.4, True)


@pytest.mark.parametrize('field', sorted(default.REPLACED_FIELDS))
def test_a_replaced_field_is_refused_naming_its_replacement(field):
  message = cli.unknown_field_message(field, cli.config_fields(default.get_config()))
  assert f'config.{field} no longer exists' in message
  replacement = {'eval_split': 'config.evals', 'shuffle_buffer': 'a uniform permutation'}
  assert replacement.get(field, 'config.target_value') in message
  # Issue 45, item 6: never advice that would move the choices (evals.eval) onto the test split.
  assert 'evals.eval.split=test' not in message
  config = default.get_config()
  config[field] = 'eval/anp_top1' if field == 'stop_at_metric' else 0.5
  with pytest.raises(ConfigError, match=f'config.{field} no longer exists'):
    setup.validate_config(config)


def test_a_command_line_with_a_replaced_field_exits_2_naming_the_new_fields(tmp_path):
  proc = subprocess.run([sys.executable, '-m', 'anp_jax.main', f'--workdir={tmp_path / "w"}',
                         '--config.stop_at_metric=eval/anp_top1', '--config.stop_at_value=0.3'],
                        env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 2
  assert ('config.stop_at_metric no longer exists: use config.target_metric (the metric), '
          'config.target_value (the value) and config.stop_at_target=True') in proc.stderr
  assert not (tmp_path / 'w').exists()
