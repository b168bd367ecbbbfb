"""`trainer.load_checkpoint` (the IPython handle) on a machine other than the one that trained
(relative and ~ paths: tests/test_checkpointing.py).

A checkpoint records each array's sharding (device ids of the job that saved it). Loading it for
inspection must not need those devices: a run saved by 8 devices (or by several processes, as
every SLURM job is) loads in a process that has one device, leaf for leaf equal.
"""

import subprocess
import sys

import numpy as np
import pytest

from anp_jax import trainer
from conftest import ROOT, leaves, subprocess_env, tiny_config

LOAD = '''
import sys
import numpy as np
import pytest
import jax
from anp_jax import runtime
runtime.configure(tensorflow=False)
from anp_jax import trainer
assert jax.device_count() == 1, jax.devices()
model, variables, config = trainer.load_checkpoint(sys.argv[1])
model.apply(variables, np.zeros((1, 16, 16, 3), np.float32), train=False)
np.savez(sys.argv[2], *[np.asarray(x) for x in jax.tree.leaves(variables)])
'''


@pytest.mark.slow(12)
def test_a_checkpoint_saved_on_8_devices_loads_on_one(data_dir, tmp_path):
  """Saved in this process (8 devices, the same as a `python -m anp_jax.main` child would use:
  only the loading side needs another device count, hence one child)."""
  workdir = tmp_path / 'run'
  trained = trainer.train_and_evaluate(
      tiny_config(data_dir, num_train_steps=3, checkpoint_every_steps=3), str(workdir))
  assert trained.setup.devices == 8
  _, here, _ = trainer.load_checkpoint(str(workdir))  # This process: 8 devices.
  saved = tmp_path / 'leaves.npz'
  out = subprocess.run([sys.executable, '-c', LOAD, str(workdir), str(saved)],
                       env=subprocess_env(1), capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  there = np.load(saved)
  expected = leaves(here)
  assert len(there.files) == len(expected) > 0
  for i, x in enumerate(expected):
    np.testing.assert_array_equal(there[f'arr_{i}'], np.asarray(x))


def test_reading_a_checkpoint_says_nothing_about_orbax_metadata(data_dir, tmp_path, caplog):
  """orbax warned 'Metadata file does not exist: .../checkpoints/3/state/_CHECKPOINT_METADATA' at
  every `load_checkpoint` and every init_from of an anp_jax run (twice per run of
  experiments/finetune.py): the file it looks for there is one level up, nothing is missing."""
  import logging
  from anp_jax import pretrained
  workdir = tmp_path / 'run'
  trainer.train_and_evaluate(tiny_config(data_dir, num_train_steps=3, checkpoint_every_steps=3),
                             str(workdir))
  with caplog.at_level(logging.INFO):
    trainer.load_checkpoint(str(workdir))
    assert pretrained.read_anp_jax(str(workdir))
  assert not [r for r in caplog.records if 'Metadata file' in r.getMessage()], caplog.text
