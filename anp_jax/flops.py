"""FLOPs from XLA's cost analysis: of a program as written, of a function compiled for the CPU,
and of one training step of this framework.

The count that matters for MFU and for the performance model is the program *as written* (every
convolution, matmul and elementwise op: the "model FLOPs"), not what a backend compiled it to:
XLA:GPU hands convolutions and matmuls to cuDNN and cuBLAS as custom calls, which its cost
analysis does not count. So:

* `program_flops`: a lowered program's count before optimisation (free: nothing is compiled);
  NaN on backends that analyse no program before compiling it (the CUDA plugin);
* `cpu_flops`: the same function compiled (never run) for the host's CPU, where convolutions and
  matmuls stay XLA operations that its cost analysis counts;
* `count_flops`: the first where the default backend gives one, else the second;
* `train_step_flops`, `step_flops_as_written`, `per_device_step_flops_on_cpu`,
  `forward_flops_per_image`: one train step (and the inference forward pass) of a compiled
  `anp_jax.benchmarking.BareStep`, counted those ways.

JAX is imported inside the functions only, so that the performance model (pure numpy) can import
this module without it.
"""

import math

import numpy as np


def program_flops(lowered) -> float:
  """FLOPs of one execution of a lowered JAX computation (``jax.jit(f).lower(...)``) as written,
  or NaN where this backend cannot analyse a program before compiling it.

  XLA's cost analysis of the program before optimisation: every convolution, matmul and
  elementwise op counted (the "model FLOPs" of MFU). The *compiled* program's count is not that
  on GPU: XLA:GPU hands convolutions and matmuls to cuDNN and cuBLAS as custom calls, which its
  cost analysis does not count (ResNet-50 at 224 px came out at 0.58 GFLOP per training image
  on an H200 instead of ~24, MFU 0.4 %). JAX analyses a lowered program only on backends without
  the PJRT C API (the CPU in jax 0.10): on a CUDA plugin this is NaN, and `cpu_flops` counts
  instead. For a `shard_map` step the program is one device's share.
  """
  try:
    return _cost_analysis_flops(lowered.cost_analysis())
  except NotImplementedError:  # Older JAX raised where newer returns None.
    return float('nan')


def cpu_flops(fn, *args) -> float:
  """FLOPs of ``fn(*args)`` counted by XLA:CPU, whatever the default backend: `fn` is compiled
  (never run) for the host's CPU, where convolutions and matmuls stay XLA operations that its
  cost analysis counts. `args` may be arrays or ``jax.ShapeDtypeStruct``s (pytrees of them);
  only their shapes and dtypes are used. NaN if XLA:CPU reports no count."""
  import jax
  # This process's CPU (in a multi-process job jax.devices('cpu') lists every process's).
  cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend='cpu')[0])
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=cpu), args)
  return _cost_analysis_flops(jax.jit(fn).lower(*abstract).compile().cost_analysis())


def _cost_analysis_flops(cost) -> float:
  """The 'flops' of an XLA cost analysis (a dict, a list of one per device program in older JAX,
  or None), NaN where it has none or reports -1 ("unknown")."""
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  flops = float(cost.get('flops', float('nan'))) if cost else float('nan')
  return flops if flops >= 0 else float('nan')


def count_flops(fn, *args) -> float:
  """FLOPs of ``fn(*args)`` as written: the lowered program's count (`program_flops`, free, no
  compilation) where the default backend gives one, else XLA:CPU's (`cpu_flops`)."""
  import jax
  flops = program_flops(jax.jit(fn).lower(*args))
  return flops if math.isfinite(flops) else cpu_flops(fn, *args)


# ----------------------------------------------------------------------------------------------
# One training step of the framework (`bare`: an `anp_jax.benchmarking.BareStep`).


def train_step_flops(config, bare) -> float:
  """FLOPs of one train step of the whole job (every device), from XLA's cost analysis of the
  step as written (`program_flops`: the compiled step's count misses the convolutions and
  matmuls that XLA:GPU gives to cuDNN and cuBLAS).

  The step is a `shard_map` program, so its count is one device's share. With gradient
  accumulation (``grad_accum_steps`` k > 1) the micro-batches run in a `lax.scan` off CPU
  (`anp_jax.steps.accumulation_unrolled`), whose body the cost analysis counts once, not k - 1
  times: FLOPs and MFU came out at about 2/k of the truth. The count is then taken from the same
  global batch with k = 1 (on every backend): the same examples through the same model and one
  optimizer update, i.e. the same work (accumulation only splits it in time). That step is only
  lowered, never compiled or run, so its activations need not fit in memory.
  """
  import jax
  flops = step_flops_as_written(config, bare)
  if not np.isfinite(flops):  # No analysis before compilation here (e.g. the CUDA plugin).
    flops = per_device_step_flops_on_cpu(config, bare)
  return flops * jax.device_count()


def step_flops_as_written(config, bare) -> float:
  """One device's share of the train step from its lowered program (`program_flops`; NaN where
  the backend analyses none), re-lowered with k = 1 under gradient accumulation."""
  from anp_jax import executors, setup as run_setup
  lowered = bare.lowered
  if bare.setup.accum_steps > 1:
    c = config.copy_and_resolve_references()
    c.grad_accum_steps = 1
    # As in `benchmarking.build_bare_step`: only the schedule uses the split sizes.
    big = int(c.batch_size) * 10_000
    setup = run_setup.resolve_setup(c, big, big)
    executor = executors.make_executor(c, bare.model, bare.tx, setup, executors.make_mesh())
    # Same state and batch (shapes and shardings): lowering neither runs nor donates them.
    lowered = executor.train_step.lower(bare.state, bare.batch)
  return program_flops(lowered)


def whole_batch_bn_model(config, heads):
  """`config`'s model with BatchNorm statistics over the whole batch of each call (one device, no
  collective, no ghost groups): the model a single-device count or reference loop runs."""
  from anp_jax import models
  whole_batch = config.copy_and_resolve_references()
  whole_batch.bn_mode = 'global'  # Outside a per-device step (no axis): the call's batch.
  return models.create_model(whole_batch, heads)


def per_device_step_flops_on_cpu(config, bare) -> float:
  """One device's share of the train step, counted by XLA:CPU (`cpu_flops`): the same
  per-device computation (`steps.per_device_train_step`) on one device's examples, without the
  collectives (which add no FLOPs worth counting), in one micro-batch (the same work as k)."""
  import jax
  from anp_jax import steps
  per_device = config.batch_size // jax.device_count()
  model = whole_batch_bn_model(config, bare.heads)

  def step(state, batch):
    return steps.per_device_train_step(state, batch, model=model, tx=bare.tx, config=config,
                                       accum_steps=1, num_devices=1, axis_name=None)
  batch = jax.tree.map(lambda a: jax.ShapeDtypeStruct((per_device,) + a.shape[1:], a.dtype),
                       bare.batch)
  return cpu_flops(step, bare.state, batch)


def forward_flops_per_image(config, bare) -> float:
  """The model's inference forward pass per image (`count_flops`), on the step's batch size."""
  import jax
  b = config.batch_size
  fwd_model = whole_batch_bn_model(config, bare.heads)
  # Shapes only: nothing is computed, and no multi-process array meets a local one.
  spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
  x1 = jax.ShapeDtypeStruct((b, config.image_size, config.image_size, 3), jax.numpy.float32)
  variables = jax.tree.map(spec, {'params': bare.state.params,
                                  'batch_stats': bare.state.batch_stats})
  return count_flops(lambda v, x: fwd_model.apply(v, x, train=False), variables, x1) / b
