"""Pre-train on one ANP task, fine-tune on another: does ``config.init_from`` pay off?

`run` trains three runs with `trainer.train_and_evaluate` (the library behind
``experiments/finetune.py``):

1. ``pretrain``: a model on task A (generated ``synthetic_anp`` pairs of one seed);
2. ``finetune``: task B (other pairs: another seed, fewer images per class) starting from (1)'s
   checkpoint via ``init_from``, heads excluded (``init_exclude='head_.*'``: task B's classes are
   other pairs, so A's classifier rows mean nothing there);
3. ``scratch``: task B from a random initialisation, same config and step budget as (2).

Every run evaluates the validation and the test split of its task. `run` trains the three
runs of one seed (``config.seed``: initialisation, data order and augmentation; the tasks' data
are the same for every seed) in ``runs/<name>`` (seed 0) or ``runs/<name>-s<seed>``, the
fine-tuning run starting from the same seed's pre-training. `summarize` turns one seed's
evaluation curves into steps-to-target (the first evaluated step whose ANP top-1 reaches a
target; targets are fractions of the scratch run's best accuracy). The statistics over seeds and
the report (``curves.png``, ``summary.md``, ``results.json``) are
`anp_jax.research.study_finetune`.
"""

import json
import os
import time
from typing import Dict, Optional, Sequence

from anp_jax import cli, metrics_io
from anp_jax.configs import default

METRIC = 'eval/anp_top1'
TEST_METRIC = 'test/anp_top1'  # Published figures; choices (none here but the targets) on METRIC.
TARGET_FRACTIONS = (0.5, 0.8, 0.9, 1.0)


def _task(size: int, train_per_class: int, eval_per_class: int, seed: int) -> dict:
  """A synthetic_anp task over size adjectives x size nouns, half of the combinations used as ANPs."""
  return dict(num_adjectives=size, num_nouns=size, num_pairs=size * size // 2,
              train_per_class=train_per_class, eval_per_class=eval_per_class, seed=seed)


# name -> (model, width, image size, task A / B synthetic overrides, steps, batch, eval every;
# images_per_s and overhead_s: the dry run's estimate, fitted to the committed cpu results,
# experiments/results/finetune_cpu: 9 runs, 5.1 min of training)
PRESETS = {
    'cpu': dict(model='resnet20', width=0.5, image_size=16, batch=64, lr=0.1,
                task_a=_task(8, 100, 20, seed=0), task_b=_task(8, 25, 20, seed=1),
                pretrain_steps=400, finetune_steps=200, eval_every_steps=20,
                images_per_s=1000.0, overhead_s=10.0),
    'tiny': dict(model='resnet8', width=0.5, image_size=16, batch=32, lr=0.1,
                 task_a=_task(4, 16, 8, seed=0), task_b=_task(4, 8, 8, seed=1),
                 pretrain_steps=6, finetune_steps=4, eval_every_steps=2,
                 images_per_s=300.0, overhead_s=5.0),
}


def task_config(preset: str, task: str, steps: int, data_dir: str, **overrides):
  """The default config sized by `preset` for task 'a' or 'b' (cosine decay, no warmup)."""
  p = PRESETS[preset]
  c = default.get_config()
  c.data_dir = data_dir
  c.synthetic.update(p[f'task_{task}'])
  c.synthetic.image_size = c.image_size = p['image_size']
  c.model.name, c.model.width = p['model'], p['width']
  c.batch_size = p['batch']
  c.eval_batch_size = 256
  c.bn_group_size = 16
  c.base_lr, c.lr_scaling = p['lr'], 'none'
  c.warmup_epochs = 0.0
  c.schedule = 'cosine'
  c.num_train_steps = steps
  c.progress_bar = False
  c.checkpoint_every_steps = steps  # The final checkpoint: what fine-tuning reads.
  c.checkpoint_every_minutes = 0
  c.log_every_steps = p['eval_every_steps']
  c.noise_scale = False
  c.evals = {'eval': {'kind': 'classification', 'split': 'validation'},
             'test': {'kind': 'classification', 'split': 'test'}}
  c.update(overrides)
  return c


def run_name(name: str, seed: int) -> str:
  """A run's directory under ``runs/``: ``pretrain`` (seed 0, the first results' layout) or
  ``pretrain-s1``."""
  return name if seed == 0 else f'{name}-s{seed}'


