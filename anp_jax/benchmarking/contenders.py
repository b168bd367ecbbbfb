"""What is timed: the framework's own compiled train step on a fixed in-memory batch (`BareStep`),
and a plain `jax.jit` + optax loop of the same model (`build_reference_step`); the FLOPs of the
former without timing anything (`flop_counts`)."""

import dataclasses
import time
from typing import Any, Dict

import numpy as np

from anp_jax import flops


def head_sizes(config) -> Dict[str, int]:
  """Class counts of the three heads without touching the dataset (synthetic: from the config)."""
  if config.dataset == 'synthetic_anp':
    s = config.synthetic
    return {'anp': int(s.num_pairs), 'adjective': int(s.num_adjectives),
            'noun': int(s.num_nouns)}
  return {'anp': 553, 'adjective': 117, 'noun': 167}  # The MVSO-EN subset of the paper.


def heads(config):
  """`head_sizes` as the `models.Heads` that `models.create_model` takes."""
  from anp_jax import models
  sizes = head_sizes(config)
  return models.Heads(sizes['anp'], sizes['adjective'], sizes['noun'])


def synthetic_batch(config, batch: int, sizes: Dict[str, int], seed: int = 0):
  """A host batch of the pipeline's shapes and dtypes (normalised images, in the model's dtype
  when that is bfloat16 as `pipeline.image_dtype` gives them; int labels)."""
  from anp_jax import models
  rng = np.random.default_rng(seed)
  s = config.image_size
  dtype = models.DTYPES['bfloat16'] if config.model.dtype == 'bfloat16' else np.float32
  return {'image': rng.standard_normal((batch, s, s, 3), np.float32).astype(dtype),
          'mask': np.ones((batch,), np.float32),
          'label_anp': rng.integers(0, sizes['anp'], batch).astype(np.int32),
          'label_adjective': rng.integers(0, sizes['adjective'], batch).astype(np.int32),
          'label_noun': rng.integers(0, sizes['noun'], batch).astype(np.int32)}


@dataclasses.dataclass
class BareStep:
  """The framework's compiled step on a fixed device batch, ready to be timed."""
  setup: Any
  state: Any
  batch: Any
  lowered: Any  # The step before compilation: what its FLOPs are counted from.
  compiled: Any
  compile_s: float
  model: Any
  tx: Any
  heads: Any  # `models.Heads` of the model (for single-device counts of the same model).

  def run(self, steps: int):
    import jax
    state = self.state
    for _ in range(steps):
      state, sums = self.compiled(state, self.batch)
    jax.block_until_ready((state, sums))
    self.state = state


def build_bare_step(config, seed: int = 0) -> BareStep:
  """`executors.make_executor`'s jitted step for `config` on this job's devices (no dataset)."""
  import jax
  from anp_jax import executors, models, optim, setup as run_setup
  run_setup.validate_config(config)
  sizes = head_sizes(config)
  # Sizes of the (unread) splits, only used to derive the schedule: 10,000 steps per epoch keeps
  # every schedule boundary (epochs x steps) well inside int32.
  big = int(config.batch_size) * 10_000
  setup = run_setup.resolve_setup(config, big, big)
  mesh = executors.make_mesh()
  model = models.create_model(config, heads(config), axis_name=executors.AXIS)
  schedule = optim.create_lr_schedule(config, setup.steps_per_epoch, setup.total_steps)
  tx = optim.create_optimizer(config, schedule)
  executor = executors.make_executor(config, model, tx, setup, mesh)
  state = executor.init()
  jax.block_until_ready(state)
  per_process = config.batch_size // jax.process_count()
  host = synthetic_batch(config, per_process, sizes, seed + jax.process_index())
  batch = executor.to_device(host)
  if config.executor != 'jit':
    raise ValueError("The benchmark times the 'jit' executor; set --config.executor=jit.")
  t0 = time.perf_counter()
  lowered = executor.train_step.lower(state, batch)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  return BareStep(setup, state, batch, lowered, compiled, compile_s, model, tx, heads(config))


def flop_counts(config) -> Dict[str, Any]:
  """A config's FLOPs per image without timing anything (``experiments/benchmark.py
  --flops_only``): the train step as written (`flops.step_flops_as_written`; NaN where the
  backend analyses no lowered program), the same step counted by XLA:CPU (what the benchmark
  falls back to on such a backend) and the inference forward pass. The step is built and
  compiled, never run."""
  import jax
  bare = build_bare_step(config)
  b, n = config.batch_size, jax.device_count()
  return {'model': config.model.name, 'image_size': config.image_size, 'batch_size': b,
          'dtype': config.model.dtype, 'devices': n,
          'train_flops_per_image_as_written': flops.step_flops_as_written(config, bare) * n / b,
          'train_flops_per_image_xla_cpu': flops.per_device_step_flops_on_cpu(config, bare) * n / b,
          'forward_flops_per_image': flops.forward_flops_per_image(config, bare)}


def build_reference_step(config, seed: int = 0):
  """A plain jax.jit + optax loop of the same model on one device: no framework code.

  Same Flax model definition (the 'xla' convolution unless the config says otherwise),
  BatchNorm statistics over the whole batch, weighted cross-entropy over the heads, SGD with
  momentum `config.momentum`, a constant learning rate. Returns (run(n), compile_s, flops).
  """
  import jax
  import jax.numpy as jnp
  import optax
  sizes = head_sizes(config)
  model = flops.whole_batch_bn_model(config, heads(config))
  host = synthetic_batch(config, config.batch_size, sizes, seed)
  x = jnp.asarray(host['image'])
  labels = {'anp': jnp.asarray(host['label_anp']),
            'adjective': jnp.asarray(host['label_adjective']),
            'noun': jnp.asarray(host['label_noun'])}
  variables = model.init(jax.random.key(seed), x[:1], train=False)
  tx = optax.sgd(0.01, momentum=config.momentum)
  weights = dict(config.loss_weights)
  carry = (variables['params'], variables['batch_stats'], tx.init(variables['params']))

  def step(carry, x, labels):
    params, stats, opt = carry

    def loss_fn(p):
      logits, new = model.apply({'params': p, 'batch_stats': stats}, x, train=True,
                                mutable=['batch_stats'])
      loss = sum(weights[h] * optax.softmax_cross_entropy_with_integer_labels(
          logits[h], labels[h]).mean() for h in logits)
      return loss, new['batch_stats']

    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt = tx.update(grads, opt, params)
    return (optax.apply_updates(params, updates), stats, opt), loss

  t0 = time.perf_counter()
  lowered = jax.jit(step, donate_argnums=(0,)).lower(carry, x, labels)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  holder = {'carry': carry}

  def run(n):
    c = holder['carry']
    for _ in range(n):
      c, loss = compiled(c, x, labels)
    jax.block_until_ready(loss)
    holder['carry'] = c

  n_params = sum(int(v.size) for v in jax.tree.leaves(variables['params']))
  count = flops.program_flops(lowered)
  if not np.isfinite(count):  # No analysis before compilation here (e.g. the CUDA plugin).
    count = flops.cpu_flops(step, carry, x, labels)
  return run, compile_s, count, n_params
