"""Data-parallel training and exact evaluation: `train_and_evaluate(config, workdir)`.

One `Mesh` over every device of the job with a single ``data`` axis. The training step is written
once, per device (`per_device_train_step`): forward/backward on the device's shard (optionally in
micro-batches), gradients averaged with `pmean` over the ``data`` axis, the same optax update on
every device. Two executors run it:

* ``jit`` (default): `jax.jit` of `jax.shard_map` over the mesh — batch ``P('data')``, state
  ``P()`` (replicated), state buffers donated. Works unchanged across processes.
* ``pmap``: `jax.pmap` over the local devices, kept for comparison (pmap is in maintenance mode).

Because the per-device computation is explicit, BatchNorm semantics are explicit too: ``global``
averages statistics over the ``data`` axis, ``per_device`` and ``ghost`` do not communicate.

``config.method`` (see `anp_jax.methods`) selects the training method, on the same pipeline and
checkpoints:

* ``sync``: the above.
* ``async``: simulated asynchronous SGD on the ``jit`` executor: the state also holds a ring
  buffer of the last ``max_tau + 1`` parameter snapshots; the step takes tau (a replicated scalar,
  drawn on the host per step) and computes the gradient on the parameters of tau steps ago, then
  updates the current parameters with it.
* ``local_sgd``: a 2-D mesh (``node``, ``device``) over the same devices in the same order. Each
  node keeps its own replica (every state leaf has a leading node axis, sharded ``P('node')``);
  gradients are averaged over ``device`` only; every ``sync_every`` steps a second compiled step
  also averages parameters and BN statistics over ``node``. The host picks the step function by
  step number, so no collective sits inside a conditional.
"""

import dataclasses
import functools
import logging
import math
import os
import time
from typing import Any, Callable, Dict, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from anp_jax import (checkpointing, durations, methods, models, optim, preemption,
                     pretrained, reporting)
from anp_jax.data import pipeline
from anp_jax.research import noise_scale
from anp_jax.models import conv as conv_lowerings

AXIS = 'data'
NODE, DEVICE = 'node', 'device'  # The local-SGD mesh axes.
HEADS = ('anp', 'adjective', 'noun')
LABEL_OF = {'anp': 'label_anp', 'adjective': 'label_adjective', 'noun': 'label_noun'}


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any
  # EMAs of the two terms of the gradient-noise-scale estimator (McCandlish et al. 2018).
  noise_ema: Dict[str, jax.Array]
  # method='async' only: the last max_tau + 1 parameter snapshots, step t in slot t % (max_tau+1).
  history: Any = None


# ----------------------------------------------------------------------------------------------
# Configuration: validation and derived sizes.


@dataclasses.dataclass(frozen=True)
class Setup:
  """Every size the run derives from the config and the job's devices (logged at start-up)."""
  process_count: int
  local_devices: int
  devices: int
  batch_size: int  # Global examples per optimizer step.
  per_process_batch: int
  per_device_batch: int
  accum_steps: int
  per_device_micro_batch: int
  eval_per_process_batch: int
  num_eval_batches: int
  steps_per_epoch: float  # train_size / batch_size: an epoch is train_size examples.
  total_steps: int
  eval_every_steps: int
  train_size: int

  def steps(self, epochs: float, rounding: str = 'round', minimum: int = 0) -> int:
    """A duration in epochs (of train_size examples) in this run's steps."""
    return durations.to_steps(steps_per_epoch=self.steps_per_epoch, epochs=epochs,
                              rounding=rounding, minimum=minimum)

  def progress(self, step: int, prefix: str) -> Dict[str, float]:
    """``prefix/examples_seen``, ``prefix/passes`` (and ``prefix/epoch`` = passes) at `step`."""
    seen = durations.examples_seen(step, self.batch_size)
    passes = durations.passes(step, self.batch_size, self.train_size)
    return {f'{prefix}/examples_seen': float(seen), f'{prefix}/passes': passes,
            f'{prefix}/epoch': passes}

  def describe(self) -> str:
    micro = (f', {self.accum_steps} micro-batches of {self.per_device_micro_batch}/device'
             if self.accum_steps > 1 else '')
    return (f'{self.process_count} process(es) x {self.local_devices} device(s) = '
            f'{self.devices} devices; global batch {self.batch_size} -> '
            f'{self.per_process_batch}/process -> {self.per_device_batch}/device{micro}; '
            f'{self.steps_per_epoch:.4g} steps/epoch, {self.total_steps} steps = '
            f'{self.total_steps * self.batch_size} examples '
            f'({self.total_steps * self.batch_size / self.train_size:.3g} passes); eval '
            f'{self.num_eval_batches} batches of {self.eval_per_process_batch}/process')


EXECUTORS = ('jit', 'pmap')

# Every enumerated config field (dotted path) and its allowed values: `validate_config` checks
# them all in one loop, before anything is read or compiled. The tuples live next to the code
# that dispatches on them.
CHOICES = {
    'dataset': pipeline.DATASETS,
    'augment': pipeline.AUGMENTS,
    'model.name': tuple(sorted(models.ARCHS)),
    'model.dtype': tuple(models.DTYPES),
    'model.conv_impl': conv_lowerings.IMPLS,
    'bn_mode': models.BN_MODES,
    'optimizer': optim.OPTIMIZERS,
    'lr_scaling': optim.SCALING_RULES,
    'schedule': optim.SCHEDULES,
    'executor': EXECUTORS,
    'method': methods.METHODS,
    'async_sgd.staleness': methods.STALENESS,
    'async_sgd.momentum': methods.MOMENTUM_MODES,
}
# Why a value someone may expect is refused (appended to the message).
_CHOICE_HINTS = {'model.dtype': models.DTYPE_HINTS}


