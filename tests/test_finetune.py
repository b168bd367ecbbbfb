"""config.init_from / init_exclude / freeze / backbone_lr_multiplier (anp_jax.pretrained).

The PyTorch reference is `experiments/torch_reference.py` (torchvision's module names rebuilt in
PyTorch), because PyPI's torchvision does not import beside the pinned torch 2.13.0 CPU build.
"""

import json
import math
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import torch  # noqa: E402  (requirements-bench.txt, installed by test.sh: builds the references)
from safetensors.numpy import save_file  # noqa: E402

from anp_jax import models, optim, param_names, pretrained, trainer  # noqa: E402
from conftest import (ROOT, assert_leaves_close, leaves, run_workers, subprocess_env,  # noqa: E402
                      tiny_config)
from experiments import torch_reference as tvr  # noqa: E402


def _state_dict(net):
  return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


def _write(sd, path):
  path = str(path)
  if path.endswith('.safetensors'):
    save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, path)
  else:
    torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, path)
  return path


def _load_config(path, name, image_size, **extra):
  import ml_collections
  return ml_collections.ConfigDict(dict(
      dict(init_from=str(path), init_exclude=(), freeze='', backbone_lr_multiplier=1.0,
           image_size=image_size, model=dict(name=name, width=1.0)), **extra))


def _variables(values):
  import flax
  return flax.traverse_util.unflatten_dict({tuple(k.split('/')): v for k, v in values.items()})


# ImageNet ResNets. ResNet-50 runs at 64 px instead of the 224 px: the conversion does
# not depend on the input size (every stride-2 layer still sees an even size, the case where
# 'SAME' padding and torchvision's padding=1 differ), and 224 px ResNet-50 forwards in both
# frameworks cost ~1 min on the 2 shared CPU cores of CI. ResNet-18 runs at the full 224 px.
# Both file formats per model: the .safetensors file's values go through both frameworks; the
# .pth file must load to exactly the same values (one forward pass per model, not per format).
@pytest.mark.slow(20)
@pytest.mark.parametrize('name,size', [('resnet18', 224), ('resnet50', 64)])
def test_torchvision_weights_give_pytorchs_outputs(tmp_path, name, size):
  net = tvr.randomized(name)
  model = models.build_resnet(name, num_anps=1000)
  n_bn = sum(k.endswith('num_batches_tracked') for k in net.state_dict())
  by_ext = {}
  for ext in ('.safetensors', '.pth'):
    path = _write(_state_dict(net), tmp_path / f'{name}{ext}')
    loaded = by_ext[ext] = pretrained.load(_load_config(path, name, size), model)
    # Every parameter and BN statistic, no fc skipped (1000 classes = the ANP head here).
    assert len(loaded.values) == len(net.state_dict()) - n_bn, ext
    assert loaded.reinitialised == [] and sorted(loaded.ignored) == sorted(
        k for k in net.state_dict() if k.endswith('num_batches_tracked')), ext
    assert f'loaded {len(loaded.values)} arrays' in loaded.report, ext
  pth, st = by_ext['.pth'].values, by_ext['.safetensors'].values
  assert sorted(pth) == sorted(st)
  for key in st:
    assert np.asarray(pth[key]).dtype == np.asarray(st[key]).dtype, key
    np.testing.assert_array_equal(pth[key], st[key], err_msg=key)
  x = np.random.RandomState(0).randn(2, 3, size, size).astype(np.float32)
  with torch.no_grad():
    ref = net(torch.from_numpy(x))['anp'].numpy()
  out = jax.jit(lambda v, x: model.apply(v, x, train=False))(
      _variables(st), x.transpose(0, 2, 3, 1))['anp']
  out = np.asarray(out)
  assert np.abs(out - ref).max() < 1e-4, np.abs(out - ref).max()
  np.testing.assert_array_equal(np.argsort(-out, 1)[:, :5], np.argsort(-ref, 1)[:, :5])


def test_torchvision_layout_round_trips_and_counts():
  # Our torch reference has torchvision's published parameter counts (so its names/shapes are
  # torchvision's), and anp_jax -> torchvision names -> anp_jax is the identity.
  assert sum(p.numel() for p in tvr.torchvision_resnet('resnet50').parameters()) == 25_557_032
  assert sum(p.numel() for p in tvr.torchvision_resnet('resnet18').parameters()) == 11_689_512
  model = models.build_resnet('resnet18', num_anps=1000)
  variables = model.init(jax.random.key(1), np.zeros((1, 32, 32, 3), np.float32), train=False)
  sd = pretrained.to_torchvision('resnet18', variables)
  assert set(sd) == {k for k in tvr.torchvision_resnet('resnet18').state_dict()
                     if not k.endswith('num_batches_tracked')}


