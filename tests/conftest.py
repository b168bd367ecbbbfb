"""Test set-up: 8 simulated CPU devices, a tiny generated dataset shared by the session."""

import os

if 'xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS', ''):
  # Subprocesses of the multi-process tests set their own count.
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_force_host_platform_device_count=8').strip()
# Tests compile for speed of compilation: most of the suite's time is compiling tiny programs that
# then run for a few steps. XLA's lowest CPU optimisation level makes each compile 2-3x cheaper;
# XLA:CPU's older elemental emitters instead of its MLIR fusion emitters halve it again (a tiny
# config's init + train + eval programs: 3.5 -> 1.4 s; the copy-insertion and scheduler flags take
# ~0.2 s more off). Every comparison in the suite is between programs compiled the same way; the
# README's IPython snippet (tests/test_readme.py) keeps XLA's defaults, as do users' runs.
# ANP_TEST_XLA_OPT=1: the whole suite with XLA's defaults.
TEST_XLA_FLAGS = ('' if os.environ.get('ANP_TEST_XLA_OPT') == '1' else
                  '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true '
                  '--xla_cpu_use_fusion_emitters=false '
                  '--xla_cpu_copy_insertion_use_region_analysis=false '
                  '--xla_cpu_enable_concurrency_optimized_scheduler=false')
if TEST_XLA_FLAGS and 'xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('CUDA_VISIBLE_DEVICES', '')
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  # Most tests compile the same tiny programs (and subprocesses inherit the environment): XLA's
  # persistent cache, fresh for each session, turns their repeats into loads, which cuts the
  # suite's time by about 3x. Set ANP_TEST_XLA_CACHE to keep one between sessions.
  import atexit
  import shutil
  import tempfile
  _keep = os.environ.get('ANP_TEST_XLA_CACHE')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _keep or tempfile.mkdtemp(prefix='anp_xla_cache_')
  if not _keep:
    atexit.register(shutil.rmtree, os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)
  os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'] = '0'

import contextlib  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

import slurm_cluster  # noqa: E402

from anp_jax import distributed, runtime, xla_flags  # noqa: E402
from anp_jax.configs import default, tiny  # noqa: E402

_NPROC_GIVEN = xla_flags.POOL_SIZE_VARIABLE in os.environ
runtime.configure()  # As every entry point: XLA:CPU flags, TensorFlow off the GPU, NPROC.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, 'tests')

TINY_SYNTHETIC = tiny.SYNTHETIC


def tiny_config(data_dir, **overrides):
  """`anp_jax/configs/tiny.py` on the dataset in `data_dir`, with dotted-key `overrides`
  (``tiny_config(d, **{'model.width': 1.0})``)."""
  c = tiny.get_config()
  c.data_dir = str(data_dir)
  c.update_from_flattened_dict(overrides)
  return c


def config_flags(config) -> list:
  """The ``--config.x=y`` flags that turn the default config into `config` (for the CLI)."""
  flags = []

  def walk(node, ref, prefix):
    for key in sorted(node.keys()):
      value, base = node[key], ref.get(key) if ref is not None else None
      if hasattr(value, 'keys'):
        walk(value, base, f'{prefix}{key}.')
      elif value != base:
        flags.append(f'--config.{prefix}{key}={value}')
  walk(config, default.get_config(), '')
  return flags


def main_cmd(data_dir, workdir, **overrides) -> list:
  """``python -m anp_jax.main`` on `tiny_config(data_dir, **overrides)` in `workdir`."""
  return ([sys.executable, '-m', 'anp_jax.main', f'--workdir={workdir}']
          + config_flags(tiny_config(data_dir, **overrides)))


def subprocess_env(devices: int = 8, **extra) -> dict:
  """The environment of a child JAX process with `devices` simulated CPU devices."""
  # PYTHONFAULTHANDLER: a child that `wait` finds hung dumps every thread's stack on SIGABRT.
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='2', JAX_PLATFORMS='cpu',
             PYTHONFAULTHANDLER='1',
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices} {TEST_XLA_FLAGS}'.strip())
  if not _NPROC_GIVEN:  # The child's own runtime.configure sizes its pool for its devices.
    env.pop(xla_flags.POOL_SIZE_VARIABLE, None)
  env.update({k: str(v) for k, v in extra.items()})
  return env