def _check_choices(config) -> None:
  for field, allowed in CHOICES.items():
    node = config
    for part in field.split('.'):
      if part not in node:  # A config without the section keeps the code's default.
        break
      node = node[part]
    else:
      if node not in allowed:
        hint = _CHOICE_HINTS.get(field, {}).get(node, '') if isinstance(node, str) else ''
        raise ValueError(f'config.{field}={node!r} is unknown; choose one of {allowed}.'
                         + (f' {hint}' if hint else ''))


def validate_config(config) -> None:
  """Fails fast, before any data is read or anything compiled, with what to change."""
  _check_choices(config)
  stem = models.ARCHS[config.model.name][2]
  min_size = models.MIN_IMAGE_SIZE[stem]
  if config.image_size < min_size:
    raise ValueError(f'config.image_size={config.image_size} is too small for '
                     f'{config.model.name} (needs >= {min_size} px); raise image_size or pick a '
                     'CIFAR-style model (resnet20/32/56).')
  for name in ('batch_size', 'eval_batch_size', 'grad_accum_steps', 'base_batch_size'):
    if int(config[name]) <= 0:
      raise ValueError(f'config.{name} must be > 0, got {config[name]}.')
  if config.num_train_steps == 0 or (config.num_train_steps < 0 and config.num_epochs <= 0):
    raise ValueError('Nothing to train: set config.num_epochs > 0 or config.num_train_steps > 0 '
                     f'(got num_epochs={config.num_epochs}, '
                     f'num_train_steps={config.num_train_steps}).')
  if config.base_lr <= 0:
    raise ValueError(f'config.base_lr must be > 0, got {config.base_lr}.')
  stop_metric = config.get('stop_at_metric', '')
  if stop_metric:
    head = stop_metric.split('/', 1)[-1]
    if not (stop_metric.startswith('eval/') and head.rsplit('_', 1)[0] in HEADS
            and head.rsplit('_', 1)[-1] in ('top1', 'top5')):
      raise ValueError(f'config.stop_at_metric={stop_metric!r}: use an evaluation accuracy, e.g. '
                       "'eval/anp_top1', 'eval/noun_top5' (or '' to train the whole budget).")
    if not 0.0 < float(config.stop_at_value) <= 1.0:
      raise ValueError(f'config.stop_at_value={config.stop_at_value} is an unreachable target '
                       'for an accuracy: use a fraction in (0, 1].')
    if config.eval_every_epochs <= 0:
      raise ValueError('config.stop_at_metric needs periodic evaluation: set '
                       'config.eval_every_epochs > 0.')
  methods.validate(config)
  pretrained.validate(config)
  pipeline.check_data_dir(config)


def resolve_setup(config, train_size: int, eval_size: int, devices: Optional[int] = None,
                  local_devices: Optional[int] = None,
                  process_count: Optional[int] = None) -> Setup:
  """Derives and checks every batch size; raises with what to change."""
  devices = jax.device_count() if devices is None else devices
  local_devices = jax.local_device_count() if local_devices is None else local_devices
  process_count = jax.process_count() if process_count is None else process_count
  methods.validate(config, devices, process_count)
  b, k = int(config.batch_size), int(config.grad_accum_steps)
  if b % devices:
    raise ValueError(f'config.batch_size={b} (the global batch) is not divisible by the '
                     f'{devices} devices of this job; use a multiple of {devices}, e.g. '
                     f'{max(devices, b // devices * devices)}.')
  per_device = b // devices
  if per_device % k:
    raise ValueError(f'The per-device batch {per_device} (= batch_size {b} / {devices} devices) '
                     f'is not divisible by config.grad_accum_steps={k}.')
  micro = per_device // k
  if config.bn_mode == 'ghost' and micro % config.bn_group_size:
    raise ValueError(f'Ghost BatchNorm needs the per-device micro-batch ({micro}) to be a '
                     f'multiple of config.bn_group_size={config.bn_group_size}; change '
                     'batch_size, grad_accum_steps or bn_group_size.')
  eb = int(config.eval_batch_size)
  if eb % devices:
    raise ValueError(f'config.eval_batch_size={eb} is not divisible by the {devices} devices; '
                     f'use a multiple of {devices}.')
  per_process = b // process_count
  if train_size // devices < per_device:
    raise ValueError(f'The training split has {train_size} examples: fewer than one per-device '
                     f'batch ({per_device}) for each of the {devices} devices. Lower '
                     'batch_size or use more data.')
  if eval_size < process_count:
    raise ValueError(f'The evaluation split has {eval_size} examples, fewer than the '
                     f'{process_count} processes.')
  # Durations are in examples: an epoch is train_size examples at any batch size (the stream
  # crosses epoch boundaries, nothing is dropped), converted to steps by `anp_jax.durations`.
  steps_per_epoch = train_size / b
  if config.num_train_steps > 0:
    total = int(config.num_train_steps)
  else:
    total = durations.to_steps(steps_per_epoch=steps_per_epoch, epochs=config.num_epochs,
                               rounding='ceil', minimum=1)
  eval_every = durations.to_steps(steps_per_epoch=steps_per_epoch,
                                  epochs=config.eval_every_epochs, minimum=1) if (
      config.eval_every_epochs > 0) else total
  eval_pp = eb // process_count
  return Setup(process_count=process_count, local_devices=local_devices, devices=devices,
               batch_size=b, per_process_batch=per_process, per_device_batch=per_device,
               accum_steps=k, per_device_micro_batch=micro, eval_per_process_batch=eval_pp,
               num_eval_batches=pipeline.num_eval_batches(eval_size, process_count, eval_pp),
               steps_per_epoch=steps_per_epoch, total_steps=total, eval_every_steps=eval_every,
               train_size=train_size)