# ----------------------------------------------------------------------------------------------
# Small models in training (tiny config: ResNet-8 at width 0.5, 8 ANPs).


@pytest.fixture(scope='module')
def tiny_file(tmp_path_factory):
  """A torchvision-layout ResNet-8 (width 0.5, 1000-class fc) as .safetensors."""
  net = tvr.randomized('resnet8', num_classes=1000, width=0.5, seed=3)
  sd = _state_dict(net)
  return _write(sd, tmp_path_factory.mktemp('weights') / 'resnet8.safetensors'), sd


def _tv(name):
  return pretrained.torchvision_name('resnet8', name)


def test_heads_reinitialised_and_exclusions_kept_fresh(data_dir, tiny_file):
  path, sd = tiny_file
  config = tiny_config(data_dir, init_from=path, init_exclude=('BasicBlock_0/Conv_0/.*',))
  run = trainer.build(config)
  loaded_state = run.init_state()
  fresh_state = run.executor.init()
  report = run.init.report
  assert 're-initialised head_anp (8 vs 1000 classes), head_adjective, head_noun' in report
  assert 'kept fresh by init_exclude 1 arrays (BasicBlock_0/Conv_0)' in report
  assert 'fc.weight' in report and '9 x num_batches_tracked' in report
  for collection in ('params', 'batch_stats'):
    got = param_names.flatten(jax.device_get(getattr(loaded_state, collection)))
    fresh = param_names.flatten(jax.device_get(getattr(fresh_state, collection)))
    for name, value in got.items():
      if name.startswith('head_') or name.startswith('BasicBlock_0/Conv_0/'):
        np.testing.assert_array_equal(value, fresh[name])
      else:
        expected = pretrained.from_torch_layout(sd[_tv(f'{collection}/{name}')])
        np.testing.assert_array_equal(value, expected)
        assert not np.array_equal(value, fresh[name]) or value.size == 1


FROZEN = r'(conv_init|bn_init|BasicBlock_0)/.*'


@pytest.mark.parametrize('variant', [
    dict(),
    dict(**{'model.dtype': 'bfloat16'}),
    dict(executor='pmap'),
    dict(method='async', **{'async_sgd.tau': 1, 'async_sgd.max_tau': 2}),
    dict(method='local_sgd', **{'local_sgd.nodes': 2, 'local_sgd.sync_every': 2}),
], ids=['jit', 'bfloat16', 'pmap', 'async', 'local_sgd'])
def test_freeze_keeps_loaded_leaves_and_their_bn_statistics(data_dir, tmp_path, tiny_file,
                                                            variant):
  path, sd = tiny_file
  config = tiny_config(data_dir, init_from=path, freeze=FROZEN, num_train_steps=3,
                       bn_mode='per_device' if variant.get('executor') == 'pmap' else 'ghost',
                       **variant)
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert np.isfinite(result.final_eval['eval/loss'])
  moved = 0
  for collection in ('params', 'batch_stats'):
    final = param_names.flatten(jax.device_get(getattr(result.state, collection)))
    for name, value in final.items():
      value = np.asarray(value)  # Local SGD: the node average (equal replicas when frozen).
      if name.startswith('head_'):
        continue
      loaded = pretrained.from_torch_layout(sd[_tv(f'{collection}/{name}')])
      frozen = param_names.matches([re.compile(FROZEN)],
                                  name.rsplit('/', 1)[0] + '/scale' if collection == 'batch_stats'
                                  else name)
      if frozen:
        np.testing.assert_array_equal(value, loaded, err_msg=name)
      else:
        moved += not np.array_equal(value, loaded)
  assert moved >= 10  # The other stages' parameters and statistics train.


