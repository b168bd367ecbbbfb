"""The input benchmark's stages are the training pipeline's own ops, and the benchmark runs end
to end (experiments/input_benchmark.py; its timings are for a quiet machine, not checked here)."""

import json

import numpy as np
import pytest

from anp_jax.data import anp, input_stages, pipeline
from conftest import run_experiment, tiny_config


@pytest.fixture(scope='module')
def photos(tmp_path_factory):
  """12 photo-like JPEGs of 64 x 48 px over 4 ANPs, prepared as they are."""
  root = tmp_path_factory.mktemp('photos')
  stats = input_stages.write_photo_folder(str(root / 'manual'), 12, 4, 48, 64, 90)
  builder = anp.prepare(str(root / 'manual'), str(root / 'tfds'), layout='folder', resize=0)
  return stats, builder


def _config(builder, tmp_path):
  return tiny_config(tmp_path, dataset='anp', augment='inception', image_size=24,
                     **{'anp.config_name': builder.builder_config.name})


def test_photo_like_jpegs_have_the_asked_size_and_compress_like_photos(photos):
  stats, builder = photos
  assert stats['images'] == 12 and builder.info.splits['train'].num_examples > 0
  image = input_stages.photo_like(np.random.default_rng(1), 375, 500)
  assert image.shape == (375, 500, 3) and image.dtype == np.uint8
  # Neither flat nor noise: at quality 90 a 64 x 48 photo-like JPEG takes well under the
  # 9,216 raw bytes, and far more than a flat image's few hundred.
  assert 1000 < stats['mean_bytes'] < 9216


def test_the_stages_compose_to_the_training_pipeline(photos, tmp_path):
  """read -> decode_and_crop -> resize -> flip -> normalise gives the training pipeline's images
  bit for bit (same positions, same seeds); decode -> crop cuts the same window."""
  _, builder = photos
  config = _config(builder, tmp_path)
  n = builder.info.splits['train'].num_examples
  stages = input_stages.stage_datasets(builder, config, images=n, batch=n)
  normalised = np.stack([x.numpy() for _, x in stages['normalise']])
  train = next(pipeline.train_dataset(builder, config, per_device_batch=n, num_shards=1,
                                      shards=[0]).as_numpy_iterator())
  assert normalised.dtype == train['image'].dtype and normalised.shape == (n, 24, 24, 3)
  np.testing.assert_array_equal(normalised.view(np.uint8), train['image'].view(np.uint8))
  batch = next(iter(stages['batch'])).numpy()
  np.testing.assert_array_equal(batch.view(np.uint8), normalised.view(np.uint8))
  for (_, crop), (_, fused) in zip(stages['crop'], stages['decode_and_crop'], strict=True):
    # The same window. libjpeg upsamples the chroma of the window's last row and column from
    # inside the window only, so those may differ a little; every other pixel is the same.
    assert crop.shape == fused.shape
    np.testing.assert_array_equal(crop.numpy()[:-1, :-1], fused.numpy()[:-1, :-1])


def test_stage_costs_are_differences_of_the_cumulative_pipelines(photos, tmp_path, monkeypatch):
  """With a timer that charges each pipeline one unit per op it runs, every stage costs what
  its own op adds."""
  _, builder = photos
  config = _config(builder, tmp_path)
  depth = {'': 0, 'read': 1, 'decode': 2, 'crop': 3, 'decode_and_crop': 2, 'resize': 3,
           'flip': 4, 'normalise': 5, 'batch': 6}
  datasets = input_stages.stage_datasets(builder, config, images=8, batch=4)
  by_id = {id(ds): stage for stage, ds in datasets.items()}

  def timer(ds):  # 1e-6 CPU s per image per op, for the datasets stage_costs builds.
    stage = by_id.get(id(ds))
    n = sum(1 for _ in ds)
    return depth[stage] * 1e-6 * (8 if stage != '' else n), 0.0, n

  monkeypatch.setattr(input_stages, 'stage_datasets', lambda *a, **k: datasets)
  costs = input_stages.stage_costs(builder, config, images=8, batch=4, timer=timer)
  for stage in input_stages.STAGES:
    assert costs[stage]['cpu_us_per_image'] == pytest.approx(1.0), stage
    assert costs[stage]['images_per_s_per_core'] == pytest.approx(1e6)
  assert costs['normalise']['cumulative_cpu_us_per_image'] == pytest.approx(5.0)