# ----------------------------------------------------------------------------------------------
# Loss and metrics.


def cross_entropy(logits, labels, label_smoothing: float = 0.0):
  n = logits.shape[-1]
  onehot = jax.nn.one_hot(labels, n)
  if label_smoothing:
    onehot = optax.smooth_labels(onehot, label_smoothing)
  return optax.softmax_cross_entropy(logits, onehot)


def head_metrics(logits: Dict[str, jax.Array], batch, config, mask=None):
  """Weighted multi-task loss (mean over unmasked examples) and metric *sums* per head."""
  mask = jnp.ones(batch['label_anp'].shape, jnp.float32) if mask is None else mask
  count = jnp.sum(mask)
  total_loss = 0.0
  sums = {'count': count}
  for head, head_logits in logits.items():
    labels = batch[LABEL_OF[head]]
    ce = cross_entropy(head_logits, labels, config.get('label_smoothing', 0.0))
    total_loss = total_loss + config.loss_weights[head] * jnp.sum(ce * mask)
    k = min(5, head_logits.shape[-1])
    topk = jax.lax.top_k(head_logits, k)[1]
    hit = topk == labels[:, None]
    sums[f'{head}_loss'] = jnp.sum(ce * mask)
    sums[f'{head}_top1'] = jnp.sum(hit[:, 0] * mask)
    sums[f'{head}_top5'] = jnp.sum(jnp.any(hit, axis=-1) * mask)
  sums['loss'] = total_loss
  return total_loss / jnp.maximum(count, 1.0), sums


def summarize(sums: Dict[str, Any], prefix: str) -> Dict[str, float]:
  """Metric sums → means (``loss``, ``anp_top1``, ...), with ``prefix/``."""
  sums = {k: float(v) for k, v in sums.items()}
  count = max(sums.pop('count'), 1.0)
  out = {f'{prefix}/{k}': v / count for k, v in sums.items() if not k.startswith('_')}
  for k, v in sums.items():
    if k.startswith('_'):  # Already a value, not a sum (e.g. the noise scale).
      out[f'{prefix}/{k[1:]}'] = v
  return out


# ----------------------------------------------------------------------------------------------
# The per-device step (shared by both executors).


def per_device_train_step(state: TrainState, batch, *, model, tx, config, accum_steps: int,
                          num_devices: int, axis_name: Optional[str] = AXIS,
                          in_shard_map: bool = False, tau: Optional[jax.Array] = None,
                          staleness_aware_lr: bool = False):
  """One optimizer step on this device's shard; collectives over `axis_name`.

  Under `shard_map` the replicated parameters are first cast to 'varying' so that `jax.grad`
  returns this device's gradient (otherwise shard_map's AD would already sum it over devices);
  the explicit `pmean` below then averages, exactly as under `pmap`.

  With ``tau`` (simulated asynchronous SGD; needs ``state.history``) the current parameters are
  first written to the history slot of this step, then the gradient is computed on the snapshot
  of ``tau`` steps ago (tau = 0: the current parameters, bit for bit) with the current BN
  statistics, and applied to the *current* parameters. ``staleness_aware_lr`` divides the
  optimizer's update (the step, weight decay included) by max(tau, 1), i.e. the learning rate
  (Zhang et al. 2016). Dividing the gradient instead would do nothing for adamw, lamb and lars,
  whose updates do not depend on the gradient's scale; the optimizer state (momentum, moments)
  still accumulates the undivided gradient.
  """

  def grads_of(params, batch_stats, mb):
    def loss_fn(p):
      logits, mutated = model.apply({'params': p, 'batch_stats': batch_stats}, mb['image'],
                                    train=True, mutable=['batch_stats'])
      loss, sums = head_metrics(logits, mb, config)
      return loss, (sums, mutated['batch_stats'])
    (_, (sums, new_stats)), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return g, sums, new_stats

  params = state.params
  history = state.history
  if tau is not None:
    slots = jax.tree.leaves(history)[0].shape[0]
    write = state.step % slots
    read = (state.step - tau) % slots  # The host guarantees 0 <= tau <= min(step, max_tau).
    history = jax.tree.map(lambda h, p: h.at[write].set(p), history, params)
    params = jax.tree.map(lambda h: h[read], history)
  if in_shard_map and axis_name is not None:
    params = jax.lax.pcast(params, axis_name, to='varying')
  if accum_steps == 1:
    grads, sums, new_stats = grads_of(params, state.batch_stats, batch)
    small_sq = optim.global_norm_sq(grads)
  else:
    micro = jax.tree.map(lambda x: x.reshape((accum_steps, -1) + x.shape[1:]), batch)

    def body(carry, mb):
      g_acc, s_acc, bs_acc, sq_acc = carry
      # Every micro-batch starts from the same running statistics, and their updates are
      # averaged: with ghost BN this equals one step on the whole batch.
      g, s, bs = grads_of(params, state.batch_stats, mb)
      add = lambda a, b: jax.tree.map(jnp.add, a, b)
      return (add(g_acc, g), add(s_acc, s), add(bs_acc, bs),
              sq_acc + optim.global_norm_sq(g)), None

    # The first micro-batch seeds the carry (it has the right types, also under shard_map).
    g0, s0, bs0 = grads_of(params, state.batch_stats, jax.tree.map(lambda x: x[0], micro))
    (grads, sums, new_stats, sq), _ = jax.lax.scan(
        body, (g0, s0, bs0, optim.global_norm_sq(g0)), jax.tree.map(lambda x: x[1:], micro))
    grads = jax.tree.map(lambda g: g / accum_steps, grads)
    new_stats = jax.tree.map(lambda s: s / accum_steps, new_stats)
    small_sq = sq / accum_steps

  b_small = batch['label_anp'].shape[0] // accum_steps
  if axis_name is not None:
    grads = jax.lax.pmean(grads, axis_name)
    sums = jax.lax.psum(sums, axis_name)
    new_stats = jax.lax.pmean(new_stats, axis_name)
    small_sq = jax.lax.pmean(small_sq, axis_name)
  new_stats = pretrained.keep_frozen_stats(config, state.batch_stats, new_stats)
  big_sq = optim.global_norm_sq(grads)
  b_big = b_small * accum_steps * num_devices

  noise_ema = state.noise_ema
  if (config.get('noise_scale', True) and b_big > b_small
      and not noise_scale.unmeasurable_reason(config.bn_mode, num_devices)):
    noise_ema = noise_scale.update_ema_state(noise_ema, small_sq, big_sq, b_small, b_big,
                                             config.get('noise_scale_ema', 0.95))
  sums = dict(sums)
  sums['_grad_norm'] = jnp.sqrt(big_sq)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  if tau is not None and staleness_aware_lr:
    # The update, not the gradient: adaptive / trust-ratio optimizers (adamw, lamb, lars)
    # normalise the gradient's scale away.
    updates = jax.tree.map(lambda u: u / jnp.maximum(tau, 1).astype(u.dtype), updates)
  params = optax.apply_updates(state.params, updates)
  new_state = state.replace(step=state.step + 1, params=params, batch_stats=new_stats,
                            opt_state=opt_state, noise_ema=noise_ema, history=history)
  return new_state, sums