@pytest.mark.slow(20)
def test_local_sgd_over_three_nodes_keeps_frozen_leaves_bit_exact(data_dir, tmp_path, tiny_file):
  # Averaging 3 equal float32 copies as (x + x + x) / 3 moves x by an ulp (8 devices allow only
  # 2, 4 or 8 nodes, where it is exact): a process with 3 devices, 3 nodes, averaged every step.
  path, sd = tiny_file
  config = tiny_config(data_dir, init_from=path, freeze=FROZEN, num_train_steps=3,
                       batch_size=24, eval_batch_size=24, bn_group_size=4, method='local_sgd',
                       **{'local_sgd.nodes': 3, 'local_sgd.sync_every': 1})
  out = tmp_path / 'out.json'
  subprocess.run([sys.executable, os.path.join(ROOT, 'tests', 'mp_worker.py')], check=True,
                 timeout=600, env=subprocess_env(3, MP_CONFIG=config.to_json(),
                                                 MP_WORKDIR=tmp_path / 'work', MP_OUT=out))
  with np.load(f'{out}.npz') as z:
    final = [z[f'arr_{j}'] for j in range(len(z.files))]
  checked = moved = 0
  shapes = trainer.build(tiny_config(data_dir)).init_state()  # For the leaves' names.
  flat = [(c, n) for c in ('params', 'batch_stats')
          for n in param_names.flatten(getattr(shapes, c))]
  assert len(flat) == len(final)
  for (collection, name), value in zip(flat, final, strict=True):
    if name.startswith('head_'):
      continue
    loaded = pretrained.from_torch_layout(sd[_tv(f'{collection}/{name}')])
    probe = name.rsplit('/', 1)[0] + '/scale' if collection == 'batch_stats' else name
    if param_names.matches([re.compile(FROZEN)], probe):
      np.testing.assert_array_equal(value, loaded, err_msg=name)
      checked += 1
    else:
      moved += not np.array_equal(value, loaded)
  assert checked >= 9 and moved >= 10


def _one_step(config):
  run = trainer.build(config)
  state = run.init_state()
  before = param_names.flatten(jax.device_get(run.fetch(state.params)))
  state, _ = run.train_step(state, next(run.train_batches()))
  after = param_names.flatten(jax.device_get(run.fetch(state.params)))
  return {k: after[k] - before[k] for k in before}


@pytest.mark.parametrize('grad_clip_norm', [0.0, 1e-3])
def test_backbone_lr_multiplier_scales_the_update_of_loaded_parameters(data_dir, tiny_file,
                                                                       grad_clip_norm):
  # With clipping (1e-3: always active) both runs clip by the same global norm, so the heads'
  # update is still the multiplier-1 one and the backbone's exactly 0.1 of it.
  path, _ = tiny_file
  common = dict(init_from=path, optimizer='sgd', momentum=0.0, weight_decay=0.0,
                schedule='constant', noise_scale=False, grad_clip_norm=grad_clip_norm)
  full = _one_step(tiny_config(data_dir, **common))
  scaled = _one_step(tiny_config(data_dir, backbone_lr_multiplier=0.1, **common))
  for name in full:
    if name.startswith('head_'):  # Re-initialised: the full rate.
      np.testing.assert_allclose(scaled[name], full[name], rtol=1e-5, atol=1e-8)
    elif np.abs(full[name]).max() > 1e-6:
      ratio = np.sum(scaled[name] * full[name]) / np.sum(full[name] * full[name])
      assert abs(ratio - 0.1) < 1e-3, (name, ratio)


def test_partitioned_optimizer_clips_by_one_global_norm_without_frozen_gradients():
  import ml_collections
  config = ml_collections.ConfigDict(dict(
      optimizer='sgd', momentum=0.0, weight_decay=0.0, grad_clip_norm=1.0,
      freeze='conv_init/.*', backbone_lr_multiplier=0.1))
  params = {'conv_init': {'kernel': np.ones((2, 2))}, 'BasicBlock_0': {'kernel': np.ones((2, 2))},
            'head_anp': {'kernel': np.ones((2, 2))}}
  grads = {'conv_init': {'kernel': np.full((2, 2), 100.0)},   # Frozen: outside the norm.
           'BasicBlock_0': {'kernel': np.full((2, 2), 3.0)},  # Loaded: norm 6.
           'head_anp': {'kernel': np.full((2, 2), 2.0)}}      # Fresh: norm 4.
  loaded = pretrained.LoadedWeights(
      source='x', kind='anp_jax', values={'params/BasicBlock_0/kernel': np.ones((2, 2))},
      reinitialised=['head_anp/kernel'], excluded=[], ignored=[], report='')
  tx = optim.create_optimizer(config, lambda step: 1.0, loaded.loaded_params)
  updates, _ = tx.update(grads, tx.init(params), params)
  norm = np.sqrt(6.0 ** 2 + 4.0 ** 2)
  np.testing.assert_allclose(updates['conv_init']['kernel'], 0.0)
  np.testing.assert_allclose(updates['BasicBlock_0']['kernel'], -0.1 * 3.0 / norm, rtol=1e-6)
  np.testing.assert_allclose(updates['head_anp']['kernel'], -2.0 / norm, rtol=1e-6)