@contextlib.contextmanager
def port_nobody_serves():
  """A port held for the ``with`` block with nothing listening on it, for a job that must not
  reach a coordinator. Held, not closed at once (the usual free-port recipe): a port released
  at once can be handed to another test worker's job, whose coordinator the process under test
  would then join as a stranger (`distributed.reserve_port`: no bind to port 0 gets it)."""
  with distributed.reserve_port() as held:
    yield held.getsockname()[1]


def coordinator_like_listener(port: int) -> socket.socket:
  """What JAX's coordinator (gRPC) binds: [::]:port (0.0.0.0 without IPv6) with SO_REUSEADDR and
  SO_REUSEPORT, listening."""
  for family, wildcard in ((socket.AF_INET6, '::'), (socket.AF_INET, '0.0.0.0')):
    sock = None
    try:
      sock = socket.socket(family)
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
      sock.bind((wildcard, port))
    except OSError:
      if sock is not None:
        sock.close()
      if family == socket.AF_INET:
        raise
      continue
    sock.listen()
    return sock


# A process of a test job that is alive but stuck fails the job within these bounds, before
# `wait`'s time-out (480 s), with its traceback in its log: a collective (gloo) waits at most
# COLLECTIVE_TIMEOUT_S for the other processes (XLA's default: 30 min), a coordination-service
# barrier at most BARRIER_TIMEOUT_S (anp_jax's default: 3600 s).
COLLECTIVE_TIMEOUT_S = 240
BARRIER_TIMEOUT_S = 240


def multiprocess_env(num_processes, process_id, port, devices_per_process, **extra) -> dict:
  """Explicit multi-process mode on 127.0.0.1 (see anp_jax/distributed/)."""
  env = subprocess_env(devices_per_process, **dict(dict(
      ANP_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', ANP_NUM_PROCESSES=num_processes,
      ANP_PROCESS_ID=process_id, ANP_INIT_TIMEOUT=60, ANP_HEARTBEAT_TIMEOUT=15,
      ANP_BARRIER_TIMEOUT=BARRIER_TIMEOUT_S,
      # The jobs here share 2 busy cores with another test worker: pinned to one core each, a
      # starved process can fall more than 30 s behind the other at its first collective, and
      # gloo's context set-up gives up after 30 s. The split itself has its own test.
      ANP_PIN_CORES=0), **extra))
  if 'xla_cpu_collective_timeout_seconds' not in env['XLA_FLAGS']:
    env['XLA_FLAGS'] += f' --xla_cpu_collective_timeout_seconds={COLLECTIVE_TIMEOUT_S}'
  return env


def launch(cmd, num_processes, devices_per_process, tmp_path, cwd=ROOT, **extra):
  """Starts `cmd` as the processes of one job (logs in tmp_path/proc<i>.log). `cmd`, `cwd` and
  each `extra` environment variable may also be a function of the process id (a process that
  runs other flags, or another checkout). The coordinator's port stays reserved until the job
  ends (`finish`): a port released at once could be handed to another test worker's job before
  this job's coordinator binds it, and the two jobs would merge."""
  def of(value, pid):
    return value(pid) if callable(value) else value

  reservation = distributed.reserve_port()
  port = reservation.getsockname()[1]
  procs = []
  for pid in range(num_processes):
    log = open(tmp_path / f'proc{pid}.log', 'w')
    env = multiprocess_env(num_processes, pid, port, devices_per_process,
                           MP_OUT=tmp_path / f'out{pid}.json',
                           **{k: of(v, pid) for k, v in extra.items()})
    procs.append(subprocess.Popen(of(cmd, pid), env=env, stdout=log, stderr=subprocess.STDOUT,
                                  cwd=of(cwd, pid)))
  procs[0].port_reservation = reservation  # Closed by `finish` (or with the Popen object).
  return procs


def finish(procs, tmp_path, timeout=480) -> list:
  """Waits for a job from `launch` to end; returns each process's log (their exit codes are
  the `returncode`s of `procs`).

  A job still running after `timeout` s (the slowest takes ~90 s on a loaded 2-core machine) is
  a hang: every process still alive gets SIGABRT (Python's fault handler then writes all its
  threads' stacks to its log), and the test fails with each process's log tail. The time-out is
  below pytest's (pytest.ini), which would kill the test without those logs."""
  deadline = time.time() + timeout
  while time.time() < deadline and any(p.poll() is None for p in procs):
    time.sleep(0.2)
  reservation = getattr(procs[0], 'port_reservation', None)
  if reservation is not None:
    reservation.close()
  hung = [i for i, p in enumerate(procs) if p.poll() is None]
  if hung:
    for i in hung:
      procs[i].send_signal(signal.SIGABRT)
    for p in procs:
      try:
        p.wait(timeout=30)
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
  logs = [open(tmp_path / f'proc{i}.log').read() for i in range(len(procs))]
  if hung:
    pytest.fail(f'Job still running after {timeout} s (hung processes: {hung}):\n' + '\n'.join(
        f'--- process {i} (exit {p.returncode}) ---\n{log[-6000:]}'
        for i, (p, log) in enumerate(zip(procs, logs, strict=True))))
  return logs