def per_device_eval_step(state: TrainState, batch, *, model, config,
                         axis_name: Optional[str] = AXIS):
  logits = model.apply({'params': state.params, 'batch_stats': state.batch_stats},
                       batch['image'], train=False)
  _, sums = head_metrics(logits, batch, config, mask=batch['mask'])
  return jax.lax.psum(sums, axis_name) if axis_name is not None else sums


# ----------------------------------------------------------------------------------------------
# State and executors.


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


def init_state(model, tx, image_size: int, seed: int, history: int = 0) -> TrainState:
  """Initial state (host-independent: every process computes the same values).

  ``history`` > 0 adds the asynchronous-SGD parameter history (that many snapshots, all equal
  to the initial parameters; slots before step 0 are never read).
  """
  x = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
  variables = model.init(jax.random.key(seed), x, train=False)
  params = variables['params']
  zero = jnp.zeros((), jnp.float32)
  snapshots = None
  if history:
    snapshots = jax.tree.map(lambda p: jnp.broadcast_to(p, (history,) + p.shape), params)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    batch_stats=variables.get('batch_stats', {}), opt_state=tx.init(params),
                    noise_ema={'g2': zero, 'trace': zero, 'weight': zero}, history=snapshots)


@dataclasses.dataclass
class Executor:
  """Compiled train/eval steps plus the host→device transfer for one executor kind."""
  kind: str
  init: Callable[[], Any]
  train_step: Callable
  eval_step: Callable
  to_device: Callable
  fetch: Callable  # A replicated device value → numpy on this host.
  unreplicate: Callable  # Executor state → TrainState with one copy of every leaf.
  # Extra arguments of `train_step` for the (0-based) step about to run: () for sync, (tau,) for
  # async, (average?,) for local SGD. Host-side and a pure function of the step: exact resume.
  step_args: Callable[[int], tuple] = lambda step: ()
  describe: str = ''  # Method-specific start-up line (staleness, memory, nodes).
  identity: Optional[Dict[str, Any]] = None  # Checkpoint identity beyond the config fields.