def test_checkpoint_in_workdir_wins_over_init_from(data_dir, tmp_path, tiny_file, capsys):
  path, sd = tiny_file
  other = _write(_state_dict(tvr.randomized('resnet8', 1000, 0.5, seed=9)),
                 tmp_path / 'copy.safetensors')
  make = lambda source: tiny_config(data_dir, init_from=source, num_train_steps=2,
                                    checkpoint_every_steps=2)
  first = trainer.train_and_evaluate(make(other), str(tmp_path / 'work'))
  assert 'anp_jax | init_from' in capsys.readouterr().out
  _write(sd, other)  # The file changes under the same name: a resume must not read its values.
  again = trainer.train_and_evaluate(make(other), str(tmp_path / 'work'))
  out = capsys.readouterr().out
  assert 'Resumed from checkpoint at step 2' in out and 'anp_jax | init_from' not in out
  for x, y in zip(leaves(first.state.params), leaves(again.state.params), strict=True):
    np.testing.assert_array_equal(x, y)
  with pytest.raises(ValueError, match='init_from'):  # Part of the checkpoint identity.
    trainer.train_and_evaluate(make(path), str(tmp_path / 'work'))


def test_init_from_an_anp_jax_run(data_dir, tmp_path):
  pre = trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=2,
                                             checkpoint_every_steps=2), str(tmp_path / 'pre'))
  config = tiny_config(data_dir, init_from=str(tmp_path / 'pre'), init_exclude=('head_.*',))
  run = trainer.build(config)
  state = jax.device_get(run.init_state())
  for collection in ('params', 'batch_stats'):
    got = param_names.flatten(getattr(state, collection))
    want = param_names.flatten(jax.device_get(getattr(pre.state, collection)))
    for name in got:
      if not name.startswith('head_'):
        np.testing.assert_array_equal(got[name], want[name])
      else:
        assert not np.array_equal(got[name], want[name])
  assert 'loaded' in run.init.report and 'kept fresh by init_exclude 6 arrays' in run.init.report


# ----------------------------------------------------------------------------------------------
# Bad input: clear errors from build(), which reads and checks the file and compiles nothing.


def test_bad_inputs_are_clear_errors_before_compiling(data_dir, tmp_path, tiny_file):
  path, sd = tiny_file
  cases = []
  cases.append((str(tmp_path / 'missing.safetensors'), 'does not exist'))
  np.savez(tmp_path / 'w.npz', a=np.zeros(1))
  cases.append((str(tmp_path / 'w.npz'), 'unknown format'))
  (tmp_path / 'bad.safetensors').write_bytes(b'not a safetensors file')
  cases.append((str(tmp_path / 'bad.safetensors'), 'not a readable .safetensors'))
  (tmp_path / 'bad.pth').write_bytes(b'garbage')
  cases.append((str(tmp_path / 'bad.pth'), 'not a readable PyTorch state dict'))
  nan = dict(sd)
  nan['layer2.0.conv1.weight'] = nan['layer2.0.conv1.weight'].copy()
  nan['layer2.0.conv1.weight'][0, 0, 0, 0] = np.nan
  cases.append((_write(nan, tmp_path / 'nan.safetensors'),
                r'non-finite values \(NaN/Inf\) in 1 array\(s\): params/BasicBlock_1/Conv_0'))
  (tmp_path / 'empty_dir').mkdir()
  cases.append((str(tmp_path / 'empty_dir'), 'without anp_jax checkpoints'))
  # ResNet-20 weights into the ResNet-8 model: the first extra names are listed.
  r20 = _write(_state_dict(tvr.randomized('resnet20', 1000, 0.5)), tmp_path / 'r20.safetensors')
  cases.append((r20, r"does not fit config.model.name='resnet8'.*not in the model: "
                     r"layer1.1.bn1.bias; .*looks like resnet20"))
  for source, message in cases:
    with pytest.raises(pretrained.InitFromError, match=message):
      trainer.build(tiny_config(data_dir, init_from=source))
  with pytest.raises(ValueError, match='backbone_lr_multiplier'):
    trainer.build(tiny_config(data_dir, backbone_lr_multiplier=0.1))
  with pytest.raises(ValueError, match='config.freeze'):
    trainer.build(tiny_config(data_dir, freeze='(unclosed'))
  # Patterns that match nothing would train everything / load everything without a word:
  # a module name without '/.*', torchvision names.
  for freeze in ('conv_init|bn_init', r'layer1\..*'):
    with pytest.raises(pretrained.InitFromError,
                       match=r"config.freeze=.* matches no parameter.*'conv_init/kernel'"):
      trainer.build(tiny_config(data_dir, freeze=freeze))
  with pytest.raises(pretrained.InitFromError,
                     match=r"init_exclude pattern 'fc\\..\*' matches no name of the model"):
    trainer.build(tiny_config(data_dir, init_from=path, init_exclude=('head_.*', r'fc\..*')))
  frozen = trainer.build(tiny_config(data_dir, freeze=FROZEN)).frozen  # The start-up line.
  assert re.fullmatch(r"freeze '.*': 9 of \d+ parameter arrays \([\d,]+ of [\d,]+ parameters\) "
                      r'get no update; 3 BatchNorm layers normalise with their running '
                      r'statistics, in training too, and keep them', frozen), frozen


