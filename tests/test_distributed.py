"""Process-topology detection (anp_jax/distributed/) as unit tests of its pure functions:
explicit variables, SLURM (one task per node gets all of the node's GPUs), missing or malformed
input, and the time-outs handed to `jax.distributed.initialize`."""

import json
import os
import socket

import pytest

from anp_jax import distributed, errors
from conftest import coordinator_like_listener


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
  """No SLURM_*, ANP_* or CUDA_VISIBLE_DEVICES from the machine running the tests, and no GPU
  listed by a driver (a test that wants some lists them in NVIDIA_GPUS_DIR)."""
  for name in list(os.environ):
    if name.startswith(('SLURM_', 'ANP_')) or name == 'CUDA_VISIBLE_DEVICES':
      monkeypatch.delenv(name)
  monkeypatch.setattr(distributed.topology, 'NVIDIA_GPUS_DIR', str(tmp_path / 'no_nvidia_driver'))
  return monkeypatch


def _slurm(monkeypatch, procid=1, ntasks=2, **extra):
  _set(monkeypatch, dict(SLURM_JOB_ID='77', SLURM_STEP_ID='0', SLURM_PROCID=procid,
                         SLURM_NTASKS=ntasks, **extra))


def test_nothing_set_is_a_single_process():
  assert distributed.detect_topology() == distributed.Topology('single')


def _set(monkeypatch, env):
  for k, v in env.items():
    monkeypatch.setenv(k, str(v))


def test_explicit_variables_and_arguments(monkeypatch):
  _set(monkeypatch, dict(ANP_COORDINATOR_ADDRESS='10.0.0.1:12345', ANP_NUM_PROCESSES='4',
                         ANP_PROCESS_ID='3', ANP_LOCAL_DEVICE_IDS='0,1'))
  assert distributed.detect_topology() == distributed.Topology('explicit', '10.0.0.1:12345', 4, 3,
                                                               [0, 1])
  # Arguments (main.py's flags) win over the variables; one process needs no coordinator.
  topo = distributed.detect_topology('host:1', 2, 0)
  assert (topo.mode, topo.coordinator_address, topo.num_processes) == ('explicit', 'host:1', 2)
  assert distributed.detect_topology('host:1', 1, 0).mode == 'single'


@pytest.mark.parametrize('env,message', [
    (dict(ANP_COORDINATOR_ADDRESS='h:1', ANP_NUM_PROCESSES='2'), 'needs all three'),
    (dict(ANP_NUM_PROCESSES='2', ANP_PROCESS_ID='0'), 'ANP_COORDINATOR_ADDRESS'),
    (dict(ANP_COORDINATOR_ADDRESS='h:1', ANP_NUM_PROCESSES='two', ANP_PROCESS_ID='0'),
     r"ANP_NUM_PROCESSES='two' must be an integer"),
    (dict(ANP_COORDINATOR_ADDRESS='h:1', ANP_NUM_PROCESSES='0', ANP_PROCESS_ID='0'), '>= 1'),
    (dict(ANP_COORDINATOR_ADDRESS='h:1', ANP_NUM_PROCESSES='2', ANP_PROCESS_ID='2'),
     'inconsistent process counts'),
    (dict(ANP_COORDINATOR_ADDRESS='h:1', ANP_NUM_PROCESSES='2', ANP_PROCESS_ID='-1'),
     'inconsistent process counts'),
    (dict(ANP_COORDINATOR_ADDRESS='10.0.0.1', ANP_NUM_PROCESSES='2', ANP_PROCESS_ID='0'),
     'host:port'),
    (dict(ANP_COORDINATOR_ADDRESS='10.0.0.1:port', ANP_NUM_PROCESSES='2', ANP_PROCESS_ID='0'),
     'host:port'),
    (dict(ANP_COORDINATOR_ADDRESS=':12345', ANP_NUM_PROCESSES='2', ANP_PROCESS_ID='0'),
     'host:port'),
    (dict(ANP_COORDINATOR_ADDRESS='10.0.0.1:99999', ANP_NUM_PROCESSES='2', ANP_PROCESS_ID='0'),
     'host:port'),
])
def test_missing_or_malformed_explicit_variables_are_named(monkeypatch, env, message):
  _set(monkeypatch, env)
  with pytest.raises(ValueError, match=message):
    distributed.detect_topology()