def wait(procs, tmp_path, timeout=480):
  """`finish`, then asserts exit 0; returns each process's MP_OUT JSON."""
  logs = finish(procs, tmp_path, timeout)
  for p, log in zip(procs, logs, strict=True):
    assert p.returncode == 0, log[-4000:]
  return [json.load(open(tmp_path / f'out{i}.json')) for i in range(len(procs))]


def run_workers(config, num_processes, tmp_path, workdir=None, **extra):
  """Trains `config` in a job of `num_processes` processes x 8 / num_processes devices
  (tests/mp_worker.py); returns each process's result dict, with its final ``params`` and
  ``batch_stats`` leaves (numpy, in `jax.tree.leaves` order)."""
  import numpy as np
  procs = launch([sys.executable, os.path.join(TESTS, 'mp_worker.py')], num_processes,
                 8 // num_processes, tmp_path, MP_CONFIG=config.to_json(),
                 MP_WORKDIR=workdir or tmp_path / 'work', **extra)
  outs = wait(procs, tmp_path)
  for i, o in enumerate(outs):
    with np.load(tmp_path / f'out{i}.json.npz') as z:
      o['leaves'] = [z[f'arr_{j}'] for j in range(len(z.files))]
  return outs


def assert_leaves_close(got, want, **tol):
  """Leaf-by-leaf comparison of two lists of arrays of the same tree (both non-empty)."""
  import numpy as np
  assert len(want) > 0 and len(got) == len(want), (len(got), len(want))
  for i, (x, y) in enumerate(zip(got, want, strict=True)):
    assert np.shape(x) == np.shape(y), (i, np.shape(x), np.shape(y))
    if tol:
      np.testing.assert_allclose(x, y, err_msg=f'leaf {i}', **tol)
    else:
      np.testing.assert_array_equal(x, y, err_msg=f'leaf {i}')


# ----------------------------------------------------------------------------------------------
# Spreading the suite over pytest-xdist workers (test.sh: --dist loadfile --no-loadscope-reorder),
# and the fast tier.
#
# A worker takes a whole test file at a time (its module fixtures are built once), in the order
# of the collection, which this hook sets heaviest file first (longest-processing-time order):
# the tail is then a light file, not the one with the multi-process or SLURM jobs (xdist's own
# order, by number of tests, sent those last). A test's weight is what it took in the last
# recorded run alone on 2 idle cores (tests/durations.json: setup + call + teardown), else its
# `@pytest.mark.slow(seconds)`, else 1 s; a file's weight is the sum of its tests'. A file heavier
# than a fair share of the suite is split in two (its heavy tests in a second file of the same
# subject). (xdist_group marks cannot split a file: with pytest 9 the loadgroup mode of xdist 3.8
# no longer renames node ids, and every test becomes its own unit.)
#
# The fast tier (`./test.sh -m fast`, docs/testing.md): every test whose recorded time is at most
# FAST_TEST_S, and in each file that has none, its quickest test; a test not recorded yet counts
# as fast unless it is marked slow. tests/test_fast_tier.py checks that the tier touches every
# module and stays within its budget.
#
# ANP_TEST_RECORD_DURATIONS=1 ./test.sh records this run's times into tests/durations.json
# (merged with the entries of tests it did not run; on a quiet machine: they are the weights).

UNMARKED_SECONDS = 1.0
FAST_TEST_S = 0.5
DURATIONS_FILE = os.environ.get('ANP_TEST_DURATIONS_FILE') or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), 'durations.json')
FAST_TIER_BUDGET_S = 120  # The tier's recorded seconds: ~3 min wall on 2 cores with start-up.


def recorded_durations() -> dict:
  """{test node id: seconds} of the last recorded run ({} without the file)."""
  try:
    with open(DURATIONS_FILE) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def _marked_seconds(item):
  mark = item.get_closest_marker('slow')
  if mark is None:
    return None
  return float(mark.args[0] if mark.args else mark.kwargs.get('seconds', 60))


