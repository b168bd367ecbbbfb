"""The batch-size sweep's ``cpu`` preset: the experiment on a 2-core machine, ≤ 45 min.

  .venv/bin/python experiments/batch_size_sweep.py --preset cpu --out workdirs/bs_sweep

ResNet-20 at width 0.5 on the generated 32-class ANP dataset drawn at 16 px (8,000 train / 1,696
eval images), 2 simulated CPU devices (ghost BN over 16 images, so the smallest batch still spans
two devices and B_simple is measured for every batch), batches 32, 64, ..., 1024, 3 arms, 1 seed —
18 runs — of 10 epochs each, nesterov, base lr 0.2 per 256, 1 epoch of warmup, cosine decay,
evaluation every half epoch, target 25 % ANP top-1 (chance 3.1 %). Measured with the linear rule
and warmup (``experiments/results/bs_sweep_cpu/``): B=256 reaches it after 83 steps (2.7 epochs)
and ends at 51.1 %; B=1024 (lr 0.8) after 56 steps (7.2 epochs), ending at 29.8 % — the
large-batch loss of accuracy at a fixed epoch budget, and far from perfect scaling in steps. No
gradient accumulation: on XLA:CPU the accumulation loop runs ~6x slower per image (115 vs 685
img/s measured), and 512 per device fits easily.

Time estimate: ResNet-20 width 1 at 32 px trains at ~120 img/s at batch 128 on this machine (90
measured while other jobs loaded it); width 0.5 quarters the FLOPs and 16 px quarters them again,
which measured 10.4x faster (934 vs 90 img/s side by side), i.e. ~1,250 img/s for the bare train
step on free cores; with the input pipeline and two simulated devices sharing the cores assume 800
img/s. 18 runs x 10 epochs x 8,000 images = 1.44 M images ≈ 1,800 s; evaluating every half epoch
adds 20 x 1,696 images per run at ~1/3 of the cost of a training image (+14 %, ≈ 250 s);
compilation and set-up ≈ 20 s per run (360 s). Total ≈ 2,400 s ≈ 40 min on 2 free cores (other
jobs on the same cores stretch it proportionally). ``--dry_run`` prints the same estimate for any
grid.
"""

from anp_jax.configs import default

# Goyal et al.'s comparison: linear rule + warmup, linear without warmup, no scaling + warmup.
GOYAL_ARMS = (('linear', True), ('linear', False), ('none', True))


def get_config():
  """The run config every grid point starts from (the sweep sets batch, rule, warmup, seed)."""
  c = default.get_config()
  c.synthetic.image_size = 16
  c.synthetic.train_per_class, c.synthetic.eval_per_class = 250, 53
  c.image_size = 16
  c.crop_padding = 2
  c.model.name, c.model.width = 'resnet20', 0.5
  c.bn_mode, c.bn_group_size = 'ghost', 16
  c.optimizer = 'nesterov'
  c.base_lr, c.base_batch_size = 0.2, 256
  c.warmup_epochs = 1.0
  c.schedule = 'cosine'
  c.eval_batch_size = 256
  c.eval_every_epochs = 0.5
  c.checkpoint_every_minutes = 0
  c.num_epochs = 10.0
  return c


def get_sweep():
  """The grid and the budget (see `anp_jax.research.sweep.SweepPreset`)."""
  # No accumulation on CPU (512 per device is the largest batch over 2 devices): XLA:CPU runs
  # the accumulation loop's convolutions ~6x slower per image (115 vs 685 img/s measured).
  return dict(batch_sizes=(32, 64, 128, 256, 512, 1024), arms=GOYAL_ARMS, target_top1=0.25,
              max_per_device_batch=512, checkpoint_every_epochs=1.0, cpu_devices=2,
              images_per_s=800.0, overhead_s=20.0)