def _train(config, workdir: str, every_steps: int):
  """Trains (or resumes, or re-evaluates a finished) run in `workdir`; returns its curve, final
  evaluation, training time and init report.

  The curve is every evaluation in the run's log (`metrics_io.read_metrics`), not the records
  of this invocation: a rerun of a finished run logs none, a resumed one only its last segment.
  The final evaluation and the training time are those of ``final_metrics.json`` (which a rerun
  leaves as the run wrote it; its wall time adds up the segments). So a rerun or a resumed run
  gives what one uninterrupted invocation gives.
  """
  from anp_jax import trainer
  run = trainer.build(config)  # Only for the epoch length: evaluation is given in epochs.
  config.eval_every_epochs = every_steps / run.setup.steps_per_epoch
  t = time.time()
  result = trainer.train_and_evaluate(config, workdir)
  wall = time.time() - t
  evals = metrics_io.read_metrics(workdir, 'eval')
  curve = [(int(r['step']), r[METRIC]) for r in evals if METRIC in r]
  test_curve = [(int(r['step']), r[TEST_METRIC]) for r in evals if TEST_METRIC in r]
  final_path = os.path.join(workdir, 'final_metrics.json')
  recorded = {}
  if os.path.exists(final_path):
    with open(final_path) as f:
      recorded = json.load(f)
  final = {k: v for k, v in recorded.items() if k.startswith(('eval/', 'test/'))} or (
      result.final_eval)
  return {'curve': curve, 'test_curve': test_curve, 'final': final,
          'wall_s': recorded.get('wall_time_s', wall),
          'init_report': run.init.report if run.init else ''}


def _finetune_config(preset: str, work_dir: str, data_dir: str, freeze: str,
                     backbone_lr_multiplier: float, seed: int = 0):
  p = PRESETS[preset]
  return task_config(preset, 'b', p['finetune_steps'], data_dir,
                     init_from=os.path.join(work_dir, 'runs', run_name('pretrain', seed)),
                     init_exclude=('head_.*',), freeze=freeze,
                     backbone_lr_multiplier=backbone_lr_multiplier, seed=seed)


def _check_directory(flag: str, path: str) -> None:
  if not path:
    raise ValueError(f'{flag} is empty; give a directory.')
  parent = cli.nearest_existing(path)
  if parent and not os.path.isdir(parent):
    what = 'is a file' if parent == path else f'is under {parent!r}, which is a file'
    raise ValueError(f'{flag}={path!r} {what}; give a directory.')


def check(work_dir: str, preset: str = 'cpu', data_dir: Optional[str] = None,
          freeze: str = '', backbone_lr_multiplier: float = 1.0, out_dir: Optional[str] = None,
          seeds: Sequence[int] = (0,)) -> None:
  """What `run` would find wrong only after pre-training, checked before it (ValueError with
  the fix; nothing is written or compiled): the directories, the fine-tuning fields
  (`optim.validate`, `pretrained.validate`; `optim.freeze_summary` on the abstract model) and,
  for runs already in ``work_dir/runs``, that they were trained with the same configuration
  (another --freeze or --backbone_lr_multiplier needs another directory).
  """
  import math
  from anp_jax import checkpointing, models, optim, pretrained
  from anp_jax.errors import InitFromError
  if preset not in PRESETS:
    raise ValueError(f'Unknown preset {preset!r}; use one of {sorted(PRESETS)}.')
  if out_dir is not None:
    _check_directory('--out', out_dir)
  _check_directory('--workdir', work_dir)
  if data_dir is not None:
    _check_directory('--data_dir', data_dir)
  data_dir = data_dir or os.path.join(work_dir, 'tfds')
  if not (isinstance(backbone_lr_multiplier, (int, float))
          and math.isfinite(backbone_lr_multiplier) and backbone_lr_multiplier >= 0):
    raise ValueError(f'--backbone_lr_multiplier={backbone_lr_multiplier!r}: use a finite number '
                     '>= 0 (the fraction of the learning rate for the pre-trained parameters).')
  config = _finetune_config(preset, work_dir, data_dir, freeze, backbone_lr_multiplier)
  probe = config.copy_and_resolve_references()
  # The pre-training run may not exist yet: check the fields against an existing directory
  # (validate reads nothing from it).
  if not os.path.isdir(probe.init_from):
    probe.init_from = os.path.dirname(os.path.abspath(__file__))
  try:
    optim.validate(probe)
    pretrained.validate(probe)
    s = probe.synthetic
    model = models.create_model(probe, models.Heads(s.num_pairs, s.num_adjectives, s.num_nouns))
    optim.freeze_summary(probe, model)
  except InitFromError as e:
    raise ValueError(str(e).replace('config.freeze', '--freeze').replace(
        'config.backbone_lr_multiplier', '--backbone_lr_multiplier')) from None
  if not seeds or len(set(seeds)) != len(seeds) or any(int(s) < 0 for s in seeds):
    raise ValueError(f'--seeds must be distinct integers >= 0, got {list(seeds)}.')
  configs = {run_name(kind, seed): c for seed in seeds
             for kind, c in seed_configs(preset, work_dir, data_dir, freeze,
                                         backbone_lr_multiplier, seed).items()}
  for name, c in configs.items():
    run_dir = os.path.join(work_dir, 'runs', name)
    if not (checkpointing.has_checkpoint(run_dir)
            and os.path.isfile(os.path.join(run_dir, 'config.json'))):
      continue
    try:
      recorded = default.read_run_config(run_dir)
    except (OSError, ValueError) as e:
      raise ValueError(f'{run_dir}/config.json is unreadable ({e}); use another --out (or '
                       '--workdir) for this run.') from None
    saved = {k: v for k, v in checkpointing.identity(recorded).items() if v is not None}
    diff = [f'{k}: {a!r} there vs {b!r} now' for k, (a, b) in
            checkpointing.identity_diff(saved, checkpointing.identity(c)).items()]
    if diff:
      raise ValueError(f'{run_dir} holds a {name} run of another configuration '
                       f'({"; ".join(diff)}). Use another --out (or --workdir) for this variant, '
                       'or the flags of that run to resume or re-report it.')