def make_executor(config, model, tx, setup: Setup, mesh) -> Executor:
  method = config.get('method', 'sync')
  if method == 'local_sgd':
    return _local_sgd_executor(config, model, tx, setup, mesh)
  history = int(config.async_sgd.max_tau) + 1 if method == 'async' else 0
  train_fn = functools.partial(per_device_train_step, model=model, tx=tx, config=config,
                               accum_steps=setup.accum_steps, num_devices=setup.devices)
  if method == 'async':
    train_fn = functools.partial(
        train_fn, staleness_aware_lr=bool(config.async_sgd.staleness_aware_lr))
  eval_fn = functools.partial(per_device_eval_step, model=model, config=config)
  init_fn = functools.partial(init_state, model, tx, config.image_size, config.seed,
                              history=history)

  if method == 'async':
    return _async_executor(config, train_fn, eval_fn, init_fn, setup, mesh)
  if config.executor == 'jit':
    replicated = NamedSharding(mesh, P())
    data = NamedSharding(mesh, P(AXIS))
    train_sm = jax.shard_map(functools.partial(train_fn, in_shard_map=True), mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=(P(), P()))
    eval_sm = jax.shard_map(eval_fn, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P())
    return Executor(
        kind='jit',
        init=jax.jit(init_fn, out_shardings=replicated),
        train_step=jax.jit(train_sm, in_shardings=(replicated, data),
                           out_shardings=(replicated, replicated), donate_argnums=(0,)),
        eval_step=jax.jit(eval_sm, in_shardings=(replicated, data), out_shardings=replicated),
        to_device=lambda batch: jax.tree.map(
            lambda x: jax.make_array_from_process_local_data(data, x), batch),
        fetch=lambda x: jax.tree.map(lambda a: np.asarray(a.addressable_data(0)), x),
        unreplicate=lambda s: s)

  n_local = jax.local_device_count()

  def replicate(tree):
    stacked = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (n_local,) + x.shape), tree)
    return jax.pmap(lambda t: t)(stacked)

  def to_device(batch):
    return jax.tree.map(lambda x: x.reshape((n_local, -1) + x.shape[1:]), batch)

  return Executor(
      kind='pmap',
      init=lambda: replicate(jax.device_get(jax.jit(init_fn)())),
      train_step=jax.pmap(train_fn, axis_name=AXIS, donate_argnums=(0,)),
      eval_step=jax.pmap(eval_fn, axis_name=AXIS),
      to_device=to_device,
      fetch=lambda x: jax.tree.map(lambda a: np.asarray(a[0]), x),
      unreplicate=lambda s: jax.tree.map(lambda a: a[0], s))


def _async_executor(config, train_fn, eval_fn, init_fn, setup: Setup, mesh) -> Executor:
  """Simulated asynchronous SGD on the jit executor: the step also takes tau (replicated)."""
  a = config.async_sgd
  replicated = NamedSharding(mesh, P())
  data = NamedSharding(mesh, P(AXIS))

  def step(state, batch, tau):
    return train_fn(state, batch, in_shard_map=True, tau=tau)

  train_sm = jax.shard_map(step, mesh=mesh, in_specs=(P(), P(AXIS), P()), out_specs=(P(), P()))
  eval_sm = jax.shard_map(eval_fn, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P())
  drawn = methods.staleness_sequence(config, setup.total_steps)
  taus = methods.clip_staleness(drawn, int(a.max_tau))

  def step_args(step: int):
    tau = np.int32(taus[step]) if step < len(taus) else np.int32(min(step, int(a.max_tau)))
    # A global (replicated) scalar, so that multi-process jobs can pass it too.
    return (jax.make_array_from_callback((), replicated, lambda _: tau),)

  shapes = jax.eval_shape(init_fn)
  snapshot = methods.tree_bytes(shapes.params)
  slots = int(a.max_tau) + 1
  describe = (f'{methods.describe_staleness(config, drawn)}; parameter history '
              f'{slots} x {snapshot / 2**20:.2f} MiB = {slots * snapshot / 2**20:.2f} MiB per '
              f'device; staleness-aware lr {"on" if a.staleness_aware_lr else "off"}; '
              f'momentum {config.momentum:g}'
              + (f' ({a.momentum})' if a.momentum == 'compensate' else ''))
  return Executor(
      kind='jit',
      init=jax.jit(init_fn, out_shardings=replicated),
      train_step=jax.jit(train_sm, in_shardings=(replicated, data, replicated),
                         out_shardings=(replicated, replicated), donate_argnums=(0,)),
      eval_step=jax.jit(eval_sm, in_shardings=(replicated, data), out_shardings=replicated),
      to_device=lambda batch: jax.tree.map(
          lambda x: jax.make_array_from_process_local_data(data, x), batch),
      fetch=lambda x: jax.tree.map(lambda a: np.asarray(a.addressable_data(0)), x),
      unreplicate=lambda s: s, step_args=step_args, describe=describe,
      identity={'method': 'async', 'async_sgd.max_tau': int(a.max_tau)})


def _is_float(x) -> bool:
  return jnp.issubdtype(x.dtype, jnp.floating)


