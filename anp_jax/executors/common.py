"""What every executor shares: the `Executor` record, the meshes, and the mesh helper.

One `Mesh` over every device of the job, in JAX's global device order: a single ``data`` axis
(`make_mesh`), or, for local SGD, (``node``, ``device``) over the same devices in the same order
(`make_node_mesh`). `MeshHelper` holds, for one mesh and one state layout (replicated ``P()`` or
one replica per node ``P('node')``), everything the jit executors would otherwise each rebuild:
the shardings, the compiled `shard_map` of a per-device step (state buffers donated) and of an
evaluation's per-device function, the host→device transfer of a batch
(`jax.make_array_from_process_local_data`: works unchanged across processes), the device→host
`fetch`, and the checkpoint restore target.
"""

import dataclasses
import functools
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from anp_jax import steps

AXIS = steps.AXIS  # 'data': the batch axis of the 1-D mesh.
NODE, DEVICE = 'node', 'device'  # The local-SGD mesh axes.

# The state's initialisation runs once per run, yet at XLA's default optimisation level LLVM spends
# longer on its unrolled per-parameter random-number code than on the training step: on 2 CPU
# cores 12.8 s (ResNet-8), 13.1 s (ResNet-20), 18.5 s (ResNet-50) of CPU time to compile and run
# it, against 2.0 / 2.2 / 9.0 s at level 0 (CPU only: not measured on GPUs, where it stays at
# XLA's default). Level 0's values differ from level 2's by at most 1 ulp in some kernels, and a
# program's exact values depend on what else it computes; hence `host_init`: one program for
# every executor, so that all of them start from bit-identical states.
INIT_COMPILER_OPTIONS = {'xla_backend_optimization_level': 0}


@dataclasses.dataclass
class Executor:
  """Compiled train/eval steps, host↔device transfers and state conversions of one run.

  ``name`` is how the per-device step is compiled (``'jit'``: `jax.jit` of `jax.shard_map` over
  the mesh; ``'pmap'``), ``method`` what it does across devices and steps (``'sync'``,
  ``'async'``, ``'local_sgd'``). The loop and the checkpointer need neither: the executor turns its
  state into a plain pytree for a checkpoint (`to_checkpoint`), gives the target a checkpoint is
  restored into (`restore_target`, with the shardings of this run's mesh) and turns the restored
  pytree back into its state (`from_checkpoint`).
  """
  name: str
  method: str
  init: Callable[[], Any]
  train_step: Callable
  # map_eval(fn, key=None) -> an `EvalStep`: `fn(outputs, batch)` (the model's evaluation-mode
  # outputs on a device's shard and the finished batch, see `steps.per_device_eval_step`)
  # compiled over this executor's state layout, its sums added over every device of the job
  # and, by `EvalStep.add`, to the running total of the split's batches inside the same
  # program; the total stays on the devices (replicated), fetched once per split. Compiled once
  # per `key` (default: `fn` itself): evaluators of one kind share one program.
  map_eval: Callable
  to_device: Callable  # A host batch (this process's examples) → device arrays.
  fetch: Callable  # A replicated device value → numpy on this host.
  unreplicate: Callable  # Executor state → TrainState with one copy of every leaf.
  restore_target: Callable  # State → its abstract pytree (shape, dtype, sharding per leaf).
  to_checkpoint: Callable = lambda state: state
  from_checkpoint: Callable = lambda tree: tree
  # Extra arguments of `train_step` for the (0-based) step about to run: () for sync, (tau,) for
  # async, (average?,) for local SGD. Host-side and a pure function of the step: exact resume.
  step_args: Callable[[int], tuple] = lambda step: ()
  describe: str = ''  # Method-specific start-up line (staleness, memory, nodes).
  identity: Optional[Dict[str, Any]] = None  # Checkpoint identity beyond the config fields.


def make_mesh(devices=None) -> jax.sharding.Mesh:
  """The one mesh of the job: every device, in JAX's global order, on the ``data`` axis."""
  devices = jax.devices() if devices is None else devices
  return jax.make_mesh((len(devices),), (AXIS,), devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,))


