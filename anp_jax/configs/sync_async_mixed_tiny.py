"""The sync/async/mixed experiment's ``tiny`` preset (tests, CI; ~75 s): the tests' dataset and
ResNet-8, sync + async-4 + local-n2-h2, half an epoch each, one learning rate.

  .venv/bin/python experiments/sync_async_mixed.py --preset tiny --out /tmp/sam
"""

from anp_jax.configs import sweep_tiny
from anp_jax.configs.sync_async_mixed_cpu import experiment_config


def get_config():
  c = experiment_config(sweep_tiny.get_config(), 32, 0.5, 0.25)
  c.evals = {'eval': {'kind': 'classification', 'split': 'validation'},
             'test': {'kind': 'classification', 'split': 'test'}}
  return c


def get_sweep():
  return dict(workers=(4,), nodes=(2,), sync_every=(2,), aware=(False,), cpu_devices=8,
              lr_grid=(1.0,), target_top1=0.2, images_per_s=2000.0, overhead_s=10.0)