@pytest.mark.slow(60)
def test_a_tiny_benchmark_run_reports_every_stage_for_every_prepared_size(tmp_path):
  out = tmp_path / 'input.json'
  run = run_experiment('input_benchmark.py', '--images=20', '--stage_images=24', '--width=64',
                       '--height=48', '--short_sides=32', '--batch=4', '--batches=2',
                       '--warmup=1', '--skip_model', f'--out={out}', devices=1)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result['reference'] == '32' and set(result['variants']) == {'source', '32'}
  source, small = result['variants']['source'], result['variants']['32']
  assert source['stored_short_side_max'] is None and small['stored_short_side_max'] == 32
  assert small['mean_stored_bytes'] < source['mean_stored_bytes']
  assert source['generated'] == dict(images=20, mean_bytes=source['generated']['mean_bytes'],
                                     width=64, height=48, quality=90)
  for variant in (source, small):
    assert set(variant['stages']) == {*input_stages.STAGES, 'host_to_device'}
    for stage in variant['stages'].values():
      assert np.isfinite(stage['cpu_us_per_image'])
    assert variant['pipeline']['images_per_s'] > 0
    assert variant['pipeline'] == variant['pipelines']['tf']
  assert result['pipeline_images_per_s'] == small['pipeline']['images_per_s']
  assert 'images/s per core' in run.stdout and 'decode_and_crop' in run.stdout
  # The device path side by side, where the stored size is bounded (not for 'source').
  assert set(small['device_stages']) == {*input_stages.DEVICE_STAGES, 'host_to_device'}
  # The box: ceil(4/3 * 32) = 43 px, but at least the 224 px image (the host's fallback).
  assert small['box'] == 224 and small['pipelines']['tf_device']['dtype'] == 'uint8'
  assert small['pipelines']['tf_device']['bytes_per_image'] == 224 * 224 * 3
  assert small['pipelines']['tf']['bytes_per_image'] == 224 * 224 * 3 * 2  # bfloat16.
  assert small['host_cost_ratio_tf_over_tf_device'] == pytest.approx(
      small['pipelines']['tf']['cpu_us_per_image'] /
      small['pipelines']['tf_device']['cpu_us_per_image'])
  assert result['host_cost_ratio_tf_over_tf_device'] == small['host_cost_ratio_tf_over_tf_device']
  assert 'resize_short_side' in source['pipelines']['tf_device']['unavailable']
  assert 'device_stages' not in source and source['box'] is None
  assert 'tf_device: decode_window' in run.stdout and 'host cost tf / tf_device' in run.stdout


def test_the_device_stages_compose_to_the_tf_device_pipeline(tmp_path):
  """read -> window -> decode_window -> batch_box gives the 'tf_device' training pipeline's
  host batches bit for bit (but the labels, which the stages do not read)."""
  stats = input_stages.write_photo_folder(str(tmp_path / 'manual'), 12, 4, 48, 64, 90)
  assert stats['images'] == 12
  builder = anp.prepare(str(tmp_path / 'manual'), str(tmp_path / 'tfds'), layout='folder',
                        resize=32)
  config = _config(builder, tmp_path)
  config.input_backend = 'tf_device'
  n = builder.info.splits['train'].num_examples
  stages = input_stages.stage_datasets(builder, config, images=n, batch=n, backend='tf_device')
  assert set(stages) == {'', *input_stages.DEVICE_STAGES}
  batch = next(iter(stages['batch_box']))
  train = next(pipeline.train_dataset(builder, config, per_device_batch=n, num_shards=1,
                                      shards=[0]).as_numpy_iterator())
  assert sorted(batch) == sorted(train)
  for key in ('image', 'geometry', 'flip', 'mask'):
    np.testing.assert_array_equal(batch[key].numpy(), train[key], err_msg=key)
  windows = [plan['window'].numpy() for _, plan in stages['window']]
  np.testing.assert_array_equal(np.stack(windows)[:, 2], train['geometry'][:, 0, 0])
