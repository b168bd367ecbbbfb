"""Several seeds at once (`anp_jax.seed_group`): each seed of a group equals its separate run.

Tolerance: the group runs the same per-device step under `vmap`, where each convolution with
per-seed kernels becomes one grouped convolution and XLA may order sums otherwise, so values
agree to float32 rounding, not bit for bit: a relative 1e-5 (a few ulp of float32's 6e-8 per
operation, accumulated over a dozen steps of a ResNet-8) with 1e-6 absolute for values near 0.
The initial states are bit-identical. On these deterministic CPU runs the crossings, stopping
steps and checkpoints' steps are the same.
"""

import json
import os
import signal

import jax
import numpy as np
import pytest

from anp_jax import checkpointing, errors, preemption, seed_group, trainer
from anp_jax.research import runner
from conftest import crossing_study, leaves, tiny_config

SEEDS = (0, 1, 2)
RTOL, ATOL = 1e-5, 1e-6
TIMING = ('time', 'train/steps_per_s', 'train/images_per_s')


def _config(data_dir, seed, **kw):
  """12 steps, every step logged, an evaluation every 2 steps, stopping at 20 % ANP top-1 (seed
  1 crosses at step 10, the others never), a checkpoint every 4 steps."""
  settings = dict(num_train_steps=12, log_every_steps=1, eval_every_epochs=0.25,
                  stop_at_target=True, target_metric='eval/anp_top1', target_value=0.2,
                  checkpoint_every_steps=4, seed=seed)
  settings.update(kw)
  return tiny_config(data_dir, **settings)


def _lines(workdir):
  return [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]


def _final(workdir):
  return json.load(open(os.path.join(workdir, 'final_metrics.json')))


def _assert_same_run(got_dir, want_dir):
  """The logs, final metrics and checkpoints of two run directories agree (to tolerance)."""
  got, want = _lines(got_dir), _lines(want_dir)
  assert [r['step'] for r in got] == [r['step'] for r in want]
  for g, w in zip(got, want):
    assert set(g) == set(w)
    for key in set(w) - set(TIMING):
      np.testing.assert_allclose(g[key], w[key], rtol=RTOL, atol=ATOL, err_msg=f'{key} @ {w}')
  fg, fw = _final(got_dir), _final(want_dir)
  assert set(fg) == set(fw)
  for key in set(fw) - {'wall_time_s'}:
    if isinstance(fw[key], float):
      np.testing.assert_allclose(fg[key], fw[key], rtol=RTOL, atol=ATOL, err_msg=key)
    else:
      assert fg[key] == fw[key], key
  steps = lambda d: sorted(os.listdir(os.path.join(d, 'checkpoints')))  # noqa: E731
  assert steps(got_dir) == steps(want_dir)
  for step in steps(want_dir):
    if step.isdigit():
      _, a = checkpointing.restore_state(str(got_dir), int(step))
      _, b = checkpointing.restore_state(str(want_dir), int(step))
      for x, y in zip(leaves(a), leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL)


@pytest.fixture(scope='module')
def both(data_dir, tmp_path_factory):
  """The three seeds trained separately and as one group: (separate dirs, group dirs,
  outcomes)."""
  root = tmp_path_factory.mktemp('seeds')
  separate = [root / f'separate{s}' for s in SEEDS]
  grouped = [root / f'group{s}' for s in SEEDS]
  for seed, workdir in zip(SEEDS, separate):
    trainer.train_and_evaluate(_config(data_dir, seed), str(workdir))
  outcomes = seed_group.train_seed_group([_config(data_dir, s) for s in SEEDS],
                                         [str(w) for w in grouped])
  return separate, grouped, outcomes


@pytest.mark.slow(40)
def test_each_seed_equals_its_separate_run_losses_evaluations_and_checkpoints(both):
  """Every logged loss and metric, the final metrics and every checkpoint of each seed equal its
  separate run's to float tolerance; the same steps are logged, evaluated and checkpointed."""
  separate, grouped, outcomes = both
  for got, want, outcome in zip(grouped, separate, outcomes):
    assert outcome.error is None and outcome.result.step == _final(want)['step']
    _assert_same_run(got, want)
    assert sorted(f for f in os.listdir(got) if not f.startswith('events')) == sorted(
        f for f in os.listdir(want) if not f.startswith('events'))
    assert json.load(open(got / 'config.json')) == json.load(open(want / 'config.json'))


@pytest.mark.slow(40)
def test_a_seed_stops_at_its_separate_run_s_crossing_and_its_checkpoint_is_that_run_s(
    both, data_dir):
  """Seed 1 crosses the target at step 10 (its separate run too) and stops there while the
  others train to 12; its stopping checkpoint equals the separate run's and a single run's
  evaluation (eval_only) of its directory gives its final metrics."""
  separate, grouped, _ = both
  finals = [_final(d) for d in grouped]
  assert [f['step'] for f in finals] == [_final(d)['step'] for d in separate] == [12, 10, 12]
  assert [f['stopped_at_target'] for f in finals] == [False, True, False]
  assert max(r['step'] for r in _lines(grouped[1])) == 10
  evaluated = trainer.train_and_evaluate(_config(data_dir, 1, eval_only=True),
                                         str(grouped[1]))
  assert evaluated.step == 10
  assert evaluated.final_eval['eval/anp_top1'] == pytest.approx(finals[1]['eval/anp_top1'])