def test_an_ipv6_coordinator_address_is_accepted():
  topo = distributed.detect_topology('[::1]:8476', 2, 1)
  assert topo.coordinator_address == '[::1]:8476'


def test_slurm_one_task_per_node_gets_all_local_gpus(monkeypatch):
  _slurm(monkeypatch, procid=1, ntasks=2, SLURM_NTASKS_PER_NODE=1,
         CUDA_VISIBLE_DEVICES='4,5,6,7')
  assert distributed.detect_topology() == distributed.Topology('slurm', None, 2, 1, [0, 1, 2, 3])
  # Without CUDA_VISIBLE_DEVICES: SLURM's GPU count; the per-node count as SLURM writes it.
  monkeypatch.delenv('CUDA_VISIBLE_DEVICES')
  monkeypatch.delenv('SLURM_NTASKS_PER_NODE')
  monkeypatch.setenv('SLURM_TASKS_PER_NODE', '1(x2)')
  monkeypatch.setenv('SLURM_GPUS_ON_NODE', '8')
  assert distributed.detect_topology().local_device_ids == list(range(8))


def test_one_task_per_node_finds_its_nodes_gpus_without_slurm_gpu_variables(monkeypatch,
                                                                            tmp_path):
  # No GRES: no CUDA_VISIBLE_DEVICES, no SLURM_GPUS_ON_NODE. JAX's SLURM detection would then
  # pin the node's one task to GPU SLURM_LOCALID (0): one of four GPUs used, silently.
  gpus = tmp_path / 'gpus'
  for bus in ('0000:17:00.0', '0000:65:00.0', '0000:ca:00.0', '0000:e3:00.0'):
    (gpus / bus).mkdir(parents=True)
  monkeypatch.setattr(distributed.topology, 'NVIDIA_GPUS_DIR', str(gpus))
  _slurm(monkeypatch, procid=1, ntasks=2, SLURM_TASKS_PER_NODE='1(x2)')
  assert distributed.detect_topology().local_device_ids == [0, 1, 2, 3]
  # Explicit addresses inside an srun step: the same (JAX detects SLURM for what is unset).
  _set(monkeypatch, dict(ANP_COORDINATOR_ADDRESS='10.0.0.1:12345', ANP_NUM_PROCESSES='2',
                         ANP_PROCESS_ID='1'))
  assert distributed.detect_topology().local_device_ids == [0, 1, 2, 3]
  # Outside SLURM nothing is pinned (several explicit processes may share a node).
  monkeypatch.delenv('SLURM_STEP_ID')
  assert distributed.detect_topology().local_device_ids is None
  # A CPU machine: no driver folder, nothing pinned.
  monkeypatch.setattr(distributed.topology, 'NVIDIA_GPUS_DIR', str(tmp_path / 'none'))
  _set(monkeypatch, dict(SLURM_STEP_ID='0'))
  assert distributed.detect_topology().local_device_ids is None


@pytest.mark.parametrize('step_tasks,node,expected', [
    ('1,3', 0, [0, 1, 2, 3]),  # This node's one task: all its GPUs.
    ('1,3', 1, None),          # Three tasks here: one GPU each, JAX's choice.
    ('3,1', 1, [0, 1, 2, 3]),
    ('2(x2),1', 2, [0, 1, 2, 3]),
    ('2(x2),1', 1, None),
])
def test_tasks_per_node_is_this_nodes_entry_of_the_steps_list(monkeypatch, step_tasks, node,
                                                              expected):
  # Before: the first node's count for every node, and the job's SLURM_NTASKS_PER_NODE first.
  _slurm(monkeypatch, procid=0, ntasks=4, SLURM_NODEID=node, SLURM_STEP_TASKS_PER_NODE=step_tasks,
         SLURM_NTASKS_PER_NODE=2, CUDA_VISIBLE_DEVICES='0,1,2,3')
  assert distributed.detect_topology().local_device_ids == expected


