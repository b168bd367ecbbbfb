"""Each extension point is one file (issue 43, item 6): this file alone adds a model (a small
MLP-Mixer with the ANP heads and options of its own), an evaluation of the model's predictions
(balanced accuracy), an optimizer (Lion), a learning-rate schedule (linear decay) and a study.
No library file changes: each is a valid config value with its options on the command line,
trains a few steps and resumes exactly; the evaluation runs on every executor and is a
target metric; the schedule's registration is what the planner reads."""

import json
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl import flags

from anp_jax import cli, evaluators, models, optim, setup, trainer
from anp_jax.configs import default
from anp_jax.errors import ConfigError
from anp_jax.research import runner
from anp_jax.research.planner import budget
from anp_jax.research.study import from_preset
from conftest import ROOT, assert_resume_is_exact, tiny_config

# ----------------------------------------------------------------------------------------------
# A model: a one-block MLP-Mixer (Tolstikhin et al. 2021) with the three heads.


class TinyMixer(nn.Module):
  heads: models.Heads
  patch_size: int
  dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    p = self.patch_size
    x = nn.Conv(self.dim, (p, p), (p, p), dtype=self.dtype, name='stem')(x.astype(self.dtype))
    x = x.reshape((x.shape[0], -1, self.dim))  # (batch, patches, channels)
    y = jnp.swapaxes(nn.LayerNorm(dtype=self.dtype, name='norm_tokens')(x), 1, 2)
    y = nn.Dense(x.shape[1], dtype=self.dtype, name='token_mix')(nn.gelu(y))
    x = x + jnp.swapaxes(y, 1, 2)
    y = nn.LayerNorm(dtype=self.dtype, name='norm_channels')(x)
    x = x + nn.Dense(self.dim, dtype=self.dtype, name='channel_mix')(nn.gelu(y))
    x = jnp.mean(x, axis=1).astype(jnp.float32)
    logits = {'anp': nn.Dense(self.heads.num_anps, name='head_anp')(x)}
    if self.heads.num_adjectives:
      logits['adjective'] = nn.Dense(self.heads.num_adjectives, name='head_adjective')(x)
    if self.heads.num_nouns:
      logits['noun'] = nn.Dense(self.heads.num_nouns, name='head_noun')(x)
    return logits


@models.register('test_mixer', min_image_size=2, image_size=16, family='mixer', options={
    'patch_size': models.Option(4, 'integer >= 1', 'the side of a patch, in pixels'),
    'mixer_dim': models.Option(16, 'integer >= 1', 'channels per patch')})
def tiny_mixer(config, args: models.ModelArgs) -> nn.Module:
  return TinyMixer(heads=args.heads, patch_size=args.options['patch_size'],
                   dim=args.options['mixer_dim'], dtype=args.dtype)


# ----------------------------------------------------------------------------------------------
# An evaluation of predictions: balanced accuracy (the mean of the per-class recalls) and the
# worst class's, over every example of the split.


@evaluators.register('test_balanced')
class BalancedAccuracy(evaluators.PredictionEvaluator):
  OPTIONS = {'split': 'validation',
             'head': evaluators.Option('anp', choices=('anp', 'adjective', 'noun'))}

  @classmethod
  def metrics(cls, config, options):
    return {'balanced_top1': evaluators.Goal('max', 1.0),
            'worst_class_top1': evaluators.Goal('max', 1.0), 'examples': evaluators.Goal('max')}

  def sums(self, outputs, batch):
    head = self.options['head']
    logits, labels = outputs[head], batch[f'label_{head}']
    seen = jax.nn.one_hot(labels, logits.shape[-1]) * batch['mask'][:, None]
    hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)[:, None]
    return {'seen': jnp.sum(seen, axis=0), 'hits': jnp.sum(seen * hit, axis=0)}

  def finish(self, sums):
    seen, hits = np.asarray(sums['seen']), np.asarray(sums['hits'])
    recall = hits[seen > 0] / seen[seen > 0]
    return {'balanced_top1': float(np.mean(recall)), 'worst_class_top1': float(np.min(recall)),
            'examples': float(np.sum(seen))}


