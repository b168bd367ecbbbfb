"""CPU demo: ResNet-20 on the generated 32 px ANP dataset, a few minutes on 2 cores.

  ./run.sh                                 # = python -m anp_jax.main --config=anp_jax/configs/default.py
  ./run.sh --config.batch_size=256 --config.num_epochs=2

Every other config imports this one and overrides a few fields. The options that registered
models, optimizers and schedules declare (`anp_jax.registry`) join every config here, at their
defaults: e.g. ``momentum`` (sgd, nesterov, lars), ``step_epochs`` (step),
``model.zero_init_last_bn`` (the ResNets). A finished run's recorded config is read back with
`read_run_config` (fields added since then get `ADDED_FIELDS`, replaced ones their
replacements: `REPLACED_FIELDS`).
"""

import copy
import json
import os
from typing import Any, Dict, Mapping

import ml_collections

from anp_jax import registry

# Where datasets are generated or prepared, for every entry point (main, the experiment scripts,
# notebooks): $ANP_DATA_DIR, else TFDS's usual place.
DATA_DIR_ENV = 'ANP_DATA_DIR'


def default_data_dir() -> str:
  return os.environ.get(DATA_DIR_ENV) or '~/tensorflow_datasets'


# config.target_metric's default: what "target" meant before the field existed (sweeps, pilots).
DEFAULT_TARGET_METRIC = 'eval/anp_top1'

# The one registry of fields added after runs were recorded, with the value those runs used
# (a new field whose default is not what older runs did gets its old behaviour here, not its
# default). Two readers: `read_run_config` fills a recorded config.json with them, and the
# checkpoint identity (`anp_jax.checkpointing.identity_diff`) compares an identity entry that an
# older checkpoint does not record with them (an entry missing here was recorded later although
# the field existed: older checkpoints are not compared on it).
ADDED_FIELDS = {
    'method': 'sync', 'model.conv_impl': 'xla', 'model.adjective_head': True,
    'model.noun_head': True, 'init_from': '', 'freeze': '', 'backbone_lr_multiplier': 1.0,
    'evals': {'eval': {'kind': 'classification', 'split': 'validation'}},
    'target_metric': DEFAULT_TARGET_METRIC, 'target_value': 0.0, 'stop_at_target': False,
    'input_backend': 'tf',
}
# Fields that were replaced, and by what: a config.json that has them is read into the new
# fields (`_replace_old_fields`); a command line or config file that still sets one is refused
# with this text (`replaced_field_message`).
REPLACED_FIELDS = {
    'stop_at_metric': 'config.target_metric (the metric), config.target_value (the value) and '
                      'config.stop_at_target=True (stop there)',
    'stop_at_value': 'config.target_value (with config.target_metric and '
                     'config.stop_at_target=True)',
    'eval_split': "config.evals, a metric prefix per evaluation: the choices' split is "
                  "--config.evals.eval.split=validation; a test split is evaluated beside it "
                  "with --config.evals.test.kind=classification --config.evals.test.split=test",
    'shuffle_buffer': 'nothing: every epoch is a uniform permutation of the whole training split '
                      '(docs/data.md)',
}


def default_eval_split(config) -> str:
  """The split of the run's default evaluation: config.evals' ``eval`` entry's if it is a
  classification, else 'validation' (`trainer.Run.evaluate`'s default, the data's 'eval split')."""
  spec = config.evals.get('eval')
  return spec.split if spec is not None and spec.kind == 'classification' else 'validation'


def replaced_field_message(field: str) -> str:
  """The error for a config that still sets a replaced field ('' if `field` was not replaced)."""
  if field not in REPLACED_FIELDS:
    return ''
  return f'config.{field} no longer exists: use {REPLACED_FIELDS[field]}.'


def _replace_old_fields(recorded: dict) -> None:
  """A recorded config's `REPLACED_FIELDS` as the fields that replaced them (in place)."""
  recorded.pop('shuffle_buffer', None)  # Read by no version since the global example order.
  split = recorded.pop('eval_split', None)
  if split and 'evals' not in recorded:
    recorded['evals'] = {'eval': {'kind': 'classification', 'split': split}}
  metric, value = recorded.pop('stop_at_metric', None), recorded.pop('stop_at_value', None)
  if metric and 'target_metric' not in recorded:  # '' was 'no target'.
    recorded.update(target_metric=metric, target_value=float(value or 0.0),
                    stop_at_target=True)