def test_malformed_local_device_ids_name_the_variable(monkeypatch):
  monkeypatch.setenv('ANP_LOCAL_DEVICE_IDS', '0,1,')
  with pytest.raises(ValueError, match=r"ANP_LOCAL_DEVICE_IDS='0,1,' must be comma-separated"):
    distributed.detect_topology()


def test_slurm_one_task_per_gpu_leaves_the_devices_to_jax(monkeypatch):
  _slurm(monkeypatch, procid=5, ntasks=8, SLURM_NTASKS_PER_NODE=4, CUDA_VISIBLE_DEVICES='0,1,2,3')
  topo = distributed.detect_topology()
  assert (topo.mode, topo.num_processes, topo.process_id) == ('slurm', 8, 5)
  assert topo.local_device_ids is None
  # ANP_LOCAL_DEVICE_IDS pins them explicitly.
  monkeypatch.setenv('ANP_LOCAL_DEVICE_IDS', '1')
  assert distributed.detect_topology().local_device_ids == [1]


def test_slurm_outside_a_multi_task_step_is_a_single_process(monkeypatch):
  _slurm(monkeypatch, procid=0, ntasks=1)  # srun -n 1
  assert distributed.detect_topology().mode == 'single'
  _slurm(monkeypatch, procid=0, ntasks=2)
  monkeypatch.delenv('SLURM_STEP_ID')  # The batch script itself, not an srun step.
  assert distributed.detect_topology().mode == 'single'


@pytest.mark.parametrize('env,message', [
    (dict(SLURM_PROCID='2'), r'SLURM_PROCID=2 is not in \[0, SLURM_NTASKS=2\)'),
    (dict(SLURM_NTASKS='many'), "SLURM_NTASKS='many' must be an integer"),
    (dict(SLURM_PROCID='x'), "SLURM_PROCID='x' must be an integer"),
])
def test_bad_slurm_variables_are_named(monkeypatch, env, message):
  _slurm(monkeypatch)
  _set(monkeypatch, env)
  with pytest.raises(ValueError, match=message):
    distributed.detect_topology()


def test_explicit_mode_wins_over_slurm(monkeypatch):
  _slurm(monkeypatch, procid=1, ntasks=4)
  topo = distributed.detect_topology('h:1', 2, 0)
  assert (topo.mode, topo.num_processes, topo.process_id) == ('explicit', 2, 0)


def test_initialize_passes_the_timeouts_and_topology_to_jax(monkeypatch):
  """ANP_HEARTBEAT_TIMEOUT / ANP_INIT_TIMEOUT reach jax.distributed.initialize (defaults 30 and
  120 s); nothing of JAX's real set-up runs."""
  import jax
  calls = []
  monkeypatch.setattr(jax.distributed, 'initialize', lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.config, 'update', lambda *a, **k: None)
  monkeypatch.setattr(distributed.launch, '_initialized', False)
  shares = []  # The core census needs the real coordination service: recorded only.
  monkeypatch.setattr(distributed.launch, 'share_host_cores', lambda *a: shares.append(a))
  ports = []  # Process 0 checks its port first.
  monkeypatch.setattr(distributed.launch, 'check_coordinator_port', lambda a, **_: ports.append(a))
  topo = distributed.initialize('127.0.0.1:1234', 2, 0)
  assert topo.mode == 'explicit' and ports == ['127.0.0.1:1234']
  assert shares == [(0, 2)]  # Right after jax.distributed.initialize.
  assert calls[-1]['heartbeat_timeout_seconds'] == 30
  assert calls[-1]['initialization_timeout'] == 120
  assert (calls[-1]['coordinator_address'], calls[-1]['num_processes'],
          calls[-1]['process_id']) == ('127.0.0.1:1234', 2, 0)
  monkeypatch.setattr(distributed.launch, '_initialized', False)
  monkeypatch.setenv('ANP_HEARTBEAT_TIMEOUT', '7')
  monkeypatch.setenv('ANP_INIT_TIMEOUT', '9')
  _slurm(monkeypatch, procid=0, ntasks=2, SLURM_NTASKS_PER_NODE=1, CUDA_VISIBLE_DEVICES='0,1')
  distributed.initialize()
  assert calls[-1]['heartbeat_timeout_seconds'] == 7
  assert calls[-1]['initialization_timeout'] == 9
  assert calls[-1]['cluster_detection_method'] == 'slurm'
  assert calls[-1]['local_device_ids'] == [0, 1]
  # A single process never initialises jax.distributed.
  monkeypatch.setattr(distributed.launch, '_initialized', False)
  for name in [n for n in os.environ if n.startswith('SLURM_')]:
    monkeypatch.delenv(name)
  distributed.initialize()
  assert len(calls) == 2