# ----------------------------------------------------------------------------------------------
# An optimizer (Lion, Chen et al. 2023) and a schedule (linear decay to a fraction of the peak).


@optim.register_optimizer('test_lion', options={
    'test_lion_b1': optim.Option(0.9, '[0, 1)', 'the update interpolation'),
    'test_lion_b2': optim.Option(0.99, '[0, 1)', 'the momentum decay')})
def lion(args: optim.OptimizerArgs) -> optax.GradientTransformation:
  """Lion: the sign of an interpolated momentum, decoupled weight decay."""
  return optax.lion(args.learning_rate, b1=args.options['test_lion_b1'],
                    b2=args.options['test_lion_b2'], weight_decay=args.weight_decay,
                    mask=args.decay_mask)


@optim.register_schedule('test_linear', decays=True, options={
    'test_linear_end': optim.Option(0.0, '[0, 1]', 'the last rate, a fraction of the peak'),
    'test_linear_epochs': optim.Option(1.0, '> 0', 'the epochs the decay takes')})
def linear(args: optim.ScheduleArgs):
  """Linear from the peak to test_linear_end x the peak in test_linear_epochs, then flat."""
  return optax.linear_schedule(args.peak, args.peak * args.options['test_linear_end'],
                               args.epochs_to_steps(args.options['test_linear_epochs']))


# ----------------------------------------------------------------------------------------------
# A study: its preset's get_config() and get_sweep().


def get_config(data_dir='/nonexistent'):
  """The tests' tiny config with all four of this file, the balanced accuracy as `bal`."""
  c = tiny_config(data_dir, **{'model.name': 'test_mixer', 'model.patch_size': 2,
                               'optimizer': 'test_lion', 'schedule': 'test_linear',
                               'test_linear_end': 0.1, 'test_linear_epochs': 0.5,
                               'base_lr': 0.01, 'weight_decay': 1e-4})
  c.evals.bal = dict(kind='test_balanced')
  return c


def get_sweep():
  return dict(points=[('b2_098', {'test_lion_b2': 0.98})], seeds=(0,), lr_grid=(1.0,),
              images_per_s=2000.0, overhead_s=5.0, cpu_devices=8, title='one file each')


# ----------------------------------------------------------------------------------------------


def test_each_is_a_config_value_with_its_options_in_every_config():
  config = default.get_config()  # No config file: the registrations added their options.
  assert (config.model.patch_size, config.model.mixer_dim) == (4, 16)
  assert (config.test_lion_b1, config.test_lion_b2, config.test_linear_end) == (0.9, 0.99, 0.0)
  assert config.test_linear_epochs == 1.0
  for field, name in (('model.name', 'test_mixer'), ('optimizer', 'test_lion'),
                      ('schedule', 'test_linear')):
    assert name in setup.CHOICES[field]
  setup.validate_config(get_config())
  assert setup.range_of('test_lion_b2').describe() == 'a number in [0, 1)'


@pytest.mark.parametrize('field,value,message', [
    ('model.patch_size', 0, r'config.model.patch_size=0 is out of range: use an integer >= 1 '
                            r'\(the side of a patch, in pixels\)'),
    ('test_lion_b1', 1.0, r'config.test_lion_b1=1.0 is out of range: use a number in \[0, 1\)'),
    ('test_linear_end', -0.5, r'config.test_linear_end=-0.5 is out of range'),
    ('evals.bal.head', 'nuon', r"config.evals.bal.head='nuon' is unknown; choose one of "
                               r"\('anp', 'adjective', 'noun'\)"),
    ('optimizer', 'test_lino', r"config.optimizer='test_lino' is unknown; choose one of .*"
                               r"'test_lion'.*a new optimizer is one module in "
                               r"anp_jax/optim/optimizers/ calling "
                               r"anp_jax.optim.register_optimizer"),
    ('model.name', 'test_mixr', r"config.model.name='test_mixr' is unknown; choose one of .*"
                                r"'test_mixer'.*a new model is one module in anp_jax/models/"),
])
def test_bad_values_of_their_options_fail_with_one_line(field, value, message):
  config = get_config()
  config.update_from_flattened_dict({field: value})
  with pytest.raises(ConfigError, match=message):
    setup.validate_config(config)


