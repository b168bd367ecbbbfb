"""Config checks and the fixes of issue 13 items 3, 6 and 11: every enumerated field is validated
in one place (unknown values fail before compile, naming the field and the allowed values), the
'inception' crop works on any image encoding, float16 is refused, and the staleness-aware
learning rate scales the *update* so that it acts on every optimizer."""

import functools
import math
import numbers
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from anp_jax import models, optim, setup, steps, trainer
from anp_jax.configs import default
from anp_jax.data import pipeline
from conftest import ROOT, leaves, main_cmd, subprocess_env, tiny_config


def _set(config, field, value):
  node = config
  *parents, last = field.split('.')
  for p in parents:
    node = node[p]
  node[last] = value


# ----------------------------------------------------------------------------------------------
# Item 3: every enumerated field is checked, with the allowed values in the message.


def test_the_table_covers_every_enumerated_field():
  # The fields whose values select code paths; the table must name each (a new enumerated
  # field added to the config without a check shows up here).
  assert set(setup.CHOICES) >= {
      'dataset', 'augment', 'model.name', 'model.dtype', 'model.conv_impl', 'bn_mode',
      'optimizer', 'lr_scaling', 'schedule', 'executor', 'method', 'async_sgd.staleness',
      'async_sgd.momentum'}
  config = tiny_config('/nonexistent')
  for field, allowed in setup.CHOICES.items():
    node = config
    for part in field.split('.'):
      node = node[part]
    assert node in allowed, (field, node, allowed)  # The defaults are valid.


@pytest.mark.parametrize('field', sorted(setup.CHOICES))
def test_unknown_enumerated_value_names_field_and_choices(field):
  config = tiny_config('/nonexistent')
  _set(config, field, 'bogus')
  with pytest.raises(ValueError) as err:
    setup.validate_config(config)
  message = str(err.value)
  assert f'config.{field}=' in message and "'bogus'" in message
  for value in setup.CHOICES[field]:
    assert repr(value) in message, (field, value, message)


@pytest.mark.parametrize('field,value,message', [
    ('grad_clip_norm', -1.0, r'grad_clip_norm=-1.0 is out of range: use a number >= 0'),
    ('weight_decay', -1e-4, 'weight_decay'),
    ('momentum', 1.0, r'momentum=1.0 is out of range: use a number in \[0, 1\)'),
    ('label_smoothing', 1.0, 'label_smoothing'),
    ('bn_momentum', 1.5, 'bn_momentum'),
    ('step_factor', 0.0, 'step_factor'),
    ('crop_fraction', 0.0, 'crop_fraction'),
    ('crop_fraction', 1.2, 'crop_fraction'),
    ('log_every_steps', 0, 'log_every_steps'),
    ('keep_checkpoints', 0, r'keep_checkpoints=0 .* could not resume'),
    ('bn_group_size', 0, r'bn_group_size=0 is out of range: use an integer >= 1'),
    ('crop_padding', 16, r'crop_padding=16 must be in \[0, image_size\) = \[0, 16\)'),
    ('crop_padding', -1, 'crop_padding'),
    ('keep_best_metric', 'eval/top1', r"keep_best_metric: 'eval/top1' is not a metric of "
                                      r"config.evals; they are \['eval/adjective_loss'"),
    ('keep_best_metric', 'test/loss', r"keep_best_metric: 'test/loss' is not a metric of "
                                      r"config.evals; they are \['eval/...'\]"),
    ('momentum', True, 'momentum'),
    ('base_lr', float('nan'), r'config.base_lr=nan is not a finite number'),  # Trained to exit 3.
    ('warmup_epochs', float('inf'), r'config.warmup_epochs=inf is not a finite number'),
    ('num_train_steps', 0, r'num_train_steps=0; use -1 to train config.num_epochs'),
    # The head is off: the metrics listed are those of the model's heads.
    ('model.adjective_head', False, r"keep_best_metric: 'eval/adjective_top1' is not a metric "
                                    r"of config.evals; they are \['eval/anp_loss', "
                                    r"'eval/anp_top1', 'eval/anp_top5', 'eval/loss', "
                                    r"'eval/noun_loss'"),
])
def test_out_of_range_numbers_fail_before_anything_runs(field, value, message):
  # Before: a negative clip norm trained uphill, keep_checkpoints=0 deleted every checkpoint,
  # log_every_steps=0 / bn_group_size=0 / bad crops failed with a traceback
  # after the workdir was written, a mistyped keep_best_metric kept nothing, silently.
  config = tiny_config('/nonexistent', augment='cifar')
  if field == 'model.adjective_head':
    config.keep_best_metric = 'eval/adjective_top1'
  _set(config, field, value)
  with pytest.raises(setup.ConfigError, match=message):
    setup.validate_config(config)


