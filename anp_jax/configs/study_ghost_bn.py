"""Study preset: ghost BatchNorm group size at a large batch (Hoffer, Hubara and Soudry, "Train
longer, generalize better: closing the generalization gap in large batch training of neural
networks", NeurIPS 2017).

  .venv/bin/python experiments/study.py --preset ghost_bn --out workdirs/ghost_bn
  .venv/bin/python experiments/study.py --preset ghost_bn --out DIR --dry_run   # runs + estimate
  .venv/bin/python experiments/study.py --preset ghost_bn:tiny --out /tmp/gbn   # tests (~1 min)

Question: at a large batch (B = 512, 2 devices x 256), does normalising over small "ghost"
batches instead of the whole batch close part of the accuracy gap of large-batch training, as
Hoffer et al. found? Points: ghost BN over 16 and 128 images, and BN over the whole global batch
of 512 (the large-batch baseline). Each at 3 seeds and base lr x 0.5, 1, 2 (chosen per point on
validation; extended x2 beyond an edge choice at most once): 27 runs, up to 9 more.

The proxy of the batch-size sweep's ``cpu`` preset (ResNet-20 width 0.5 at 16 px on the
generated 32-class ANP dataset, 8,000 training images; nesterov, 0.4 per 256 with the
square-root rule, so 0.57 at B=512; 1 warmup epoch, cosine) with the Goyal curve's 6-epoch
budget (94 steps at B=512), evaluation of both splits every half epoch, target 25 % ANP top-1 on
validation. Every run trains its whole budget: the question is the final test accuracy (Hoffer
et al.'s generalization gap), steps to the target are reported beside it.

Time (``--dry_run`` prints it for any overrides): 27 runs x 6 epochs at ~15 s an epoch with the
evaluations (~700 img/s of training on the loaded 2 cores) + ~15 s set-up per run ≈ 47 min;
each extension run ≈ 1.8 min. ``:tiny`` is the tests' variant: ResNet-8 on the
tests' 8-class dataset, B=32 on 8 devices, ghost groups of 2 against global BN, 2 seeds, half
an epoch.
"""

from anp_jax.configs import sweep_cpu, sweep_tiny


def _evaluate_test_split(c):
  """Choices on the validation split, published figures on the held-out test split."""
  c.evals = {'eval': {'kind': 'classification', 'split': 'validation'},
             'test': {'kind': 'classification', 'split': 'test'}}


def get_config(variant: str = 'cpu'):
  """The run config every point starts from; ``variant`` 'cpu' (the study) or 'tiny' (tests)."""
  if variant == 'tiny':
    c = sweep_tiny.get_config()
    c.batch_size = 32
    c.num_epochs = 0.5
    c.eval_every_epochs = 0.25
    c.target_value = 0.15
  elif variant == 'cpu':
    c = sweep_cpu.get_config('goyal')  # 6 epochs; validation and test evaluated.
    c.batch_size = 512
    c.target_value = 0.25
  else:
    raise ValueError(f'Unknown variant {variant!r} of study_ghost_bn: use cpu or tiny.')
  c.target_metric = 'eval/anp_top1'
  c.noise_scale = False  # Not a question of this study (and not measurable with global BN).
  _evaluate_test_split(c)
  return c


def get_sweep(variant: str = 'cpu'):
  """Points over bn_mode / bn_group_size, seeds, the rate grid and the time estimate."""
  if variant == 'tiny':
    return dict(points=[('g0002', {'bn_mode': 'ghost', 'bn_group_size': 2}),
                        ('global', {'bn_mode': 'global'})],
                seeds=(0, 1), lr_grid=(1.0,), lr_extensions=0, cpu_devices=8,
                checkpoint_every_epochs=0.25, images_per_s=2000.0, overhead_s=10.0,
                title='Ghost BN group size at a large batch (tiny test variant)')
  points = [(f'g{g:04d}', {'bn_mode': 'ghost', 'bn_group_size': g}) for g in (16, 128)]
  points.append(('global', {'bn_mode': 'global'}))
  return dict(points=points, seeds=(0, 1, 2), lr_grid=(0.5, 1.0, 2.0), lr_extensions=1,
              cpu_devices=2, checkpoint_every_epochs=1.0, images_per_s=520.0, overhead_s=15.0,
              title='Ghost BatchNorm group size at B = 512 (Hoffer et al. 2017)')