def test_their_options_and_a_new_evaluation_are_command_line_flags(data_dir):
  """With no config file and no edit to default.py (item 3)."""
  argv = ['prog', f'--config.data_dir={data_dir}', '--config.model.name=test_mixer',
          '--config.model.patch_size=2', '--config.optimizer=test_lion',
          '--config.test_lion_b2=0.98', '--config.schedule=test_linear',
          '--config.evals.bal.kind=test_balanced', '--config.evals.bal.head=noun',
          '--config.evals.cal.kind', 'calibration', '--config.evals.cal.bins=5',
          '--config.keep_best_metric=bal/balanced_top1']
  assert cli.check_config_argv(argv[1:], 'config', f'{ROOT}/anp_jax/configs/tiny.py') == ''
  fv = flags.FlagValues()
  cli.define_config_flag('config', f'{ROOT}/anp_jax/configs/tiny.py', 'the config',
                         flag_values=fv, sys_argv=argv)
  fv(argv)
  config = fv.config
  assert (config.model.patch_size, config.test_lion_b2) == (2, 0.98)
  assert dict(config.evals.bal) == {'kind': 'test_balanced', 'split': 'validation',
                                    'head': 'noun'}
  assert dict(config.evals.cal) == {'kind': 'calibration', 'split': 'validation', 'bins': 5,
                                    'head': 'anp'}
  setup.validate_config(config)
  # A misspelt option of a registered entry is still an unknown field, with the nearest one.
  assert 'did you mean --config.model.patch_size' in cli.check_config_argv(
      ['--config.model.name=test_mixer', '--config.model.pach_size=2'], 'config',
      f'{ROOT}/anp_jax/configs/tiny.py')


def test_they_train_and_resume_exactly(data_dir, tmp_path, capsys):
  def make(steps):
    c = get_config(data_dir)
    c.update(num_train_steps=steps, checkpoint_every_steps=2, log_every_steps=1,
             eval_every_epochs=0.25)  # Every 2 steps (32 per step, 256 per epoch).
    return c

  whole, _ = assert_resume_is_exact(make, 4, 2, tmp_path, capsys)
  params = whole.state.params
  assert params['stem']['kernel'].shape == (2, 2, 3, 16)  # model.patch_size=2 reached it.
  assert params['token_mix']['kernel'].shape == (64, 64)  # (16 / 2)^2 patches.
  lion = [s for s in jax.tree.leaves(whole.state.opt_state, is_leaf=lambda x: hasattr(x, 'mu'))
          if type(s).__name__ == 'ScaleByLionState']
  assert lion, whole.state.opt_state  # The optimizer state is Lion's.
  records = [json.loads(line) for line in open(tmp_path / 'whole' / 'metrics.jsonl')]
  lrs = {r['step']: r['train/lr'] for r in records if 'train/lr' in r}
  peak = 0.01 * 32 / 256  # base_lr x batch / base_batch (linear rule), no warmup.
  assert sorted(lrs) == [1, 2, 3, 4]  # Half an epoch = 4 steps of decay, whatever the run.
  for step, lr in lrs.items():  # Logged at step s: the rate of step s - 1.
    assert lr == pytest.approx(peak * (1 - 0.9 * (step - 1) / 4), rel=1e-6), step
  evals = [r for r in records if 'bal/balanced_top1' in r]
  assert [r['step'] for r in evals] == [2, 4]
  assert all(r['bal/examples'] == 104 for r in evals)  # Every example once, padding masked.
  assert 0 <= whole.final_eval['bal/worst_class_top1'] <= whole.final_eval['bal/balanced_top1']


