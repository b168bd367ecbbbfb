"""The performance model's input stage (anp_jax/research/perfmodel/input_stage.py): host cores per
node against an input pipeline's core-seconds per image, in `predict`, the perfmodel command line
and the planner's warning."""

import json
import math
import os
import subprocess
import sys

import pytest

from anp_jax.research import perfmodel as pm
from conftest import ROOT, subprocess_env

H200_INPUT_JSON = os.path.join(ROOT, 'experiments', 'results', 'bench_gpu_h200',
                               'input_pipeline.json')


def test_the_paper_pipeline_preset_is_the_h200_measurement():
  """234 images/s per core: 3,744 images/s on the H200 machine's 16 cores, read from the
  committed JSON the same way `from_benchmark` reads any input benchmark."""
  preset = pm.tf_jpeg224()
  assert preset.images_per_s_per_core == pytest.approx(234.0, abs=0.1)
  measured = pm.from_benchmark(H200_INPUT_JSON)
  assert measured.core_seconds_per_image == pytest.approx(preset.core_seconds_per_image)
  assert pm.input_pipeline('tf_jpeg224') == preset and pm.input_pipeline('none') is None
  # The issue's arithmetic: the bare step's 5,708 images/s per H200 needs ~25 such cores.
  assert pm.cores_per_device_needed(preset, 5708) == pytest.approx(24.4, abs=0.1)


def test_from_benchmark_reads_each_backends_cpu_time(tmp_path):
  """The input benchmark's JSON: each backend's process CPU time per image, of the reference
  dataset; a backend it did not measure is an error naming those it did."""
  result = {'reference': '256', 'pipeline_images_per_s': 1.0, 'cpu_cores': 2, 'variants': {
      '256': {'pipelines': {'tf': {'cpu_us_per_image': 4000.0},
                            'tf_device': {'cpu_us_per_image': 1000.0}}},
      'source': {'pipelines': {'tf': {'cpu_us_per_image': 9000.0}}}}}
  path = tmp_path / 'input.json'
  path.write_text(json.dumps(result))
  assert pm.from_benchmark(str(path), 'tf_device').images_per_s_per_core == pytest.approx(1000)
  assert pm.input_pipeline(f'{path}:tf').images_per_s_per_core == pytest.approx(250)
  with pytest.raises(ValueError, match=r"input_backend='dali_cpu'.*'tf', 'tf_device'"):
    pm.from_benchmark(str(path), 'dali_cpu')
  with pytest.raises(ValueError, match='give a preset'):
    pm.input_pipeline('fast')


def test_an_input_bound_node_steps_at_the_hosts_pace():
  """One DGX H200 node (112 cores for 8 GPUs) at 256 images per GPU: the paper pipeline feeds
  112 x 234 = 26.2k images/s, less than the GPUs take, so the step is the hosts' time and the
  prediction says 'input'; with a pipeline 4x cheaper the devices bound it again, exactly as
  without any input stage."""
  node, w = pm.dgx_h200(nodes=1), pm.resnet50()
  free = pm.predict(node, w, 256)
  assert free.bound == 'unmodelled' and free.input_time is None
  paper = pm.predict(node, w, 256, input_pipeline=pm.tf_jpeg224())
  feed = 112 * pm.tf_jpeg224().images_per_s_per_core
  assert paper.bound == 'input' and paper.input_images_per_s == pytest.approx(feed)
  assert paper.step_time == pytest.approx(8 * 256 / feed) and paper.step_time > free.step_time
  assert paper.images_per_s == pytest.approx(feed)
  cheap = pm.InputPipeline('cheap', pm.tf_jpeg224().core_seconds_per_image / 4)
  fed = pm.predict(node, w, 256, input_pipeline=cheap)
  assert fed.bound == 'devices' and fed.step_time == free.step_time
  assert fed.images_per_s == free.images_per_s
  with pytest.raises(ValueError, match='host_cores_per_node'):
    pm.predict(pm.Cluster(1, 8, pm.h200(), node.interconnect), w, 256, input_pipeline=cheap)


@pytest.mark.parametrize('method,kwargs', [('async', {}), ('mixed', {}),
                                           ('mixed', {'mixed_mode': 'local_sgd',
                                                      'local_steps': 4})])
