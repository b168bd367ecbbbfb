"""Every entry point's command line (anp_jax/cli.py's parser and messages): bad input exits 2
with one line saying what to change, before any work; a run's first screen is anp_jax's own lines.

Each bad-input case fails in seconds (range checks, missing or unusable paths, unknown names, an
extra positional argument), before anything is compiled, timed, loaded or prepared: never a Python
traceback (exit 1), never an error only after minutes of work.
"""

import os
import subprocess
import sys

import pytest

from anp_jax.configs import default
from conftest import main_cmd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXP = os.path.join(ROOT, 'experiments')
TINY = os.path.join(ROOT, 'anp_jax', 'configs', 'tiny.py')
BENCH = [os.path.join(EXP, 'benchmark.py'), f'--config={TINY}', '--notorch', '--noreference']
CKPT = [os.path.join(EXP, 'checkpoint_overhead.py')]
INPUT = [os.path.join(EXP, 'input_benchmark.py'), '--skip_model']
PERFVAL = [os.path.join(EXP, 'perfmodel_validation.py')]
PRETRAINED = ['-m', 'anp_jax.pretrained']
PERFMODEL = ['-m', 'anp_jax.research.perfmodel']
PLANNER = ['-m', 'anp_jax.research.planner']
PREPARE = ['-m', 'anp_jax.data.prepare', '--manual_dir', '{tmp}/manual']

# (command, arguments, a phrase of the message). '{file}' is an existing plain file, '{tmp}' an
# existing empty folder.
CASES = [
    # experiments/benchmark.py
    (BENCH, ['--workdir={file}'], 'is a file, not a directory'),
    (BENCH, ['--noloop', '--config.model.name=resnet5O'], "config.model.name='resnet5O'"),
    (BENCH, ['--noloop', '--windows=0'], '--windows=0 is out of range'),
    (BENCH, ['--noloop', '--steps_per_window=0'], '--steps_per_window=0 is out of range'),
    (BENCH, ['--noloop', '--warmup=-1'], '--warmup=-1 is out of range'),
    (BENCH, ['--noloop', '--out={file}/b.json'], 'cannot create its folder'),
    (BENCH, ['--noloop', '--out={tmp}'], 'is a directory'),
    (BENCH, ['--noloop', 'extra'], 'Unexpected arguments'),
    # experiments/checkpoint_overhead.py
    (CKPT, ['--models=resnet5O'], 'unknown model(s) resnet5O'),
    (CKPT, ['--models=resnet8', '--repeats=0'], '--repeats=0 is out of range'),
    (CKPT, ['--models='], '--models is empty'),
    (CKPT, ['extra'], 'Unexpected arguments'),
    # experiments/input_benchmark.py
    (INPUT, ['--images', '0'], '--images=0 is out of range'),
    (INPUT, ['--batches', '0'], '--batches=0 is out of range'),
    (INPUT, ['--data_dir', '{tmp}/nonexist'], '--data_dir'),
    (INPUT, ['--out={tmp}'], 'give the path of the JSON file'),
    (INPUT, ['--out={file}/r.json'], 'cannot create its folder'),
    (INPUT, ['extra'], 'Unexpected arguments'),
    (INPUT, ['--backends=tf,dali'], '--backends=tf,dali: give one or more of tf,tf_device'),
    # experiments/perfmodel_validation.py
    (PERFVAL, ['--out={tmp}/pv', '--budget', '-1'], '--budget=-1.0 must be > 0'),
    (PERFVAL, ['--out={tmp}/pv', '--timeout', '0'], '--timeout=0.0 must be > 0'),
    (PERFVAL, ['--out={file}', '--parts', 'paper'], 'is a file, not a directory'),
    (PERFVAL, ['--out={tmp}/pv', 'extra'], 'Unexpected arguments'),
    # python -m anp_jax.research.perfmodel
    (PERFMODEL, ['--inter_bw=0'], 'inter_node_bandwidth must be positive'),
    (PERFMODEL, ['--gpus_per_node=8'], 'holds at most 4 k80 devices'),
    (PERFMODEL, ['--per-device-batch=32'], 'Did you mean: per_device_batch'),
    (PERFMODEL, ['extra'], 'Unexpected arguments'),
    # python -m anp_jax.research.planner
    (PLANNER, ['--pilot={tmp}/nonexist', '--methods=sync'], 'is not a trainer workdir'),
    (PLANNER, ['--sweep={tmp}', '--methods=sync'], 'has no results.json'),
    (PLANNER, ['--sweep={tmp}', '--out={file}'], 'is a file'),
    (PLANNER, ['extra'], 'Unexpected arguments'),
    # The old names of those two tools fail with the new one.
    ([os.path.join(EXP, 'perfmodel.py')], ['--per-device-batch=32'],
     'python -m anp_jax.research.perfmodel'),
    (['-m', 'anp_jax.plan'], ['--sweep={tmp}'], 'python -m anp_jax.research.planner'),
    # python -m anp_jax.pretrained (the source is never read: the flags alone are wrong)
    (PRETRAINED, ['--source={tmp}/r.safetensors', '--num_anps=0'], '--num_anps=0 is out of range'),
    (PRETRAINED, ['--source={tmp}/r.safetensors', '--width=0'], '--width=0.0 is out of range'),
    (PRETRAINED, ['--source={tmp}', '--to_safetensors={tmp}/x.safetensors'],
     'converts torchvision-style files'),
    (PRETRAINED, ['--source={tmp}/r.safetensors', '--to_safetensors={file}/x.safetensors'],
     'cannot create its folder'),
    (PRETRAINED, ['--num_anps=5'], '--source is required'),
    (PRETRAINED, ['{tmp}/r.safetensors'], 'Unexpected arguments'),
    (PRETRAINED, ['--to-safetensors=x'], 'Did you mean: to_safetensors'),
    # python -m anp_jax.data.prepare (the manual dir does not even exist: checked before it)
    (PREPARE, ['--data_dir', '{file}'], 'is a file, not a folder'),
    (PREPARE, ['--data_dir', '{tmp}/d', '--contact_sheet', '{file}/x.png'],
     'cannot create its folder'),
    (PREPARE, ['--data_dir', '{tmp}/d', '--contact_sheet', '{tmp}/x.png', '--contact_split',
               'bogus'], "--contact_split='bogus' is not a split"),
    (PREPARE, ['--data_dir', '{tmp}/d', '--layout', 'bogus'], "--layout='bogus' is unknown"),
    (PREPARE, ['--data_dir', '{tmp}/d', '--resize-short-side', '256'],
     'Did you mean: resize_short_side'),  # One style: underscores, as every tool.
    (PREPARE, ['--data_dir', '{tmp}/d', '--jpeg_quality', 'high'], '--jpeg_quality=high'),
    (PREPARE, ['--data_dir', '{tmp}/d', 'extra'], 'Unexpected arguments'),
    (PREPARE[:2], ['--data_dir', '{tmp}/d'], '--manual_dir is required'),
]


