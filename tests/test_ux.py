"""What a new user hits (issue 18): reports whatever the runs reached, workdirs untouched by a
refused run, eval-only without a checkpoint, relative checkpoint paths, flag errors that exit 2
with the fix, quiet start-up, honest progress, perfmodel presets, README figures that match the
committed results."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from anp_jax.configs import default
from conftest import ROOT, run_experiment, subprocess_env, tiny_config


def _train(data_dir, workdir, **overrides):
  from anp_jax import trainer
  config = tiny_config(data_dir, **overrides)
  return trainer.train_and_evaluate(config, str(workdir))


# ----------------------------------------------------------------------------------------------
# 1. The sweep report when no run reaches the target.


def _row(batch, steps_to_target, top1=0.1):
  return {'name': f'b{batch:05d}-linear-warmup-lrx1-s0', 'batch': batch, 'rule': 'linear',
          'warmup': 'on', 'seed': 0, 'lr_mult': 1.0, 'base_lr': 0.2, 'lr': 0.1 * batch / 128,
          'warmup_epochs': 1.0, 'epochs': 1.0, 'devices': 2, 'per_device_batch': batch // 2,
          'accum_steps': 1, 'steps_per_epoch': 10, 'total_steps': 10, 'status': 'finished',
          'final_step': 10, 'final_top1': top1, 'final_top5': 0.3, 'best_top1': top1,
          'target_top1': 0.25, 'steps_to_target': steps_to_target,
          'examples_to_target': None if steps_to_target is None else steps_to_target * batch,
          'epochs_to_target': None, 'wall_time_s': 1.0, 'b_simple': None, 'best_lr': True,
          'error': None}


@pytest.mark.parametrize('reached', [(None, None), (40, None)])
def test_report_is_written_when_runs_miss_the_target(tmp_path, reached):
  rows = [_row(128, reached[0]), _row(256, reached[1])]
  (tmp_path / 'results.json').write_text(json.dumps(rows))
  r = run_experiment('report.py', str(tmp_path))
  assert r.returncode == 0, r.stderr
  text = (tmp_path / 'report.md').read_text()
  assert (tmp_path / 'steps_vs_batch.png').stat().st_size > 0
  assert '| linear rule, warmup | 256 |' in text and 'never' in text
  assert 'did not reach' in text  # The missed runs are named, not silently left out.


# ----------------------------------------------------------------------------------------------
# 2, 3, 12. Workdirs: a refused run changes nothing; eval-only needs a checkpoint and writes
# nothing.


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp('trained')
  _train(data_dir, workdir, num_train_steps=3)
  return workdir


def _snapshot(workdir):
  return {name: (workdir / name).read_bytes() for name in ('config.json', 'metrics.jsonl')}


def test_refused_resume_leaves_the_workdir_untouched(data_dir, trained):
  from anp_jax import trainer
  before = _snapshot(trained)
  with pytest.raises(ValueError, match=r'model\.width'):
    _train(data_dir, trained, num_train_steps=6, **{'model.width': 1.0})
  assert _snapshot(trained) == before
  model, variables, _ = trainer.load_checkpoint(str(trained))
  model.apply(variables, np.zeros((1, 16, 16, 3), np.float32), train=False)


def test_failed_validation_leaves_no_new_workdir(data_dir, tmp_path):
  workdir = tmp_path / 'new' / 'run'
  with pytest.raises(ValueError, match='not divisible'):
    _train(data_dir, workdir, batch_size=36)  # 8 devices.
  assert not (tmp_path / 'new' / 'run').exists()


def test_eval_only_without_a_checkpoint_is_an_error(data_dir, tmp_path):
  workdir = tmp_path / 'typo'
  with pytest.raises(FileNotFoundError, match='no checkpoint found in'):
    _train(data_dir, workdir, eval_only=True)
  assert not workdir.exists()


def test_eval_only_evaluates_the_checkpoint_and_writes_nothing(data_dir, trained):
  before = _snapshot(trained), sorted(os.listdir(trained))
  result = _train(data_dir, trained, num_train_steps=3, eval_only=True, batch_size=64)
  assert (_snapshot(trained), sorted(os.listdir(trained))) == before
  assert result.step == 3
  final = json.loads((trained / 'final_metrics.json').read_text())  # The training's evaluation.
  assert result.final_eval['eval/anp_top1'] == pytest.approx(final['eval/anp_top1'])


def test_workdir_that_is_a_file_says_so(data_dir, tmp_path):
  path = tmp_path / 'file'
  path.write_text('not a directory')
  with pytest.raises(OSError, match='is a file'):
    _train(data_dir, path)


# ----------------------------------------------------------------------------------------------
# 4. load_checkpoint on relative and ~ paths.


def test_load_checkpoint_resolves_relative_and_home_paths(trained, monkeypatch):
  from anp_jax import trainer
  monkeypatch.chdir(trained.parent)
  trainer.load_checkpoint(trained.name)
  monkeypatch.setenv('HOME', str(trained.parent))
  trainer.load_checkpoint(os.path.join('~', trained.name))


# ----------------------------------------------------------------------------------------------
# 12. One data directory for every entry point.


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


# ----------------------------------------------------------------------------------------------
# 10. Performance-model numbers a user will not misread.


def _perfmodel(*args):
  """``python -m anp_jax.research.perfmodel ARGS``'s output (it must succeed)."""
  r = subprocess.run([sys.executable, '-m', 'anp_jax.research.perfmodel', *args],
                     env=subprocess_env(), capture_output=True, text=True, timeout=600)
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