# ----------------------------------------------------------------------------------------------
# Several processes of a job on one host share its cores (`core_share`, pure).

def test_processes_on_one_host_split_its_cores_in_process_order():
  hosts = {i: ('a', tuple(range(8))) for i in range(3)}
  shares = [distributed.core_share(i, hosts) for i in range(3)]
  assert shares == [[0, 1], [2, 3, 4], [5, 6, 7]]  # Disjoint, nearly equal, all cores used.


def test_cores_are_shared_per_host_and_per_launch_affinity():
  hosts = {0: ('a', (0, 1, 2, 3)), 1: ('b', (0, 1, 2, 3)), 2: ('a', (0, 1, 2, 3)),
           3: ('b', (0, 1, 2, 3))}
  assert [distributed.core_share(i, hosts) for i in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
  # A launcher that already gave the tasks their own cores (SLURM --cpus-per-task, taskset).
  bound = {0: ('a', (0, 1)), 1: ('a', (2, 3))}
  assert distributed.core_share(0, bound) is None and distributed.core_share(1, bound) is None
  # Alone on its host (one process per node): nothing to share.
  assert distributed.core_share(1, {0: ('a', (0, 1)), 1: ('b', (0, 1))}) is None


def test_fewer_cores_than_processes_changes_nothing():
  hosts = {i: ('a', (0, 1)) for i in range(4)}
  assert all(distributed.core_share(i, hosts) is None for i in range(4))


def test_pinning_can_be_turned_off_on_every_process_only(monkeypatch):
  """ANP_PIN_CORES=0 pins nothing, once every process is seen to have it (a process that pins
  would otherwise wait for the others' core census until ANP_INIT_TIMEOUT); nothing here may
  start JAX's backend (the census comes before it, so that XLA's thread pools fit the share)."""
  from jax._src import distributed as jax_distributed
  import jax
  monkeypatch.setattr(jax, 'process_count', lambda: pytest.fail('started JAX\'s backend'))
  monkeypatch.setattr(distributed.coordination, '_barrier_uses', {})
  monkeypatch.setenv('ANP_PIN_CORES', '0')
  monkeypatch.setenv('ANP_INIT_TIMEOUT', '9')
  store = _FakeStore({1: {'ANP_PIN_CORES': 'off'}})
  monkeypatch.setattr(jax_distributed.global_state, 'client', store)
  assert distributed.share_host_cores(0, 2) is None
  assert store.barriers == [('anp_jax/same/core_pinning/0', 9_000)]  # ANP_INIT_TIMEOUT bounds it.
  store.others = {1: {'ANP_PIN_CORES': 'on'}}
  with pytest.raises(errors.ConfigError, match=r"(?s)different core pinning.*ANP_PIN_CORES: "
                     r"process 0 has 'off', process 1 has 'on'.*the same way for every process"):
    distributed.share_host_cores(0, 2)


def test_a_failed_barrier_says_what_it_waited_for_and_which_setting_bounds_it(monkeypatch):
  import jax
  from jax._src import distributed as jax_distributed

  class Client:
    def wait_at_barrier(self, barrier_id, timeout_ms):
      raise RuntimeError('DEADLINE_EXCEEDED: Barrier timed out. # of tasks that reached the '
                         'barrier: 1/2.')

  monkeypatch.setattr(jax_distributed.global_state, 'client', Client())
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(distributed.coordination, '_barrier_uses', {})
  monkeypatch.setenv('ANP_BARRIER_TIMEOUT', '7')
  with pytest.raises(RuntimeError, match=r"Waiting for the other processes of the job at "
                     r"'train_end' \(barrier anp_jax/train_end/0, at most 7 s, ANP_BARRIER_TIMEOUT"
                     r"\) failed: DEADLINE_EXCEEDED: .* 1/2\..*raise ANP_BARRIER_TIMEOUT"):
    distributed.barrier('train_end')


def test_barrier_waits_at_the_coordination_service_with_a_new_id_per_use(monkeypatch):
  """Not a device collective (gloo's first use gives up after 30 s, while process 0 may be
  generating the dataset for minutes): a coordination-service barrier, ANP_BARRIER_TIMEOUT."""
  import jax
  from jax._src import distributed as jax_distributed
  calls = []

  class Client:
    def wait_at_barrier(self, barrier_id, timeout_ms):
      calls.append((barrier_id, timeout_ms))

  monkeypatch.setattr(jax_distributed.global_state, 'client', Client())
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(distributed.coordination, '_barrier_uses', {})
  distributed.barrier('end')
  distributed.barrier('end')  # A sweep's second run: another barrier.
  monkeypatch.setenv('ANP_BARRIER_TIMEOUT', '7')
  distributed.barrier('data')
  assert calls == [('anp_jax/end/0', 3_600_000), ('anp_jax/end/1', 3_600_000),
                   ('anp_jax/data/0', 7_000)]


# ----------------------------------------------------------------------------------------------
# The coordinator's port: taken ports refused, reserved ports kept (`check_coordinator_port`,
# `reserve_port`); every process runs the same config (`check_same_everywhere`).

def test_a_port_where_another_coordinator_listens_is_refused():
  """Another job's coordinator (SO_REUSEPORT, like gRPC): without the check the second
  coordinator binds beside it and the two jobs' processes merge."""
  with distributed.reserve_port() as held:
    port = held.getsockname()[1]
    with coordinator_like_listener(port):
      with pytest.raises(errors.ConfigError, match=f'127.0.0.1:{port}.*another job'):
        distributed.check_coordinator_port(f'127.0.0.1:{port}')


def test_a_port_another_program_holds_is_refused():
  """Bound without SO_REUSEPORT: JAX's coordinator would crash (a segmentation fault)."""
  with socket.socket() as other:
    other.bind(('127.0.0.1', 0))
    port = other.getsockname()[1]
    with pytest.raises(errors.ConfigError, match=f'port {port} .*cannot be bound'):
      distributed.check_coordinator_port(f'127.0.0.1:{port}')
    other.listen()
    with pytest.raises(errors.ConfigError, match='already accepts connections'):
      distributed.check_coordinator_port(f'localhost:{port}')


def test_a_port_with_a_closed_jobs_connections_in_time_wait_is_accepted():
  """A job restarted on its port right after the last one ended (SLURM requeue, a rerun)."""
  with distributed.reserve_port() as held:
    port = held.getsockname()[1]
  with coordinator_like_listener(port) as server:  # The last job's coordinator.
    client = socket.create_connection(('127.0.0.1', port))
    accepted, _ = server.accept()
    accepted.close()  # The side on `port` closes first: its connection stays in TIME_WAIT.
    client.close()
  distributed.check_coordinator_port(f'127.0.0.1:{port}')


def test_under_slurm_process_0_checks_the_port_jax_derives_and_names_the_override(monkeypatch):
  """JAX's SLURM detection puts the coordinator on the first node at a port from the job id
  (``JAX_COORDINATOR_PORT`` overrides it): a second job on that node whose id is the same
  modulo 4096 gets the same port."""
  import jax
  calls = []
  monkeypatch.setattr(jax.distributed, 'initialize', lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.config, 'update', lambda *a, **k: None)
  monkeypatch.setattr(distributed.launch, '_initialized', False)
  monkeypatch.setattr(distributed.launch, 'share_host_cores', lambda *a: None)
  with distributed.reserve_port() as held:
    port = held.getsockname()[1]
    with coordinator_like_listener(port):
      _slurm(monkeypatch, procid=0, SLURM_STEP_NODELIST='localhost', JAX_COORDINATOR_PORT=port)
      assert distributed.ports._slurm_coordinator_address() == f'localhost:{port}'
      with pytest.raises(errors.ConfigError, match='export JAX_COORDINATOR_PORT'):
        distributed.initialize()
      assert calls == []
      _slurm(monkeypatch, procid=1, SLURM_STEP_NODELIST='localhost', JAX_COORDINATOR_PORT=port)
      distributed.initialize()  # Only process 0 starts the coordinator.
      assert len(calls) == 1
  monkeypatch.delenv('JAX_COORDINATOR_PORT')
  monkeypatch.setenv('SLURM_JOB_ID', str(4096 + 5))
  assert distributed.ports._slurm_coordinator_address() == f'localhost:{65535 - 4095 + 5}'


def test_a_reserved_port_is_accepted_and_never_handed_out_while_held():
  with distributed.reserve_port() as held:
    port = held.getsockname()[1]
    distributed.check_coordinator_port(f'127.0.0.1:{port}')
    with coordinator_like_listener(port):  # The coordinator binds beside the reservation.
      pass
    handed_out = set()
    for _ in range(3000):  # Other launchers' free ports, of a range of ~14,000.
      with socket.socket() as other:
        other.bind(('127.0.0.1', 0))
        handed_out.add(other.getsockname()[1])
      with distributed.reserve_port() as other:
        handed_out.add(other.getsockname()[1])
    assert port not in handed_out and len(handed_out) > 1000


def test_differences_name_each_field_and_process():
  same = {'batch_size': 8, 'model.name': 'resnet20'}
  assert distributed.differences({0: same, 1: dict(same)}) == []
  lines = distributed.differences({0: same, 1: dict(same, batch_size=16), 2: {'batch_size': 8}})
  assert lines == ["batch_size: process 0 has 8, process 1 has 16",
                   "model.name: process 0 has 'resnet20', process 2 has '<unset>'"]
  many = distributed.differences({0: {str(i): i for i in range(30)}, 1: {}}, limit=4)
  assert len(many) == 5 and many[-1] == '... and 26 more'


class _FakeStore:
  """The coordination service's key-value store and barriers, seen by one process."""

  def __init__(self, others):
    self.kv, self.barriers, self.others = {}, [], others

  def key_value_set(self, key, value):
    self.kv[key] = value

  def wait_at_barrier(self, barrier_id, timeout_ms):
    self.barriers.append((barrier_id, timeout_ms))
    for pid, values in self.others.items():  # The other processes arrived with theirs.
      self.kv[f'{barrier_id}/{pid}'] = json.dumps(values)

  def key_value_dir_get(self, prefix):
    return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]