@pytest.mark.slow(10)
def test_the_initial_states_are_those_of_the_separate_runs_bit_for_bit(data_dir):
  run = trainer.build(_config(data_dir, 0))
  stacked = seed_group.group_program(run).init([0, 7])
  for i, seed in enumerate((0, 7)):
    alone = trainer.build(_config(data_dir, seed)).init_state()
    for x, y in zip(leaves(stacked), leaves(alone), strict=True):
      np.testing.assert_array_equal(x[i], y)


@pytest.mark.slow(40)
def test_a_diverging_seed_is_recorded_diverged_while_the_other_finishes(data_dir, tmp_path):
  """At base_lr 2500 seed 0's state overflows within 6 steps and seed 3's does not (their
  separate runs too): the group records seed 0's divergence (the trainer's error, at the same
  step) and trains seed 3 to its end, as its separate run. At this rate the training is chaotic
  (losses of 1e9 by step 4), so rounding differences grow past the tolerance after the first
  steps: those are compared, and the steps logged, checkpointed and reached."""
  make = lambda seed: tiny_config(data_dir, base_lr=2500.0, seed=seed,  # noqa: E731
                                  log_every_steps=1)
  with pytest.raises(errors.NonFiniteLossError) as alone:
    trainer.train_and_evaluate(make(0), str(tmp_path / 'separate0'))
  trainer.train_and_evaluate(make(3), str(tmp_path / 'separate3'))
  outcomes = seed_group.train_seed_group([make(0), make(3)],
                                         [str(tmp_path / 'group0'), str(tmp_path / 'group3')])
  assert outcomes[0].error is not None and outcomes[0].result is None
  assert outcomes[0].error.step == alone.value.step
  assert str(outcomes[0].error).split(' (learning')[0] == str(alone.value).split(' (learning')[0]
  assert outcomes[1].error is None and outcomes[1].result.step == 6
  got, want = _lines(tmp_path / 'group3'), _lines(tmp_path / 'separate3')
  assert [r['step'] for r in got] == [r['step'] for r in want]
  np.testing.assert_allclose([r['train/loss'] for r in got[:2]],
                             [r['train/loss'] for r in want[:2]], rtol=RTOL)
  assert _final(tmp_path / 'group3')['step'] == _final(tmp_path / 'separate3')['step'] == 6
  assert not os.path.exists(tmp_path / 'group0' / 'final_metrics.json')  # The runner's to write.


@pytest.mark.slow(40)
def test_a_preempted_group_resumes_from_its_checkpoints_and_ends_as_the_uninterrupted_one(
    both, data_dir, tmp_path, monkeypatch):
  """A signal after step 5: every seed checkpoints at step 5 and the group raises Preempted;
  the same call again resumes all three from step 5 and ends exactly as the uninterrupted group
  (the same batches from step 5 on, the restored states bit for bit)."""
  _, uninterrupted, _ = both
  preemption.install()
  preemption.reset()
  make = seed_group.group_program
  calls = []

  def signalling(run):
    prog = make(run)
    step = prog.step

    def counted(state, batch):
      calls.append(1)
      if len(calls) == 5:
        os.kill(os.getpid(), signal.SIGTERM)
      return step(state, batch)
    prog.step = counted
    return prog

  dirs = [str(tmp_path / f'group{s}') for s in SEEDS]
  configs = [_config(data_dir, s) for s in SEEDS]
  monkeypatch.setattr(seed_group, 'group_program', signalling)
  try:
    with pytest.raises(errors.Preempted) as info:
      seed_group.train_seed_group(configs, dirs)
  finally:
    preemption.reset()
  assert info.value.step == 5
  assert all(seed_group.latest_checkpoint_step(d) == 5 for d in dirs)
  monkeypatch.setattr(seed_group, 'group_program', make)
  outcomes = seed_group.train_seed_group(configs, dirs)
  assert [o.result.step for o in outcomes] == [12, 10, 12]
  for got, want in zip(dirs, uninterrupted):
    final, expected = _final(got), _final(want)
    assert {k: v for k, v in final.items() if k != 'wall_time_s'} == {
        k: v for k, v in expected.items() if k != 'wall_time_s'}


