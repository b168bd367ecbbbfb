"""The studies' --dry_run time estimate: the cost model (`anp_jax.research.run_costs`), its fit
from measured phases, its refresh from a study's own finished runs, and the estimate against a
real study (slow: trains the tiny preset)."""

import json
import os
import re
import subprocess
import sys

import pytest

from anp_jax.research import run_costs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shape(name, steps=10, batch=32, evals=2, eval_images=100, work=0.5, point='a', seed=0,
          checkpoints=3):
  programs = {'train': point, 'eval': 'e', 'init': f's{seed}'}
  return run_costs.RunShape(name, steps, steps * batch, evals * eval_images, checkpoints, work,
                            programs)


TRUE = run_costs.Costs(start_s=9.0, runner_s=2.0, run_s=1.5, checkpoint_s=0.25,
                       compile_miss_s={'init': 3.0, 'train': 12.0, 'eval': 2.0},
                       compile_hit_s={'init': 0.4, 'train': 1.0, 'eval': 0.2},
                       train_step_s=0.03, train_s_per_image=2e-3, eval_s_per_image=5e-4)


def phases_of(s: run_costs.RunShape, miss: dict, costs=TRUE):
  """The phases `anp_jax.phases` would record for run `s` under `costs` (`miss`: per program,
  whether this run compiled it afresh)."""
  def compiled(program, seconds):
    c = (costs.compile_miss_s if miss[program] else costs.compile_hit_s)[program]
    return {'seconds': seconds + c, 'trace_s': c / 4, 'lower_s': c / 4, 'compile_s': c / 2,
            ('cache_misses' if miss[program] else 'cache_hits'): 1.0}
  return {'start': {'seconds': costs.run_s * 0.6}, 'finish': {'seconds': costs.run_s * 0.4},
          'init': compiled('init', 0.0),
          'train': compiled('train', s.steps * costs.train_step_s
                            + s.images * s.work * costs.train_s_per_image),
          'eval:eval': compiled('eval', s.eval_images * s.work * costs.eval_s_per_image),
          'checkpoint': {'seconds': s.checkpoints * costs.checkpoint_s,
                         'count': float(s.checkpoints)}}


def test_estimate_compiles_each_program_once_per_invocation():
  """Seeds of a point share the train step (loaded the second time), a new point compiles its
  own; the initialisation depends on the seed; every part is in the estimate."""
  shapes = [shape('a0', point='a', seed=0), shape('a1', point='a', seed=1),
            shape('b0', point='b', seed=0)]
  est = run_costs.estimate(shapes, TRUE)
  miss, hit = TRUE.compile_miss_s, TRUE.compile_hit_s
  compile_s = (2 * miss['train'] + hit['train'] + miss['eval'] + 2 * hit['eval']
               + 2 * miss['init'] + hit['init'])
  assert est.parts['compile'] == pytest.approx(compile_s)
  assert est.parts['start + imports'] == TRUE.start_s and est.parts['runner'] == TRUE.runner_s
  assert est.parts['train steps'] == pytest.approx(3 * (10 * 0.03 + 320 * 0.5 * 2e-3))
  assert est.parts['evaluations'] == pytest.approx(3 * 200 * 0.5 * 5e-4)
  assert est.parts['checkpoints'] == pytest.approx(9 * 0.25)
  assert est.seconds == pytest.approx(sum(est.parts.values()))
  # What the dry run prints names the parts.
  assert 'compile' in est.describe() and 'start + imports' in est.describe()
  # A half-trained run costs half its steps, evaluations and checkpoints (not its set-up).
  half = run_costs.estimate([run_costs.RunShape(**{**vars(shapes[0]), 'done_steps': 5})], TRUE)
  full = run_costs.estimate(shapes[:1], TRUE)
  assert half.parts['train steps'] == pytest.approx(full.parts['train steps'] / 2)
  assert half.parts['compile'] == full.parts['compile']