def test_resnet18_weights_into_resnet50_name_the_first_mismatches(tmp_path):
  path = _write(_state_dict(tvr.torchvision_resnet('resnet18')), tmp_path / 'r18.safetensors')
  model = models.build_resnet('resnet50', num_anps=553)
  with pytest.raises(pretrained.InitFromError) as e:
    pretrained.load(_load_config(path, 'resnet50', 64), model)
  message = str(e.value)
  assert ('shape mismatches: layer1.0.conv1.weight: file (64, 64, 3, 3) -> (3, 3, 64, 64) vs '
          'model BottleneckBlock_0/Conv_0/kernel (1, 1, 64, 64)') in message
  assert 'missing from the file: layer1.0.bn3.bias (model BottleneckBlock_0/BatchNorm_2/bias' in (
      message)
  assert 'layer1.0.conv3.weight (model BottleneckBlock_0/Conv_2/kernel (1, 1, 64, 256))' in message
  assert 'looks like resnet18' in message


def test_safetensors_needs_no_pytorch_and_pth_names_the_pip_command(tiny_file, tmp_path):
  path, sd = tiny_file
  pth = _write(sd, tmp_path / 'w.pth')
  code = f"""
import sys
sys.modules['torch'] = None  # `import torch` raises ImportError from here on.
import ml_collections
from anp_jax import models, pretrained
config = ml_collections.ConfigDict(dict(init_from={path!r}, init_exclude=(), freeze='',
    backbone_lr_multiplier=1.0, image_size=16, model=dict(name='resnet8', width=0.5)))
model = models.build_resnet('resnet8', num_anps=1000, width=0.5)
print(pretrained.load(config, model).report)
config.init_from = {pth!r}
try:
  pretrained.load(config, model)
except pretrained.InitFromError as e:
  print('ERROR', e)
"""
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'init_from' in out.stdout and 'loaded 47 arrays' in out.stdout
  assert 'ERROR' in out.stdout and 'pip install torch' in out.stdout


def test_main_exits_2_on_a_missing_file(data_dir, tmp_path):
  cmd = [sys.executable, '-m', 'anp_jax.main', f'--workdir={tmp_path / "w"}',
         f'--config.data_dir={data_dir}', f'--config.init_from={tmp_path / "nope.pth"}']
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
  assert out.returncode == 2 and 'does not exist' in out.stderr, out.stderr[-2000:]


# ----------------------------------------------------------------------------------------------
# Multi-process: every process reads the same file.


@pytest.mark.slow(105)
def test_two_processes_loading_the_same_file_equal_one(data_dir, tmp_path, tiny_file):
  path, _ = tiny_file
  config = tiny_config(data_dir, num_train_steps=3, log_every_steps=1, bn_mode='global',
                       eval_every_epochs=0, init_from=path, freeze='conv_init/.*',
                       backbone_lr_multiplier=0.5)
  single = trainer.train_and_evaluate(config, str(tmp_path / 'one'))
  outs = run_workers(config, 2, tmp_path, workdir=tmp_path / 'two')
  losses = [h['train/loss'] for h in single.records if 'train/loss' in h]
  for o in outs:  # Gloo sums in another order than XLA in-process: float rounding only.
    np.testing.assert_allclose(o['losses'], losses, rtol=1e-5)
    assert_leaves_close(o['leaves'], leaves((single.state.params, single.state.batch_stats)),
                        rtol=2e-4, atol=2e-6)