# ----------------------------------------------------------------------------------------------
# 9. Progress that moves, with honest rates.


def test_rates_after_an_evaluation_exclude_it(monkeypatch):
  from anp_jax import reporting
  now = [100.0]
  monkeypatch.setattr(reporting.time, 'time', lambda: now[0])
  bar = reporting.ProgressBar(100, images_per_step=10, enabled=False)
  bar.reset_clock(0)
  now[0] += 10.0  # 10 steps of training in 10 s ...
  now[0] += 30.0  # ... then a 30 s evaluation.
  bar.exclude(30.0)
  assert bar.rates(10) == pytest.approx((1.0, 10.0))


def test_progress_bar_in_a_log_writes_plain_lines_every_few_seconds(monkeypatch):
  import io
  from anp_jax import reporting
  now = [0.0]
  monkeypatch.setattr(reporting.time, 'time', lambda: now[0])
  stream = io.StringIO()
  bar = reporting.ProgressBar(100, images_per_step=10, stream=stream)
  for step in range(1, 31):
    now[0] += 1.0
    bar.update(step)
  lines = stream.getvalue().splitlines()
  assert 5 <= len(lines) <= 7 and '\r' not in stream.getvalue()


def test_benchmark_windows_report_progress():
  from anp_jax import benchmarking
  lines = []
  contenders = [benchmarking.Contender(name, 8, lambda n: None) for name in ('a', 'b')]
  benchmarking.interleave(contenders, windows=3, steps_per_window=2, warmup_steps=1,
                          progress=lines.append)
  assert [l for l in lines if l.startswith('window ')] == [
      l for l in lines if re.match(r'window \d/3: a [\d.e+]+ img/s, b [\d.e+]+ img/s', l)]
  assert len([l for l in lines if l.startswith('window ')]) == 3
  assert len([l for l in lines if 'warm-up' in l]) == 2


# ----------------------------------------------------------------------------------------------
# 7. One way to run things.


def test_readme_commands_have_one_form():
  """Every command line of the README's code blocks starts the same way (no bare `python`)."""
  text = open(os.path.join(ROOT, 'README.md')).read()
  blocks = re.findall(r'```bash\n(.*?)```', text, re.S)
  commands = [l.strip() for b in blocks for l in b.splitlines()
              if l.strip() and not l.startswith((' ', '\t', '#'))]
  bad = [c for c in commands if re.search(r'(^|\s)(PYTHONPATH=\S* )?python3? ', c)]
  assert not bad, bad
  assert not re.search(r'PYTHONPATH=\. ', text)
  assert all(c.split()[0] in ('.venv/bin/python', './run.sh', './test.sh', 'sbatch',
                              'experiments/bench_gpu.sh') or '=' in c.split()[0]
             for c in commands), commands


def test_package_builds_with_every_module(tmp_path):
  """pyproject.toml: the wheel (what `pip install -e .` installs) holds all of anp_jax."""
  import shutil
  src = tmp_path / 'src'  # setuptools builds in the source tree: not in the checkout.
  shutil.copytree(os.path.join(ROOT, 'anp_jax'), src / 'anp_jax',
                  ignore=shutil.ignore_patterns('__pycache__'))
  for name in ('pyproject.toml', 'requirements.txt', 'README.md'):
    shutil.copy(os.path.join(ROOT, name), src / name)
  out = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps',
                        '--no-build-isolation', '-w', str(tmp_path), str(src)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-2000:]
  import zipfile
  wheel, = [p for p in os.listdir(tmp_path) if p.endswith('.whl')]
  names = set(zipfile.ZipFile(tmp_path / wheel).namelist())
  ours = {os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(
      os.path.join(ROOT, 'anp_jax')) for f in fs if f.endswith('.py')}
  assert ours <= names, sorted(ours - names)


@pytest.mark.slow(30)
def test_experiment_scripts_run_from_another_directory(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env.pop('PYTHONPATH', None)
  for script in ('report.py', 'batch_size_sweep.py', 'perfmodel_validation.py',
                 'sync_async_mixed.py'):
    out = subprocess.run([sys.executable, os.path.join(ROOT, 'experiments', script), '--help'],
                         env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, (script, out.stderr[-2000:])