def test_fit_recovers_the_constants_it_was_measured_with():
  """Runs of two batch sizes separate the per-step from the per-image cost; misses and hits,
  evaluations, checkpoints and the fixed cost come back as they were put in."""
  shapes = [shape('a0', batch=32, seed=0), shape('a1', batch=32, seed=1),
            shape('b0', batch=256, steps=4, point='b', work=1.0, seed=0)]
  seen, samples = set(), []
  for s in shapes:
    miss = {p: (p, s.programs[p]) not in seen for p in run_costs.PROGRAMS}
    seen |= {(p, s.programs[p]) for p in run_costs.PROGRAMS}
    samples.append((s, phases_of(s, miss)))
  fitted = run_costs.fit(samples, run_costs.Costs(), start_s=9.0, runner_s=2.0)
  for field in ('start_s', 'runner_s', 'run_s', 'checkpoint_s', 'train_step_s',
                'train_s_per_image', 'eval_s_per_image'):
    assert getattr(fitted, field) == pytest.approx(getattr(TRUE, field), rel=1e-6), field
  assert fitted.compile_miss_s == pytest.approx(TRUE.compile_miss_s)
  assert fitted.compile_hit_s == pytest.approx(TRUE.compile_hit_s)
  assert run_costs.estimate(shapes, fitted).seconds == pytest.approx(
      run_costs.estimate(shapes, TRUE).seconds)


def test_program_keys():
  """The train step differs by every setting but the seed (the rate is a constant in it); the
  evaluation only by the model, image size, batch and devices; the initialisation by the seed."""
  base = {'model': {'name': 'resnet8', 'width': 0.5}, 'image_size': 16, 'seed': 0,
          'base_lr': 0.1, 'bn_mode': 'ghost', 'evals': {'eval': {}}, 'target_value': 0.2}
  setup = {'devices': 2, 'per_device_batch': 16, 'accum_steps': 1, 'eval_per_process_batch': 32,
           'total_steps': 10}
  k = run_costs.program_keys(base, setup)
  seed1 = run_costs.program_keys({**base, 'seed': 1}, setup)
  lr = run_costs.program_keys({**base, 'base_lr': 0.2}, setup)
  target = run_costs.program_keys({**base, 'target_value': 0.3}, setup)
  assert seed1['train'] == k['train'] and seed1['eval'] == k['eval'] and seed1['init'] != k['init']
  assert lr['train'] != k['train'] and lr['eval'] == k['eval'] and lr['init'] == k['init']
  assert target == k
  assert run_costs.work({'model': {'name': 'resnet20', 'width': 1.0}, 'image_size': 32}) == 1.0
  assert run_costs.work(base) == pytest.approx(8 / 20 * 0.25 * 0.25)


def test_refresh_uses_the_study_s_own_finished_runs(tmp_path):
  """Runs that finished with their phases recorded replace the committed constants; a resumed
  run (its phases only its last part) and a diverged one are not used."""
  config = {'model': {'name': 'resnet20', 'width': 1.0}, 'image_size': 32, 'seed': 0,
            'evals': {'eval': {}}, 'checkpoint_every_steps': 5}
  setup = {'devices': 1, 'per_device_batch': 32, 'accum_steps': 1, 'eval_per_process_batch': 50,
           'num_eval_batches': 2, 'process_count': 1, 'total_steps': 10, 'batch_size': 32,
           'eval_every_steps': 5}
  s = run_costs.shape_of('r0', config, setup)
  assert (s.steps, s.images, s.eval_images, s.checkpoints) == (10, 320, 200, 3)
  slow = run_costs.Costs(**{**vars(TRUE), 'train_s_per_image': 4e-3, 'run_s': 3.0,
                            'sources': {}})
  for name, extra in (('r0', {}), ('r1', {'resumed': True}), ('r2', {})):
    d = tmp_path / 'runs' / name
    d.mkdir(parents=True)
    (d / 'config.json').write_text(json.dumps(config))
    (d / 'sweep_run.json').write_text(json.dumps({'batch': 32, **setup}))
    (d / 'final_metrics.json').write_text(json.dumps(
        {'step': 10, **({'diverged': True} if name == 'r2' else {})}))
    (d / run_costs.PHASES_FILE).write_text(json.dumps(
        {'setup': setup, 'phases': phases_of(s, {p: True for p in run_costs.PROGRAMS}, slow),
         **extra}))
  costs, used = run_costs.refresh(TRUE, str(tmp_path), ['r0', 'r1', 'r2', 'missing'])
  assert used == 1
  assert costs.run_s == pytest.approx(3.0)
  assert costs.compile_miss_s['train'] == pytest.approx(TRUE.compile_miss_s['train'])
  # One kind of run: the per-step cost kept, the rest per image.
  assert costs.train_step_s == TRUE.train_step_s
  assert costs.train_s_per_image == pytest.approx(4e-3)
  assert costs.start_s == TRUE.start_s  # Not measured by a run.