def test_what_cannot_train_as_one_group_says_why(data_dir, tmp_path):
  base = [_config(data_dir, s) for s in (0, 1)]
  assert seed_group.refusal(base) == ''
  assert seed_group.refusal(base[:1]) == 'a single run'
  other = _config(data_dir, 1, base_lr=0.3)
  assert 'differ in more than the seed (base_lr)' in seed_group.refusal([base[0], other])
  assert 'same seed' in seed_group.refusal([base[0], _config(data_dir, 0)])
  for field, value in (('method', 'async'), ('executor', 'pmap')):
    configs = [_config(data_dir, s, **{field: value}) for s in (0, 1)]
    assert 'only the sync method on the jit executor' in seed_group.refusal(configs)
  # Checkpoints of different steps: refused before anything in the directories changes.
  for name, step in (('a', 4), ('b', 8)):
    os.makedirs(tmp_path / name / 'checkpoints' / str(step))
  with pytest.raises(seed_group.GroupRefused, match=r'different steps \(\[4, 8\]\)'):
    seed_group.train_seed_group(base, [str(tmp_path / 'a'), str(tmp_path / 'b')])
  assert sorted(os.listdir(tmp_path / 'a')) == ['checkpoints']


def test_auto_groups_only_where_a_committed_measurement_found_it_faster():
  """The committed CPU measurement found the grouped step slower at every per-device batch: auto
  never groups on CPU; an unmeasured platform is not grouped either."""
  for batch in (1, 16, 256, 4096):
    assert runner.seeds_at_once_faster(batch, 'cpu').startswith('slower on cpu')
  assert runner.seeds_at_once_faster(16, 'rocm').startswith('not measured on rocm')


def _study(data_dir, out, mode):
  """One tiny point, 2 seeds, stopping at the later of a training-split ('eval') and a test
  crossing: a seed that crosses on 'eval' first continues to its test crossing."""
  return crossing_study(data_dir, out, kind='seeds', target_value=0.3, seeds=(0, 1),
                        stop_at_target=True, seeds_at_once=mode)


@pytest.mark.slow(120)
def test_the_study_runner_with_seeds_at_once_gives_the_separate_runs_results(
    data_dir, tmp_path, capsys):
  """--seeds_at_once on against off on a study whose runs continue to their test crossing: the
  same rows (steps to the target on both splits, outcomes, final metrics to tolerance); the dry
  run and the training say which points run grouped; a rerun trains nothing."""
  rows = {}
  for mode in ('off', 'on'):
    study, base, opts = _study(data_dir, tmp_path / mode, mode)
    rows[mode] = runner.run_study(study, base, opts)
  out = capsys.readouterr().out
  assert '2 seeds at once' in out
  assert any(json.load(open(tmp_path / 'on' / 'runs' / r['name'] / 'config.json'))
             ['target_metric'] == 'test/anp_top1' for r in rows['on'])  # A continuation ran.
  for a, b in zip(rows['off'], rows['on'], strict=True):
    for key in ('name', 'outcome', 'test_outcome', 'steps_to_target', 'test_steps_to_target'):
      assert a.get(key) == b.get(key), key
  for r in rows['on']:
    _assert_same_run(tmp_path / 'on' / 'runs' / r['name'], tmp_path / 'off' / 'runs' / r['name'])
  study, base, opts = _study(data_dir, tmp_path / 'fresh', 'on')
  opts.dry_run = True
  runner.run_study(study, base, opts)
  assert "Seeds at once (--seeds_at_once=on), each point's seeds as one computation: g0002 x1" \
      in capsys.readouterr().out
  study, base, opts = _study(data_dir, tmp_path / 'on', 'on')
  runner.run_study(study, base, opts)
  assert 'finished earlier, skipped' in capsys.readouterr().out
  assert jax.device_count() == 8



def test_the_measurement_script_refuses_a_batch_the_preset_cannot_take_and_writes_atomically(
    tmp_path):
  """experiments/seeds_at_once.py: a per-device batch the preset's ghost BN group does not
  divide is exit 2 with the reason on one line, nothing written (it was a traceback). Its result
  (and study_throughput.py's) goes through `study_results.write_measurement`: the JSON and the
  README, each replaced whole. (Its measuring path, 38 CPU s at its smallest, is left to the
  script's committed runs.)"""
  from anp_jax.research import study_results
  from conftest import run_experiment
  r = run_experiment('seeds_at_once.py', '--per_device_batches', '4', '--steps', '1',
                     '--seeds', '2', '--devices', '2', '--out', str(tmp_path / 'x'))
  assert r.returncode == 2 and 'Traceback' not in r.stderr
  assert r.stderr.strip().splitlines()[-1].startswith('ERROR: Ghost BatchNorm needs')
  assert not (tmp_path / 'x').exists()
  out = tmp_path / 'm'
  paths = study_results.write_measurement(str(out), 'results.json', {'a': [1, 2]}, '# t\n')
  assert paths == [str(out / 'results.json'), str(out / 'README.md')]
  assert json.loads((out / 'results.json').read_text()) == {'a': [1, 2]}
  study_results.write_measurement(str(out), 'results.json', {'a': 3}, '# u\n')
  assert (out / 'README.md').read_text() == '# u\n' and sorted(os.listdir(out)) == [
      'README.md', 'results.json']  # No temporary file left.