def _local_sgd_executor(config, model, tx, setup: Setup, mesh) -> Executor:
  """Local SGD over the (node, device) mesh; state leaves carry a leading node axis."""
  nodes, per_node = mesh.shape[NODE], mesh.shape[DEVICE]
  every = int(config.local_sgd.sync_every)
  average_opt = bool(config.local_sgd.average_opt_state)
  both = (NODE, DEVICE)
  node_sharded = NamedSharding(mesh, P(NODE))
  replicated = NamedSharding(mesh, P())
  data = NamedSharding(mesh, P(both))
  train_fn = functools.partial(per_device_train_step, model=model, tx=tx, config=config,
                               accum_steps=setup.accum_steps, num_devices=per_node,
                               axis_name=DEVICE, in_shard_map=True)
  init_fn = functools.partial(init_state, model, tx, config.image_size, config.seed)

  def node_mean(tree):
    return jax.tree.map(lambda x: jax.lax.pmean(x, NODE) if _is_float(x) else x, tree)

  def step(state, batch, average: bool):
    local = jax.tree.map(lambda x: x[0], state)  # This node's replica.
    new, sums = train_fn(local, batch)
    if average:
      new = new.replace(params=node_mean(new.params), batch_stats=node_mean(new.batch_stats))
      if average_opt:
        new = new.replace(opt_state=node_mean(new.opt_state))
    grad_norm = sums.pop('_grad_norm')
    sums = jax.lax.psum(sums, NODE)  # Metric sums over the whole global batch.
    sums['_grad_norm'] = jax.lax.pmean(grad_norm, NODE)
    return jax.tree.map(lambda x: x[None], new), sums

  def eval_step(state, batch):
    # The node-averaged model (what a final average would give).
    local = jax.tree.map(lambda x: x[0], state)
    local = local.replace(params=node_mean(local.params),
                          batch_stats=node_mean(local.batch_stats))
    return per_device_eval_step(local, batch, model=model, config=config, axis_name=both)

  compiled = {}
  for average in (False, True):
    sm = jax.shard_map(functools.partial(step, average=average), mesh=mesh,
                       in_specs=(P(NODE), P(both)), out_specs=(P(NODE), P()))
    compiled[average] = jax.jit(sm, in_shardings=(node_sharded, data),
                                out_shardings=(node_sharded, replicated), donate_argnums=(0,))

  def train_step(state, batch, average: bool = False):
    return compiled[bool(average)](state, batch)

  def init():
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (nodes,) + x.shape), init_fn())

  def average_state(state):
    return jax.tree.map(lambda x: jnp.mean(x, axis=0).astype(x.dtype) if _is_float(x) else x[0],
                        state)

  def fetch(tree):
    def one(a):
      value = np.asarray(a.addressable_data(0))
      spec = getattr(a.sharding, 'spec', ())
      return value[0] if len(spec) and spec[0] == NODE else value
    return jax.tree.map(one, tree)

  eval_sm = jax.shard_map(eval_step, mesh=mesh, in_specs=(P(NODE), P(both)), out_specs=P())
  return Executor(
      kind='local_sgd',
      init=jax.jit(init, out_shardings=node_sharded),
      train_step=train_step,
      eval_step=jax.jit(eval_sm, in_shardings=(node_sharded, data), out_shardings=replicated),
      to_device=lambda batch: jax.tree.map(
          lambda x: jax.make_array_from_process_local_data(data, x), batch),
      fetch=fetch,
      unreplicate=jax.jit(average_state, out_shardings=replicated),
      step_args=lambda step: ((step + 1) % every == 0,),
      describe=(f'local SGD: {nodes} node(s) x {per_node} device(s), parameters'
                f'{" and optimizer state" if average_opt else ""} and BN statistics averaged '
                f'across nodes every {every} step(s)'
                + ("; bn_mode='global' averages over a node's batch" if
                   config.bn_mode == 'global' else '')),
      identity={'method': 'local_sgd', 'local_sgd.nodes': nodes})


# ----------------------------------------------------------------------------------------------
# The training loop.


@dataclasses.dataclass
class Run:
  """Everything a run is built from; also the handle for interactive use (see README)."""
  config: ml_collections.ConfigDict
  builder: Any
  meta: pipeline.DatasetMeta
  setup: Setup
  mesh: jax.sharding.Mesh
  model: nn.Module
  schedule: optax.Schedule
  tx: optax.GradientTransformation
  executor: Executor
  init: Optional[pretrained.LoadedWeights] = None  # config.init_from, read and checked.

  def init_state(self):
    state = self.executor.init()
    return state if self.init is None else pretrained.place(state, self.init)

  def train_batches(self, start_step: int = 0):
    """Global training batches (device arrays), from `start_step` on."""
    ds = pipeline.train_dataset(self.builder, self.config,
                                per_device_batch=self.setup.per_device_batch,
                                num_shards=self.setup.devices,
                                shards=pipeline.local_shards(self.mesh), start_step=start_step)
    return pipeline.global_batches(ds, None, to_device=self.executor.to_device)

  def train_step(self, state, batch, step: Optional[int] = None):
    """One step; `step` (0-based, default: read from `state`) picks tau / the averaging."""
    if step is None:
      step = int(self.executor.fetch(state.step))
    return self.executor.train_step(state, batch, *self.executor.step_args(step))

  def evaluate(self, state, split: Optional[str] = None) -> Dict[str, float]:
    sums = evaluate(self.executor, state, self.builder, self.config, self.setup,
                    split or self.meta.eval_split)
    return summarize(sums, 'eval')

  def fetch(self, tree):
    return self.executor.fetch(tree)


def build(config: ml_collections.ConfigDict) -> Run:
  """Validates `config`, prepares the dataset and builds mesh, model, optimizer and executor."""
  validate_config(config)
  builder = pipeline.get_builder(config)
  meta = pipeline.dataset_meta(builder, config)
  setup = resolve_setup(config, meta.train_size, meta.eval_size)
  method = config.get('method', 'sync')
  if method == 'local_sgd':
    mesh = make_node_mesh(methods.resolve_nodes(config, setup.devices, setup.process_count))
  else:
    mesh = make_mesh()
  # Global BN averages over the axis the gradients are averaged over: a node's devices in local
  # SGD (the nodes only meet at the averaging steps).
  model = models.create_model(config, meta.num_anps, meta.num_adjectives, meta.num_nouns,
                              axis_name=DEVICE if method == 'local_sgd' else AXIS)
  schedule = optim.create_lr_schedule(config, setup.steps_per_epoch, setup.total_steps)
  tx_config = config
  if method == 'async' and config.async_sgd.momentum == 'compensate':
    tx_config = ml_collections.ConfigDict(config.to_dict())
    tx_config.momentum = methods.compensated_momentum(
        config.momentum, methods.expected_staleness(config) + 1)
  # Read and checked here, on the host, before anything compiles.
  init = pretrained.load(config, model) if config.get('init_from', '') else None
  tx = pretrained.create_optimizer(tx_config, schedule, init)
  executor = make_executor(tx_config, model, tx, setup, mesh)
  return Run(config, builder, meta, setup, mesh, model, schedule, tx, executor, init)