# ----------------------------------------------------------------------------------------------
# The experiment's library (anp_jax.transfer): steps-to-target and the report.


def test_transfer_steps_to_target_and_the_report_over_seeds(tmp_path):
  from anp_jax import transfer
  from anp_jax.research import study_finetune
  curve = [(0, 0.1), (10, 0.3), (20, 0.5), (30, 0.45)]
  assert transfer.steps_to_target(curve, 0.3) == 10
  assert transfer.steps_to_target(curve, 0.5) == 20
  assert transfer.steps_to_target(curve, 0.51) is None

  def seed(s, ft, sc):
    """One seed's summary: final test top-1 `ft` fine-tuned, `sc` from scratch."""
    run = lambda final, test_curve: {'curve': test_curve, 'test_curve': test_curve,
                                     'final': {'eval/anp_top1': final, 'test/anp_top1': final},
                                     'wall_s': 60.0, 'init_report': 'loaded 3 arrays'}
    runs = {'pretrain': run(0.6, [(5, 0.6)]),
            'finetune': run(ft, [(10, ft / 2), (20, ft)]),
            'scratch': run(sc, [(10, sc / 4), (20, sc)])}
    return {'runs': runs, 'seed': s, 'preset': dict(transfer.PRESETS['tiny'], finetune_steps=20),
            **transfer.summarize(runs)}
  per_seed = [seed(0, 0.5, 0.3), seed(1, 0.6, 0.3), seed(2, 0.4, 0.3)]
  agg = study_finetune.aggregate(per_seed)
  ft = agg['final_test_top1']['finetune']
  assert (ft['mean'], ft['n'], ft['kind']) == (pytest.approx(0.5), 3, 'complete')
  half = 4.302653 * 0.1 / math.sqrt(3)  # t(0.975, 2) x sd 0.1 / sqrt(3).
  assert (ft['low'], ft['high']) == pytest.approx((0.5 - half, 0.5 + half), rel=1e-6)
  assert agg['paired_difference']['mean'] == pytest.approx(0.2)
  by_fraction = {r['fraction']: r for r in agg['steps_to_target']}
  # Target 1.0 x 30 % (the scratch mean): fine-tuned reach it at 20 steps (10 for seed 1, at
  # 30 % after 10 steps), scratch at 20.
  assert by_fraction[1.0]['finetune_per_seed'] == [20, 10, 20]
  assert by_fraction[1.0]['scratch']['mean'] == 20 and by_fraction[0.5]['scratch']['mean'] == 20
  missed = study_finetune.aggregate([seed(0, 0.1, 0.3), seed(1, 0.6, 0.3)])
  row = {r['fraction']: r for r in missed['steps_to_target']}[1.0]
  assert row['finetune']['kind'] == 'censored' and row['finetune']['reached'] == 1
  paths = study_finetune.write_report(per_seed, str(tmp_path), command='python x.py')
  assert all(os.path.getsize(p) > 0 for p in paths)
  md = open(paths[1]).read()
  assert 'Seeds [0, 1, 2]' in md and 'loaded 3 arrays' in md and 'Student-t' in md
  assert f'| task B fine-tuned | 50.0 [{100 * (0.5 - half):.1f}, {100 * (0.5 + half):.1f}] |' in md
  assert '| 1.0 | 30.0 % | 17 [' in md  # Mean of 20, 10, 20 steps.