def make_node_mesh(nodes: int, devices=None) -> jax.sharding.Mesh:
  """The local-SGD mesh: (``node``, ``device``), the devices of `make_mesh` in the same order.

  Node-major: node i holds the devices i*d .. (i+1)*d - 1 of the 1-D order, so a batch sharded
  ``P(('node', 'device'))`` puts the same examples on every device as ``P('data')`` does, and
  with one node per process a node is exactly one process's devices.
  """
  devices = jax.devices() if devices is None else devices
  shape = (nodes, len(devices) // nodes)
  mesh = jax.make_mesh(shape, (NODE, DEVICE), devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  if list(mesh.devices.flat) != list(devices):  # make_mesh may reorder for a physical topology.
    mesh = jax.sharding.Mesh(np.asarray(devices, dtype=object).reshape(shape), (NODE, DEVICE),
                             axis_types=(jax.sharding.AxisType.Auto,) * 2)
  return mesh


def host_init(init_fn):
  """`init_fn()` (the plain `steps.init_state`, same arguments for every executor) computed by one
  program on this process's first device, as numpy.

  Every executor builds its state from this, through transfers and broadcasts only (async's
  parameter history, local SGD's node axis, pmap's device axis), which add no arithmetic: sync,
  pmap, async and local SGD start from bit-identical parameters, and every process of a job
  from the same (the program and its inputs are the same on each).
  """
  options = INIT_COMPILER_OPTIONS if jax.default_backend() == 'cpu' else None
  return jax.device_get(jax.jit(init_fn, compiler_options=options)())


def per_device_functions(config, model, tx, setup, **train_kwargs):
  """(train_fn, eval_fn, init_fn): the steps of `anp_jax.steps` bound to this run (``eval_fn(state,
  batch, fn=...)``: `steps.per_device_eval_step`)."""
  bound = dict(model=model, tx=tx, config=config, accum_steps=setup.accum_steps,
               num_devices=setup.devices)
  train_fn = functools.partial(steps.per_device_train_step, **dict(bound, **train_kwargs))
  eval_fn = functools.partial(steps.per_device_eval_step, model=model, config=config)
  init_fn = functools.partial(steps.init_state, model, tx, config.image_size, config.seed)
  return train_fn, eval_fn, init_fn


@dataclasses.dataclass(frozen=True)
class MeshHelper:
  """Shardings, compiled steps and transfers for a state laid out as `state_spec` on `mesh`."""
  mesh: jax.sharding.Mesh
  batch_spec: P = P(AXIS)
  state_spec: P = P()  # P(): replicated; P(NODE): one replica per node (leading node axis).

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())

  @property
  def data(self) -> NamedSharding:
    return NamedSharding(self.mesh, self.batch_spec)

  @property
  def state(self) -> NamedSharding:
    return NamedSharding(self.mesh, self.state_spec)

  def jit_init(self, init_fn, expand=None):
    """`init_fn` (see `host_init`) → a function returning the initial state on this mesh:
    `host_init`'s values put on every device, then, if given, passed through `expand`, a
    jitted rearrangement without arithmetic (a history of snapshots, a node axis)."""
    expanded = None if expand is None else jax.jit(expand, out_shardings=self.state)

    def init():
      state = jax.device_put(host_init(init_fn), self.replicated if expand else self.state)
      return state if expanded is None else expanded(state)
    return init

  def jit_train_step(self, step_fn, num_scalar_args: int = 0):
    """`step_fn(state, batch, *scalars)` per device → jitted over the mesh, state donated;
    the scalars (e.g. tau) are replicated global arrays."""
    sm = jax.shard_map(step_fn, mesh=self.mesh,
                       in_specs=(self.state_spec, self.batch_spec) + (P(),) * num_scalar_args,
                       out_specs=(self.state_spec, P()))
    return jax.jit(sm, in_shardings=(self.state, self.data) + (self.replicated,) * num_scalar_args,
                   out_shardings=(self.state, self.replicated), donate_argnums=(0,))

  def jit_eval_step(self, eval_fn) -> 'EvalStep':
    """`eval_fn(state, batch)` per device (sums psum'd inside) → an `EvalStep` jitted over the
    mesh: the batch's sums, and the running total's update in the same program (total
    donated)."""
    sm = jax.shard_map(eval_fn, mesh=self.mesh, in_specs=(self.state_spec, self.batch_spec),
                       out_specs=P())
    acc = jax.shard_map(accumulate(eval_fn), mesh=self.mesh,
                        in_specs=(self.state_spec, self.batch_spec, P(), P()), out_specs=P())
    replicated = self.replicated

    def put(value):  # A replicated global array (every process passes the same value).
      value = np.asarray(value)
      return jax.make_array_from_callback(value.shape, replicated, lambda index: value[index])
    return EvalStep(
        jax.jit(sm, in_shardings=(self.state, self.data), out_shardings=replicated),
        jax.jit(acc, in_shardings=(self.state, self.data, replicated, replicated),
                out_shardings=replicated, donate_argnums=(2,)),
        put)

  def to_device(self, batch):
    """This process's part of a global batch → global arrays sharded over the batch axis."""
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(self.data, x), batch)

  def fetch(self, tree):
    """Device values → numpy on this host: a replicated leaf's local copy, and the first
    node's replica of a node-sharded one (metric sums are replicated)."""
    def one(a):
      value = np.asarray(a.addressable_data(0))
      spec = getattr(a.sharding, 'spec', ())
      return value[0] if len(spec) and spec[0] == NODE else value
    return jax.tree.map(one, tree)

  def restore_target(self, state):
    """The abstract state a checkpoint is restored into: this mesh's shardings, so a state
    saved on other devices (8 → 4) lands where this run keeps it."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.state),
                        state)


def accumulate(sums_fn):
  """``sums_fn(state, batch)`` → ``step(state, batch, total, first)``: the batch's sums if
  `first`, else ``total + sums``, leaf by leaf. The same float additions, in the same order, as
  adding each batch's sums to the total outside (an IEEE addition is one rounding wherever it
  runs; the select keeps the first batch's sums bit for bit, -0.0 included), in one program per
  batch instead of one per leaf."""
  def step(state, batch, total, first):
    sums = sums_fn(state, batch)
    return jax.tree.map(lambda t, s: jnp.where(first, s, t + s), total, sums)
  return step


class EvalStep:
  """A compiled evaluation of batches (`Executor.map_eval`).

  ``step(state, batch)``: the batch's sums (replicated device arrays). ``step.add(state, batch,
  total)``: ``total`` plus the batch's sums, computed and added in one program (``total`` None:
  the first batch's sums), ``total``'s buffers donated: an evaluation of n batches dispatches n
  programs and fetches one total (`anp_jax.evaluators.PredictionEvaluator`). Before, each batch
  also dispatched one addition per metric leaf, each a separate multi-device program: many tiny
  collectives' launches on XLA:CPU's one pool, where under heavy load a 2-device evaluation once
  aborted ("Expected 2 threads to join the rendezvous, but only 1 of them arrived").
  """

  def __init__(self, per_batch: Callable, accumulating: Callable, put: Callable,
               flag: Optional[Callable] = None):
    """`per_batch(state, batch) -> sums`; `accumulating(state, batch, total, first) -> total`
    (total donated); `put(numpy value)` -> a leaf of its total (a device array, or the numpy
    value where the step takes host values), `flag(bool)` -> its `first` (default: `put`)."""
    self._per_batch, self._accumulating, self._put = per_batch, accumulating, put
    self._flag = flag or put
    self._zeros = None  # The total's structure, zeros (read once, from the first batch).
    self._first = self._rest = None

  def __call__(self, state, batch):
    return self._per_batch(state, batch)

  def add(self, state, batch, total=None):
    """``total`` (None: nothing yet) plus the sums of `batch`, in one program."""
    if total is None:
      if self._zeros is None:
        shapes = jax.eval_shape(self._per_batch, state, batch)
        self._zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
        self._first, self._rest = self._flag(np.bool_(True)), self._flag(np.bool_(False))
      return self._accumulating(state, batch, jax.tree.map(self._put, self._zeros), self._first)
    return self._accumulating(state, batch, total, self._rest)


def memoized_map_eval(make: Callable[[Callable], Callable]) -> Callable:
  """An executor's `Executor.map_eval` from `make(fn) -> compiled step`: one compiled step per
  key (default: `fn`), so that evaluators computing the same sums share one program."""
  compiled = {}

  def map_eval(fn, key=None):
    k = fn if key is None else key
    if k not in compiled:
      compiled[k] = make(fn)
    return compiled[k]
  return map_eval