@dataclasses.dataclass
class TrainResult:
  state: TrainState  # Unreplicated final state.
  history: list  # Logged train/eval metric dicts, in order.
  final_eval: Dict[str, float]
  setup: Setup
  wall_time_s: float


def evaluate(executor: Executor, state, builder, config, setup: Setup, split: str):
  """Exact evaluation: every example of `split` counted once (padding masked out)."""
  ds = pipeline.eval_dataset(builder, config, per_process_batch=setup.eval_per_process_batch,
                             split=split)
  total = None
  n = 0
  for batch in pipeline.global_batches(ds, None, to_device=executor.to_device):
    sums = executor.eval_step(state, batch)
    total = sums if total is None else jax.tree.map(jnp.add, total, sums)
    n += 1
  if n != setup.num_eval_batches:
    raise RuntimeError(f'Evaluation produced {n} batches, expected {setup.num_eval_batches}.')
  return executor.fetch(total)


class NonFiniteLossError(FloatingPointError):
  """Training diverged: the loss became NaN or Inf."""


def _check_finite(metrics: Dict[str, float], step: int, lr: float):
  loss = metrics.get('train/loss')
  if loss is not None and not math.isfinite(loss):
    raise NonFiniteLossError(
        f'Training stopped: the loss is {loss} at step {step} (learning rate {lr:.4g}). '
        'Lower config.base_lr, add warmup (config.warmup_epochs) or gradient clipping '
        '(config.grad_clip_norm). Checkpoints written before this step are intact.')


def _train_metrics(executor, pending, state, schedule, step, setup, config):
  """Fetches the accumulated step sums and turns them into logged means; NaN/Inf guard."""
  host = [executor.fetch(s) for s in pending]
  grad_norm = float(np.mean([h.pop('_grad_norm') for h in host]))
  totals = {k: sum(h[k] for h in host) for k in host[0]}
  metrics = summarize(totals, 'train')
  metrics['train/grad_norm'] = grad_norm
  metrics['train/lr'] = float(schedule(step - 1))
  metrics.update(setup.progress(step, 'train'))
  if config.get('noise_scale', True):
    metrics.update(noise_scale.log_fields(executor.fetch(state.noise_ema)))
  _check_finite(metrics, step, metrics['train/lr'])
  return metrics


