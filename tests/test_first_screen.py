"""The first screen of ``./run.sh`` (issue 45): the default config trains, resumes and is evaluated
without a single warning, traceback or log line glued onto the progress bar.

Was, on every 1-device run (the demo, its resume and its evaluation): the gradient-noise-scale
notice twice, as an absl ``W1205 ... trainer.py:244]`` line and as ``anp_jax | WARNING: B_simple
is not measured: ...``, about what a run on one device without accumulation cannot measure.

What run.sh execs, ``python -m anp_jax.main``, on the real default config (ResNet-20, the
generated 32 px dataset, generated here on first use as a user's first run does) for a few steps,
with stdout and stderr a pipe (a log file, SLURM output: the progress bar's plain lines).
"""

import re
import subprocess
import sys

import pytest

from conftest import ROOT, subprocess_env

# absl's prefix (W1205 20:59:28.483542 140254349118336 trainer.py:251]) and the C++ logs' (XLA,
# TensorFlow: W0000 00:00:1733 ...), at any level.
LOG_PREFIX = re.compile(r'^[IWEF]\d{4} \d\d:\d\d:\d\d')
# A plain progress-bar line, and nothing after it.
BAR = re.compile(r'^\[[█·]+\] \d+/\d+ +[\d.]+% \| [\d.]+ step/s \| \d+ img/s \| ETA \S+ \|'
                 r'( loss \S+ top1 \S+)?$')


def _main(workdir, data_dir, *flags):
  """(exit code, the lines of stdout and stderr) of ``python -m anp_jax.main`` on the default
  config."""
  proc = subprocess.run([sys.executable, '-m', 'anp_jax.main', f'--workdir={workdir}', *flags],
                        env=subprocess_env(1, ANP_DATA_DIR=data_dir), cwd=ROOT,
                        capture_output=True, text=True, timeout=900)
  return proc.returncode, (proc.stdout + proc.stderr).splitlines()


def _noise(lines):
  """The lines a quiet first screen must not have."""
  bad = []
  for line in lines:
    if (LOG_PREFIX.match(line) or 'warning' in line.lower() or 'Traceback' in line
        or ('| ETA' in line and not BAR.match(line))):
      bad.append(line)
  return bad


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
  """The demo's first screen (2 steps of the default config), then its resume to step 3."""
  data_dir = str(tmp_path_factory.mktemp('tensorflow_datasets'))
  workdir = tmp_path_factory.mktemp('demo')
  first = _main(workdir, data_dir, '--config.num_train_steps=2')
  resumed = _main(workdir, data_dir, '--config.num_train_steps=3')
  return workdir, data_dir, first, resumed


@pytest.mark.slow(150)
def test_the_demo_prints_no_warning(demo):
  _, _, (rc, lines), _ = demo
  assert rc == 0, '\n'.join(lines[-40:])
  assert any(line.startswith('anp_jax | generating the synthetic_anp dataset') for line in lines)
  assert any(line.startswith('Done in ') for line in lines), lines
  assert _noise(lines) == [], '\n'.join(lines)


@pytest.mark.slow(40)
def test_its_resume_prints_no_warning(demo):
  _, _, _, (rc, lines) = demo
  assert rc == 0, '\n'.join(lines[-40:])
  assert any(line.startswith('Resumed from checkpoint at step 2') for line in lines), lines
  assert _noise(lines) == [], '\n'.join(lines)


@pytest.mark.slow(30)
def test_its_evaluation_prints_no_warning(demo):
  workdir, data_dir, _, _ = demo
  rc, lines = _main(workdir, data_dir, '--config.eval_only=True')
  assert rc == 0, '\n'.join(lines[-40:])
  assert any(line.startswith('Evaluated the checkpoint of step 3') for line in lines), lines
  assert _noise(lines) == [], '\n'.join(lines)


def test_the_noise_check_finds_what_the_first_screen_showed():
  """The check itself (what the tests above rely on), on the lines the first screen had."""
  bar = '[█████···················] 5/30  16.7% | 1.20 step/s | 154 img/s | ETA 0m21s |'
  assert _noise([bar, bar + ' loss 5.406 top1 0.0759', 'Done in 0.4 min: ...']) == []
  was = ['W1205 20:59:28.483542 140254349118336 trainer.py:244] anp_jax | WARNING: B_simple is '
         'not measured: ...',
         'anp_jax | WARNING: B_simple is not measured: ...',
         bar + ' W1205 20:59:28.48 trainer.py:251] Preempted',
         'Traceback (most recent call last):']
  assert _noise(was) == was