# ----------------------------------------------------------------------------------------------
# Issue 42, item 6: one table of the numeric fields' ranges (setup.RANGES), every field in it.


def _is_number(value) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _numeric_fields(config):
  """{dotted field: value} of every number (booleans are switches, not numbers) and every
  non-empty sequence of numbers of `config`."""
  flat = setup.flat_fields(config.to_dict())
  return {k: v for k, v in flat.items() if _is_number(v) or (
      isinstance(v, (tuple, list)) and v and all(_is_number(x) for x in v))}


def test_every_numeric_field_has_a_declared_range_or_a_reason():
  """A numeric field added to the default config without a range fails here."""
  fields = _numeric_fields(default.get_config())
  assert len(fields) > 40
  undeclared = set(fields) - set(setup.RANGES) - set(setup.UNCONSTRAINED)
  assert not undeclared, f'numeric fields without a range or a reason: {sorted(undeclared)}'
  assert not set(setup.RANGES) & set(setup.UNCONSTRAINED)
  assert all(isinstance(why, str) and why.strip() for why in setup.UNCONSTRAINED.values())
  stale = (set(setup.RANGES) | set(setup.UNCONSTRAINED)) - set(fields)
  assert not stale, f'entries that name no numeric field of the config: {sorted(stale)}'
  setup.check_ranges(default.get_config())  # The defaults are in range.


def _bad_values(field):
  """Values outside `field`'s declared range: past each bound, a non-integer for an integer
  field, NaN and +-inf for a float field, a boolean for any."""
  r = setup.range_of(field)
  bad = [True]
  if r.low is not None:
    bad.append(r.low if r.low_open else r.low - 1)
  if r.high is not None:
    bad.append(r.high if r.high_open else r.high + 1)
  if r.integer:
    bad.append((r.low if r.low is not None else 0) + 1.5)
  bad += [float('nan'), float('inf'), float('-inf')]
  return bad


def _with(field, value, **overrides):
  """The tiny config with `field` = `value` of any type: a config file that builds its own
  ConfigDict (or a caller's dict) is not held to the default's types as ``--config.x=y`` is."""
  tree = tiny_config('/nonexistent', **overrides).to_dict()
  node = tree
  *parents, last = field.split('.')
  for p in parents:
    node = node[p]
  node[last] = value
  return ml_collections.ConfigDict(tree)


@pytest.mark.parametrize('field', sorted(setup.RANGES))
def test_a_value_out_of_its_declared_range_is_refused_naming_the_field(field):
  default_value = tiny_config('/nonexistent').to_dict()
  for part in field.split('.'):
    default_value = default_value[part]
  for value in _bad_values(field):
    if setup.range_of(field).each:  # A sequence: one bad entry among good ones.
      value = tuple(default_value) + (value,)
    config = _with(field, value)
    with pytest.raises(setup.ConfigError) as err:
      setup.validate_config(config)
    message = str(err.value)
    assert message.startswith(f'config.{field}=') and setup.range_of(field).describe() in message, (
        field, value, message)
    assert '\n' not in message


