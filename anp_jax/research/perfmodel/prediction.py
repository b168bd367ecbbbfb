"""Whole-system prediction: step time, throughput, epoch time, speed-ups and staleness of one
training configuration (`predict`), for synchronous, asynchronous, mixed-asynchronous and
local-SGD training.
"""

import dataclasses
from typing import Dict, Optional

from anp_jax.research.perfmodel.analytic_async import analytic_async
from anp_jax.research.perfmodel.costs import (compute_time, device_step_time,
                                              hierarchical_allreduce_time,
                                              node_axis_allreduce_time, ring_allreduce_time)
from anp_jax.research.perfmodel.hardware import Cluster, Interconnect, Workload
from anp_jax.research.perfmodel.input_stage import (InputPipeline, input_step_time,
                                                    node_feed_rate)
from anp_jax.staleness import require_non_negative, require_positive, simulate_async

METHODS = ('sync', 'async', 'mixed')


@dataclasses.dataclass(frozen=True)
class Prediction:
  """Predicted performance of one configuration.

  ``step_time`` is the wall time of one training step: of the synchronous global step for
  'sync' and local-SGD, of one worker's local step (mean) for the asynchronous methods.
  ``compute_time`` is a device's forward+backward time of one step, ``comm_time`` the
  communication time per step before overlap (amortised over the local steps), and
  ``exposed_comm_time`` what of it is not hidden behind the backward pass (or, asynchronously,
  what the worker waits for its transfers and the server).

  ``global_batch`` is images per step summed over all devices; asynchronously each update carries
  only one worker's share, whose distribution is ``effective_batch_distribution`` (images per
  update -> probability). ``staleness_distribution`` maps staleness (updates applied between a
  worker's read of the parameters and the update applying its gradient) to probability; local
  SGD reports the local steps since the last global average instead. Speed-ups compare images/s
  with one device training alone (no communication) and with one node of the same method.
  ``analytic_images_per_s`` / ``analytic_staleness_distribution``: the closed form of
  `analytic_async` for the same asynchronous configuration (None where it does not apply:
  synchronous methods, merging servers), next to the simulated values as a cross-check.

  With an input pipeline (`predict`'s ``input_pipeline`` and the cluster's
  ``host_cores_per_node``): ``input_time`` is what a node's cores need to prepare one step's
  images (`input_stage.input_step_time`; it runs ahead of the step, so a step takes the longer
  of the two), ``input_images_per_s`` what all the nodes' cores can feed, and ``bound`` says
  whether the 'input' or the 'devices' (compute and communication) set the step time
  ('unmodelled' without an input pipeline).
  """
  method: str
  nodes: int
  devices_per_node: int
  per_device_batch: int
  global_batch: int
  compute_time: float
  comm_time: float
  exposed_comm_time: float
  step_time: float
  images_per_s: float
  epoch_time: float
  speedup_vs_one_device: float
  speedup_vs_one_node: float
  efficiency: float
  num_workers: int
  worker_batch: int
  updates_per_s: float
  mean_staleness: float
  staleness_distribution: Dict[int, float]
  effective_batch_distribution: Dict[int, float]
  description: str = ''
  cluster: Optional[Cluster] = dataclasses.field(default=None, repr=False, compare=False)
  analytic_images_per_s: Optional[float] = None
  analytic_staleness_distribution: Optional[Dict[int, float]] = None
  input_time: Optional[float] = None
  input_images_per_s: Optional[float] = None
  bound: str = 'unmodelled'

  @property
  def num_devices(self) -> int:
    return self.nodes * self.devices_per_node


@dataclasses.dataclass(frozen=True)
class _Core:
  """What `_predict_core` computes; `predict` adds the speed-ups against reference runs."""
  compute_time: float
  comm_time: float
  exposed_comm_time: float
  step_time: float
  images_per_s: float
  num_workers: int
  worker_batch: int
  updates_per_s: float
  staleness: Dict[int, float]
  effective_batch: Dict[int, float]
  description: str
  analytic_images_per_s: Optional[float] = None
  analytic_staleness: Optional[Dict[int, float]] = None
  input_bound: bool = False