def test_check_same_everywhere_raises_on_every_difference(monkeypatch):
  import jax
  from jax._src import distributed as jax_distributed
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  monkeypatch.setattr(distributed.coordination, '_barrier_uses', {})
  mine = {'batch_size': 8, 'workdir': '/runs/a'}
  store = _FakeStore({0: mine})
  monkeypatch.setattr(jax_distributed.global_state, 'client', store)
  distributed.check_same_everywhere('configs or workdirs', mine)
  store.others = {0: dict(mine, workdir='/runs/b')}
  with pytest.raises(errors.ConfigError, match=r"(?s)different configs or workdirs.*workdir: "
                     r"process 0 has '/runs/b', process 1 has '/runs/a'.*same coordinator"):
    distributed.check_same_everywhere('configs or workdirs', mine)
  # A new barrier per use (a sweep's runs), bounded by ANP_BARRIER_TIMEOUT.
  assert store.barriers == [('anp_jax/same/configs_or_workdirs/0', 3_600_000),
                            ('anp_jax/same/configs_or_workdirs/1', 3_600_000)]
  store.others = {}  # A process missing from the census is an error too, not a pass.
  with pytest.raises(RuntimeError, match=r'Expected 2 processes'):
    distributed.check_same_everywhere('configs or workdirs', mine)


