"""Simulated asynchronous SGD (``config.method='async'``) on the jit executor.

Every update applies a gradient computed on the parameters of ``tau`` steps ago: the state also
holds a ring buffer of the last ``max_tau + 1`` parameter snapshots (`TrainState.history`), the
step takes tau (a replicated scalar, drawn on the host per step, `Executor.step_args`) and
computes the gradient on the snapshot of tau steps ago, then updates the *current* parameters
with it (`anp_jax.steps.per_device_train_step`). The global batch of one step plays one worker's
mini-batch: to simulate N workers of batch b, set ``batch_size=b`` and take the staleness of N
workers (``staleness='simulated', workers=N``: mean tau = N - 1). `staleness_sequence` draws tau
per step as a pure function of the seed and the step, so a resumed run sees the same sequence.

BatchNorm: the forward pass runs the *stale* parameters with the *current* running statistics,
and the statistics it computes replace the current ones (a worker's statistics travel with its
gradient). Memory: (max_tau + 1) x parameter bytes per device (`tree_bytes` of the params).
``async_sgd.momentum='compensate'`` lowers the explicit momentum by the implicit momentum of
asynchrony (`optimizer_config`).
"""

import functools
import math

import jax
import ml_collections
import numpy as np

from anp_jax import steps
from anp_jax.executors.common import (Executor, MeshHelper, memoized_map_eval,
                                      per_device_functions)
from anp_jax.methods import STALENESS
from anp_jax.staleness import staleness_sampler


def expected_staleness(config) -> float:
  """Mean tau of config.async_sgd's distribution (before clipping): N - 1 for N workers."""
  a = config.async_sgd
  if a.staleness in ('constant', 'geometric'):
    return float(a.tau)
  if a.staleness == 'uniform':
    return a.max_tau / 2
  return float(a.workers - 1)


def compensated_momentum(momentum: float, workers: float) -> float:
  """Mitliagkas et al. 2016: N asynchronous workers add implicit momentum ~ 1 - 1/N."""
  return max(0.0, float(momentum) - (1.0 - 1.0 / workers))


def staleness_sequence(config, num_steps: int) -> np.ndarray:
  """tau for steps 0..num_steps-1 (int32): deterministic in ``async_sgd.seed``; not clipped.

  'constant': tau every step. 'uniform': integers 0..max_tau. 'geometric': P(k) = p (1-p)^k with
  mean tau (p = 1 / (1 + tau)). 'simulated': the staleness of `workers` workers against a
  parameter server, from the event simulation `anp_jax.staleness.staleness_sampler`, in the
  order the server applies the gradients (mean workers - 1). The sequence for n steps is a
  prefix of the one for more steps, so a longer run resumed from a shorter one agrees.
  """
  a = config.async_sgd
  n = int(num_steps)
  seed = int(a.seed)
  if a.staleness == 'constant':
    return np.full(n, int(a.tau), np.int32)
  if a.staleness == 'uniform':
    rng = np.random.default_rng([seed, 1])
    return rng.integers(0, int(a.max_tau) + 1, size=n).astype(np.int32)
  if a.staleness == 'geometric':
    if a.tau == 0:
      return np.zeros(n, np.int32)
    rng = np.random.default_rng([seed, 2])
    return (rng.geometric(1.0 / (1.0 + a.tau), size=n) - 1).astype(np.int32)
  if a.staleness == 'simulated':
    # The simulation's first gradients depend on nothing later, so a prefix stays a prefix.
    return staleness_sampler(int(a.workers), max(n, 1),
                                       compute_time_cv=float(a.compute_cv),
                                       seed=seed)[:n].astype(np.int32)
  raise ValueError(f'config.async_sgd.staleness={a.staleness!r} is unknown; choose one of '
                   f'{STALENESS}.')


def clip_staleness(taus: np.ndarray, max_tau: int, start_step: int = 0) -> np.ndarray:
  """tau clipped to the history kept (max_tau) and to the steps done (none before step 0)."""
  steps = np.arange(start_step, start_step + len(taus))
  return np.minimum(np.minimum(taus, max_tau), steps).astype(np.int32)


def describe_staleness(config, taus: np.ndarray) -> str:
  """One start-up line: the distribution, its realised mean, and what was clipped."""
  a = config.async_sgd
  over = int(np.sum(taus > a.max_tau))
  line = (f"simulated asynchronous SGD: staleness '{a.staleness}' (expected mean "
          f'{expected_staleness(config):.2f}, realised {taus.mean():.2f} over {len(taus)} '
          f'steps), max_tau {a.max_tau}')
  if over:
    line += (f'; {over} draw(s) ({100 * over / len(taus):.2f} %) exceeded max_tau and are '
             f'clipped to {a.max_tau}: raise config.async_sgd.max_tau to keep them '
             f'(largest draw {int(taus.max())})')
  return line


def tree_bytes(tree) -> int:
  """Bytes of a pytree of arrays (or ShapeDtypeStructs): one parameter snapshot of the history."""
  return int(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
                 for x in jax.tree.leaves(tree)))


def optimizer_config(config) -> ml_collections.ConfigDict:
  """The config the optimizer is built from: with ``momentum='compensate'``, a copy whose
  momentum is lowered by the implicit momentum of the expected staleness (else `config`)."""
  if config.async_sgd.momentum != 'compensate':
    return config
  tx_config = ml_collections.ConfigDict(config.to_dict())
  tx_config.momentum = compensated_momentum(config.momentum, expected_staleness(config) + 1)
  return tx_config


def make(config, model, tx, setup, mesh) -> Executor:
  """The async executor; `config` is the optimizer's (`optimizer_config`), for the start-up line."""
  a = config.async_sgd
  slots = int(a.max_tau) + 1
  train_fn, eval_fn, init_fn = per_device_functions(
      config, model, tx, setup, staleness_aware_lr=bool(a.staleness_aware_lr))
  helper = MeshHelper(mesh)

  def step(state, batch, tau):
    return train_fn(state, batch, in_shard_map=True, tau=tau)

  drawn = staleness_sequence(config, setup.total_steps)
  taus = clip_staleness(drawn, int(a.max_tau))

  def step_args(step: int):
    tau = np.int32(taus[step]) if step < len(taus) else np.int32(min(step, int(a.max_tau)))
    # A global (replicated) scalar, so that multi-process jobs can pass it too.
    return (jax.make_array_from_callback((), helper.replicated, lambda _: tau),)

  snapshot = tree_bytes(jax.eval_shape(init_fn).params)
  describe = (f'{describe_staleness(config, drawn)}; parameter history '
              f'{slots} x {snapshot / 2**20:.2f} MiB = {slots * snapshot / 2**20:.2f} MiB per '
              f'device; staleness-aware lr {"on" if a.staleness_aware_lr else "off"}; '
              f'momentum {config.momentum:g}'
              + (f' ({a.momentum})' if a.momentum == 'compensate' else ''))
  return Executor(
      name='jit', method='async',
      init=helper.jit_init(init_fn, expand=functools.partial(steps.add_history, history=slots)),
      train_step=helper.jit_train_step(step, num_scalar_args=1),
      # The current parameters (not the history) and BN statistics.
      map_eval=memoized_map_eval(
          lambda fn: helper.jit_eval_step(functools.partial(eval_fn, fn=fn))),
      to_device=helper.to_device, fetch=helper.fetch, unreplicate=lambda state: state,
      restore_target=helper.restore_target, step_args=step_args, describe=describe,
      identity={'method': 'async', 'async_sgd.max_tau': int(a.max_tau)})