@pytest.mark.slow(60)
def test_transfer_rerun_and_resume_give_the_curves_of_one_invocation(tmp_path, monkeypatch,
                                                                     capsys):
  # A rerun on a finished workdir trains nothing (train_and_evaluate re-evaluates only), and a
  # resumed run trains only the steps after its checkpoint: the curves must come from each run's
  # whole log, so both give the summary of one uninterrupted invocation. (Before: every curve
  # of the rerun was empty and summarize failed on max(); a resumed run's curve lost its start.)
  # Checkpoints every 2 steps (the evaluation interval), so that a run can be cut at step 2;
  # BatchNorm groups of 4 for the 8 devices of the tests (the preset's batch is for one device).
  import shutil
  from anp_jax import metrics_io, transfer
  make = transfer.task_config
  monkeypatch.setattr(transfer, 'task_config', lambda *a, **k: make(
      *a, **k, checkpoint_every_steps=2, bn_group_size=4))
  work = tmp_path / 'work'
  first = transfer.run(str(work), 'tiny')
  assert [s for s, _ in first['runs']['pretrain']['curve']] == [2, 4, 6]
  assert [s for s, _ in first['runs']['finetune']['curve']] == [2, 4]
  assert [s for s, _ in first['runs']['scratch']['curve']] == [2, 4]
  assert first['runs']['scratch']['final'][transfer.METRIC] == (
      first['runs']['scratch']['curve'][-1][1])
  second = transfer.run(str(work), 'tiny')
  assert second == first  # wall_s included: the training time the runs recorded.
  # The scratch run cut after its checkpoint at step 2 (its later log lines stay, as after a
  # kill), then resumed by a third invocation.
  scratch = work / 'runs' / 'scratch'
  shutil.rmtree(scratch / 'checkpoints' / '4')
  os.remove(scratch / 'final_metrics.json')
  capsys.readouterr()
  third = transfer.run(str(work), 'tiny')
  assert f'Resumed from checkpoint at step 2 in {scratch}' in capsys.readouterr().out
  assert len(metrics_io.read_metrics(str(scratch), 'eval')) == 2
  for name in ('pretrain', 'finetune', 'scratch'):
    assert third['runs'][name]['curve'] == first['runs'][name]['curve'], name
    assert third['runs'][name]['final'] == first['runs'][name]['final'], name
  for key in ('best_scratch', 'best_finetune', 'steps_to_target'):
    assert third[key] == first[key], key


@pytest.mark.slow(30)
def test_finetune_cli_with_seeds_end_to_end_and_rerun(tmp_path):
  """--seeds 0,1: each seed's three runs (the fine-tuning from the same seed's pre-training),
  statistics over both on the test split; a rerun trains nothing and reports the same."""
  out = tmp_path / 'out'
  r = _finetune_cli('--out', str(out), '--seeds', '0,1')
  assert r.returncode == 0, r.stderr[-3000:]
  runs = sorted(os.listdir(out / 'runs'))
  assert runs == ['finetune', 'finetune-s1', 'pretrain', 'pretrain-s1', 'scratch',
                  'scratch-s1'], runs
  for name in runs:
    config = json.load(open(out / 'runs' / name / 'config.json'))
    assert config['seed'] == (1 if name.endswith('-s1') else 0)
    assert config['evals']['test']['split'] == 'test'
  assert json.load(open(out / 'runs' / 'finetune-s1' / 'config.json'))['init_from'] == str(
      out / 'runs' / 'pretrain-s1')
  results = json.load(open(out / 'results.json'))
  assert [s['seed'] for s in results['seeds']] == [0, 1]
  finals = [s['runs']['finetune']['final']['test/anp_top1'] for s in results['seeds']]
  assert results['statistics']['final_test_top1']['finetune']['mean'] == pytest.approx(
      sum(finals) / 2)
  md = (out / 'summary.md').read_text()
  assert 'Seeds [0, 1]' in md and 'test split' in md
  r = _finetune_cli('--out', str(out), '--seeds', '0,1')
  assert r.returncode == 0 and 'already finished' in r.stdout, r.stderr[-2000:]
  assert json.load(open(out / 'results.json'))['statistics'] == results['statistics']
  r = _finetune_cli('--out', str(out), '--seeds', '0,0')
  assert r.returncode == 2 and '--seeds must be distinct' in r.stderr


def _finetune_cli(*args, cwd=ROOT):
  # One CPU device, as the preset is sized for; compiled as the suite compiles (conftest's
  # TEST_XLA_FLAGS: XLA's defaults made this file's end-to-end test ~1.5x as long).
  env = subprocess_env(devices=1)
  return subprocess.run([sys.executable, os.path.join(ROOT, 'experiments', 'finetune.py'),
                         '--preset', 'tiny', *args], capture_output=True, text=True, cwd=cwd,
                        env=env, timeout=300)


