"""A real one-node SLURM cluster (munged + slurmctld + slurmd on 127.0.0.1) for the SLURM tests.

.ci/run installs Debian's slurm-wlm and munge; `cluster(directory)` writes a slurm.conf with free
ports into `directory` (state, spool, logs, munge key and socket all stay there), starts the
daemons, yields the environment that points the SLURM commands at it, and on the way out (also
after a failure) cancels every job, waits for their processes to end, and stops the daemons.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import time

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
AuthInfo=socket={d}/munge.sock,cred_expire={requeue_hold}
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

# A requeued job waits AuthInfo's cred_expire seconds (default 120) before it may start again;
# shorter here so that the requeue tests take seconds, not minutes. (It is also the lifetime of a
# job step's credential, which must outlast a step's launch, hence not lower.)
REQUEUE_HOLD_S = 20

# Every SLURM and munge command the tests run ends within this (a daemon that stopped answering
# fails the test with the command named, instead of hanging it).
COMMAND_TIMEOUT_S = 60

COMMANDS = ('munged', 'mungekey', 'slurmctld', 'slurmd', 'sbatch', 'sinfo', 'squeue', 'scancel',
           'scontrol')


def _need(binary):
  path = shutil.which(binary)
  assert path, (f'{binary} not found: install Debian\'s slurm-wlm and munge '
                '(apt-get install slurm-wlm munge), as .ci/run does.')
  return path


def command(args, **kwargs) -> subprocess.CompletedProcess:
  """`subprocess.run(args, **kwargs)` within COMMAND_TIMEOUT_S seconds."""
  return subprocess.run(args, timeout=COMMAND_TIMEOUT_S, **kwargs)


def _free_ports(n):
  """n free ports below the kernel's ephemeral range, for the daemons to bind seconds later.

  Ports from bind(('', 0)) come from the ephemeral range, where every other test's binds to
  port 0 and outgoing connections (gloo, gRPC) take theirs: one could take a daemon's port
  before the daemon starts. Below the range only programs that name a port bind."""
  import random
  import socket
  try:
    with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
      low = int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    low = 32768
  candidates = random.sample(range(20000, max(low, 20200)), 200)
  ports = []
  for port in candidates:
    with socket.socket() as s:
      try:
        s.bind(('127.0.0.1', port))
      except OSError:
        continue
    ports.append(port)
    if len(ports) == n:
      return ports
  raise RuntimeError(f'No {n} free ports found among {candidates[:10]}...')


def job_processes(directory, **variables):
  """Pids of live processes whose environment names this cluster's slurm.conf (job steps'
  processes inherit SLURM_CONF) and has each of `variables` (e.g. SLURM_JOB_ID='3',
  SLURM_PROCID='1')."""
  wanted = [f'SLURM_CONF={directory}/slurm.conf'.encode()] + [
      f'{k}={v}'.encode() for k, v in variables.items()]
  found = []
  for name in os.listdir('/proc'):
    if not name.isdigit() or int(name) == os.getpid():
      continue
    try:
      with open(f'/proc/{name}/environ', 'rb') as f:
        environ = f.read().split(b'\0')
    except OSError:
      continue
    if all(w in environ for w in wanted):
      found.append(int(name))
  return found


def _cancel_all(env, timeout=60):
  """Cancels every job of the cluster and waits (bounded) until none is left running."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    try:
      out = command(['squeue', '-h', '-o', '%i'], env=env, capture_output=True, text=True)
      jobs = out.stdout.split()
      if out.returncode == 0 and not jobs:
        break
      command(['scancel', '--full'] + jobs, env=env, capture_output=True)
    except subprocess.TimeoutExpired:  # Try again until the deadline; the daemons stop anyway.
      pass
    time.sleep(1)


@contextlib.contextmanager
def cluster(directory):
  """Runs the one-node cluster in `directory` (a fresh temporary folder); yields its env."""
  for b in COMMANDS:
    _need(b)
  d = directory
  for sub in ('state', 'spool'):
    (d / sub).mkdir()
  conf = d / 'slurm.conf'
  ctld_port, d_port = _free_ports(2)
  conf.write_text(SLURM_CONF.format(d=d, ctld_port=ctld_port, d_port=d_port,
                                    requeue_hold=REQUEUE_HOLD_S))
  env = dict(os.environ, SLURM_CONF=str(conf))
  command(['mungekey', '-c', '-f', '-k', str(d / 'munge.key')], check=True)
  os.chmod(d / 'munge.key', 0o600)
  daemons = []
  command(['munged', '--force', f'--key-file={d}/munge.key', f'--socket={d}/munge.sock',
                  f'--pid-file={d}/munged.pid', f'--log-file={d}/munged.log',
                  f'--seed-file={d}/munged.seed'], check=True)
  try:
    daemons.append(subprocess.Popen(['slurmctld', '-D', '-i', '-f', str(conf)], env=env,
                                    stdout=open(d / 'ctld.out', 'w'), stderr=subprocess.STDOUT))
    daemons.append(subprocess.Popen(['slurmd', '-D', '-N', 'localhost', '-f', str(conf)], env=env,
                                    stdout=open(d / 'd.out', 'w'), stderr=subprocess.STDOUT))
    deadline = time.time() + 90
    while True:
      out = command(['sinfo', '-h', '-o', '%T'], env=env, capture_output=True, text=True)
      if out.returncode == 0 and out.stdout.strip() in ('idle', 'mixed'):
        break
      if time.time() > deadline or any(p.poll() is not None for p in daemons):
        logs = '\n'.join((d / f).read_text()[-2000:] for f in ('ctld.out', 'd.out')
                         if (d / f).exists())
        raise RuntimeError(f'SLURM did not come up: {out.stdout} {out.stderr}\n{logs}')
      time.sleep(1)
    yield env
  finally:
    if all(p.poll() is None for p in daemons) and len(daemons) == 2:
      _cancel_all(env)
    for p in daemons:
      p.send_signal(signal.SIGTERM)
    for p in daemons:
      try:
        p.wait(timeout=30)
      except subprocess.TimeoutExpired:
        p.kill()
    # slurmd leaves running job steps alone when it stops: end any that the cancel missed.
    for pid in job_processes(d):
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    pid = d / 'munged.pid'
    if pid.exists():
      try:
        os.kill(int(pid.read_text().strip()), signal.SIGTERM)
      except (ProcessLookupError, ValueError):
        pass


def example_script(dest):
  """The shipped experiments/slurm/train.sbatch, written to `dest` without its GPU request (the
  tests' cluster has none); the tests give the sizes on sbatch's command line, which overrides
  the script's #SBATCH lines."""
  text = open(os.path.join(ROOT, 'experiments', 'slurm', 'train.sbatch')).read()
  dest.write_text('\n'.join(l for l in text.splitlines() if '--gpus-per-node' not in l) + '\n')
  return dest


def job_info(env, job_id) -> dict:
  """`scontrol show job` of `job_id` as a dict (JobState, Restarts, ExitCode, Reason, ...); {}
  once the controller has forgotten the job."""
  out = command(['scontrol', 'show', 'job', '-o', str(job_id)], env=env,
                       capture_output=True, text=True)
  if out.returncode != 0:
    return {}
  return dict(field.split('=', 1) for field in out.stdout.split() if '=' in field)