def test_the_evaluation_is_a_target_metric_and_keeps_the_best(data_dir, tmp_path):
  config = get_config(data_dir)
  config.update(num_train_steps=4, eval_every_epochs=0.25, checkpoint_every_steps=0,
                target_metric='bal/balanced_top1', target_value=1e-6, stop_at_target=True,
                keep_best_metric='bal/worst_class_top1')
  result = trainer.train_and_evaluate(config, str(tmp_path))
  final = json.load(open(tmp_path / 'final_metrics.json'))
  assert final['stopped_at_target'] is True and result.step == 2
  assert final['bal/balanced_top1'] >= 1e-6
  assert (tmp_path / 'checkpoints_best').is_dir()
  config = get_config()
  config.update(target_metric='bal/balanced_top2', target_value=0.5)
  with pytest.raises(ConfigError, match=r"'bal/balanced_top2' is not a metric of config.evals; "
                                        r"they are \['bal/balanced_top1', 'bal/examples', "
                                        r"'bal/worst_class_top1'\]"):
    setup.validate_config(config)


VARIANTS = {
    'jit': dict(),
    'pmap': dict(executor='pmap', bn_mode='per_device'),
    'async': dict(method='async', **{'async_sgd.tau': 1, 'async_sgd.max_tau': 2}),
    'local_sgd': dict(method='local_sgd', **{'local_sgd.nodes': 2}),
}


def test_the_evaluation_gets_the_same_predictions_on_every_executor(data_dir):
  """`Executor.map_eval` on every method, from the same initial parameters (every executor
  starts from the same host-initialised state): the same examples, the same hits."""
  got = {}
  for name, overrides in VARIANTS.items():
    config = get_config(data_dir)
    config.update_from_flattened_dict(overrides)
    run = trainer.build(config)
    got[name] = run.evaluators['bal'].evaluate(run.init_state())
  assert got['jit']['bal/examples'] == 104
  for name in VARIANTS:
    assert got[name] == got['jit'], name


def test_the_planner_reads_the_schedules_registration():
  assert budget.decays('test_linear') and not budget.decays('constant')
  plan = budget.Budget(train_size=256, num_epochs=1.0, num_train_steps=-1, warmup_epochs=0.0,
                       schedule='test_linear', lr_scaling='linear', base_lr=0.1,
                       base_batch_size=256)
  assert plan.feasibility(7, 32)[1] == 'late'  # 7 of 8 steps: deep in the decay.
  assert plan.feasibility(3, 32)[1] == 'ok'


def test_a_study_of_them_trains_and_resumes(data_dir, tmp_path, capsys):
  base = get_config(data_dir)
  base.update(target_value=0.05, num_train_steps=2, eval_every_epochs=0.25)
  study = from_preset('one_file_each', get_sweep(), base)
  opts = runner.Options(out=str(tmp_path / 'study'), report=False)
  rows = runner.run_study(study, base, opts)
  assert len(rows) == 1 and rows[0]['point'] == 'b2_098'
  run_dir = tmp_path / 'study' / 'runs' / rows[0]['name']
  recorded = json.load(open(run_dir / 'config.json'))
  assert (recorded['optimizer'], recorded['test_lion_b2'], recorded['model']['patch_size']) == (
      'test_lion', 0.98, 2)
  capsys.readouterr()
  again = runner.run_study(study, base, opts)  # Finished: nothing trains again.
  assert [r['name'] for r in again] == [r['name'] for r in rows]
  assert 'Resumed from checkpoint' not in capsys.readouterr().out
  assert json.load(open(run_dir / 'final_metrics.json'))['step'] == 2
