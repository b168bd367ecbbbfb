"""The shipped configs and presets (anp_jax/configs, the sweep's and the sync/async/mixed study's
presets): every one reads its data directory from $ANP_DATA_DIR."""

from anp_jax.configs import default


def test_every_entry_point_uses_the_project_data_dir(monkeypatch, tmp_path):
  from anp_jax.research import sweep, sync_async_mixed
  from anp_jax.configs import musa2_resnet50
  monkeypatch.setenv('ANP_DATA_DIR', str(tmp_path))
  configs = [default.get_config(), musa2_resnet50.get_config()]
  configs += [sweep.preset_config(name) for name in sweep.preset_names(sweep.PREFIX)]
  configs += [sweep.load_preset(sync_async_mixed.PREFIX, name)[0]
              for name in sweep.preset_names(sync_async_mixed.PREFIX)]
  assert len(configs) == 7
  assert [c.data_dir for c in configs] == [str(tmp_path)] * len(configs)