def test_asynchronous_and_local_sgd_workers_wait_for_their_input(method, kwargs):
  cluster, w = pm.dgx_h200(nodes=2), pm.resnet50()
  free = pm.predict(cluster, w, 256, method, **kwargs)
  paper = pm.predict(cluster, w, 256, method, input_pipeline=pm.tf_jpeg224(), **kwargs)
  assert paper.bound == 'input' and paper.images_per_s < free.images_per_s
  # No faster than the two nodes' hosts can feed (the simulation's rate, within its noise).
  assert paper.images_per_s <= 1.02 * paper.input_images_per_s


def test_input_warnings_name_the_configurations_the_cores_cannot_feed():
  h200, k80 = pm.dgx_h200(nodes=1), pm.minotauro(nodes=1)
  fast = pm.predict(h200, pm.resnet50(), 256)
  rows = [('1x8 B=2048 sync', fast.images_per_s / 8), ('slow', 100.0)]
  warnings = pm.input_warnings(h200, rows)
  assert len(warnings) == 1
  assert '112 host cores per node = 14 per device cannot feed 1 configuration' in warnings[0]
  assert '1x8 B=2048 sync' in warnings[0] and "input_backend='tf_device'" in warnings[0]
  k80_rate = pm.predict(k80, pm.resnet50(), 32).images_per_s / 4
  assert pm.input_warnings(k80, [('k80', k80_rate)]) == []  # 16 cores feed 4 K80 dies.
  unknown = pm.Cluster(1, 8, pm.h200(), h200.interconnect)
  assert pm.input_warnings(unknown, rows) == []  # Cores unknown: nothing to say.


def test_input_warnings_only_where_the_pipeline_measured_applies():
  """The 224 px JPEG pipeline's host cost says nothing about a workload of other images (a 16 px
  pilot's: was 'cannot feed ... with the tf_jpeg224 input' for it): no warning there; one for
  the 224 px workloads and where the image size is unknown."""
  h200 = pm.dgx_h200(nodes=1)
  rows = [('1x8 B=2048 sync', 20_000.0)]
  assert pm.tf_jpeg224().image_size == 224 and pm.resnet50().image_size == 224
  assert pm.resnet20().image_size == 32
  assert pm.input_warnings(h200, rows, image_size=16) == []
  assert pm.input_warnings(h200, rows, image_size=pm.resnet20().image_size) == []
  assert len(pm.input_warnings(h200, rows, image_size=224)) == 1
  assert len(pm.input_warnings(h200, rows)) == 1


def test_the_perfmodel_command_line_models_the_input_on_request():
  def run(*extra):
    r = subprocess.run([sys.executable, '-m', 'anp_jax.research.perfmodel', '--cluster=dgx_h200',
                        '--device=h200', '--gpus_per_node=8', '--per_device_batch=256',
                        '--nodes=1', *extra], env=subprocess_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout
  plain, modelled = run(), run('--input_pipeline=tf_jpeg224')
  assert 'bound' not in plain and 'input:' not in plain
  assert '112 host cores per node feed 26,209 images/s per node, 14 cores per device' in modelled
  row = modelled.strip().splitlines()[-1].split()
  assert row[-1] == 'input' and math.isclose(float(row[-2]), 1e3 * 2048 / 26209.5, rel_tol=1e-3)
  assert run('--input_pipeline=tf_jpeg224', '--host_cores_per_node=448').strip().splitlines(
      )[-1].split()[-1] == 'devices'


def _sweep(tmp_path):
  """A finished batch-size sweep's results.json: steps to target S(B) = 120 (1 + 200 / B)."""
  rows = [{'batch': b, 'rule': 'linear', 'warmup': 'on', 'best_lr': True, 'status': 'finished',
           'steps_to_target': 120.0 * (1 + 200.0 / b), 'b_simple': 250.0,
           'target_top1': 0.25} for b in (64, 128, 256, 512, 1024)]
  (tmp_path / 'results.json').write_text(json.dumps(rows))
  return str(tmp_path)


@pytest.mark.parametrize('cluster,warned', [('dgx_h200', True), ('minotauro', False)])
def test_the_planner_warns_when_a_clusters_cores_cannot_feed_its_steps(tmp_path, cluster,
                                                                       warned):
  r = subprocess.run([sys.executable, '-m', 'anp_jax.research.planner', f'--sweep={_sweep(tmp_path)}',
                      f'--cluster={cluster}', '--methods=sync', '--nodes=1'],
                     env=subprocess_env(), capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert 'Fastest:' in r.stdout
  assert ('WARNING: dgx_h200: 112 host cores per node' in r.stderr) == warned, r.stderr[-2000:]