@pytest.mark.parametrize('field', sorted(setup.RANGES))
def test_the_closed_bounds_of_a_range_are_allowed(field):
  r = setup.range_of(field)
  for bound in (r.low if not r.low_open else None, r.high if not r.high_open else None):
    if bound is not None:
      value = int(bound) if r.integer else float(bound)
      setup.check_ranges(_with(field, (value,) if r.each else value))


@pytest.mark.parametrize('field,value,message', [
    # The issue's cases: before, all accepted (1-channel layers; gradient ascent on the ANP head).
    ('model.width', 0.0, r'config.model.width=0.0 is out of range: use a number > 0'),
    ('model.width', -1.0, r'config.model.width=-1.0 is out of range: use a number > 0'),
    ('loss_weights.anp', -1.0, r'config.loss_weights.anp=-1.0 is out of range: use a number '
                               r'>= 0'),
    ('loss_weights.anp', float('nan'), r'config.loss_weights.anp=nan is not a finite number'),
    # And a few more of the sweep's: before, accepted.
    ('adam_b2', 1.0, r'adam_b2=1.0 is out of range: use a number in \[0, 1\)'),
    ('eval_every_epochs', -1.0, 'eval_every_epochs=-1.0 is out of range'),
    ('seed', 2**40, r'seed=1099511627776 is out of range: use an integer in \[0, 4294967295\]'),
    ('step_epochs', (30, -1), r'step_epochs=\(30, -1\) is out of range'),
    ('lars_trust_coefficient', 0.0, 'lars_trust_coefficient=0.0 is out of range'),
    ('synthetic.train_per_class', 0, 'synthetic.train_per_class=0 is out of range'),
    ('batch_size', 32.0, r'config.batch_size=32.0 is not an integer: use an integer >= 1'),
])
def test_bad_numbers_of_issue_42_are_refused(field, value, message):
  config = _with(field, value)
  with pytest.raises(setup.ConfigError, match=message):
    setup.validate_config(config)


