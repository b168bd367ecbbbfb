"""The paper recipe: ResNet-50 on the MVSO-style `anp` dataset at 224 px (MUSA2 2017).

553 ANPs (117 adjectives, 167 nouns), SGD momentum 0.9, batch 128, lr 0.01, weight decay 1e-4,
224 px crops and flips. Published: 23.4 % top-1 / 48.2 % top-5 on ANPs, fine-tuned from ImageNet
weights: download torchvision's ResNet-50 file yourself (nothing is downloaded at run time) and
pass it as ``init_from`` (.pth needs PyTorch; .safetensors does not; see docs/fine-tuning.md). The ANP head (553 vs 1000 classes) and the adjective/noun
heads are re-initialised automatically. A GPU-node run:

  ./run.sh --config=anp_jax/configs/musa2_resnet50.py --config.data_dir=/path/to/prepared \
      --config.init_from=~/weights/resnet50-11ad3fa6.pth

Without init_from the same recipe trains from scratch (expect far lower accuracy than published).
"""

from anp_jax.configs import default


def get_config():
  c = default.get_config()
  c.dataset = 'anp'
  c.image_size = 224
  c.augment = 'inception'
  # ~300k photos: each process reads its own examples from the files rather than holding the
  # whole encoded split in memory (docs/data.md).
  c.cache = False
  # Choices (learning rate, stopping) on validation, published figures on the held-out test split.
  c.evals.test = dict(kind='classification', split='test')
  c.model.name = 'resnet50'
  c.model.dtype = 'bfloat16'
  c.model.zero_init_last_bn = True
  c.bn_mode = 'per_device'
  c.optimizer = 'sgd'
  c.momentum = 0.9
  c.weight_decay = 1e-4
  c.batch_size = 128
  c.base_batch_size = 128  # The recipe's lr 0.01 is quoted for batch 128.
  c.base_lr = 0.01
  c.lr_scaling = 'linear'
  c.warmup_epochs = 0.0
  c.schedule = 'step'
  c.step_epochs = (10, 20)
  c.num_epochs = 30.0
  c.eval_batch_size = 256
  c.log_every_steps = 100
  c.eval_every_epochs = 1.0
  c.checkpoint_every_steps = 2000
  c.noise_scale = True
  return c