def weight_of(item, recorded) -> float:
  """The seconds `item` is expected to take (see above)."""
  if item.nodeid in recorded:
    return float(recorded[item.nodeid])
  marked = _marked_seconds(item)
  return UNMARKED_SECONDS if marked is None else marked


def fast_tier(items, recorded) -> set:
  """The node ids of the fast tier among `items` (see above)."""
  fast, quickest = set(), {}
  for item in items:
    path = item.nodeid.split('::', 1)[0]
    if item.nodeid in recorded:
      seconds = float(recorded[item.nodeid])
      if seconds <= FAST_TEST_S:
        fast.add(item.nodeid)
      if path not in quickest or seconds < quickest[path][0]:
        quickest[path] = (seconds, item.nodeid)
    elif _marked_seconds(item) is None:
      fast.add(item.nodeid)
  for path, (_, nodeid) in quickest.items():
    if not any(n.split('::', 1)[0] == path for n in fast):
      fast.add(nodeid)
  return fast


@pytest.hookimpl(tryfirst=True)  # Before -m selects on the `fast` mark it adds.
def pytest_collection_modifyitems(items):
  """Orders the test files heaviest first, each one's tests in their collected order, and marks
  the fast tier."""
  recorded = recorded_durations()
  weight, first = {}, {}
  for i, item in enumerate(items):
    path = item.nodeid.split('::', 1)[0]
    weight[path] = weight.get(path, 0.0) + weight_of(item, recorded)
    first.setdefault(path, i)
  order = {id(item): i for i, item in enumerate(items)}

  def key(item):
    path = item.nodeid.split('::', 1)[0]
    return -weight[path], first[path], order[id(item)]
  items.sort(key=key)
  fast = fast_tier(items, recorded)
  for item in items:
    if item.nodeid in fast:
      item.add_marker(pytest.mark.fast)


_RECORDED = {}  # This run's times, by node id (the controller's, with xdist).


def pytest_runtest_logreport(report):
  if os.environ.get('ANP_TEST_RECORD_DURATIONS') == '1':
    _RECORDED[report.nodeid] = _RECORDED.get(report.nodeid, 0.0) + report.duration


def still_defined(nodeid: str, root: str = None) -> bool:
  """Whether the test `nodeid` (``tests/test_x.py::[Class::]test_name[params]``) still exists:
  its file under `root` (the repository) defines ``def test_name(`` (a parametrized test's
  parameters are not checked)."""
  path, _, rest = nodeid.partition('::')
  name = rest.split('::')[-1].split('[')[0]
  try:
    with open(os.path.join(root or ROOT, path)) as f:
      return f'def {name}(' in f.read()
  except OSError:
    return False


def pytest_sessionfinish(session, exitstatus):
  """ANP_TEST_RECORD_DURATIONS=1: this run's times into tests/durations.json, by the controller
  (or the only process), merged with the recorded times of the tests it did not run."""
  if os.environ.get('ANP_TEST_RECORD_DURATIONS') != '1' or hasattr(session.config, 'workerinput'):
    return
  if not _RECORDED:
    return
  merged = {**recorded_durations(), **{k: round(v, 2) for k, v in _RECORDED.items()}}
  # Entries of tests that were deleted or renamed go (they had made 355 s of the recorded total
  # stale by 2026-12-06, and weighed on the fast tier's budget and the scheduling).
  merged = {k: v for k, v in merged.items() if still_defined(k)}
  tmp = DURATIONS_FILE + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(dict(sorted(merged.items())), f, indent=0)
    f.write('\n')
  os.replace(tmp, DURATIONS_FILE)


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """A prepared tiny synthetic_anp dataset (generated once per test session)."""
  path = tmp_path_factory.mktemp('tfds')
  from anp_jax.data import pipeline
  pipeline.get_builder(tiny_config(path))
  return path


@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
  """A one-node SLURM cluster (tests/slurm_cluster.py) for the tests of one file: yields (env
  with SLURM_CONF, its directory); every job cancelled and every daemon stopped afterwards."""
  directory = tmp_path_factory.mktemp('slurm')
  with slurm_cluster.cluster(directory) as env:
    yield env, directory


@pytest.fixture(scope='session')
def sync_baseline(data_dir, tmp_path_factory):
  """5 synchronous steps of the tiny config, every step logged (the reference that async with
  tau = 0 and local SGD with H = 1 must reproduce); computed once per session."""
  from anp_jax import trainer
  config = tiny_config(data_dir, noise_scale=False, log_every_steps=1, num_train_steps=5)
  return trainer.train_and_evaluate(config, str(tmp_path_factory.mktemp('sync_baseline')))


