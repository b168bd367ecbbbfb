"""Model structure: output heads, shapes, parameter counts, init options, dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from anp_jax import models
from anp_jax.models import build_resnet


def _param_count(model, size):
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, size, size, 3)),
                                             train=False))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes['params']))


@pytest.mark.parametrize('name,expected', [
    ('resnet18', 11_689_512), ('resnet34', 21_797_672), ('resnet50', 25_557_032),
    ('resnet101', 44_549_160), ('resnet152', 60_192_808)])
def test_imagenet_resnet_parameter_counts_match_torchvision(name, expected):
  # torchvision's published counts for 1000 classes (v1.5 has the same parameters as v1).
  assert _param_count(build_resnet(name, num_anps=1000), 224) == expected


@pytest.mark.parametrize('name,expected', [('resnet20', 0.27e6), ('resnet32', 0.46e6),
                                           ('resnet56', 0.85e6)])
def test_cifar_resnet_parameter_counts_match_he_et_al(name, expected):
  count = _param_count(build_resnet(name, num_anps=10), 32)
  assert abs(count - expected) / expected < 0.03, count


def test_cifar_resnet20_uses_projection_shortcuts():
  # Option B (1x1 conv + BN where the shape changes), as the README and the docstring say:
  # 272,474 parameters with 10 classes = the paper's option-A count 269,722 + the projections.
  params = jax.eval_shape(lambda: build_resnet('resnet20', num_anps=10).init(
      jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False))['params']
  blocks = sorted(b for b, layers in params.items() if 'conv_proj' in layers)
  assert blocks == ['BasicBlock_3', 'BasicBlock_6']  # First blocks of stages 2 and 3.
  proj_count = sum(int(np.prod(x.shape)) for b in blocks
                   for x in jax.tree.leaves((params[b]['conv_proj'], params[b]['norm_proj'])))
  assert proj_count == (16 * 32 + 2 * 32) + (32 * 64 + 2 * 64)  # 1x1 kernels + BN scale/bias.
  total = _param_count(build_resnet('resnet20', num_anps=10), 32)
  assert total == 272_474 and total - proj_count == 269_722


def test_width_multiplier_scales_parameters_quadratically():
  base = _param_count(build_resnet('resnet20', num_anps=10), 32)
  wide = _param_count(build_resnet('resnet20', num_anps=10, width=2.0), 32)
  assert 3.7 < wide / base < 4.1


def test_heads_and_shapes():
  model = build_resnet('resnet8', num_anps=7, num_adjectives=3, num_nouns=5, width=0.5)
  x = jnp.ones((4, 16, 16, 3))
  variables = model.init(jax.random.key(0), x, train=False)
  out = model.apply(variables, x, train=False)
  assert {k: v.shape for k, v in out.items()} == {'anp': (4, 7), 'adjective': (4, 3),
                                                 'noun': (4, 5)}
  out, mutated = model.apply(variables, x, train=True, mutable=['batch_stats'])
  assert 'batch_stats' in mutated
  no_aux = build_resnet('resnet8', num_anps=7, width=0.5)
  assert set(no_aux.apply(no_aux.init(jax.random.key(0), x, train=False), x,
                          train=False)) == {'anp'}


def test_zero_init_last_bn_scale_is_an_option():
  x = jnp.ones((2, 16, 16, 3))
  for flag, expected in ((True, 0.0), (False, 1.0)):
    model = build_resnet('resnet8', num_anps=4, width=0.5, zero_init_last_bn=flag)
    params = model.init(jax.random.key(0), x, train=False)['params']
    block = params['BasicBlock_0']
    # The second BN of the block (before the residual add) is the last one.
    assert float(jnp.mean(block['BatchNorm_1']['scale'])) == expected
    assert float(jnp.mean(block['BatchNorm_0']['scale'])) == 1.0


def test_bfloat16_compute_keeps_float32_params_and_logits():
  model = build_resnet('resnet8', num_anps=4, width=0.5, dtype=jnp.bfloat16)
  x = jnp.ones((2, 16, 16, 3))
  variables = model.init(jax.random.key(0), x, train=False)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(variables['params']))
  assert model.apply(variables, x, train=False)['anp'].dtype == jnp.float32


def test_bottleneck_v15_strides_on_the_3x3_conv():
  model = build_resnet('resnet50', num_anps=10)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 64, 64, 3)),
                                             train=False))['params']
  block = params['BottleneckBlock_3']  # First block of stage 2 (downsampling).
  assert block['Conv_0']['kernel'].shape[:2] == (1, 1)
  assert block['Conv_1']['kernel'].shape[:2] == (3, 3)
  # The stride sits on Conv_1: checked through the output spatial size of a traced module.
  out = jax.eval_shape(lambda: model.apply(
      model.init(jax.random.key(0), jnp.zeros((1, 64, 64, 3)), train=False),
      jnp.zeros((1, 64, 64, 3)), train=False, capture_intermediates=True,
      mutable=['intermediates']))
  inter = out[1]['intermediates']['BottleneckBlock_3']
  assert inter['Conv_0']['__call__'][0].shape[1] == 16  # 1x1 keeps 16x16 (stride 1)
  assert inter['Conv_1']['__call__'][0].shape[1] == 8  # 3x3 halves it


def test_unknown_model_name_is_rejected():
  with pytest.raises(ValueError, match='Unknown model'):
    build_resnet('resnet51', num_anps=3)


def test_create_model_from_config():
  from anp_jax.configs import default
  c = default.get_config()
  model = models.create_model(c, models.Heads(num_anps=32, num_adjectives=8, num_nouns=8))
  assert model.num_anps == 32 and model.bn.group_size == 32


# ----------------------------------------------------------------------------------------------
# The registry: one door for every model.


def test_every_resnet_is_registered_with_its_structure_and_sizes():
  assert set(models.names()) >= {'resnet8', 'resnet18', 'resnet20', 'resnet50', 'resnet152'}
  r50, r20 = models.spec('resnet50'), models.spec('resnet20')
  assert (r50.family, r50.min_image_size, r50.image_size) == ('resnet', 32, 224)
  assert (r20.family, r20.min_image_size, r20.image_size) == ('resnet', 4, 32)
  assert r50.arch.stage_sizes == (3, 4, 6, 3) and r50.arch.block == 'bottleneck'
  assert r20.arch.stem == 'cifar'
  with pytest.raises(ValueError, match=r"Unknown model 'resnet51'; choose one of .*'resnet50'"):
    models.spec('resnet51')


def test_create_model_takes_any_meta_and_applies_the_head_switches():
  from anp_jax.configs import default

  class Meta:  # What the pipeline's DatasetMeta offers (and more).
    num_anps, num_adjectives, num_nouns, train_size = 12, 5, 6, 100

  c = default.get_config()
  c.model.name, c.model.width = 'resnet8', 0.5
  x = jnp.zeros((2, 8, 8, 3))
  for noun_head, expected in ((True, {'anp': 12, 'adjective': 5, 'noun': 6}),
                              (False, {'anp': 12, 'adjective': 5})):
    c.model.noun_head = noun_head
    model = models.create_model(c, Meta())
    logits = model.apply(model.init(jax.random.key(0), x, train=False), x, train=False)
    assert {k: v.shape[-1] for k, v in logits.items()} == expected
  only_anp = models.create_model(c, models.Heads(3))
  assert only_anp.apply(only_anp.init(jax.random.key(0), x, train=False), x,
                        train=False).keys() == {'anp'}


def test_register_refuses_duplicates_and_bad_metadata():
  factory = lambda config, args: None
  with pytest.raises(ValueError, match="'resnet50' is already registered .*replace=True"):
    models.register('resnet50', min_image_size=32)(factory)
  assert models.spec('resnet50').family == 'resnet'  # Untouched.
  with pytest.raises(ValueError, match='min_image_size=0 must be an integer >= 1'):
    models.register('toy_bad', min_image_size=0)
  with pytest.raises(ValueError, match='image_size=2 must be an integer >= min_image_size=4'):
    models.register('toy_bad', min_image_size=4, image_size=2)
  with pytest.raises(ValueError, match='not callable'):
    models.register('toy_bad', min_image_size=4)('not a function')
  assert 'toy_bad' not in models.names()
