"""A real one-node SLURM cluster (munged + slurmctld + slurmd on 127.0.0.1) runs the sbatch example.

The cluster is conftest's `slurm` fixture (tests/slurm_cluster.py): .ci/run installs Debian's
slurm-wlm and munge; the fixture writes a slurm.conf into a temporary directory, starts the
daemons and stops them afterwards.
"""

import os
import subprocess

import slurm_cluster
from conftest import config_flags, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sbatch_example_runs_two_tasks_as_one_jax_job(slurm, data_dir, tmp_path):
  env, _ = slurm
  workdir = tmp_path / 'work'
  out_file = tmp_path / 'job.out'
  flags = [f'--workdir={workdir}'] + config_flags(tiny_config(
      data_dir, num_train_steps=4, log_every_steps=2, batch_size=16, eval_batch_size=16))
  # The example script as shipped, with this one-node CPU cluster's sizes on the command line
  # (command-line options override its #SBATCH lines) and without its GPU request.
  script = slurm_cluster.example_script(tmp_path / 'train.sbatch')
  cmd = ['sbatch', '--wait', '--nodes=1', '--ntasks=2', '--ntasks-per-node=2',
         '--cpus-per-task=1', '--time=10', f'--output={out_file}', '--chdir', ROOT,
         str(script)] + flags
  job_env = dict(env, ANP_INIT_TIMEOUT='60', XLA_FLAGS='', JAX_PLATFORMS='cpu')
  result = subprocess.run(cmd, env=job_env, capture_output=True, text=True, timeout=600)
  log = out_file.read_text() if out_file.exists() else ''
  assert result.returncode == 0, (result.stdout, result.stderr, log[-5000:])
  assert 'process 0/2' in log and 'process 1/2' in log, log[-5000:]
  assert '2 process(es)' in log
  assert 'Done in' in log
  assert (workdir / 'final_metrics.json').exists()