def seed_configs(preset: str, work_dir: str, data_dir: str, freeze: str,
                 backbone_lr_multiplier: float, seed: int) -> Dict:
  """The three runs of one seed, in order: {'pretrain' / 'finetune' / 'scratch': config}
  (their directories: `run_name`)."""
  p = PRESETS[preset]
  return {'pretrain': task_config(preset, 'a', p['pretrain_steps'], data_dir, seed=seed),
          'finetune': _finetune_config(preset, work_dir, data_dir, freeze,
                                       backbone_lr_multiplier, seed),
          'scratch': task_config(preset, 'b', p['finetune_steps'], data_dir, seed=seed)}


def plan(work_dir: str, preset: str = 'cpu', data_dir: Optional[str] = None,
         seeds: Sequence[int] = (0,)) -> Dict:
  """What `run` trains for `seeds`, without training or writing anything: the runs (name,
  task, steps, batch, whether already finished) and the estimated seconds of the rest
  (training images and evaluations, at 1/3 the cost per image, at the preset's
  ``images_per_s``, plus ``overhead_s`` per run: the estimate of the studies' dry runs)."""
  p = PRESETS[preset]
  data_dir = data_dir or os.path.join(work_dir, 'tfds')
  runs, seconds = [], 0.0
  for seed in seeds:
    for kind, config in seed_configs(preset, work_dir, data_dir, '', 1.0, seed).items():
      s = config.synthetic
      directory = os.path.join(work_dir, 'runs', run_name(kind, seed))
      finished = os.path.exists(os.path.join(directory, 'final_metrics.json'))
      steps = int(config.num_train_steps)
      evals = -(-steps // p['eval_every_steps'])
      eval_images = 2 * s.num_pairs * s.eval_per_class  # Validation and test.
      if not finished:
        seconds += ((steps * p['batch'] + evals * eval_images / 3) / p['images_per_s']
                    + p['overhead_s'])
      runs.append({'name': run_name(kind, seed), 'task': 'A' if kind == 'pretrain' else 'B',
                   'anps': s.num_pairs, 'train_images': s.num_pairs * s.train_per_class,
                   'steps': steps, 'batch': p['batch'], 'finished': finished,
                   'init_from': run_name('pretrain', seed) if kind == 'finetune' else ''})
  return {'runs': runs, 'seconds': seconds, 'images_per_s': p['images_per_s'],
          'overhead_s': p['overhead_s']}


def run(work_dir: str, preset: str = 'cpu', data_dir: Optional[str] = None,
        freeze: str = '', backbone_lr_multiplier: float = 1.0, out_dir: Optional[str] = None,
        seed: int = 0) -> Dict:
  """Trains pretrain, finetune and scratch into ``work_dir/runs``; returns `summarize`'s dict.

  A finished run directory is not retrained: train_and_evaluate resumes it (and re-evaluates);
  an interrupted one resumes from its last checkpoint. Either way the curves come from the runs'
  whole logs (`_train`), so the summary is that of one uninterrupted invocation. Bad input is
  a ValueError before anything trains (`check`, with the report's `out_dir` when given).
  """
  check(work_dir, preset, data_dir, freeze, backbone_lr_multiplier, out_dir=out_dir,
        seeds=(seed,))
  p = PRESETS[preset]
  data_dir = data_dir or os.path.join(work_dir, 'tfds')
  configs = seed_configs(preset, work_dir, data_dir, freeze, backbone_lr_multiplier, seed)
  results = {kind: _train(config, os.path.join(work_dir, 'runs', run_name(kind, seed)),
                          p['eval_every_steps'])
             for kind, config in configs.items()}
  summary = summarize(results)
  summary.update(preset={k: v for k, v in p.items()}, seed=seed)
  return summary


def steps_to_target(curve: Sequence, target: float) -> Optional[int]:
  """First evaluated step whose accuracy is >= `target` (None: never reached)."""
  for step, acc in curve:
    if acc >= target:
      return int(step)
  return None


def summarize(results: Dict[str, Dict]) -> Dict:
  """Steps-to-target of finetune vs scratch for fractions of the scratch run's best accuracy."""
  best_scratch = max(a for _, a in results['scratch']['curve'])
  rows = []
  for fraction in TARGET_FRACTIONS:
    target = fraction * best_scratch
    rows.append({'fraction': fraction, 'target': target,
                 'finetune': steps_to_target(results['finetune']['curve'], target),
                 'scratch': steps_to_target(results['scratch']['curve'], target)})
  return {'runs': results, 'best_scratch': best_scratch,
          'best_finetune': max(a for _, a in results['finetune']['curve']),
          'steps_to_target': rows}