def test_the_job_identity_is_every_field_but_the_per_process_ones_plus_the_workdir():
  from anp_jax import setup
  from anp_jax.configs import tiny
  config = tiny.get_config()
  ident = setup.job_identity(config, '/runs/a')
  assert ident['workdir'] == '/runs/a' and ident['model.name'] == config.model.name
  assert ident['batch_size'] == config.batch_size
  assert not set(setup.PER_PROCESS_FIELDS) & set(ident)
  config.data_dir, config.progress_bar = '/local/ssd/tfds', not config.progress_bar
  assert setup.job_identity(config, '/runs/a') == ident
  config.log_every_steps += 1  # Decides which steps fetch metrics: must be the same everywhere.
  assert setup.job_identity(config, '/runs/a') != ident


def test_the_software_identity_names_the_versions_and_follows_the_sources(tmp_path):
  import jax
  (tmp_path / 'sub').mkdir()
  (tmp_path / 'a.py').write_text('x = 1\n')
  (tmp_path / 'sub' / 'b.py').write_text('y = 2\n')
  first = distributed.software_identity(str(tmp_path))
  assert first['jax'] == jax.__version__ and first['python'].count('.') == 2
  assert {'flax', 'optax', 'orbax-checkpoint', 'tensorflow-datasets'} <= set(first)
  (tmp_path / '__pycache__').mkdir()  # Byte-code and other files do not count.
  (tmp_path / '__pycache__' / 'a.py').write_text('cached')
  (tmp_path / 'notes.txt').write_text('not code')
  assert distributed.software_identity(str(tmp_path)) == first
  (tmp_path / 'sub' / 'b.py').write_text('y = 3\n')  # Another checkout on one node.
  changed = distributed.software_identity(str(tmp_path))
  assert changed['anp_jax_sources_sha1'] != first['anp_jax_sources_sha1']
  assert distributed.differences({0: first, 1: changed}) == [
      f"anp_jax_sources_sha1: process 0 has '{first['anp_jax_sources_sha1']}', process 1 has "
      f"'{changed['anp_jax_sources_sha1']}'"]
  (tmp_path / 'sub' / 'b.py').rename(tmp_path / 'b.py')  # Same text, another file.
  assert distributed.software_identity(str(tmp_path)) != changed


