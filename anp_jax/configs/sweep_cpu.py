"""The batch-size sweep's ``cpu`` preset: Shallue et al.'s protocol on a 2-core machine.

  .venv/bin/python experiments/batch_size_sweep.py --preset cpu --out DIR --stop_at_target
  .venv/bin/python experiments/batch_size_sweep.py --preset cpu:goyal --out DIR2 --lr_from DIR
  .venv/bin/python experiments/batch_size_sweep.py --preset cpu --out DIR --dry_run  # runs + cost

The proxy: ResNet-20 at width 0.5 on the generated 32-class ANP dataset drawn at 16 px (8,000
train / 1,696 validation / 1,696 test images), 2 simulated CPU devices, ghost BN over 16 images
(so every batch spans two devices and B_simple is measured at every batch), nesterov, 1 epoch of
warmup, cosine decay, evaluation of both the validation and the test split every half epoch,
target 25 % ANP top-1 (chance 3.1 %). Choices (learning rate, stopping) on validation; published
figures on test.

Variants:

* ``cpu`` (default) — steps to the target (Shallue, Lee, Antognini, Sohl-Dickstein, Frostig and
  Dahl, "Measuring the effects of data parallelism on neural network training", JMLR 2019):
  batches 32 ... 1024, 3 seeds, the learning rate tuned per batch size on a x2 grid (0.5, 1, 2 x
  the square-root rule's 0.4 per 256: 0.14 at B=32, 0.8 at B=1024) extended beyond an edge
  choice at most twice, a 16-epoch budget (125 steps at B=1024, 4,000 at B=32: the target is
  crossed well before 60 % of it). With ``--stop_at_target`` each run stops at the later of its
  validation and test crossings, so only runs that miss pay for the whole budget.
* ``cpu:goyal`` — final test accuracy at a fixed example budget (Goyal et al., "Accurate, large
  minibatch SGD: training ImageNet in 1 hour", 2017): the same batches and seeds for 6 epochs
  each, at the rate the ``cpu`` sweep chose for the batch (``--lr_from``; it was tuned for steps
  to the target under the 16-epoch budget, not for the 6-epoch accuracy).

Time: ``--dry_run`` estimates 288 min for the 54 runs of ``cpu`` and up to 236 min for its 36
possible extension runs, and 39 min for the 18 runs of ``cpu:goyal`` (the costs measured in
experiments/results/study_throughput/costs.json, docs/performance.md, as if every run trained
its whole budget: an upper bound with ``--stop_at_target``). Measured (docs/studies.md, section 1): the ``cpu`` sweep with
``--stop_at_target``, its runs stopping at ~2-7 epochs, took 66 runs (54 + 12 extensions), 1.06
h of training and ~1.4 h wall on the loaded 2-core machine (~700 img/s, load 6-8; ~12 s of
set-up per run, 30 s when its compilation is not in JAX's persistent cache,
``JAX_COMPILATION_CACHE_DIR``); ``cpu:goyal`` 13 min of training, 15 min wall.
"""

from anp_jax.configs import default

# The scaling rule only centres the rate grid: the rate is tuned per batch size.
SHALLUE_ARMS = (('sqrt', True),)
VARIANTS = ('shallue', 'goyal')


def _check(variant: str) -> str:
  variant = variant or 'shallue'
  if variant not in VARIANTS:
    raise ValueError(f'Unknown variant {variant!r} of sweep_cpu: use one of {list(VARIANTS)}.')
  return variant


def get_config(variant: str = 'shallue'):
  """The run config every grid point starts from (the sweep sets batch, rule, warmup, seed)."""
  variant = _check(variant)
  c = default.get_config()
  c.synthetic.image_size = 16
  c.synthetic.train_per_class, c.synthetic.eval_per_class = 250, 53  # Test: as validation.
  c.image_size = 16
  c.crop_padding = 2
  c.model.name, c.model.width = 'resnet20', 0.5
  c.bn_mode, c.bn_group_size = 'ghost', 16
  c.optimizer = 'nesterov'
  c.base_lr, c.base_batch_size, c.lr_scaling = 0.4, 256, 'sqrt'
  c.warmup_epochs = 1.0
  c.schedule = 'cosine'
  c.eval_batch_size = 256
  c.eval_every_epochs = 0.5
  c.evals = {'eval': {'kind': 'classification', 'split': 'validation'},
             'test': {'kind': 'classification', 'split': 'test'}}
  c.checkpoint_every_minutes = 0
  c.num_epochs = 16.0 if variant == 'shallue' else 6.0
  return c


def get_sweep(variant: str = 'shallue'):
  """The grid and the budget (see `anp_jax.research.sweep.SweepPreset`)."""
  variant = _check(variant)
  # No accumulation on CPU (512 per device is the largest batch over 2 devices): XLA:CPU runs
  # the accumulation loop's convolutions ~6x slower per image (115 vs 685 img/s measured).
  grid = dict(lr_search=(0.5, 1.0, 2.0), lr_extensions=2) if variant == 'shallue' else {}
  return dict(batch_sizes=(32, 64, 128, 256, 512, 1024), arms=SHALLUE_ARMS, target_top1=0.25,
              seeds=(0, 1, 2), max_per_device_batch=512, checkpoint_every_epochs=1.0,
              cpu_devices=2, images_per_s=520.0, overhead_s=15.0, **grid)
