"""The training and evaluation step of one device, written once for every executor and method.

`per_device_train_step` is the whole optimizer step on this device's shard of the global batch:
forward/backward (optionally in ``accum_steps`` micro-batches), gradients averaged with `pmean`
over `axis_name`, the same optax update on every device, the gradient-noise-scale EMAs, and the
metric *sums* (`anp_jax.metrics.summarize` turns them into means). The executors
(`anp_jax.executors`) run it under `jax.shard_map` or `jax.pmap`; because the per-device
computation is explicit, BatchNorm semantics are explicit too: ``global`` averages statistics
over `axis_name`, ``per_device`` and ``ghost`` do not communicate.
"""

from typing import Any, Dict, Optional

import flax
import jax
import jax.numpy as jnp
import optax

from anp_jax import collectives, noise_scale, optim
from anp_jax.data import device_input
from anp_jax.metrics import LABEL_OF

AXIS = 'data'  # The mesh axis of the batch (every device of the job).


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any
  # EMAs of the two terms of the gradient-noise-scale estimator (McCandlish et al. 2018).
  noise_ema: Dict[str, jax.Array]
  # method='async' only: the last max_tau + 1 parameter snapshots, step t in slot t % (max_tau+1).
  history: Any = None


def init_state(model, tx, image_size: int, seed: int, history: int = 0) -> TrainState:
  """Initial state (host-independent: every process computes the same values).

  ``history`` > 0 adds the asynchronous-SGD parameter history (that many snapshots, all equal
  to the initial parameters; slots before step 0 are never read).
  """
  x = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
  variables = model.init(jax.random.key(seed), x, train=False)
  params = variables['params']
  zero = jnp.zeros((), jnp.float32)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     batch_stats=variables.get('batch_stats', {}), opt_state=tx.init(params),
                     noise_ema={'g2': zero, 'trace': zero, 'weight': zero})
  return add_history(state, history) if history else state


def add_history(state: TrainState, history: int) -> TrainState:
  """`state` with an asynchronous-SGD parameter history of `history` snapshots, all equal to its
  parameters (a broadcast: no arithmetic, so the parameters stay bit for bit those of `state`)."""
  return state.replace(history=jax.tree.map(
      lambda p: jnp.broadcast_to(p, (history,) + p.shape), state.params))


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
    ce = cross_entropy(head_logits, labels, config.label_smoothing)
    total_loss = total_loss + config.loss_weights[head] * jnp.sum(ce * mask)
    k = min(5, head_logits.shape[-1])
    topk = jax.lax.top_k(head_logits, k)[1]
    hit = topk == labels[:, None]
    sums[f'{head}_loss'] = jnp.sum(ce * mask)
    sums[f'{head}_top1'] = jnp.sum(hit[:, 0] * mask)
    sums[f'{head}_top5'] = jnp.sum(jnp.any(hit, axis=-1) * mask)
  sums['loss'] = total_loss
  return total_loss / jnp.maximum(count, 1.0), sums


def accumulation_unrolled(unroll: Optional[bool] = None) -> bool:
  """Whether gradient accumulation runs its micro-batches as straight-line code (`unroll`, or by
  default: on CPU) rather than in a `lax.scan`.

  XLA:CPU runs a convolution inside a loop body in the layout it was written in: the backward
  pass's filter-gradient convolutions (dim_labels ``f01b_i01o->01bf``) stay in that form instead
  of being transposed into the form that it gives to Eigen outside loops (jax-ml/jax#12868,
  open). A ResNet-20 step at batch 128 in 4 micro-batches ran at 0.14x the images/s of the same
  step without accumulation in the scan, 0.84x unrolled (medians, docs/performance.md).
  Unrolled, the program holds `accum_steps` copies of the forward/backward pass: its
  compilation grows with them (ResNet-20, 32 px: 45 s with the scan, 159 s unrolled at 16
  micro-batches on 2 busy cores), once per run, against ~7x every step. Other backends keep the
  scan (one copy)."""
  return jax.default_backend() == 'cpu' if unroll is None else bool(unroll)