def _exposed(comm: float, overlap: float, backward: float) -> float:
  """Communication left after hiding ``overlap`` of it behind (at most) the backward pass."""
  return comm - min(overlap * comm, backward)


def _ps_transfer_time(nbytes: float, senders: int, num_ps: int, ic: Interconnect) -> float:
  """Time for ``senders`` nodes to each move ``nbytes`` to (or from) ``num_ps`` servers at once.

  Each server link carries senders * nbytes / num_ps; each sender's link carries nbytes; the
  slower of the two bounds the phase. Servers sit on their own network links (dedicated nodes).
  """
  bw = ic.inter_node_bandwidth
  return max(senders * nbytes / (num_ps * bw), nbytes / bw) + ic.inter_node_latency


def _predict_core(cluster: Cluster, workload: Workload, b: int, method: str, overlap: float,
                  num_ps: int, local_steps: int, async_worker: str, mixed_mode: str,
                  sync_comm: str, ps_merge: bool, ps_apply_time: float, compute_cv: float,
                  sim_updates: int, seed: int, input_time: Optional[float]) -> _Core:
  """The prediction of one configuration; ``input_time`` (None: not modelled) is the host's
  time to prepare a step's images, overlapped with the step (a step takes the longer)."""
  feed = input_time or 0.0
  ic = cluster.interconnect
  n, d = cluster.nodes, cluster.devices_per_node
  t_c = device_step_time(cluster, workload, b)
  backward = (t_c - cluster.device.step_overhead_s) * workload.backward_fraction
  grad, params = workload.grad_bytes, workload.param_bytes
  intra = ring_allreduce_time(grad, d, ic.intra_node_bandwidth, ic.intra_node_latency)
  global_batch = n * d * b

  if method == 'sync':
    if sync_comm == 'allreduce':
      comm = hierarchical_allreduce_time(grad, n, d, ic)
      how = f'hierarchical ring all-reduce over {n}x{d}'
    else:
      # Reduce to a leader per node, push to / pull from the servers, broadcast inside the node.
      comm = (intra + ring_allreduce_time(params, d, ic.intra_node_bandwidth,
                                          ic.intra_node_latency) +
              _ps_transfer_time(grad, n, num_ps, ic) + _ps_transfer_time(params, n, num_ps, ic))
      how = f'{num_ps} parameter server(s), node-level aggregation'
    exposed = _exposed(comm, overlap, backward)
    step = max(t_c + exposed, feed)
    return _Core(t_c, comm, exposed, step, global_batch / step, 1, global_batch, 1 / step,
                 {0: 1.0}, {global_batch: 1.0}, f'synchronous SGD, {how}',
                 input_bound=feed > t_c + exposed)

  if method == 'mixed' and mixed_mode == 'local_sgd':
    node_step = t_c + _exposed(intra, overlap, backward)
    # Parameters (and BN statistics, ignored: tiny) averaged as the trainer does: `pmean` over
    # the node axis of every device's full replica.
    average = node_axis_allreduce_time(params, n, d, ic)
    step = max(node_step + average / local_steps, feed)
    comm = intra + average / local_steps
    stale = {j: 1.0 / local_steps for j in range(local_steps)} if n > 1 else {0: 1.0}
    return _Core(t_c, comm, step - t_c, step, global_batch / step, n, d * b, 1 / step, stale,
                 {d * b: 1.0},
                 f'local SGD: synchronous inside each node, parameters averaged over {n} nodes '
                 f'every {local_steps} step(s)',
                 input_bound=feed > node_step + average / local_steps)

  # Asynchronous parameter-server training: 'async' (workers = devices or nodes) or the seed
  # paper's mixed-asynchronous (workers = nodes, synchronous inside each node).
  worker_is_node = method == 'mixed' or async_worker == 'node'
  if worker_is_node:
    num_workers, worker_batch, sharing = n, d * b, 1
    worker_compute = t_c + _exposed(intra, overlap, backward)
  else:
    num_workers, worker_batch, sharing = n * d, b, d
    worker_compute = t_c
  input_bound = feed > worker_compute
  worker_compute = max(worker_compute, feed)  # A worker's next batch is ready only then.
  worker_bw = ic.inter_node_bandwidth / sharing  # devices of a node share its interface
  # A worker pushes a gradient / pulls parameters once per `local_steps` local steps.
  push = grad / worker_bw + ic.inter_node_latency
  pull = params / worker_bw + ic.inter_node_latency
  server = grad / (num_ps * ic.inter_node_bandwidth) + ic.inter_node_latency
  sim = simulate_async(num_workers, local_steps * worker_compute, compute_cv, push + pull,
                       sim_updates, seed, server_time=server, apply_time=ps_apply_time,
                       push_fraction=push / (push + pull), merge=ps_merge,
                       worker_batch=local_steps * worker_batch)
  analytic = None
  if not ps_merge and ps_apply_time == 0:  # The closed form covers the non-merging server.
    analytic = analytic_async(num_workers, local_steps * worker_compute, compute_cv, push + pull,
                              server_time=server, push_fraction=push / (push + pull),
                              worker_batch=local_steps * worker_batch)
  images_per_s = sim.images_per_s
  step = num_workers * worker_batch / images_per_s
  comm = (push + pull) / local_steps + (intra if worker_is_node else 0.0)
  who = f'{num_workers} node workers (synchronous inside)' if worker_is_node else (
      f'{num_workers} device workers')
  name = 'mixed-asynchronous' if method == 'mixed' else 'asynchronous'
  return _Core(t_c, comm, step - t_c, step, images_per_s, num_workers, worker_batch,
               sim.updates_per_s, sim.staleness_pmf(), sim.effective_batch_pmf(),
               f'{name} SGD, {who}, {num_ps} parameter server(s)'
               f'{", merging" if ps_merge else ""}'
               f'{f", {local_steps} local steps per push" if local_steps > 1 else ""}',
               analytic_images_per_s=analytic and analytic.images_per_s,
               analytic_staleness=analytic and analytic.staleness_pmf, input_bound=input_bound)


