"""Config checks and the fixes of issue 13 items 3, 6 and 11: every enumerated field is validated
in one place (unknown values fail before compile, naming the field and the allowed values), the
'inception' crop works on any image encoding, float16 is refused, and the staleness-aware
learning rate scales the *update* so that it acts on every optimizer."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from anp_jax import models, optim, setup, steps, trainer
from anp_jax.data import pipeline
from conftest import leaves, tiny_config


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
    ('grad_clip_norm', -1.0, r'grad_clip_norm=-1.0 is out of range: use a number >= 0.0'),
    ('weight_decay', -1e-4, 'weight_decay'),
    ('momentum', 1.0, r'momentum=1.0 is out of range: use a number in \[0.0, 1.0\)'),
    ('label_smoothing', 1.0, 'label_smoothing'),
    ('bn_momentum', 1.5, 'bn_momentum'),
    ('step_factor', 0.0, 'step_factor'),
    ('crop_fraction', 0.0, 'crop_fraction'),
    ('crop_fraction', 1.2, 'crop_fraction'),
    ('log_every_steps', 0, 'log_every_steps'),
    ('keep_checkpoints', 0, r'keep_checkpoints=0 .* could not resume'),
    ('bn_group_size', 0, r"bn_group_size=0 must be >= 1 with bn_mode='ghost'"),
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
