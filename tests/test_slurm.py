"""A real one-node SLURM cluster (munged + slurmctld + slurmd on 127.0.0.1) runs the sbatch example.

.ci/run installs Debian's slurm-wlm and munge; the fixture writes a slurm.conf into a temporary
directory, starts the daemons and stops them afterwards.
"""

import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import config_flags, free_port, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SLURM_CONF = """\
ClusterName=anptest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=10
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _need(binary):
  path = shutil.which(binary)
  assert path, (f'{binary} not found: install Debian\'s slurm-wlm and munge '
                '(apt-get install slurm-wlm munge), as .ci/run does.')
  return path


@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
  for b in ('munged', 'mungekey', 'slurmctld', 'slurmd', 'sbatch', 'sinfo'):
    _need(b)
  d = tmp_path_factory.mktemp('slurm')
  for sub in ('state', 'spool'):
    (d / sub).mkdir()
  conf = d / 'slurm.conf'
  ctld_port = free_port()
  d_port = free_port()
  while d_port == ctld_port:
    d_port = free_port()
  conf.write_text(SLURM_CONF.format(d=d, ctld_port=ctld_port, d_port=d_port))
  env = dict(os.environ, SLURM_CONF=str(conf))
  subprocess.run(['mungekey', '-c', '-f', '-k', str(d / 'munge.key')], check=True)
  os.chmod(d / 'munge.key', 0o600)
  daemons = []
  subprocess.run(['munged', '--force', f'--key-file={d}/munge.key', f'--socket={d}/munge.sock',
                  f'--pid-file={d}/munged.pid', f'--log-file={d}/munged.log',
                  f'--seed-file={d}/munged.seed'], check=True)
  try:
    daemons.append(subprocess.Popen(['slurmctld', '-D', '-i', '-f', str(conf)], env=env,
                                    stdout=open(d / 'ctld.out', 'w'), stderr=subprocess.STDOUT))
    daemons.append(subprocess.Popen(['slurmd', '-D', '-N', 'localhost', '-f', str(conf)], env=env,
                                    stdout=open(d / 'd.out', 'w'), stderr=subprocess.STDOUT))
    deadline = time.time() + 90
    while True:
      out = subprocess.run(['sinfo', '-h', '-o', '%T'], env=env, capture_output=True, text=True)
      if out.returncode == 0 and out.stdout.strip() in ('idle', 'mixed'):
        break
      if time.time() > deadline or any(p.poll() is not None for p in daemons):
        logs = '\n'.join((d / f).read_text()[-2000:] for f in ('ctld.out', 'd.out')
                         if (d / f).exists())
        raise RuntimeError(f'SLURM did not come up: {out.stdout} {out.stderr}\n{logs}')
      time.sleep(1)
    yield env, d
  finally:
    for p in daemons:
      p.send_signal(signal.SIGTERM)
    for p in daemons:
      try:
        p.wait(timeout=30)
      except subprocess.TimeoutExpired:
        p.kill()
    pid = d / 'munged.pid'
    if pid.exists():
      try:
        os.kill(int(pid.read_text().strip()), signal.SIGTERM)
      except (ProcessLookupError, ValueError):
        pass


def test_sbatch_example_runs_two_tasks_as_one_jax_job(slurm, data_dir, tmp_path):
  env, _ = slurm
  workdir = tmp_path / 'work'
  out_file = tmp_path / 'job.out'
  flags = [f'--workdir={workdir}'] + config_flags(tiny_config(
      data_dir, num_train_steps=4, log_every_steps=2, batch_size=16, eval_batch_size=16))
  # The example script as shipped, with this one-node CPU cluster's sizes on the command line
  # (command-line options override its #SBATCH lines) and without its GPU request.
  script = tmp_path / 'train.sbatch'
  text = open(os.path.join(ROOT, 'experiments', 'slurm', 'train.sbatch')).read()
  script.write_text('\n'.join(l for l in text.splitlines() if '--gpus-per-node' not in l) + '\n')
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