@pytest.mark.parametrize('args, phrase', [
    (('--freeze', 'conv_init'), 'matches no parameter'),
    (('--freeze', '('), '--freeze'),
    (('--backbone_lr_multiplier=-1',), 'backbone_lr_multiplier'),
    (('--backbone_lr_multiplier=nan',), 'backbone_lr_multiplier'),
])
def test_finetune_cli_refuses_bad_fine_tuning_flags_before_pretraining(tmp_path, args, phrase):
  out = tmp_path / 'out'
  r = _finetune_cli('--out', str(out), *args)
  assert r.returncode == 2, r.stderr[-2000:]
  assert phrase in r.stderr and 'Traceback' not in r.stderr, r.stderr[-2000:]
  assert not (out / 'runs').exists()  # Nothing trained.


def test_finetune_cli_refuses_a_file_as_out(tmp_path):
  target = tmp_path / 'afile'
  target.write_text('x')
  r = _finetune_cli('--out', str(target))
  assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr[-2000:]
  assert 'is a file' in r.stderr


def test_finetune_cli_refuses_another_variant_in_the_same_out_before_pretraining(tmp_path):
  # A finished fine-tuning run of the default flags (its config and a checkpoint directory).
  from anp_jax import transfer
  work = tmp_path / 'out'
  runs = work / 'runs'
  p = transfer.PRESETS['tiny']
  config = transfer.task_config('tiny', 'b', p['finetune_steps'], str(work / 'tfds'),
                                init_from=str(runs / 'pretrain'), init_exclude=('head_.*',))
  (runs / 'finetune' / 'checkpoints' / '4').mkdir(parents=True)
  (runs / 'finetune' / 'config.json').write_text(config.to_json())
  r = _finetune_cli('--out', str(work), '--backbone_lr_multiplier', '0.5')
  assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr[-2000:]
  assert 'backbone_lr_multiplier' in r.stderr and '--out' in r.stderr, r.stderr[-2000:]
  assert not (runs / 'pretrain').exists()


def test_pretrained_cli_checks_a_pth_file_and_writes_its_safetensors_copy(tmp_path, tiny_file):
  """`python -m anp_jax.pretrained --source=... --to_safetensors=...`: the start-up report of a
  .pth file, and a .safetensors copy holding the same arrays."""
  from safetensors.numpy import load_file
  _, sd = tiny_file
  pth = _write(sd, str(tmp_path / 'resnet8.pth'))
  out = tmp_path / 'copy.safetensors'
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='2')
  r = subprocess.run([sys.executable, '-m', 'anp_jax.pretrained', f'--source={pth}',
                      '--model=resnet8', '--width=0.5', '--num_anps=10', '--image_size=16',
                      f'--to_safetensors={out}'], env=env, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert 'loaded' in r.stdout and f'wrote {out}' in r.stdout
  copy = load_file(str(out))
  assert sorted(copy) == sorted(sd)
  for name, value in sd.items():
    np.testing.assert_array_equal(copy[name], np.asarray(value))


def test_finetune_dry_run_lists_the_runs_and_writes_nothing(tmp_path):
  """The README says every study has --dry_run; finetune.py had none."""
  out = tmp_path / 'out'
  r = _finetune_cli('--out', str(out), '--seeds', '0,1', '--dry_run')
  assert r.returncode == 0, r.stderr[-2000:]
  assert 'finetune --preset tiny: 6 runs (6 to train)' in r.stdout, r.stdout
  assert '  finetune-s1: task B' in r.stdout and 'from pretrain-s1' in r.stdout
  assert not out.exists()  # Nothing trained or written.


def test_finetune_estimate_and_docstring_agree_with_the_committed_cost():
  """finetune.py's docstring said "~15 min" for the run that took 5.1 min of training: it quotes
  the dry run's estimate, which is fitted to the committed results."""
  from anp_jax import transfer
  committed = json.load(open(os.path.join(ROOT, 'experiments', 'results', 'finetune_cpu',
                                          'results.json')))
  measured = sum(r['wall_s'] for s in committed['seeds'] for r in s['runs'].values())
  plan = transfer.plan('/nonexistent/ft', 'cpu', seeds=(0, 1, 2))
  assert len(plan['runs']) == 9 and abs(plan['seconds'] / measured - 1) < 0.15
  doc = open(os.path.join(ROOT, 'experiments', 'finetune.py')).read()
  assert f'CPU: 9 runs, ~{plan["seconds"] / 60:.0f} min' in doc