def _target_reached(config, evaluated: Optional[Dict[str, float]]) -> bool:
  """Whether `evaluated` meets config.stop_at_metric >= config.stop_at_value (if set)."""
  metric = config.get('stop_at_metric', '')
  return bool(metric and evaluated and evaluated.get(metric, -math.inf) >= config.stop_at_value)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> TrainResult:
  """Trains `config` with the devices of this job, writing logs (and checkpoints) to `workdir`."""
  t_start = time.time()
  validate_config(config)
  workdir = os.path.abspath(os.path.expanduser(workdir))
  is_main = jax.process_index() == 0
  eval_only = bool(config.get('eval_only', False))
  # Nothing in the workdir changes until the run is accepted (config valid, checkpoint ours).
  checkpointing.check_workdir(workdir, require_checkpoint=eval_only)

  run = build(config)
  checkpointing.make_workdir(workdir, is_main)
  builder, meta, setup, mesh = run.builder, run.meta, run.setup, run.mesh
  schedule, executor = run.schedule, run.executor
  logging.info('Setup: %s', setup.describe())
  if executor.describe:
    logging.info('Method: %s', executor.describe)
  unmeasurable = (config.get('noise_scale', True)
                  and noise_scale.unmeasurable_reason(config.bn_mode, setup.devices))
  if unmeasurable:
    logging.warning('Noise scale not measured: %s.', unmeasurable)
  if is_main:
    print(f'anp_jax | {setup.describe()}', flush=True)
    if executor.describe:
      print(f'anp_jax | {executor.describe}', flush=True)
    if unmeasurable:
      print(f'anp_jax | WARNING: B_simple is not measured: {unmeasurable}.', flush=True)

  # Local SGD restores into the state's own (node-sharded) shardings; jit into replicated ones.
  # The label sets too: a checkpoint of a dataset with other classes would otherwise fail to
  # restore, look corrupt, and the run would silently start again from scratch.
  classes = {'num_anps': meta.num_anps, 'num_adjectives': meta.num_adjectives,
             'num_nouns': meta.num_nouns}
  ckpt = checkpointing.Checkpointer(workdir, config, mesh=mesh if executor.kind == 'jit' else None,
                                    identity_extra={**classes, **(executor.identity or {})})
  state = executor.init()
  state, start_step = ckpt.restore_or_init(state, executor)
  if eval_only:  # Beside the training logs, which stay as the training wrote them.
    if not start_step:
      ckpt.close()
      raise FileNotFoundError(f'config.eval_only: no checkpoint found in {workdir} (none '
                              'could be restored).')
    final = summarize(evaluate(executor, state, builder, config, setup, meta.eval_split), 'eval')
    ckpt.close()
    if is_main:
      reporting.write_json_atomic(os.path.join(workdir, 'eval_only_metrics.json'),
                                  {'step': start_step, 'time': time.time(), **final})
    return TrainResult(executor.unreplicate(state), [final], final, setup, time.time() - t_start)
  if run.init is not None and start_step == 0:  # A checkpoint in the workdir wins (resume).
    state = pretrained.place(state, run.init)
    logging.info(run.init.report)
    if is_main:
      print(f'anp_jax | {run.init.report}', flush=True)
  if is_main:  # The run is accepted: record its config.
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  writer = reporting.MetricWriter(workdir)
  history = []

  batches = run.train_batches(start_step)
  bar = reporting.ProgressBar(setup.total_steps, setup.batch_size, start_step,
                              enabled=config.progress_bar)
  pending = []
  final_eval: Dict[str, float] = {}
  step = start_step
  stopped_at_target = False
  run_ahead = preemption.RunAhead()  # Bounds the signal-to-checkpoint delay to a few steps.
  if config.get('stop_at_metric', '') and 0 < start_step < setup.total_steps:
    # A resumed early-stopping run may have stopped at this checkpoint already.
    final_eval = summarize(evaluate(executor, state, builder, config, setup, meta.eval_split),
                           'eval')
    final_eval.update(setup.progress(step, 'eval'))
    stopped_at_target = _target_reached(config, final_eval)
    if not stopped_at_target:
      final_eval = {}
  try:
    while step < setup.total_steps and not stopped_at_target:
      batch = next(batches)
      state, sums = executor.train_step(state, batch, *executor.step_args(step))
      pending.append(sums)
      run_ahead.push(sums)
      step += 1
      if step == start_step + 1:
        bar.reset_clock(step)  # Exclude compilation from the rates.
      last = step == setup.total_steps
      save_now, preempted = ckpt.save_due(step, force=last)
      # Metrics are fetched (and checked for NaN/Inf) before every save, so a diverged state is
      # never written over good checkpoints.
      if step % config.log_every_steps == 0 or last or save_now:
        metrics = _train_metrics(executor, pending, state, schedule, step, setup, config)
        pending = []
        sps, ips = bar.rates(step)
        metrics['train/steps_per_s'], metrics['train/images_per_s'] = sps, ips
        writer.write(step, metrics)
        history.append({'step': step, **metrics})
        bar.update(step, {'loss': metrics['train/loss'], 'top1': metrics['train/anp_top1']},
                   force=True)
      else:
        bar.update(step)
      evaluated = None
      if step % setup.eval_every_steps == 0 or last:
        jax.block_until_ready(state)  # The steps dispatched so far are training time.
        t_eval = time.time()
        sums = evaluate(executor, state, builder, config, setup, meta.eval_split)
        final_eval = evaluated = summarize(sums, 'eval')
        final_eval.update(setup.progress(step, 'eval'))
        writer.write(step, final_eval)
        history.append({'step': step, **final_eval})
        if is_main:
          bar.close()
          print(f'eval @ step {step}: ANP top-1 {100 * final_eval["eval/anp_top1"]:.2f}% '
                f'top-5 {100 * final_eval["eval/anp_top5"]:.2f}% | loss '
                f'{final_eval["eval/loss"]:.3f}', flush=True)
        bar.exclude(time.time() - t_eval)  # Rates after an evaluation count training only.
      if _target_reached(config, evaluated):
        stopped_at_target = True
        if is_main:
          print(f'{config.stop_at_metric} = {evaluated[config.stop_at_metric]:.4f} reached '
                f'config.stop_at_value={config.stop_at_value:g} at step {step}: stopping.',
                flush=True)
        if not save_now:  # Keep the stopping point (and the progress) in a checkpoint.
          save_now = True
      if save_now or evaluated:
        host_state = (jax.device_get(executor.unreplicate(state)) if executor.kind == 'pmap'
                      else None)
        if save_now:
          ckpt.save(step, state, host_state=host_state)
        if evaluated:
          ckpt.save_best(step, state, evaluated, host_state=host_state)
      if preempted and not last:
        ckpt.wait()
        logging.warning('Preempted: process %d stops at step %d.', jax.process_index(), step)
        if is_main:
          bar.close()
          print(f'Preempted: checkpoint written at step {step}; exiting with code '
                f'{checkpointing.EXIT_PREEMPTED} so that the launcher requeues the job.',
                flush=True)
        raise checkpointing.Preempted(step)
    if not final_eval:  # Resumed a finished run: report its accuracy again.
      if is_main:
        print(f'The run in {workdir} already finished (step {step}); evaluating its final '
              'checkpoint. Use another --workdir for a new run.', flush=True)
      final_eval = summarize(evaluate(executor, state, builder, config, setup, meta.eval_split),
                             'eval')
      final_eval.update(setup.progress(step, 'eval'))
  finally:
    bar.close()
    writer.close()
    ckpt.close()
  wall = time.time() - t_start
  if is_main:
    # Its existence means "this run is done" to the sweep: never seen half-written.
    reporting.write_json_atomic(os.path.join(workdir, 'final_metrics.json'), {
        'step': step, 'wall_time_s': wall, 'stopped_at_target': stopped_at_target,
        'examples_seen': durations.examples_seen(step, setup.batch_size),
        'passes': durations.passes(step, setup.batch_size, setup.train_size), **final_eval})
    if history:
      reporting.plot_history(history, os.path.join(workdir, 'curves.png'))
  from anp_jax import distributed
  distributed.barrier('train_and_evaluate_end')
  return TrainResult(executor.unreplicate(state), history, final_eval, setup, wall)
