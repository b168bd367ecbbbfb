"""The SPRINT-style performance model: collective costs, the async simulation, predictions, and
its command line (python -m anp_jax.research.perfmodel), whose numbers a user will not misread."""

import math
import subprocess
import sys

import numpy as np
import pytest

from anp_jax.research import perfmodel as pm
from conftest import subprocess_env


def _cli(*args):
  """``python -m anp_jax.research.perfmodel ARGS``, the model's command line."""
  return subprocess.run([sys.executable, '-m', 'anp_jax.research.perfmodel', *args],
                        env=subprocess_env(), capture_output=True, text=True, timeout=600)


def _cluster(nodes=1, devices_per_node=4, **device_kwargs):
  return pm.minotauro(nodes=nodes, devices_per_node=devices_per_node,
                      device=pm.k80() if not device_kwargs else pm.Device(**device_kwargs))


def test_import_needs_neither_tensorflow_nor_jax():
  code = ('import sys, anp_jax.research.perfmodel; '
          'print(sorted(m for m in ("tensorflow", "jax", "flax") if m in sys.modules))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == '[]'


@pytest.mark.parametrize('n', [1, 2, 3, 4, 8, 16, 64])
def test_ring_allreduce_is_the_2_n_minus_1_over_n_formula(n):
  nbytes, bw, lat = 102.2e6, 6e9, 2e-6
  expected = 0.0 if n == 1 else 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat
  assert pm.ring_allreduce_time(nbytes, n, bw, lat) == expected


def test_hierarchical_allreduce_reduces_to_flat_rings_and_shares_the_nic():
  ic = pm.minotauro_interconnect()
  g = 1e8
  intra = pm.ring_allreduce_time(g, 4, ic.intra_node_bandwidth, ic.intra_node_latency)
  inter = pm.ring_allreduce_time(g, 16, ic.inter_node_bandwidth, ic.inter_node_latency)
  assert pm.hierarchical_allreduce_time(g, 1, 4, ic) == intra
  assert pm.hierarchical_allreduce_time(g, 16, 1, ic) == inter
  both = pm.hierarchical_allreduce_time(g, 16, 4, ic)
  half = pm.ring_reduce_scatter_time(g, 4, ic.intra_node_bandwidth, ic.intra_node_latency)
  assert both == pytest.approx(2 * half + inter)
  assert both == pytest.approx(intra + inter)  # RS + AG inside = one intra all-reduce


@pytest.mark.parametrize('n', [4, 8, 16])
def test_simulated_mean_staleness_of_identical_workers_is_n_minus_1(n):
  result = pm.simulate_async(n, 1.0, compute_time_cv=0.3, comm_time=0.1, num_updates=20_000,
                             seed=n)
  assert len(result.staleness) == 20_000
  assert abs(result.mean_staleness - (n - 1)) <= 0.05 * (n - 1)
  # The staleness varies with jitter but the pmf is a distribution over non-negative integers.
  pmf = result.staleness_pmf()
  assert min(pmf) >= 0 and len(pmf) > 1 and sum(pmf.values()) == pytest.approx(1.0)
  # Throughput: n workers, each cycle = compute + comm (the server is not a bottleneck here).
  assert result.gradients_per_s == pytest.approx(n / 1.1, rel=0.03)


def test_deterministic_workers_have_constant_staleness_and_lognormal_works():
  result = pm.simulate_async(8, 1.0, 0.0, 0.2, 2_000)
  assert set(result.staleness.tolist()) == {7}
  result = pm.simulate_async(8, 1.0, 0.2, 0.2, 10_000, distribution='lognormal')
  assert abs(result.mean_staleness - 7) < 0.35


def test_saturated_server_caps_throughput_and_merging_grows_the_effective_batch():
  # Server link time 0.25 s per gradient: at most 4 gradients/s whatever the 8 workers do.
  capped = pm.simulate_async(8, 1.0, 0.2, 0.0, 10_000, server_time=0.25)
  assert capped.gradients_per_s == pytest.approx(4.0, rel=0.02)
  merged = pm.simulate_async(8, 1.0, 0.2, 0.0, 10_000, apply_time=0.25, merge=True,
                             worker_batch=32)
  pmf = merged.effective_batch_pmf()
  assert max(pmf) > 32 and all(b % 32 == 0 for b in pmf)
  assert merged.mean_staleness < 7  # Merged gradients see fewer, larger updates.


def test_staleness_sampler_returns_the_requested_samples():
  samples = pm.staleness_sampler(6, 5_000, compute_time_cv=0.2, seed=3)
  assert samples.shape == (5_000,) and samples.dtype == np.int64
  assert abs(samples.mean() - 5) < 0.25
  assert np.array_equal(samples, pm.staleness_sampler(6, 5_000, compute_time_cv=0.2, seed=3))


@pytest.mark.parametrize('build,message', [
    (lambda: pm.Interconnect(0.0, 1e-6, 6e9, 2e-6), 'intra_node_bandwidth'),
    (lambda: pm.Interconnect(10e9, 1e-6, -1.0, 2e-6), 'inter_node_bandwidth'),
    (lambda: pm.Interconnect(10e9, -1e-6, 6e9, 2e-6), 'intra_node_latency'),
    (lambda: pm.minotauro(nodes=2, devices_per_node=8), 'max_devices_per_node'),
    (lambda: pm.minotauro(nodes=0), 'nodes'),
    (lambda: pm.dgx_h200(devices_per_node=9), 'holds at most 8 h200'),
    (lambda: pm.Device('gpu', peak_flops=1e12, efficiency=1.5), 'efficiency'),
    (lambda: pm.Device('gpu', peak_flops=-1e12, efficiency=0.5), 'peak_flops'),
    (lambda: pm.Device('gpu', step_time_s=0.5), 'measured_batch'),
    (lambda: pm.Workload('w', 8e9, 0.0, 1000), 'param_bytes'),
    (lambda: pm.predict(_cluster(), pm.resnet50(), 0), 'per_device_batch'),
    (lambda: pm.predict(_cluster(), pm.resnet50(), 32, overlap=1.5), 'overlap'),
    (lambda: pm.predict(_cluster(), pm.resnet50(), 32, method='hogwild'), 'method'),
    (lambda: pm.predict(_cluster(), pm.resnet50(), 32, method='async', num_ps=0), 'num_ps'),
    (lambda: pm.predict(_cluster(), pm.resnet50(), 1024), 'per_device_batch=1024'),
])
def test_impossible_hardware_or_settings_raise_value_error_naming_the_field(build, message):
  with pytest.raises(ValueError, match=message):
    build()


def test_compute_time_from_flops_and_from_a_measurement():
  w = pm.resnet50()
  k80 = pm.k80()
  # Calibrated on TensorFlow's K80 benchmark: ~49.5 images/s at batch 32, ~52 at batch 64.
  assert 32 / pm.compute_time(w, k80, 32) == pytest.approx(49.5, rel=0.02)
  assert 64 / pm.compute_time(w, k80, 64) == pytest.approx(52.0, rel=0.02)
  measured = pm.Device('gpu', step_time_s=0.5, measured_batch=64, measured_workload='resnet50',
                       step_overhead_s=0.1)
  assert pm.compute_time(w, measured, 32) == pytest.approx(0.3)
  with pytest.raises(ValueError, match='measured'):
    pm.compute_time(pm.resnet20(), measured, 32)


def test_intra_node_scaling_is_near_linear_when_compute_dominates():
  w = pm.resnet50()
  for d in (1, 2, 4):
    p = pm.predict(_cluster(devices_per_node=d), w, 32)
    assert p.global_batch == 32 * d
    assert p.speedup_vs_one_device == pytest.approx(d, rel=0.03)
    assert p.efficiency > 0.97


def test_communication_bound_scaling_degrades_and_overlap_helps():
  w = pm.resnet50()
  slow = pm.Interconnect(10e9, 10e-6, 0.5e9, 50e-6)  # 4 Gb/s Ethernet-class links
  cluster = pm.Cluster(16, 4, pm.k80(), slow, max_devices_per_node=4)
  plain = pm.predict(cluster, w, 32)
  hidden = pm.predict(cluster, w, 32, overlap=1.0)
  assert plain.efficiency < 0.8
  assert hidden.step_time < plain.step_time
  # The backward pass bounds what overlap can hide.
  backward = (plain.compute_time - cluster.device.step_overhead_s) * w.backward_fraction
  assert hidden.exposed_comm_time == pytest.approx(plain.comm_time - min(plain.comm_time,
                                                                         backward))
  assert plain.epoch_time == pytest.approx(w.dataset_size / plain.images_per_s)


def test_async_mixed_and_local_sgd_predictions():
  w = pm.resnet50()
  cluster = _cluster(nodes=4)
  asyn = pm.predict(cluster, w, 32, method='async', sim_updates=5_000)
  assert asyn.num_workers == 16 and asyn.worker_batch == 32
  assert asyn.mean_staleness == pytest.approx(15, rel=0.05)
  assert sum(asyn.staleness_distribution.values()) == pytest.approx(1.0)
  assert asyn.effective_batch_distribution == {32: 1.0}
  mixed = pm.predict(cluster, w, 32, method='mixed', num_ps=4, sim_updates=5_000)
  assert mixed.num_workers == 4 and mixed.worker_batch == 128
  assert mixed.mean_staleness == pytest.approx(3, rel=0.05)
  # More servers split the serialised server traffic: never slower.
  assert (pm.predict(cluster, w, 32, method='async', num_ps=4, sim_updates=5_000).images_per_s
          >= asyn.images_per_s * 0.99)
  local = pm.predict(cluster, w, 32, method='mixed', mixed_mode='local_sgd', local_steps=8)
  sync = pm.predict(cluster, w, 32)
  assert local.images_per_s > sync.images_per_s
  assert local.mean_staleness == pytest.approx(3.5)


def test_best_configuration_meets_the_target_global_batch():
  w = pm.resnet50()
  cluster = pm.minotauro(nodes=8)
  best = pm.best_configuration(cluster, w, 512)
  assert best.global_batch >= 512 and best.global_batch - 512 < best.num_devices
  ranked = pm.rank_configurations(cluster, w, 512, match='exact')
  assert all(p.global_batch == 512 for p in ranked)
  assert [p.epoch_time for p in ranked] == sorted(p.epoch_time for p in ranked)
  assert ranked[0] == pm.best_configuration(cluster, w, 512, match='exact')
  # With a fixed global batch and compute-bound steps, all 32 devices win.
  assert (best.nodes, best.devices_per_node, best.per_device_batch) == (8, 4, 16)
  # Memory bounds the per-device batch: a 4096 global batch cannot run on 2 K80 dies.
  small = pm.minotauro(nodes=1, devices_per_node=2)
  with pytest.raises(ValueError, match='No configuration'):
    pm.best_configuration(small, w, 4096, node_counts=[1], device_counts=[1, 2])
  # Given candidate batches, only those meeting the target are considered.
  chosen = pm.best_configuration([cluster], w, 256, per_device_batches=[8, 16, 32, 64])
  assert chosen.global_batch >= 256 and chosen.per_device_batch in (8, 16, 32, 64)


def test_cli_prints_a_table():
  r = _cli('--model', 'resnet50', '--nodes', '16', '--gpus_per_node', '4', '--device', 'k80',
           '--per_device_batch', '32', '--method', 'sync', '--sweep_nodes', '1,2,4,8,16')
  assert r.returncode == 0, r.stderr
  out = r.stdout
  lines = out.splitlines()
  header = next(i for i, line in enumerate(lines) if line.lstrip().startswith('nodes'))
  assert 'img/s' in lines[header] and 'staleness' in lines[header]
  rows = lines[header + 2:header + 7]
  assert [int(r.split()[0]) for r in rows] == [1, 2, 4, 8, 16]
  assert rows[-1].split()[2] == '2048'  # 16 nodes x 4 devices x 32


def test_cli_async_target_batch_and_errors():
  r = _cli('--method', 'async', '--nodes', '2', '--num_ps', '2', '--inter_bw', '3')
  assert r.returncode == 0, r.stderr
  assert 'asynchronous SGD, 8 device workers' in r.stdout
  r = _cli('--target_global_batch', '256', '--sweep_nodes', '1,2,4')
  assert r.returncode == 0, r.stderr
  assert 'best for global batch 256' in r.stdout
  r = _cli('--gpus_per_node', '8')
  assert r.returncode == 2
  assert 'max_devices_per_node' in r.stderr


def test_resnet50_forward_flops_from_xla_cost_analysis():
  from anp_jax.models import build_resnet
  w = pm.workload_from_flax(build_resnet('resnet50', num_anps=1000), 224, name='resnet50')
  assert abs(w.flops_per_image_fwd - 8.2e9) <= 0.1 * 8.2e9, w.flops_per_image_fwd
  assert w.param_bytes == 25_557_032 * 4
  preset = pm.resnet50()
  assert math.isclose(w.flops_per_image_fwd, preset.flops_per_image_fwd, rel_tol=0.1)


def test_resnet20_preset_matches_the_flax_model():
  from anp_jax.models import build_resnet
  w = pm.workload_from_flax(build_resnet('resnet20', num_anps=10), 32, name='resnet20',
                            dataset_size=pm.CIFAR10_TRAIN_IMAGES)
  preset = pm.resnet20()
  assert w.param_bytes == preset.param_bytes
  assert w.flops_per_image_fwd == pytest.approx(preset.flops_per_image_fwd, rel=0.02)


def test_devices_sharing_a_compute_pool_split_it_instead_of_adding_to_it():
  w = pm.resnet20()
  host = pm.Device('host', peak_flops=1e11, efficiency=0.5)
  loopback = pm.Interconnect(5e9, 20e-6, 1e9, 50e-6)
  alone = pm.predict(pm.Cluster(1, 1, host, loopback), w, 64)
  shared = pm.predict(pm.Cluster(1, 4, host, loopback, devices_per_compute_pool=4), w, 16)
  separate = pm.predict(pm.Cluster(1, 4, host, loopback), w, 16)
  # Four simulated devices on one host's cores: the same 64 images take as long as on one device.
  assert shared.compute_time == pytest.approx(alone.compute_time)
  assert shared.images_per_s < alone.images_per_s  # ... plus the all-reduce.
  assert separate.images_per_s > 3 * alone.images_per_s
  assert pm.device_step_time(pm.Cluster(1, 4, host, loopback, devices_per_compute_pool=4), w,
                             16) == pytest.approx(pm.compute_time(w, host, 64))
  # Two single-device processes on one host: the pool spans the 'nodes'.
  two = pm.Cluster(2, 1, host, loopback, devices_per_compute_pool=2)
  assert two.pool_sharing == 2 and two.resized(nodes=1).pool_sharing == 1
  with pytest.raises(ValueError, match='devices_per_compute_pool'):
    pm.Cluster(1, 2, host, loopback, devices_per_compute_pool=0)


@pytest.mark.parametrize('n,cv,comm', [(2, 0.3, 0.0), (4, 0.1, 0.5), (8, 0.6, 0.2),
                                       (16, 1.0, 0.0), (16, 0.3, 0.5), (64, 0.2, 0.1)])
def test_analytic_async_matches_the_discrete_event_simulation(n, cv, comm):
  sim = pm.simulate_async(n, 1.0, cv, comm, 20_000, seed=n)
  ana = pm.analytic_async(n, 1.0, cv, comm, worker_batch=32)
  assert ana.mean_staleness == n - 1
  assert sum(ana.staleness_pmf.values()) == pytest.approx(1.0, abs=1e-3)
  assert ana.staleness_variance == pytest.approx(sim.staleness.var(), rel=0.2)
  assert pm.total_variation(ana.staleness_pmf, sim.staleness_pmf()) < 0.15
  assert ana.images_per_s == pytest.approx(sim.gradients_per_s * 32, rel=0.02)
  assert ana.effective_batch_pmf == {32: 1.0} and not ana.server_bound


def test_analytic_async_limits_and_saturated_server():
  # Lock-step workers: staleness exactly N - 1; exponential cycles: geometric, P(0) = 1/N.
  assert pm.analytic_async(8, 1.0, 0.0).staleness_pmf == {7: 1.0}
  geometric = pm.analytic_async(8, 1.0, 1.0).staleness_pmf
  assert geometric[0] == pytest.approx(1 / 8, rel=1e-3)
  assert geometric[3] == pytest.approx(1 / 8 * (7 / 8)**3, rel=1e-3)
  ana = pm.analytic_async(8, 1.0, 0.2, 0.0, server_time=0.25)
  sim = pm.simulate_async(8, 1.0, 0.2, 0.0, 10_000, server_time=0.25)
  assert ana.server_bound and ana.gradients_per_s == 4.0
  assert sim.gradients_per_s == pytest.approx(ana.gradients_per_s, rel=0.02)
  with pytest.raises(ValueError, match='num_workers'):
    pm.analytic_async(0, 1.0)


def test_async_predictions_carry_the_closed_form_next_to_the_simulation():
  cluster = _cluster(nodes=4)
  asyn = pm.predict(cluster, pm.resnet50(), 32, method='async', num_ps=4, sim_updates=10_000)
  assert asyn.analytic_images_per_s == pytest.approx(asyn.images_per_s, rel=0.03)
  assert pm.total_variation(asyn.analytic_staleness_distribution,
                            asyn.staleness_distribution) < 0.15
  assert pm.predict(cluster, pm.resnet50(), 32).analytic_images_per_s is None


def test_cli_calibrates_from_a_measured_step_time_and_rejects_bad_input():
  r = _cli('--model', 'resnet20', '--step_time_ms', '100', '--measured_batch', '64', '--nodes',
           '1', '--gpus_per_node', '1', '--per_device_batch', '64')
  assert r.returncode == 0, r.stderr
  row = r.stdout.splitlines()[-1].split()
  assert float(row[3]) == pytest.approx(100.0) and float(row[5].replace(',', '')) == 640.0
  for args, message in ((['--step_time_ms', '100'], '--measured_batch'),
                        # Zero bandwidth: impossible hardware.
                        (['--intra_bw', '0'], 'intra_node_bandwidth must be positive'),
                        (['--inter_bw', '0', '--nodes', '2'], 'inter_node_bandwidth'),
                        (['--efficiency', '1.5'], 'efficiency')):
    r = _cli(*args)
    assert r.returncode == 2, args
    assert message in r.stderr, (args, r.stderr)


def test_cli_workload_from_a_flax_model():
  r = _cli('--flax_model', 'resnet8', '--image_size', '16', '--width', '0.25', '--num_classes',
           '8', '--dataset_size', '1000', '--nodes', '1', '--gpus_per_node', '2', '--device',
           'cpu', '--step_time_ms', '20', '--measured_batch', '32',
           '--devices_per_compute_pool', '2', '--per_device_batch', '16')
  assert r.returncode == 0, r.stderr
  out = r.stdout
  assert out.startswith('resnet8_w0.25:') and '1,000 images/epoch' in out
  row = out.splitlines()[-1].split()
  # Two devices share the measured pool: 32 images per step still take the measured 20 ms.
  assert float(row[3]) == pytest.approx(20.0, rel=0.01)
  r = _cli('--flax_model', 'resnet7')
  assert r.returncode == 2
  assert 'resnet7' in r.stderr


def test_local_sgd_average_is_costed_as_the_trainer_does_it():
  # The local-SGD executor (executors/local_sgd.py) averages with pmean over 'node' of every
  # device's full replica:
  # d concurrent rings of the whole parameter buffer over the N nodes, sharing the node's NIC,
  # and no intra-node reduce-scatter (which the hierarchical all-reduce would do).
  ic = pm.minotauro_interconnect()
  p, n, d = 1e8, 4, 4
  expected = 2 * (n - 1) / n * d * p / ic.inter_node_bandwidth + 2 * (n - 1) * ic.inter_node_latency
  assert pm.node_axis_allreduce_time(p, n, d, ic) == pytest.approx(expected)
  assert pm.node_axis_allreduce_time(p, 1, d, ic) == 0.0
  assert pm.node_axis_allreduce_time(p, n, 1, ic) == pm.hierarchical_allreduce_time(p, n, 1, ic)
  # With d > 1 the node moves d times the hierarchical scheme's inter-node bytes.
  assert pm.node_axis_allreduce_time(p, n, d, ic) > pm.hierarchical_allreduce_time(p, n, d, ic)
  # predict() charges exactly that, amortised over the local steps.
  w = pm.resnet50()
  cluster = _cluster(nodes=n)
  h = 8
  local = pm.predict(cluster, w, 32, method='mixed', mixed_mode='local_sgd', local_steps=h)
  intra = pm.ring_allreduce_time(w.grad_bytes, cluster.devices_per_node,
                                 ic.intra_node_bandwidth, ic.intra_node_latency)
  average = pm.node_axis_allreduce_time(w.param_bytes, n, cluster.devices_per_node, ic)
  assert local.comm_time == pytest.approx(intra + average / h)


def test_h200_preset_reproduces_the_measured_resnet50_step_times():
  """The h200 preset is calibrated on anp_jax's bare ResNet-50 step measured on an H200
  (experiments/results/bench_gpu_h200): one GPU's predicted step time matches both batch sizes."""
  import json
  import os
  results = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         'experiments', 'results', 'bench_gpu_h200')
  one_gpu = pm.Cluster(1, 1, pm.h200(), pm.dgx_h200().interconnect, max_devices_per_node=8)
  for b in (128, 256):
    with open(os.path.join(results, f'resnet50_bf16_b{b}.json')) as f:
      measured = json.load(f)
    assert measured['config']['batch_size'] == b and measured['config']['image_size'] == 224
    predicted = pm.predict(one_gpu, pm.resnet50(), b)
    assert predicted.step_time == pytest.approx(measured['bare']['step_time_median_s'], rel=0.02)