def test_committed_costs_load():
  """The committed measurement exists, is of the CPU, and says how it was made."""
  costs = run_costs.load(os.path.join(ROOT, run_costs.COSTS_FILE))
  assert costs is not None and costs.platform == 'cpu'
  with open(os.path.join(ROOT, run_costs.COSTS_FILE)) as f:
    record = json.load(f)
  assert record['command'].startswith('experiments/measure_costs.py')
  assert all(v > 0 for v in costs.compile_miss_s.values())


ESTIMATE = re.compile(r'estimated (\d+) (s|min) for the rest \(([^;]*);')


def dry_run_seconds(args, env):
  out = subprocess.run([sys.executable, os.path.join(ROOT, 'experiments', 'study.py'), *args,
                        '--dry_run'], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  m = ESTIMATE.search(out.stdout)
  assert m, out.stdout
  return float(m.group(1)) * (60 if m.group(2) == 'min' else 1), m.group(3), out.stdout


@pytest.mark.slow(200)
def test_estimate_within_a_factor_of_two_of_the_real_study(tmp_path):
  """The tiny preset's --dry_run estimate against its real run, each a fresh process with an
  empty compilation cache. The constants are measured in this test first (the tests' XLA flags
  and this machine's load differ from the committed file's): a calibration study of other
  shapes (one seed, a quarter epoch), then the dry run of the full preset (two seeds of both
  points, half an epoch: seeds that load their programs, a longer run) with those constants, then
  the real study. The estimate must be within a factor of 2 of the real wall time."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  calibration = run_costs.measure_study(
      ['--preset', 'ghost_bn:tiny', '--seeds', '0', '--config.num_epochs=0.25',
       '--config.eval_every_epochs=0.25'], str(tmp_path / 'calibration'), env=env)
  assert len(calibration['samples']) == 2
  costs = run_costs.fit_studies([calibration], source='calibration')
  costs_path = tmp_path / 'costs.json'
  costs_path.write_text(json.dumps(costs.to_json()))
  env[run_costs.COSTS_ENV] = str(costs_path)
  study = ['--preset', 'ghost_bn:tiny']
  out = tmp_path / 'study' / 'out'
  estimate, parts, printed = dry_run_seconds([*study, '--out', str(out)], env)
  assert 'compile' in parts and 'train steps' in parts, printed
  assert not out.exists()
  real = run_costs.measure_study(study, str(tmp_path / 'study'), env=env)
  assert len(real['samples']) == 4
  ratio = real['wall_s'] / estimate
  print(f'estimate {estimate:.0f} s ({parts}), real {real["wall_s"]:.0f} s, ratio {ratio:.2f}')
  assert 0.5 <= ratio <= 2.0, (estimate, parts, real['wall_s'])
  # Rerun: every run finished, nothing left; its constants now come from its own runs.
  again, _, printed = dry_run_seconds([*study, '--out', str(out)], env)
  assert again == 0 and 'refreshed from 4 finished run(s)' in printed, printed
