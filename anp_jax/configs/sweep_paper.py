"""The batch-size sweep's ``paper`` preset: ResNet-50 at 224 px on the prepared ``anp`` dataset
(MUSA2 recipe's data, augmentation and 30-epoch step schedule) with Goyal et al.'s large-batch
recipe: SGD momentum 0.9, lr 0.1 per 256, 5 warmup epochs, ghost BN over 32 images per worker,
zero-init last BN γ, bf16; batches 256, 512, ..., 8192, at most 256 per device per micro-batch;
target 20 % top-1. For a GPU cluster (multi-process jobs are set up from SLURM / ANP_* variables,
as in main.py):

  .venv/bin/python experiments/batch_size_sweep.py --preset paper --out /scratch/bs \\
      --config.data_dir=/d/anp

The time estimate assumes ~1,000 img/s per GPU (ResNet-50, bf16, 224 px), scaled by devices.
"""

from anp_jax.configs import musa2_resnet50

# Goyal et al.'s linear rule with warmup, against the same rule without warmup and no scaling.
GOYAL_ARMS = (('linear', True), ('linear', False), ('none', True))


def get_config():
  c = musa2_resnet50.get_config()
  c.optimizer, c.momentum, c.weight_decay = 'sgd', 0.9, 1e-4
  c.base_lr, c.base_batch_size = 0.1, 256
  c.warmup_epochs = 5.0
  c.bn_mode, c.bn_group_size = 'ghost', 32
  c.model.zero_init_last_bn = True
  c.eval_batch_size = 1024
  c.eval_every_epochs = 1.0
  c.progress_bar = False
  c.num_epochs = 30.0
  return c


def get_sweep():
  return dict(batch_sizes=(256, 512, 1024, 2048, 4096, 8192), arms=GOYAL_ARMS, target_top1=0.2,
              max_per_device_batch=256, checkpoint_every_epochs=1.0, cpu_devices=0,
              images_per_s=0.0, images_per_s_per_device=1000.0, overhead_s=120.0)