@pytest.mark.slow(20)
@pytest.mark.parametrize('flag,message', [
    ('--config.model.width=0', 'config.model.width=0.0 is out of range: use a number > 0'),
    ('--config.loss_weights.anp=-1', 'config.loss_weights.anp=-1.0 is out of range'),
    ('--config.loss_weights.anp=nan', 'config.loss_weights.anp=nan is not a finite number'),
])
def test_bad_numbers_exit_2_with_one_line_and_no_workdir(data_dir, tmp_path, flag, message):
  """Before: exit 0, a run trained with 1-channel layers or ascending the ANP loss."""
  workdir = tmp_path / 'w'
  out = subprocess.run(main_cmd(data_dir, workdir) + [flag], env=subprocess_env(1),
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert out.returncode == 2, out.stderr[-2000:]
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('ERROR: ') and message in lines[0], lines
  assert not workdir.exists()


def _shipped_configs():
  """Every config the project ships: each config file (each variant of a study or sweep preset),
  the fine-tuning study's task configs and the performance model's measurement config."""
  import runpy
  from anp_jax import transfer
  from anp_jax.configs import study_plan_validation, sweep_cpu
  from anp_jax.research import perfvalidation
  here = os.path.join(ROOT, 'anp_jax', 'configs')
  variants = {'study_ghost_bn': ('cpu', 'tiny'), 'sweep_cpu': sweep_cpu.VARIANTS,
              'study_plan_validation': (*study_plan_validation.TASKS, 'tiny')}
  out = {}
  for name in sorted(os.listdir(here)):
    if name.endswith('.py') and not name.startswith('_'):
      module = runpy.run_path(os.path.join(here, name))
      for variant in variants.get(name[:-3], (None,)):
        args = () if variant is None else (variant,)
        out[f'{name[:-3]}{":" + variant if variant else ""}'] = module['get_config'](*args)
  for preset in transfer.PRESETS:
    for task in 'ab':
      out[f'transfer:{preset}:{task}'] = transfer.task_config(preset, task, 10, '/nonexistent')
  out['perf_measure:spec'] = perfvalidation.measurement_config(
      perfvalidation.MeasureSpec(data_dir='/nonexistent', batches=(8,)))
  return out


def test_every_shipped_config_validates(tmp_path):
  configs = _shipped_configs()
  assert len(configs) >= 20
  for name, config in configs.items():
    config.data_dir = str(tmp_path)  # Exists: the `anp` presets' data_dir check passes.
    try:
      setup.validate_config(config)
    except ValueError as e:
      raise AssertionError(f'{name}: {e}') from e


def test_valid_edge_values_pass():
  config = tiny_config('/nonexistent', grad_clip_norm=0.0, momentum=0.0, weight_decay=0.0,
                       crop_fraction=1.0, bn_momentum=1.0, keep_best_metric='eval/loss',
                       checkpoint_every_steps=0, checkpoint_every_minutes=0.0)
  setup.validate_config(config)


def _val_only(**overrides):
  """The tiny config whose one evaluator logs under ``val/`` (no ``eval/`` metric)."""
  config = tiny_config('/nonexistent', **overrides)
  config.evals = {'val': {'kind': 'classification', 'split': 'validation'}}
  return config


def test_a_run_without_a_target_needs_no_target_metric():
  """Issue 42, item 5. Before: refused with "target_metric 'eval/anp_top1' is not a metric of
  config.evals" although no target was set (target_value=0)."""
  setup.validate_config(_val_only())
  setup.validate_config(_val_only(keep_best_metric='val/loss', target_metric='val/anp_top1',
                                  target_value=0.5, stop_at_target=True, eval_every_epochs=1.0))


@pytest.mark.parametrize('overrides,message', [
    # A target, or a field that needs the metric, is still checked against config.evals.
    (dict(target_value=0.5), r"config.target_metric: 'eval/anp_top1' is not a metric of "
                             r"config.evals; they are \['val/...'\]"),
    (dict(stop_at_target=True, eval_every_epochs=1.0), 'needs a target'),
    (dict(keep_best_metric='eval/loss'), r"keep_best_metric: 'eval/loss' is not a metric"),
    # A metric named explicitly is checked even without a target: a typo is not ignored.
    (dict(target_metric='val/anp_tpo1'), r"config.target_metric: 'val/anp_tpo1' is not a "
                                         'metric of config.evals'),
    (dict(target_metric='val/loss'), 'lower-is-better'),
])
def test_a_target_or_a_named_metric_is_still_checked(overrides, message):
  with pytest.raises(setup.ConfigError, match=message):
    setup.validate_config(_val_only(**overrides))


def test_unknown_augment_fails_in_build_before_anything_else(tmp_path):
  # Before the fix an unknown augment silently trained flip-only.
  config = tiny_config(tmp_path / 'never_created', augment='randaugment')
  with pytest.raises(ValueError, match=r"config.augment='randaugment'.*'inception'"):
    trainer.build(config)
  assert not (tmp_path / 'never_created').exists()  # Failed before the dataset was prepared.


def test_float16_is_refused_with_bfloat16_suggested():
  config = tiny_config('/nonexistent')
  config.model.dtype = 'float16'
  with pytest.raises(ValueError, match="config.model.dtype='float16'.*loss scaling.*'bfloat16'"):
    setup.validate_config(config)
  assert 'float16' not in models.DTYPES


# ----------------------------------------------------------------------------------------------
# Item 3: the Inception crop on PNG (the generated dataset) and JPEG bytes.


def test_inception_augment_reads_a_batch_of_the_generated_png_dataset(data_dir):
  config = tiny_config(data_dir, augment='inception')
  builder = pipeline.get_builder(config)
  raw = next(iter(builder.as_dataset(split='train[:1]',
                                     decoders={'image': pipeline.tfds.decode.SkipDecoding()})))
  assert raw['image'].numpy()[:4] == b'\x89PNG'  # TFDS stores the generated images as PNG.
  ds = pipeline.train_dataset(builder, config, per_device_batch=8,
                              num_shards=8, shards=[0, 1])
  batch = next(iter(ds.as_numpy_iterator()))
  assert batch['image'].shape == (16, 16, 16, 3)
  assert np.all(np.isfinite(batch['image']))
  # A random crop, not the plain image: the batch differs from augment='none'.
  plain = next(iter(pipeline.train_dataset(
      builder, tiny_config(data_dir, augment='none'), per_device_batch=8,
      num_shards=8, shards=[0, 1]).as_numpy_iterator()))
  assert not np.allclose(batch['image'], plain['image'])


def _encoded(image: np.ndarray, fmt: str) -> tf.Tensor:
  encode = tf.io.encode_png if fmt == 'png' else functools.partial(tf.io.encode_jpeg,
                                                                  quality=100)
  return encode(tf.constant(image))


@pytest.mark.parametrize('fmt', ['png', 'jpeg'])
def test_inception_crop_takes_the_same_window_for_every_encoding(fmt):
  # A smooth 40x48 image: JPEG at quality 100 decodes close to the original, so the crops of
  # both encodings agree when (and only when) they take the same window.
  y, x = np.mgrid[0:40, 0:48]
  image = np.stack([4 * y, 5 * x, 2 * (x + y)], -1).astype(np.uint8)
  seed = tf.constant([3, 7], tf.int64)
  got = pipeline._inception_crop(_encoded(image, fmt), 16, seed).numpy()
  ref = pipeline._inception_crop(_encoded(image, 'jpeg'), 16, seed).numpy()
  assert got.shape == (16, 16, 3)
  np.testing.assert_allclose(got, ref, atol=6)
  other = pipeline._inception_crop(_encoded(image, fmt), 16, tf.constant([4, 1], tf.int64))
  assert np.abs(other.numpy() - got).max() > 20  # Another seed, another window.


# ----------------------------------------------------------------------------------------------
# Item 6: the staleness-aware learning rate divides the update, for every optimizer.


@pytest.mark.parametrize('name', optim.OPTIMIZERS)
def test_staleness_aware_lr_divides_the_update_of_every_optimizer(name):
  # A large rate: the update is measured as new - old parameters in float32.
  config = tiny_config('/nonexistent', optimizer=name, schedule='constant', method='async',
                       lr_scaling='none', base_lr=1.0, noise_scale=False, **{'async_sgd.max_tau': 4,
                                             'async_sgd.staleness_aware_lr': True})
  model = models.create_model(config, models.Heads(8, 4, 4))
  tx = optim.create_optimizer(config, optim.create_lr_schedule(config, 10, 100))
  state = steps.init_state(model, tx, config.image_size, 0, history=5)
  # Step 4 with a history of five equal snapshots: tau = 1 and tau = 4 read the same parameters,
  # so both steps see the same gradient and differ only by the staleness-aware factor.
  state = state.replace(step=jnp.asarray(4, jnp.int32))
  rng = np.random.default_rng(0)
  batch = {'image': jnp.asarray(rng.normal(size=(8, 16, 16, 3)), jnp.float32),
           'label_anp': jnp.asarray(rng.integers(0, 8, 8), jnp.int32),
           'label_adjective': jnp.asarray(rng.integers(0, 4, 8), jnp.int32),
           'label_noun': jnp.asarray(rng.integers(0, 4, 8), jnp.int32)}
  step = jax.jit(functools.partial(steps.per_device_train_step, model=model, tx=tx,
                                   config=config, accum_steps=1, num_devices=1, axis_name=None,
                                   staleness_aware_lr=True))

  def update_norms(tau):
    new, _ = step(state, batch, tau=jnp.asarray(tau, jnp.int32))
    return np.array([np.linalg.norm(a - b) for a, b in zip(leaves(new.params),
                                                            leaves(state.params))])

  base, stale = update_norms(1), update_norms(4)
  moved = base > 0
  assert moved.sum() >= len(base) // 2
  # Every parameter's step (kernels under a trust ratio, BN and biases) shrinks by 1/tau.
  np.testing.assert_allclose(stale[moved] / base[moved], 0.25, rtol=2e-3)
  assert np.all(stale[~moved] == 0)
