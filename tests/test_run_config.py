"""A finished run's config.json read back: fields added since it was recorded get the value
those runs used (`default.ADDED_FIELDS`), so readers use plain attribute access."""

import json

import pytest

from anp_jax.configs import default
from anp_jax.research import planner as plan


def _write_old_config(workdir, drop=('method', 'stop_at_metric', 'stop_at_value',
                                     'model.conv_impl'), **changed):
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
  assert (config.method, config.stop_at_metric, config.stop_at_value) == ('sync', '', 0.0)
  assert config.model.conv_impl == 'xla' and config.model.adjective_head is True
  assert (config.model.name, config.model.width, config.batch_size) == ('resnet8', 0.5, 64)

  _write_old_config(tmp_path, drop=(), method='async', stop_at_metric='eval/anp_top1',
                    stop_at_value=0.3)
  config = default.read_run_config(str(tmp_path))
  assert (config.method, config.stop_at_metric, config.stop_at_value) == (
      'async', 'eval/anp_top1', 0.3)


def test_a_pilot_recorded_before_stop_at_metric_asks_for_a_target(tmp_path):
  _write_old_config(tmp_path)
  (tmp_path / 'metrics.jsonl').write_text(json.dumps({'step': 4, 'eval/anp_top1': 0.5}) + '\n')
  with pytest.raises(plan.PlanError, match='Give --target'):
    plan.load_pilot(str(tmp_path))