def test_values_given_as_a_function_are_computed_only_with_several_processes(monkeypatch):
  import jax
  from jax._src import distributed as jax_distributed
  calls = []

  def values():
    calls.append(1)
    return {'x': 1}

  distributed.check_same_everywhere('software', values)  # One process: nothing to compare.
  assert calls == []
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(jax, 'process_index', lambda: 0)
  monkeypatch.setattr(distributed.coordination, '_barrier_uses', {})
  monkeypatch.setattr(jax_distributed.global_state, 'client', _FakeStore({1: {'x': 1}}))
  distributed.check_same_everywhere('software', values)
  assert calls == [1]


@pytest.mark.parametrize('value', ['0', '-5'])
def test_a_zero_or_negative_time_out_is_an_error_not_the_default(monkeypatch, value):
  # Before: 0 silently meant the default and a negative value went to JAX.
  monkeypatch.setenv('ANP_HEARTBEAT_TIMEOUT', value)
  with pytest.raises(ValueError, match=f'ANP_HEARTBEAT_TIMEOUT={value} must be a positive number '
                                       r'of seconds \(unset: 30\)'):
    distributed.preflight()
  monkeypatch.setenv('ANP_HEARTBEAT_TIMEOUT', '7')
  distributed.preflight()
  monkeypatch.delenv('ANP_HEARTBEAT_TIMEOUT')
  assert distributed.barrier_timeout_s() == 3600