def _id(case):
  command, args, _ = case
  name = command[1] if command[0] == '-m' else os.path.basename(command[0])
  return f"{name}:{' '.join(a.split('/')[-1] for a in args)}"


@pytest.mark.parametrize('command,args,message', CASES, ids=[_id(c) for c in CASES])
def test_bad_input_exits_2_with_one_line(tmp_path, command, args, message):
  afile = tmp_path / 'afile'
  afile.write_text('not a folder')
  tmp = tmp_path / 'empty'
  tmp.mkdir()
  fill = lambda a: a.replace('{file}', str(afile)).replace('{tmp}', str(tmp))
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='2')
  r = subprocess.run([sys.executable, *map(fill, command), *map(fill, args)], env=env,
                     cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
  assert message in r.stderr, r.stderr[-2000:]
  assert 'Traceback' not in r.stderr, r.stderr[-2000:]
  assert len(r.stderr.strip().splitlines()) <= 2, r.stderr[-2000:]  # No help text.
  assert not list(tmp.iterdir()), 'nothing written before the error'


# ----------------------------------------------------------------------------------------------
# Config flags of python -m anp_jax.main and the experiment scripts: misspelt, mistyped,
# missing file -> exit 2 with the fix first.


def _env(**extra):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu')
  env.update(extra)
  return env


@pytest.mark.parametrize('flag, expected', [
    ('--config.batchsize=64', 'Unknown config field --config.batchsize; did you mean '
                              '--config.batch_size?'),
    ('--config.model.nmae=resnet8', 'did you mean --config.model.name?'),
    ('--config.batch_size=abc', '--config.batch_size=abc'),
    ('--config=/nonexistent/config.py', 'Config file /nonexistent/config.py'),
    # absl's other forms (the message was a garbled repr of ml_collections' error).
    ('--noconfig.batchsize', 'Unknown config field --config.batchsize; did you mean'),
    ('-config.batchsize=64', 'Unknown config field --config.batchsize; did you mean'),
    # A test evaluator: how to add one, never a move of the validation evaluator onto test.
    ('--config.evals.test.split=test', 'Add one by giving its kind first: '
                                       '--config.evals.test.kind=classification '
                                       '--config.evals.test.split=test'),
])
def test_bad_config_flags_exit_2_with_the_fix_first(tmp_path, flag, expected):
  out = subprocess.run([sys.executable, '-m', 'anp_jax.main', f'--workdir={tmp_path / "w"}',
                        flag], env=_env(), capture_output=True, text=True, timeout=120)
  assert out.returncode == 2, out.stderr[-2000:]
  assert 'Traceback' not in out.stderr
  first = out.stderr.strip().splitlines()[0]
  assert expected in first, out.stderr
  assert 'config_config' not in out.stderr
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize('key', ['evals.test.split', 'evals.test', 'evals.test.kind',
                                 'evals.heldout.split'])
def test_a_new_evaluator_is_never_hinted_onto_the_validation_evaluator(key):
  """`--config.evals.test.split=test` was answered "did you mean --config.evals.eval.split?":
  followed, it replaces validation (where every choice is made) with the test split."""
  from anp_jax import cli
  message = cli.unknown_field_message(key, cli.config_fields(default.get_config()))
  assert 'did you mean' not in message and 'evals.eval.split' not in message, message
  name = key.split('.')[1]
  assert f"c.evals.{name} = dict(kind='classification'" in message
  assert 'docs/evaluation.md' in message and "keep config.evals.eval on 'validation'" in message


@pytest.mark.parametrize('key, hint', [('evals.eval.splt', 'evals.eval.split'),
                                       ('evals.evl.split', 'evals.eval.split')])
def test_a_misspelt_existing_evaluator_still_gets_its_field(key, hint):
  from anp_jax import cli
  message = cli.unknown_field_message(key, cli.config_fields(default.get_config()))
  assert message.endswith(f'did you mean --config.{hint}?'), message


def test_sweep_override_typo_suggests_the_field(tmp_path):
  from anp_jax.research import sweep
  with pytest.raises(sweep.SweepError, match=r'did you mean --config\.model\.width\?'):
    sweep.parse_args(['--preset', 'tiny', '--out', str(tmp_path), '--config.model.widht=4'])


# ----------------------------------------------------------------------------------------------
# A run's first screen is anp_jax's own lines; --help answers without TensorFlow.

THIRD_PARTY_NOISE = ('absl::InitializeLog', 'oneDNN', 'Using custom data configuration',
                     'Downloading and preparing', 'Generating splits', '\x1b[', '\r')


OWN_LINES = ('process 0/1 on ', 'anp_jax | ', '[', 'eval @ step', 'Done in ')


@pytest.mark.slow(30)
def test_first_screen_is_anp_jax_own_lines(tmp_path):
  # The dataset is generated during the run (its lines count too); checkpoints as by default.
  saves = {k: default.get_config()[k] for k in ('checkpoint_every_steps',
                                                'checkpoint_every_minutes', 'async_checkpointing')}
  argv = main_cmd(tmp_path / 'fresh_data', tmp_path / 'run', progress_bar=True,
                  num_train_steps=4, **saves)
  env = _env()
  for key in ('TF_CPP_MIN_LOG_LEVEL', 'TF_ENABLE_ONEDNN_OPTS'):  # What a new user has.
    env.pop(key, None)
  out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  text = out.stdout + out.stderr
  assert not [s for s in THIRD_PARTY_NOISE if s in text], text[:3000]
  foreign = [l for l in text.splitlines() if l.strip() and not l.startswith(OWN_LINES)]
  assert not foreign, '\n'.join(foreign[:20])
  assert 'anp_jax | generating the synthetic_anp dataset' in out.stdout


def test_prepare_help_does_not_import_tensorflow():
  code = ('import runpy, sys\n'
          'sys.argv = ["prepare", "--help"]\n'
          'try:\n'
          '  runpy.run_module("anp_jax.data.prepare", run_name="__main__")\n'
          'except SystemExit as e:\n'
          '  assert e.code == 0, e.code\n'
          'print("tensorflow" in sys.modules)\n')
  out = subprocess.run([sys.executable, '-c', code], env=_env(), capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip().splitlines()[-1] == 'False'


@pytest.mark.parametrize('module, names', [
    ('anp_jax.research.planner', ('--batches', '--nodes', '--sync_periods', '--pilot')),
    ('anp_jax.research.perfmodel', ('--sweep_nodes', '--cluster')),
    ('anp_jax.main', ('--config', '--workdir'))])
def test_help_lists_the_flags_defined_through_cli_helpers(module, names):
  """`planner --help` hid --batches, --nodes and --sync_periods (absl credited them to
  anp_jax.cli, whose helper defined them: only --helpfull listed them)."""
  out = subprocess.run([sys.executable, '-m', module, '--help'], env=_env(), capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  listed = {line.split(':')[0].strip() for line in out.stdout.splitlines()
            if line.startswith('  --')}
  assert set(names) <= listed, (sorted(set(names) - listed), out.stdout[-3000:])