def test_musa2_sizes_are_the_published_split():
  """MUSA2's ANP set has a published split, 307,185 training / 77,073 test images
  (docs/references.md); the epoch of the minotauro preset and the planner's default dataset are
  that split, not 80 % of all 384,258 images (307,406)."""
  import inspect
  from anp_jax.research import planner
  assert pm.MUSA2_TRAIN_IMAGES == 307_185
  assert pm.CLUSTER_DATASETS['minotauro'][0] == pm.MUSA2_TRAIN_IMAGES
  assert inspect.signature(planner.build_plan).parameters['dataset_size'].default == 307_185


def test_sources_cite_papers_in_the_repository_not_files_outside_it():
  """Citations point to docs/references.md (authors, title, venue, year), never to a file outside
  the repository such as a shared folder's REFERENCES.md."""
  import os
  from conftest import ROOT
  outside = []
  for folder in ('anp_jax', 'experiments', 'docs'):
    for d, _, files in os.walk(os.path.join(ROOT, folder)):
      for name in files:
        if name.endswith(('.py', '.md', '.sh')):
          path = os.path.join(d, name)
          with open(path, encoding='utf-8') as f:
            if 'REFERENCES.md' in f.read():
              outside.append(os.path.relpath(path, ROOT))
  assert outside == []
  with open(os.path.join(ROOT, 'docs', 'references.md'), encoding='utf-8') as f:
    references = f.read()
  for cited in ('Oyama', 'Campos', 'Sastre', 'Fernández', 'McCandlish', '307,185'):
    assert cited in references, cited