def read_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run recorded (``workdir/config.json``) in today's fields: replaced fields
  mapped to their replacements, the `ADDED_FIELDS` it lacks with the value it used.

  For what reads finished runs (`trainer.load_checkpoint`, the planner's pilot, reports): plain
  attribute access then works on configs of every version. No JAX; reads, never writes.
  """
  with open(os.path.join(workdir, 'config.json')) as f:
    recorded = json.load(f)
  _replace_old_fields(recorded)
  for field, value in ADDED_FIELDS.items():
    *parents, name = field.split('.')
    node = recorded
    for part in parents:
      node = node.setdefault(part, {})
    if node.get(name) is None:
      node[name] = copy.deepcopy(value)
  return ml_collections.ConfigDict(recorded)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  # Data.
  c.dataset = 'synthetic_anp'  # 'synthetic_anp' (generated here) or 'anp' (a prepared folder).
  c.data_dir = default_data_dir()
  c.synthetic = ml_collections.ConfigDict(dict(
      num_adjectives=8, num_nouns=8, num_pairs=32, image_size=32,
      train_per_class=250, eval_per_class=53, label_noise=0.0, seed=0,
      test_per_class=0))  # 0: as many test images per ANP as eval_per_class.
  c.anp = ml_collections.ConfigDict(dict(config_name=''))  # Used with dataset='anp'.
  c.image_size = 32
  # 'cifar' (pad + crop + flip), 'inception' (random-resized crop + flip, any image encoding),
  # 'flip', 'none'. Every enumerated field's choices: anp_jax.setup.CHOICES.
  c.augment = 'cifar'
  c.crop_padding = 4
  c.crop_fraction = 0.875
  c.cache = True
  # Who finishes the images (anp_jax/data/windows.py): 'tf' (the host), 'tf_device' (the host
  # decodes the crop window, the device resizes, flips, normalises), 'dali' / 'dali_cpu' (DALI).
  c.input_backend = 'tf'

  # Model: any registered model (docs/models.md); its own options join c.model (the ResNets':
  # zero_init_last_bn, conv_impl).
  c.model = ml_collections.ConfigDict(dict(
      # dtype: 'float32' or 'bfloat16' (float16 is refused: it would need loss scaling).
      name='resnet20', width=1.0, dtype='float32', adjective_head=True, noun_head=True))
  c.loss_weights = ml_collections.ConfigDict(dict(anp=1.0, adjective=0.5, noun=0.5))
  c.label_smoothing = 0.0
  # BatchNorm statistics: 'global' (whole global batch), 'per_device', 'ghost' (bn_group_size).
  c.bn_mode = 'ghost'
  c.bn_group_size = 32
  c.bn_momentum = 0.9

  # Optimisation. The GLOBAL batch is the knob; lr = base_lr * rule(batch_size / base_batch_size).
  c.batch_size = 128
  c.eval_batch_size = 256
  c.grad_accum_steps = 1  # Micro-batches per step: simulates a large batch on few devices.
  # Any registered optimizer and schedule; their options (momentum, adam_b1, step_epochs, ...)
  # join the config at their defaults: docs/optim.md lists them all.
  c.optimizer = 'nesterov'
  c.weight_decay = 5e-4
  c.base_lr = 0.2
  c.base_batch_size = 256
  c.lr_scaling = 'linear'  # 'linear', 'sqrt', 'none'.
  c.warmup_epochs = 1.0
  c.schedule = 'cosine'
  c.grad_clip_norm = 0.0  # 0 disables.
  c.num_epochs = 5.0  # Epochs of train_size examples: ceil(N * train_size / batch_size) steps.
  c.num_train_steps = -1  # > 0 overrides num_epochs.

  # Evaluation (docs/evaluation.md). evals: metric prefix -> evaluator spec (anp_jax.evaluators);
  # every one runs at each evaluation step and logs '<prefix>/<metric>' (eval/anp_top1,
  # eval/loss, ...). Add one in a config file, e.g.
  # c.evals.test = dict(kind='classification', split='test').
  c.evals = ml_collections.ConfigDict(
      {'eval': ml_collections.ConfigDict(dict(kind='classification', split='validation'))})
  # THE metric "target" means everywhere (early stop, a sweep's steps to target, the planner,
  # the reports); higher is better. target_value: 0 = no target. stop_at_target: end the run at
  # the first evaluation with target_metric >= target_value (time-to-accuracy runs).
  c.target_metric = DEFAULT_TARGET_METRIC
  c.target_value = 0.0
  c.stop_at_target = False

  # Execution.
  c.executor = 'jit'  # 'jit' (mesh + shardings) or 'pmap' (for comparison).
  c.log_every_steps = 25
  c.eval_every_epochs = 1.0
  c.progress_bar = True
  c.noise_scale = True  # Log the gradient noise scale B_simple (McCandlish et al. 2018).
  c.noise_scale_ema = 0.95

  # Training method (docs/methods.md).
  # 'sync': synchronous data parallelism (gradients all-reduced every step).
  # 'async': simulated asynchronous SGD: each update applies a gradient computed on parameters
  #   tau steps old. The global batch of one step plays ONE worker's mini-batch: to simulate N
  #   workers of batch b, set batch_size=b and take the staleness of N workers.
  # 'local_sgd': mixed: synchronous inside each node, parameters averaged across nodes every
  #   local_sgd.sync_every steps (periodic model averaging over a 2-D ('node', 'device') mesh).
  c.method = 'sync'
  c.async_sgd = ml_collections.ConfigDict(dict(
      staleness='constant',  # 'constant' | 'uniform' | 'geometric' | 'simulated'.
      tau=0,  # Constant staleness; the mean staleness for 'geometric'.
      # Parameter snapshots kept: memory (max_tau + 1) x parameter bytes per device. 'uniform'
      # draws 0..max_tau; larger 'geometric'/'simulated' draws are clipped to it (reported).
      max_tau=8,
      workers=4,  # N for 'simulated' (anp_jax.staleness.staleness_sampler): mean tau = N - 1.
      compute_cv=0.1,  # Coefficient of variation of a worker's step time for 'simulated'.
      staleness_aware_lr=False,  # Zhang et al. 2016: divide the step by max(tau, 1).
      # 'keep' | 'compensate' (Mitliagkas et al. 2016: asynchrony adds implicit momentum
      # ~ 1 - 1/N; the explicit momentum becomes max(0, momentum - (1 - 1/N)), N = mean tau + 1).
      momentum='keep',
      seed=0))  # Seed of the staleness sequence (a function of seed and step: exact resume).
  c.local_sgd = ml_collections.ConfigDict(dict(
      nodes=0,  # Replica groups (the 'node' mesh axis); 0 = one per JAX process.
      sync_every=1,  # H: average parameters (and BN statistics) across nodes every H steps.
      average_opt_state=False))  # Also average the optimizer state (momentum) at sync points.

  # Fine-tuning (docs/fine-tuning.md; anp_jax/pretrained/, anp_jax/optim/partition.py).
  # init_from: '' (from scratch), an anp_jax workdir/checkpoint, or a torchvision-style ResNet
  # state dict (.safetensors / .pth); used for a fresh run only (a checkpoint in the
  # workdir wins). init_exclude: regexes of parameter names kept at their fresh initialisation
  # (full match, e.g. 'head_.*'); heads of another shape are re-initialised anyway.
  c.init_from = ''
  c.init_exclude = ()
  c.freeze = ''  # Regex of parameters not updated (and their BN statistics kept); '' = none.
  c.backbone_lr_multiplier = 1.0  # Loaded parameters train at this x the rate; new heads at 1x.

  # Checkpoints.
  c.checkpoint_every_steps = 500
  c.checkpoint_every_minutes = 10.0
  c.keep_checkpoints = 3
  c.keep_best_metric = ''  # Any evaluator's metric, e.g. 'eval/loss': also keep the best by it.
  c.async_checkpointing = True
  c.eval_only = False
  return registry.add_options(c)


def flat_fields(tree: Mapping, prefix: str = '') -> Dict[str, Any]:
  """{'model': {'name': x}} -> {'model.name': x}: a config's JSON under dotted field names."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(flat_fields(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out