def per_device_train_step(state: TrainState, batch, *, model, tx, config, accum_steps: int,
                          num_devices: int, axis_name: Optional[str] = AXIS,
                          in_shard_map: bool = False, tau: Optional[jax.Array] = None,
                          staleness_aware_lr: bool = False,
                          unroll_accumulation: Optional[bool] = None):
  """One optimizer step on this device's shard; collectives over `axis_name`.

  With ``accum_steps`` > 1 the micro-batches run one after the other, their gradients summed in
  order, either as straight-line code (``unroll_accumulation``) or in a `lax.scan` (one compiled
  copy of the forward/backward pass). Default (None): unrolled on CPU, where the scan cost ~7x
  per image (`accumulation_unrolled`); the same sums either way.

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

  batch = device_input.finish(batch, config)  # uint8 windows -> images ('tf_device', 'dali').

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
    carry = (g0, s0, bs0, optim.global_norm_sq(g0))
    if accumulation_unrolled(unroll_accumulation):
      for i in range(1, accum_steps):
        carry, _ = body(carry, jax.tree.map(lambda x, i=i: x[i], micro))
    else:
      carry, _ = jax.lax.scan(body, carry, jax.tree.map(lambda x: x[1:], micro))
    grads, sums, new_stats, sq = carry
    grads = jax.tree.map(lambda g: g / accum_steps, grads)
    new_stats = jax.tree.map(lambda s: s / accum_steps, new_stats)
    small_sq = sq / accum_steps

  b_small = batch['label_anp'].shape[0] // accum_steps
  if axis_name is not None:
    # One all-reduce for everything the devices share (see `anp_jax.collectives`): the
    # gradient, BN statistics and |g|^2 averaged, the metric sums summed.
    (grads, new_stats, small_sq), sums = collectives.psum(
        ((grads, new_stats, small_sq), sums), axis_name)
    n = jax.lax.axis_size(axis_name)
    grads, new_stats, small_sq = jax.tree.map(lambda x: x / n, (grads, new_stats, small_sq))
  new_stats = optim.keep_frozen_stats(config, state.batch_stats, new_stats)
  big_sq = optim.global_norm_sq(grads)
  b_big = b_small * accum_steps * num_devices

  noise_ema = state.noise_ema
  if (config.noise_scale and b_big > b_small
      and not noise_scale.unmeasurable_reason(config.bn_mode, num_devices)):
    noise_ema = noise_scale.update_ema_state(noise_ema, small_sq, big_sq, b_small, b_big,
                                             config.noise_scale_ema)
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


def per_device_eval_step(state: TrainState, batch, *, model, config, fn=None,
                         axis_name: Optional[str] = AXIS):
  """What an evaluation adds up on this device's shard of a batch, summed over `axis_name`.

  ``fn(outputs, batch)`` gets the model's evaluation-mode outputs (the logits per head) and the
  finished batch (images, labels, and ``mask``: 0 for evaluation's padding examples, which every
  sum must leave out) and returns a pytree of sums over its examples; default: the
  classification metric sums of `head_metrics`. The executors compile it over their own state
  layout (`anp_jax.executors.common.Executor.map_eval`); the evaluators add the sums over the
  batches on the devices and fetch them once (`anp_jax.evaluators.PredictionEvaluator`).
  """
  batch = device_input.finish(batch, config)
  logits = model.apply({'params': state.params, 'batch_stats': state.batch_stats},
                       batch['image'], train=False)
  if fn is None:
    _, sums = head_metrics(logits, batch, config, mask=batch['mask'])
  else:
    sums = fn(logits, batch)
  return collectives.psum(sums, axis_name) if axis_name is not None else sums


def all_finite(state: TrainState) -> jax.Array:
  """Whether every parameter, BatchNorm statistic and optimizer-state value of `state` is finite
  (a boolean scalar): one reduction, checked before every evaluation and checkpoint. The
  noise-scale EMAs and the async parameter history are measurements and past parameters, not
  the model."""
  leaves = [x for x in jax.tree.leaves((state.params, state.batch_stats, state.opt_state))
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