# ----------------------------------------------------------------------------------------------
# Numbers a user will not misread.


def _perfmodel(*args):
  """``python -m anp_jax.research.perfmodel ARGS``'s output (it must succeed)."""
  r = _cli(*args)
  assert r.returncode == 0, r.stderr
  return r.stdout


def test_perfmodel_minotauro_epoch_is_the_papers_dataset():
  argv = ['--model', 'resnet50', '--cluster', 'minotauro', '--device', 'k80',
          '--per_device_batch', '32', '--nodes', '1']
  out = _perfmodel(*argv)
  assert '307,185 images/epoch' in out  # MUSA2's published training split.
  row = out.splitlines()[-1].split()
  images_per_s = float(row[5].replace(',', ''))
  assert row[7] == 'min'  # The epoch column: 307,185 images, not ImageNet's 1.28 M (1.8 h).
  assert float(row[6]) == pytest.approx(307_185 / images_per_s / 60, abs=0.1)
  assert '1,000 images/epoch (--dataset_size)' in _perfmodel(*argv, '--dataset_size', '1000')
  out = _perfmodel('--target_global_batch', '128', '--sweep_nodes', '1,2')
  assert out.splitlines()[-1].endswith('(307,185 images)')


def test_perfmodel_headers_say_what_was_predicted():
  out = _perfmodel('--model', 'resnet20', '--device', 'cpu', '--step_time_ms', '100',
                   '--measured_batch', '64', '--nodes', '1', '--gpus_per_node', '1')
  assert 'minotauro: cpu' not in out and '(measured)' not in out
  assert "minotauro's links with cpu devices: cpu calibrated to 100 ms per step of 64" in out
  out = _perfmodel('--method', 'mixed', '--num_ps', '4', '--sweep_nodes', '1,4,16')
  method = next(l for l in out.splitlines() if l.startswith('method:'))
  assert '16 node workers' not in method and 'one worker per node' in method