def predict(cluster: Cluster, workload: Workload, per_device_batch: int, method: str = 'sync', *,
            overlap: float = 0.0, num_ps: int = 1, local_steps: int = 1,
            async_worker: str = 'device', mixed_mode: str = 'async',
            sync_comm: str = 'allreduce', ps_merge: bool = False, ps_apply_time: float = 0.0,
            compute_cv: float = 0.1, sim_updates: int = 20_000, seed: int = 0,
            input_pipeline: Optional[InputPipeline] = None) -> Prediction:
  """Predict step time, throughput, epoch time and speed-ups of one training configuration.

  Methods:

  * ``'sync'``: synchronous data parallelism. ``sync_comm='allreduce'`` (default) sums the
    gradients with `hierarchical_allreduce_time`; ``'ps'`` as TensorFlow 1.x's replicated
    parameter servers do: each node reduces its gradients, pushes them to ``num_ps`` servers and
    pulls the parameters back (`_ps_transfer_time`), then broadcasts them inside the node.
    ``overlap`` in [0, 1] is the fraction of the communication hidden behind the backward pass
    (bucketed all-reduce), never more than the backward pass itself.
  * ``'async'``: asynchronous SGD against ``num_ps`` parameter servers, simulated by
    `simulate_async`. ``async_worker='device'`` makes every device a worker (the devices of a
    node then share its network interface); ``'node'`` makes every node one worker that is
    synchronous inside (then identical to ``'mixed'``). Gradient bytes are split evenly over
    the servers, each of which has an inter-node link of its own. ``compute_cv`` is the
    coefficient of variation of a worker's step time: it shapes the staleness distribution,
    not its mean. ``ps_merge`` switches to SPRINT's merging server (see `simulate_async`), with
    ``ps_apply_time`` seconds per update.
  * ``'mixed'`` with ``mixed_mode='async'`` (default): the seed paper's *mixed-asynchronous*
    scheme: synchronous all-reduce inside each node, asynchronous parameter servers across nodes;
    ``local_steps`` > 1 lets a node take that many synchronous steps between pushes.
    ``mixed_mode='local_sgd'``: synchronous inside each node, and every ``local_steps`` steps a
    synchronous all-reduce averages the parameters across nodes (local SGD / periodic model
    averaging), costed as `anp_jax.executors.local_sgd` does it (`node_axis_allreduce_time`: every device's
    full replica over the node axis); there is no staleness, and the reported 'staleness' is
    the local steps since the last average.

  ``input_pipeline`` (`input_stage.InputPipeline`; needs the cluster's ``host_cores_per_node``)
  adds the input stage: a node's cores prepare its devices' images while they train, so a step
  (an asynchronous worker's compute) takes at least `input_stage.input_step_time`; the
  prediction's ``bound`` says which one sets it. Without it the input is free (as before).
  """
  if method not in METHODS:
    raise ValueError(f'method={method!r}; choose one of {METHODS}.')
  if not isinstance(cluster, Cluster):
    raise ValueError(f'cluster must be a Cluster, got {type(cluster).__name__}.')
  if not isinstance(workload, Workload):
    raise ValueError(f'workload must be a Workload, got {type(workload).__name__}.')
  require_positive('predict', 'per_device_batch', per_device_batch, integer=True)
  require_non_negative('predict', 'overlap', overlap)
  if overlap > 1:
    raise ValueError(f'predict.overlap is a fraction in [0, 1], got {overlap!r}.')
  require_positive('predict', 'num_ps', num_ps, integer=True)
  require_positive('predict', 'local_steps', local_steps, integer=True)
  require_non_negative('predict', 'ps_apply_time', ps_apply_time)
  require_non_negative('predict', 'compute_cv', compute_cv)
  require_positive('predict', 'sim_updates', sim_updates, integer=True)
  if async_worker not in ('device', 'node'):
    raise ValueError(f"predict.async_worker={async_worker!r}; choose 'device' or 'node'.")
  if mixed_mode not in ('async', 'local_sgd'):
    raise ValueError(f"predict.mixed_mode={mixed_mode!r}; choose 'async' or 'local_sgd'.")
  if sync_comm not in ('allreduce', 'ps'):
    raise ValueError(f"predict.sync_comm={sync_comm!r}; choose 'allreduce' or 'ps'.")
  if method == 'sync' and local_steps != 1:
    raise ValueError("predict.local_steps applies to method='mixed' (and 'async'); synchronous "
                     'SGD communicates every step.')

  input_time = feed_rate = None
  if input_pipeline is not None:
    if cluster.host_cores_per_node is None:
      raise ValueError(f'predict.input_pipeline needs the host cores of {cluster.name!r}\'s '
                       'nodes: set Cluster.host_cores_per_node.')
    input_time = input_step_time(cluster, input_pipeline, per_device_batch)
    feed_rate = cluster.nodes * node_feed_rate(cluster, input_pipeline)
  args = (workload, per_device_batch, method, overlap, num_ps, local_steps, async_worker,
          mixed_mode, sync_comm, ps_merge, ps_apply_time, compute_cv, sim_updates, seed,
          input_time)
  core = _predict_core(cluster, *args)
  one_node = core if cluster.nodes == 1 else _predict_core(cluster.resized(nodes=1), *args)
  one_device_rate = per_device_batch / compute_time(workload, cluster.device, per_device_batch)
  speedup_device = core.images_per_s / one_device_rate
  mean_staleness = sum(k * p for k, p in core.staleness.items())
  return Prediction(
      method=method, nodes=cluster.nodes, devices_per_node=cluster.devices_per_node,
      per_device_batch=per_device_batch, global_batch=cluster.num_devices * per_device_batch,
      compute_time=core.compute_time, comm_time=core.comm_time,
      exposed_comm_time=core.exposed_comm_time, step_time=core.step_time,
      images_per_s=core.images_per_s, epoch_time=workload.dataset_size / core.images_per_s,
      speedup_vs_one_device=speedup_device,
      speedup_vs_one_node=core.images_per_s / one_node.images_per_s,
      efficiency=speedup_device / cluster.num_devices, num_workers=core.num_workers,
      worker_batch=core.worker_batch, updates_per_s=core.updates_per_s,
      mean_staleness=mean_staleness, staleness_distribution=core.staleness,
      effective_batch_distribution=core.effective_batch, description=core.description,
      cluster=cluster, analytic_images_per_s=core.analytic_images_per_s,
      analytic_staleness_distribution=core.analytic_staleness, input_time=input_time,
      input_images_per_s=feed_rate,
      bound='unmodelled' if input_time is None else ('input' if core.input_bound else 'devices'))
