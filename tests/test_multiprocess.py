"""Real multi-process jobs on 127.0.0.1 (jax.distributed, gloo): equivalence, shards, failures."""

import json
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from anp_jax import train
from conftest import tiny_config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _env(num_processes, process_id, port, devices_per_process, **extra):
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='2', JAX_PLATFORMS='cpu',
             ANP_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', ANP_NUM_PROCESSES=str(num_processes),
             ANP_PROCESS_ID=str(process_id), ANP_INIT_TIMEOUT='60', ANP_HEARTBEAT_TIMEOUT='15',
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices_per_process}')
  env.update({k: str(v) for k, v in extra.items()})
  return env


def _launch(cmd, num_processes, devices_per_process, tmp_path, **extra):
  port = _free_port()
  procs = []
  for pid in range(num_processes):
    log = open(tmp_path / f'proc{pid}.log', 'w')
    procs.append(subprocess.Popen(cmd, env=_env(num_processes, pid, port, devices_per_process,
                                                MP_OUT=tmp_path / f'out{pid}.json', **extra),
                                  stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
  return procs


def _wait(procs, tmp_path, timeout=600):
  deadline = time.time() + timeout
  for p in procs:
    try:
      p.wait(timeout=max(1, deadline - time.time()))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  logs = [open(tmp_path / f'proc{i}.log').read() for i in range(len(procs))]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-4000:]
  return [json.load(open(tmp_path / f'out{i}.json')) for i in range(len(procs))]


OVERRIDES = dict(num_train_steps=5, log_every_steps=1, bn_mode='global', eval_every_epochs=0)


@pytest.fixture(scope='module')
def reference(data_dir, tmp_path_factory):
  """The same job in one process with 8 devices."""
  assert jax.device_count() == 8
  config = tiny_config(data_dir, **OVERRIDES)
  return train.train_and_evaluate(config, str(tmp_path_factory.mktemp('single')))


@pytest.mark.parametrize('num_processes', [2, 4])
def test_multi_process_equals_single_process(data_dir, tmp_path, reference, num_processes):
  mp_config = dict(OVERRIDES, data_dir=str(data_dir), workdir=str(tmp_path / 'work'))
  procs = _launch([sys.executable, os.path.join(HERE, 'mp_worker.py')], num_processes,
                  8 // num_processes, tmp_path, MP_CONFIG=json.dumps(mp_config))
  outs = _wait(procs, tmp_path)
  assert [o['process_count'] for o in outs] == [num_processes] * num_processes
  assert all(o['devices'] == 8 and o['local_devices'] == 8 // num_processes for o in outs)
  ref_losses = [h['train/loss'] for h in reference.history if 'train/loss' in h]
  for o in outs:  # Every process sees the same replicated metrics.
    np.testing.assert_allclose(o['losses'], ref_losses, rtol=1e-4)
    assert o['final_eval']['eval/anp_top1'] == pytest.approx(
        reference.final_eval['eval/anp_top1'], abs=1e-6)
  # Each process read a different part of the global batch, together all of it.
  digests = [set(o['first_batch_digests']) for o in outs]
  assert all(len(d) == 32 // num_processes for d in digests)
  assert len(set.union(*digests)) == 32
  # Exact eval in every process: the mean is over all 104 examples (a count check via top-1).
  top1 = outs[0]['final_eval']['eval/anp_top1'] * 104
  assert abs(top1 - round(top1)) < 1e-3


def test_a_dead_process_makes_the_others_exit(data_dir, tmp_path):
  """kill -9 of one process: the survivor exits non-zero within the heartbeat timeout."""
  cmd = [sys.executable, '-m', 'anp_jax.main', f'--workdir={tmp_path / "work"}',
         f'--config.data_dir={data_dir}', '--config.num_train_steps=100000',
         '--config.model.name=resnet8', '--config.model.width=0.25', '--config.image_size=16',
         '--config.batch_size=8', '--config.bn_group_size=4', '--config.progress_bar=False',
         '--config.checkpoint_every_steps=0', '--config.checkpoint_every_minutes=0',
         '--config.log_every_steps=5', '--config.eval_every_epochs=0']
  for key, value in tiny_config(data_dir).synthetic.items():
    cmd.append(f'--config.synthetic.{key}={value}')
  procs = _launch(cmd, 2, 1, tmp_path)
  metrics = tmp_path / 'work' / 'metrics.jsonl'
  deadline = time.time() + 300
  while not (metrics.exists() and metrics.read_text().count('\n') >= 2):
    assert time.time() < deadline, open(tmp_path / 'proc0.log').read()[-3000:]
    assert procs[0].poll() is None, open(tmp_path / 'proc0.log').read()[-3000:]
    time.sleep(1)
  procs[1].kill()
  t0 = time.time()
  try:
    rc = procs[0].wait(timeout=120)
  finally:
    procs[0].kill()
  assert rc != 0
  assert time.time() - t0 < 120


def test_inconsistent_process_id_fails_fast(tmp_path):
  env = _env(2, 5, _free_port(), 1)
  out = subprocess.run([sys.executable, '-m', 'anp_jax.main', f'--workdir={tmp_path}'],
                       env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert out.returncode != 0
  assert 'inconsistent process counts' in out.stderr


def test_unreachable_coordinator_fails_with_a_message(tmp_path):
  env = _env(2, 1, _free_port(), 1, ANP_INIT_TIMEOUT=8)
  t0 = time.time()
  out = subprocess.run([sys.executable, '-m', 'anp_jax.main', f'--workdir={tmp_path}'],
                       env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
  assert out.returncode != 0
  assert time.time() - t0 < 120
  assert 'coordinator' in (out.stderr + out.stdout)


def test_first_run_on_an_empty_data_dir_prepares_the_dataset_once(tmp_path):
  """Two processes on a fresh data_dir: process 0 generates synthetic_anp, the other waits at a
  barrier and then reads it (before: the second one read a half-written dataset and failed)."""
  data_dir = tmp_path / 'fresh_tfds'
  assert not data_dir.exists()
  mp_config = dict(OVERRIDES, num_train_steps=2, data_dir=str(data_dir),
                   workdir=str(tmp_path / 'work'))
  procs = _launch([sys.executable, os.path.join(HERE, 'mp_worker.py')], 2, 1, tmp_path,
                  MP_CONFIG=json.dumps(mp_config))
  outs = _wait(procs, tmp_path)
  assert [o['process_count'] for o in outs] == [2, 2]
  assert outs[0]['final_eval']['eval/anp_top1'] == outs[1]['final_eval']['eval/anp_top1']