def leaves(tree):
  """The leaves of a pytree as host numpy arrays."""
  import jax
  import numpy as np
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_resume_is_exact(make_config, steps: int, split: int, tmp_path, capsys, whole=None):
  """Trains `steps` steps in one go, then `split` steps + a resumed run to `steps` in another
  workdir; asserts the resume message and bit-identical final states. `make_config(n)` is the
  config with ``num_train_steps=n`` (it must checkpoint at `split`). `whole`: the result of
  the run in one go if a fixture already has it (``train_and_evaluate(make_config(steps))``),
  instead of training it here. Returns (whole, resumed)."""
  from anp_jax import trainer
  if whole is None:
    whole = trainer.train_and_evaluate(make_config(steps), str(tmp_path / 'whole'))
  assert int(whole.state.step) == steps
  trainer.train_and_evaluate(make_config(split), str(tmp_path / 'split'))
  resumed = trainer.train_and_evaluate(make_config(steps), str(tmp_path / 'split'))
  assert f'Resumed from checkpoint at step {split}' in capsys.readouterr().out
  assert_leaves_close(leaves(resumed.state), leaves(whole.state))
  return whole, resumed


def direct_eval(config, params, batch_stats):
  """Top-1 accuracy per head and the mean loss over the whole evaluation split, counted directly:
  every example through the model in one call on one device (no batching, padding, masking or
  sharding), the reference for the trainer's exact evaluation."""
  import numpy as np
  import tensorflow_datasets as tfds
  from anp_jax import metrics, models, steps
  from anp_jax.data import pipeline
  builder = pipeline.get_builder(config)
  meta = pipeline.dataset_meta(builder, config)
  ds = builder.as_dataset(split=meta.eval_split, shuffle_files=False,
                          decoders={'image': tfds.decode.SkipDecoding()})
  stored = pipeline._stored_size(builder)
  ds = ds.map(lambda ex: pipeline.preprocess(ex, train=False, config=config, stored_size=stored))
  examples = next(iter(tfds.as_numpy(ds.batch(1 << 20))))
  n = len(examples['label_anp'])
  assert n == meta.eval_size
  model = models.create_model(config, meta)
  logits = model.apply({'params': params, 'batch_stats': batch_stats}, examples['image'],
                       train=False)
  out = {'count': n}
  loss = 0.0
  for head, head_logits in logits.items():
    labels = examples[metrics.LABEL_OF[head]]
    hits = int(np.sum(np.argmax(np.asarray(head_logits), -1) == labels))
    out[f'eval/{head}_top1'] = hits / n
    out[f'{head}_hits'] = hits
    ce = float(np.mean(np.asarray(steps.cross_entropy(head_logits, labels))))
    loss += config.loss_weights[head] * ce
  out['eval/loss'] = loss
  return out


def crossing_study(data_dir, out, *, kind: str, target_value: float, seeds, **options):
  """(study, base config, runner options) of one tiny point (ghost BN over 2 examples) evaluated
  every 0.25 epoch for 2 epochs, checkpointed as often: its 'eval' evaluator on the training split
  (high accuracy: crosses a target first), 'test' on the test split (crosses later). `options`
  go to `runner.Options` (e.g. stop_at_target, seeds_at_once)."""
  from anp_jax.configs import study_ghost_bn
  from anp_jax.research import runner
  from anp_jax.research.study import Study
  base = study_ghost_bn.get_config('tiny')
  base.data_dir = str(data_dir)
  base.num_epochs, base.eval_every_epochs = 2.0, 0.25
  base.evals = {'eval': {'kind': 'classification', 'split': 'train'},
                'test': {'kind': 'classification', 'split': 'test'}}
  study = Study(kind=kind, points=(('g0002', {'bn_group_size': 2}),), target_value=target_value,
                seeds=tuple(seeds), checkpoint_every_epochs=0.25)
  return study, base, runner.Options(out=str(out), report=False, **options)


def run_experiment(script: str, *args: str, timeout: float = 600,
                   **env) -> subprocess.CompletedProcess:
  """``python experiments/SCRIPT ARGS`` in a child process: the scripts are command lines, so the
  tests check what they print and their exit status, as a user would see them."""
  return subprocess.run([sys.executable, os.path.join(ROOT, 'experiments', script), *args],
                        env=subprocess_env(**env), capture_output=True, text=True,
                        timeout=timeout)
