"""Training-throughput benchmark: images/s, step time, compile time, memory, FLOPs and MFU.

`experiments/benchmark.py` is the command line; everything it does lives here so that tests and
notebooks can call it. What is measured (all on the devices of this job, after warm-up):

* ``bare``: the framework's own compiled train step (`executors.make_executor`, i.e. `jax.jit` of
  the `shard_map`-ped per-device step, state donated) on one fixed in-memory batch. Compile time is
  measured separately (``lower().compile()``); throughput comes from timed *windows* of several
  asynchronously dispatched steps ended by one `block_until_ready`, so host dispatch overlaps
  device work exactly as in training; the spread is over windows.
* ``loop``: the full training loop, `trainer.train_and_evaluate`, with the real input pipeline
  (tf.data), metric fetches, logging, the NaN guard and the config's checkpoint cadence. Its
  steady-state rate is read from the ``time`` stamps of its own ``metrics.jsonl``: the lines are
  written right after a metric fetch (a device sync), so (steps between the first and last train
  line) x batch / (time between them) excludes compilation, data generation and the final
  evaluation and checkpoint.
* ``reference``: a plain training loop of the same Flax model written directly with `jax.jit` +
  optax (SGD momentum, weighted cross-entropy over the heads, BN statistics): no framework code.
* ``torch``: the same architecture in PyTorch (CPU, channels-last), same batch, image size, heads
  and optimizer; parameter counts are checked to match. The PyTorch code is not part of the
  library: the caller passes it as ``torch_reference`` (`experiments/torch_reference.py`).
  Skipped (and said so in the JSON) when torch is not installed or no reference is given.

Contenders that are compared are timed in alternating windows (A, B, C, A, B, C, ...) and every
ratio is the median of per-round ratios, so a machine whose load changes during the run (the
2-core reference machine is shared) biases neither side.

FLOPs come from XLA's cost analysis of the compiled step (forward + backward + update, per
image; with gradient accumulation, of the same global batch without it: `train_step_flops`);
MFU = achieved FLOP/s / the job's peak FLOP/s, from a large matrix multiplication in the model's
compute dtype timed in the same run on one device (`job_peak_flops`: times the devices on
accelerators, the host's own on CPU, where simulated devices share its cores).
"""

import contextlib
import dataclasses
import json
import os
import platform
import resource
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from anp_jax import distributed, metrics_io, xla_flags

# ----------------------------------------------------------------------------------------------
# Timing primitives.


@dataclasses.dataclass
class Timing:
  """Per-window step times of one contender (seconds per step), and what a step processes."""
  images_per_step: int
  step_times: List[float] = dataclasses.field(default_factory=list)

  def summary(self) -> Dict[str, float]:
    t = np.asarray(self.step_times, np.float64)
    if t.size == 0:
      return {}
    med = float(np.median(t))
    return {'images_per_s': self.images_per_step / med, 'step_time_median_s': med,
            'step_time_min_s': float(t.min()), 'step_time_max_s': float(t.max()),
            'step_time_p10_s': float(np.percentile(t, 10)),
            'step_time_p90_s': float(np.percentile(t, 90)),
            'step_time_rel_spread': float((np.percentile(t, 90) - np.percentile(t, 10)) / med),
            'windows': int(t.size)}


class Contender:
  """Something that trains: `run(n)` performs n steps and returns when they are finished."""

  def __init__(self, name: str, images_per_step: int, run: Callable[[int], None]):
    self.name, self.run = name, run
    self.timing = Timing(images_per_step)

  def window(self, steps: int):
    t0 = time.perf_counter()
    self.run(steps)
    self.timing.step_times.append((time.perf_counter() - t0) / steps)


def _silent(message: str):
  del message


def interleave(contenders: Sequence[Contender], windows: int, steps_per_window: int,
               warmup_steps: int, progress: Callable[[str], None] = _silent) -> Dict[str, Any]:
  """Warms every contender up, then times them in alternating windows; ratios per round.

  `progress` gets a line after each warm-up and each round (the rates of that round).
  """
  for c in contenders:
    if warmup_steps:
      t0 = time.perf_counter()
      c.run(warmup_steps)
      progress(f'{c.name}: {warmup_steps} warm-up step(s) in {time.perf_counter() - t0:.1f} s')
  for w in range(windows):
    for c in contenders:
      c.window(steps_per_window)
    progress(f'window {w + 1}/{windows}: ' + ', '.join(
        f'{c.name} {c.timing.images_per_step / max(c.timing.step_times[-1], 1e-12):.1f} img/s'
        for c in contenders))
  out = {c.name: c.timing.summary() for c in contenders}
  ratios = {}
  for i, a in enumerate(contenders):
    for b in contenders[i + 1:]:
      # a's throughput / b's throughput = b's step time / a's step time, round by round.
      per_round = np.asarray(b.timing.step_times) / np.asarray(a.timing.step_times)
      ratios[f'{a.name}/{b.name}'] = {'median': float(np.median(per_round)),
                                      'min': float(per_round.min()),
                                      'max': float(per_round.max())}
  return {'results': out, 'ratios': ratios}


# ----------------------------------------------------------------------------------------------
# XLA cost analysis, peak FLOP/s, memory.


def forward_flops(apply_fn: Callable, *args) -> float:
  """FLOPs of `apply_fn(*args)` (e.g. a model's inference forward pass) per XLA's cost analysis
  of the program as written (`perfmodel.count_flops`), not of what a backend compiled it to."""
  from anp_jax.research import perfmodel
  return perfmodel.count_flops(apply_fn, *args)


def measure_peak_flops(dtype: str = 'float32', n: Optional[int] = None, repeats: int = 5,
                       device=None) -> Dict[str, Any]:
  """The machine's achievable FLOP/s: best of `repeats` timed n x n x n matmuls in `dtype`.

  The best (not the median) is the "peak": MFU is reported against what this machine can do at
  its best moment, which on a loaded machine makes MFU conservative.
  """
  import jax
  import jax.numpy as jnp
  from anp_jax import models
  device = device or jax.local_devices()[0]
  if n is None:
    n = 2048 if device.platform == 'cpu' else 8192
  dt = models.DTYPES[dtype]
  key = jax.random.key(0)
  a = jax.device_put(jax.random.normal(key, (n, n), jnp.float32).astype(dt), device)
  b = jax.device_put(jax.random.normal(jax.random.fold_in(key, 1), (n, n),
                                       jnp.float32).astype(dt), device)
  mm = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=dt))
  mm(a, b).block_until_ready()
  inner = 1 if device.platform == 'cpu' else 10
  best = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(inner):
      out = mm(a, b)
    out.block_until_ready()
    best = min(best, (time.perf_counter() - t0) / inner)
  return {'dtype': dtype, 'n': n, 'seconds': best, 'flops_per_s': 2.0 * n ** 3 / best,
          'device': str(device.device_kind)}


def job_peak_flops(device_peak: float, platform: str, devices: int,
                   processes: int) -> Tuple[float, int, str]:
  """The whole job's peak FLOP/s from `measure_peak_flops` on one device: (peak, multiplier, why).

  An accelerator computes on its own: the job's peak is one device's times the devices. On CPU
  the devices of a process (``--xla_force_host_platform_device_count``) are simulated: they share
  the host's cores, and the matmul on one of them already runs on all of them (XLA:CPU's thread
  pool), so multiplying by the simulated devices would state MFU that many times too low for the
  same work. There the peak is the host's, counted once per process (each process is taken to
  be its own host; processes sharing one host, as `scaling_runs`' layouts do, overstate it).
  """
  if platform == 'cpu':
    return (device_peak * processes, processes,
            f'the host\'s ({processes} process(es) x one matmul on all cores; simulated CPU '
            'devices share them)')
  return device_peak * devices, devices, f'one device\'s x {devices} devices'


def memory_report(compiled=None) -> Dict[str, Any]:
  """Peak device memory (when the backend reports it), XLA's buffer plan, host peak RSS."""
  import jax
  out: Dict[str, Any] = {}
  stats = None
  with contextlib.suppress(Exception):
    stats = jax.local_devices()[0].memory_stats()
  out['device_peak_bytes'] = int(stats['peak_bytes_in_use']) if stats and (
      'peak_bytes_in_use' in stats) else None
  if compiled is not None:
    with contextlib.suppress(Exception):
      m = compiled.memory_analysis()
      out['xla_temp_bytes'] = int(m.temp_size_in_bytes)
      out['xla_argument_bytes'] = int(m.argument_size_in_bytes)
      out['xla_output_bytes'] = int(m.output_size_in_bytes)
      out['xla_alias_bytes'] = int(m.alias_size_in_bytes)
  # ru_maxrss is in KiB on Linux.
  out['host_peak_rss_bytes'] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
  return out


# ----------------------------------------------------------------------------------------------
# The framework's step (bare), the full loop, and the plain JAX reference.


def head_sizes(config) -> Dict[str, int]:
  """Class counts of the three heads without touching the dataset (synthetic: from the config)."""
  if config.dataset == 'synthetic_anp':
    s = config.synthetic
    return {'anp': int(s.num_pairs), 'adjective': int(s.num_adjectives),
            'noun': int(s.num_nouns)}
  return {'anp': 553, 'adjective': 117, 'noun': 167}  # The MVSO-EN subset of the paper.


def _heads(config):
  """`head_sizes` as the `models.Heads` that `models.create_model` takes."""
  from anp_jax import models
  sizes = head_sizes(config)
  return models.Heads(sizes['anp'], sizes['adjective'], sizes['noun'])


def _whole_batch_bn_model(config):
  """`config`'s model with BatchNorm statistics over the whole batch of each call (one
  device, no collective, no ghost groups)."""
  from anp_jax import models
  whole_batch = config.copy_and_resolve_references()
  whole_batch.bn_mode = 'global'  # Outside a per-device step (no axis): the call's batch.
  return models.create_model(whole_batch, _heads(config))


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
  model = models.create_model(config, _heads(config), axis_name=executors.AXIS)
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
  return BareStep(setup, state, batch, lowered, compiled, compile_s, model, tx)


def train_step_flops(config, bare: BareStep) -> float:
  """FLOPs of one train step of the whole job (every device), from XLA's cost analysis of the
  step as written (`perfmodel.program_flops`: the compiled step's count misses the convolutions
  and matmuls that XLA:GPU gives to cuDNN and cuBLAS).

  The step is a `shard_map` program, so its count is one device's share. With
  gradient accumulation (``grad_accum_steps`` k > 1) the micro-batches run in a `lax.scan`
  (`anp_jax.steps`), whose body the cost analysis counts once, not k - 1 times: FLOPs and MFU
  came out at about 2/k of the truth. The count is then taken from the same global batch with
  k = 1: the same examples through the same model and one optimizer update, i.e. the same work
  (accumulation only splits it in time). That step is only lowered, never compiled or run, so
  its activations need not fit in memory.
  """
  import jax
  flops = _step_flops_as_written(config, bare)
  if not np.isfinite(flops):  # No analysis before compilation here (e.g. the CUDA plugin).
    flops = _per_device_step_flops_on_cpu(config, bare)
  return flops * jax.device_count()


def _step_flops_as_written(config, bare: BareStep) -> float:
  """One device's share of the train step from its lowered program (`perfmodel.program_flops`;
  NaN where the backend analyses none), re-lowered with k = 1 under gradient accumulation."""
  from anp_jax import executors, setup as run_setup
  from anp_jax.research import perfmodel
  lowered = bare.lowered
  if bare.setup.accum_steps > 1:
    c = config.copy_and_resolve_references()
    c.grad_accum_steps = 1
    big = int(c.batch_size) * 10_000  # As in `build_bare_step`: only the schedule uses it.
    setup = run_setup.resolve_setup(c, big, big)
    executor = executors.make_executor(c, bare.model, bare.tx, setup, executors.make_mesh())
    # Same state and batch (shapes and shardings): lowering neither runs nor donates them.
    lowered = executor.train_step.lower(bare.state, bare.batch)
  return perfmodel.program_flops(lowered)


def _per_device_step_flops_on_cpu(config, bare: BareStep) -> float:
  """One device's share of the train step, counted by XLA:CPU (`perfmodel.cpu_flops`): the same
  per-device computation (`steps.per_device_train_step`) on one device's examples, without the
  collectives (which add no FLOPs worth counting), in one micro-batch (the same work as k)."""
  import jax
  from anp_jax import steps
  from anp_jax.research import perfmodel
  per_device = config.batch_size // jax.device_count()
  model = _whole_batch_bn_model(config)

  def step(state, batch):
    return steps.per_device_train_step(state, batch, model=model, tx=bare.tx, config=config,
                                       accum_steps=1, num_devices=1, axis_name=None)
  batch = jax.tree.map(lambda a: jax.ShapeDtypeStruct((per_device,) + a.shape[1:], a.dtype),
                       bare.batch)
  return perfmodel.cpu_flops(step, bare.state, batch)


def _forward_flops_per_image(config, bare: BareStep) -> float:
  """The model's inference forward pass per image (`forward_flops`), on the step's batch size."""
  import jax
  b = config.batch_size
  fwd_model = _whole_batch_bn_model(config)
  # Shapes only: nothing is computed, and no multi-process array meets a local one.
  spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
  x1 = jax.ShapeDtypeStruct((b, config.image_size, config.image_size, 3), jax.numpy.float32)
  variables = jax.tree.map(spec, {'params': bare.state.params,
                                  'batch_stats': bare.state.batch_stats})
  return forward_flops(lambda v, x: fwd_model.apply(v, x, train=False), variables, x1) / b


def flop_counts(config) -> Dict[str, Any]:
  """A config's FLOPs per image without timing anything (``experiments/benchmark.py
  --flops_only``): the train step as written (`perfmodel.program_flops`; NaN where the backend
  analyses no lowered program), the same step counted by XLA:CPU (what the benchmark falls back
  to on such a backend) and the inference forward pass. The step is built and compiled, never
  run."""
  import jax
  bare = build_bare_step(config)
  b, n = config.batch_size, jax.device_count()
  return {'model': config.model.name, 'image_size': config.image_size, 'batch_size': b,
          'dtype': config.model.dtype, 'devices': n,
          'train_flops_per_image_as_written': _step_flops_as_written(config, bare) * n / b,
          'train_flops_per_image_xla_cpu': _per_device_step_flops_on_cpu(config, bare) * n / b,
          'forward_flops_per_image': _forward_flops_per_image(config, bare)}


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
  model = _whole_batch_bn_model(config)
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
  from anp_jax.research import perfmodel
  flops = perfmodel.program_flops(lowered)
  if not np.isfinite(flops):  # No analysis before compilation here (e.g. the CUDA plugin).
    flops = perfmodel.cpu_flops(step, carry, x, labels)
  return run, compile_s, flops, n_params


def _loop_rate(workdir: str, batch_size: int) -> Dict[str, float]:
  """Steady-state images/s of a finished run from its metrics.jsonl time stamps."""
  rows = [r for r in metrics_io.read_metrics(workdir, kind='train') if 'train/loss' in r]
  if len(rows) < 2:
    raise ValueError('The training loop logged fewer than two train lines; raise --steps or '
                     'lower --config.log_every_steps.')
  first, last = rows[0], rows[-1]
  steps = last['step'] - first['step']
  seconds = last['time'] - first['time']
  return {'images_per_s': steps * batch_size / seconds, 'step_time_median_s': seconds / steps,
          'timed_steps': int(steps), 'first_timed_step': int(first['step']),
          'loop_reported_images_per_s': float(last.get('train/images_per_s', float('nan')))}


# What a training run leaves in its workdir (`trainer`, `checkpointing`).
RUN_FILES = ('metrics.jsonl', 'final_metrics.json', 'checkpoints', 'checkpoints_best')


def check_loop_workdir(workdir: Optional[str]):
  """Raises `errors.ConfigError` (exit 2) if `workdir` already holds a training run.

  The trainer resumes whatever run it finds there: with the same settings it trains nothing and
  the rate would be the old run's, read from its metrics.jsonl; with more steps the timed window
  would span both invocations. A benchmark measures this invocation, so it needs a fresh one.
  """
  from anp_jax import errors
  if workdir is None:
    return
  found = [f for f in RUN_FILES if os.path.exists(os.path.join(workdir, f))]
  if found:
    raise errors.ConfigError(
        f'The loop workdir {workdir} already holds a training run ({", ".join(found)}): the '
        'trainer would resume it instead of timing a new one. Pass an empty or new --workdir '
        '(or none: a temporary directory), or delete that run.')


def measure_loop(config, steps: int, workdir: Optional[str] = None) -> Dict[str, Any]:
  """Runs `trainer.train_and_evaluate` and reads its steady-state rate from metrics.jsonl.

  The config's logging cadence L = ``log_every_steps`` is kept (a metric fetch syncs host and
  device, so the cadence is part of what the loop costs): the run lasts L + ceil(steps / L) * L
  steps and the timed window runs from the first log line (step L: compilation and warm-up are
  before it) to the last. Evaluation runs only at the end (after the window); the config's
  checkpoint cadence is kept.

  `workdir` (default: a temporary directory, deleted afterwards) keeps the loop's files for
  inspection. It must not hold a run already (`check_loop_workdir` raises a ValueError before
  anything is trained): the trainer would resume that run, and a rerun of the benchmark into the
  same directory would report the earlier run's rate without training a step. Refused rather
  than timed in a fresh subdirectory, so the files are always where the user pointed.
  """
  from anp_jax import trainer
  check_loop_workdir(workdir)
  c = config.copy_and_resolve_references()
  every = max(1, int(c.log_every_steps))
  c.num_train_steps = every * (1 + max(1, -(-steps // every)))
  c.eval_every_epochs = 0.0
  c.progress_bar = False
  with contextlib.ExitStack() as stack:
    if workdir is None:
      workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix='anp_bench_'))
    t0 = time.perf_counter()
    trainer.train_and_evaluate(c, workdir)
    wall = time.perf_counter() - t0
    out = _loop_rate(workdir, c.batch_size)
  out['wall_s'] = wall
  out['log_every_steps'] = every
  return out


# ----------------------------------------------------------------------------------------------
# The whole benchmark.


def environment(torch_version: Optional[str] = None) -> Dict[str, Any]:
  """The software, devices and load this benchmark ran with (``torch_version``: None if absent)."""
  import jax
  import jaxlib
  d = jax.local_devices()[0]
  return {'jax': jax.__version__, 'jaxlib': jaxlib.__version__, 'backend': d.platform,
          'device_kind': d.device_kind, 'devices': jax.device_count(),
          'local_devices': jax.local_device_count(), 'processes': jax.process_count(),
          'cpu_cores': len(os.sched_getaffinity(0)), 'xla_flags': os.environ.get('XLA_FLAGS', ''),
          'python': platform.python_version(), 'host': platform.node(),
          'load_average': os.getloadavg(), 'torch': torch_version,
          'time_utc': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}


def run_benchmark(config, *, warmup_steps: int = 2, windows: int = 5, steps_per_window: int = 3,
                  loop: bool = True, loop_steps: Optional[int] = None, reference: bool = True,
                  torch_compare: bool = True, torch_reference=None, peak_n: Optional[int] = None,
                  workdir: Optional[str] = None,
                  progress: Callable[[str], None] = _silent) -> Dict[str, Any]:
  """Measures everything the module docstring lists for `config`; returns a JSON-able dict.

  ``torch_reference``: the PyTorch contender, a module with ``torch_available()`` (the version or
  None) and ``build_torch_step(config)`` -> (run, parameter count, threads), i.e.
  `experiments/torch_reference.py`; without one, ``torch_compare`` only records why it was skipped.

  Every key is always present; what was not measured is None with a ``*_skipped`` reason.
  `progress` receives a line at every stage (compilation, each timed window, the matmul peak,
  the training loop), so a run of minutes is never silent.
  """
  import jax
  version = torch_reference.torch_available() if torch_reference is not None else None
  result: Dict[str, Any] = {'environment': environment(version), 'config': {
      'model': config.model.name, 'conv_impl': config.model.get('conv_impl', 'xla'),
      'dtype': config.model.dtype, 'image_size': config.image_size,
      'batch_size': config.batch_size, 'bn_mode': config.bn_mode,
      'optimizer': config.optimizer, 'grad_accum_steps': config.grad_accum_steps,
      'dataset': config.dataset},
      'method': {'warmup_steps': warmup_steps, 'windows': windows,
                 'steps_per_window': steps_per_window}}
  progress(f'compiling the train step ({config.model.name}, batch {config.batch_size})...')
  bare = build_bare_step(config)
  progress(f'compiled in {bare.compile_s:.1f} s')
  b = config.batch_size
  flops_step = train_step_flops(config, bare)
  result['compile_s'] = bare.compile_s
  result['flops_per_image_train'] = flops_step / b
  sizes = head_sizes(config)
  result['flops_per_image_forward'] = _forward_flops_per_image(config, bare)
  result['n_params'] = int(sum(int(v.size) for v in jax.tree.leaves(bare.state.params)))

  contenders = [Contender('anp_jax', b, bare.run)]
  result['reference'] = None
  if reference:
    if jax.device_count() == 1:
      ref_run, ref_compile, ref_flops, _ = build_reference_step(config)
      contenders.append(Contender('reference', b, ref_run))
      result['reference'] = {'compile_s': ref_compile, 'flops_per_image_train': ref_flops / b}
    else:
      result['reference_skipped'] = 'the plain reference loop is single-device'
  result['torch'] = None
  if torch_compare:
    platform_ = jax.local_devices()[0].platform
    if torch_reference is None:
      result['torch_skipped'] = 'no PyTorch reference given (experiments/torch_reference.py)'
    elif version is None:
      result['torch_skipped'] = 'torch is not installed (pip install torch to compare)'
    elif platform_ != 'cpu' or config.model.dtype != 'float32':
      result['torch_skipped'] = 'the PyTorch comparison is CPU float32 only'
    else:
      t_run, t_params, t_threads = torch_reference.build_torch_step(config)
      if t_params != result['n_params']:
        raise RuntimeError(f'PyTorch model has {t_params} parameters, Flax {result["n_params"]}:'
                           ' the architectures differ.')
      contenders.append(Contender('torch', b, t_run))
      result['torch'] = {'version': version, 'n_params': t_params, 'threads': t_threads}

  progress(f'timing {", ".join(c.name for c in contenders)}: {windows} window(s) of '
           f'{steps_per_window} step(s) each, alternating')
  timed = interleave(contenders, windows, steps_per_window, warmup_steps, progress)
  result['bare'] = timed['results']['anp_jax']
  if result['reference'] is not None:
    result['reference'].update(timed['results']['reference'])
  if result['torch'] is not None:
    result['torch'].update(timed['results']['torch'])
  result['ratios'] = timed['ratios']
  result['memory'] = memory_report(bare.compiled)
  del contenders

  progress('measuring the matmul peak FLOP/s...')
  peak = measure_peak_flops(config.model.dtype, peak_n)
  progress(f'peak {peak["flops_per_s"] / 1e9:.1f} GFLOP/s')
  # The peak was timed on one device; the step runs on all devices of the job.
  job_peak, multiplier, why = job_peak_flops(peak['flops_per_s'], jax.local_devices()[0].platform,
                                             jax.device_count(), jax.process_count())
  peak.update(job_flops_per_s=job_peak, job_multiplier=multiplier, job_peak=why)
  result['peak'] = peak
  achieved = result['bare']['images_per_s'] * result['flops_per_image_train']
  result['achieved_flops_per_s'] = achieved
  result['mfu'] = achieved / job_peak

  result['loop'] = None
  if loop:
    loop_steps = loop_steps or windows * steps_per_window
    progress(f'training loop: {loop_steps} steps of trainer.train_and_evaluate...')
    lr = measure_loop(config, loop_steps, workdir)
    progress(f'training loop: {lr["images_per_s"]:.1f} img/s; timing the bare step again')
    # The loop cannot alternate with the bare step window by window; time the bare step again
    # right after it and compare against both (a load change shows up as before != after).
    after = Contender('anp_jax_after_loop', b, bare.run)
    for _ in range(windows):
      after.window(steps_per_window)
    result['bare_after_loop'] = after.timing.summary()
    bracket = 0.5 * (result['bare']['images_per_s'] + result['bare_after_loop']['images_per_s'])
    result['loop'] = lr
    result['ratios']['loop/bare'] = lr['images_per_s'] / bracket
    result['loop']['mfu'] = lr['images_per_s'] * result['flops_per_image_train'] / job_peak
  else:
    result['loop_skipped'] = 'disabled (--noloop)'
  return result


# ----------------------------------------------------------------------------------------------
# Output.

REQUIRED_KEYS = ('environment', 'config', 'method', 'compile_s', 'flops_per_image_train',
                 'flops_per_image_forward', 'n_params', 'bare', 'reference', 'torch', 'ratios',
                 'memory', 'peak', 'achieved_flops_per_s', 'mfu', 'loop')


def table(result: Dict[str, Any]) -> str:
  """A human-readable table of a `run_benchmark` result."""
  c, e = result['config'], result['environment']
  lines = [f"{c['model']} {c['image_size']}px batch {c['batch_size']} {c['dtype']} "
           f"conv={c['conv_impl']} on {e['devices']} x {e['device_kind']} "
           f"({e['backend']}, {e['cpu_cores']} cores, load {e['load_average'][0]:.1f})",
           f"compile {result['compile_s']:.1f} s | {result['flops_per_image_train'] / 1e9:.3f} "
           f"GFLOP/image/train step ({result['flops_per_image_forward'] / 1e9:.3f} forward) | "
           f"peak {result['peak']['flops_per_s'] / 1e9:.1f} GFLOP/s ({result['peak']['dtype']} "
           f"{result['peak']['n']}^3 matmul) | params {result['n_params']:,}",
           f"MFU against the job peak {result['peak']['job_flops_per_s'] / 1e9:.1f} GFLOP/s: "
           f"{result['peak']['job_peak']}",
           f"{'':24s}{'images/s':>10s}{'step ms':>10s}{'p10-p90 ms':>16s}{'MFU':>8s}"]

  def row(name, r, mfu=None):
    if not r:
      return
    spread = (f"{1e3 * r['step_time_p10_s']:.0f}-{1e3 * r['step_time_p90_s']:.0f}"
              if 'step_time_p10_s' in r else '')
    m = f'{100 * mfu:.1f}%' if mfu is not None else ''
    lines.append(f"{name:24s}{r['images_per_s']:10.1f}{1e3 * r['step_time_median_s']:10.1f}"
                 f"{spread:>16s}{m:>8s}")

  row('anp_jax bare step', result['bare'], result['mfu'])
  row('anp_jax training loop', result['loop'], (result['loop'] or {}).get('mfu'))
  row('anp_jax bare, after loop', result.get('bare_after_loop'))
  row('plain jax.jit + optax', result['reference'])
  row(f"pytorch {(result['torch'] or {}).get('version', '')}", result['torch'])
  for k in ('reference_skipped', 'torch_skipped', 'loop_skipped'):
    if k in result:
      lines.append(f'{k}: {result[k]}')
  for k, v in result['ratios'].items():
    if isinstance(v, dict):
      lines.append(f"ratio {k}: {v['median']:.3f} (per-round {v['min']:.3f}-{v['max']:.3f})")
    else:
      lines.append(f'ratio {k}: {v:.3f}')
  mem = result['memory']
  lines.append('memory: ' + ', '.join(f'{k}={v / 2**20:.0f} MiB' for k, v in mem.items()
                                      if v is not None))
  return '\n'.join(lines)


def write_json(result: Dict[str, Any], path: str):
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w') as f:
    json.dump(result, f, indent=2, default=str)


# ----------------------------------------------------------------------------------------------
# Multi-device scaling on one machine (simulated CPU devices, processes on 127.0.0.1).

# (name, processes, devices per process); the global batch stays the same.
SCALING_LAYOUTS = (('1proc_x_1dev', 1, 1), ('1proc_x_2dev', 1, 2), ('2proc_x_1dev', 2, 1))


# Flags of experiments/benchmark.py that `scaling_runs` sets for each child itself: a flag with
# a value (its space-separated value goes too), and booleans (--x, --nox, --x=v; no value).
SCALING_OWN_FLAGS = ('out',)
SCALING_OWN_BOOLS = ('scaling',)


def scaling_child_args(args: Sequence[str]) -> List[str]:
  """The parent's command-line arguments without those `scaling_runs` sets per child.

  Every spelling absl accepts is removed: ``--out=PATH``, ``--out PATH`` (the value too: left
  behind it would be a stray positional argument and the child would exit with "Unexpected
  arguments"), ``-out``, and ``--scaling`` / ``--noscaling`` / ``--scaling=true``. Anything else
  (``--config.x=y``, ``--outline``) is passed on as it was.
  """
  out, skip, flags_end = [], False, False
  for arg in args:
    if skip:
      skip = False
      continue
    flags_end = flags_end or arg == '--'  # After '--' everything is positional: kept as is.
    name, has_value = arg, False
    if arg.startswith('-') and not flags_end:
      name, has_value = arg.lstrip('-').split('=', 1)[0], '=' in arg
    if name in SCALING_OWN_FLAGS:
      skip = not has_value
      continue
    if name in SCALING_OWN_BOOLS or (name.startswith('no') and name[2:] in SCALING_OWN_BOOLS):
      continue
    out.append(arg)
  return out


def scaling_runs(script: str, args: Sequence[str], out_dir: str,
                 timeout_s: float = 1800) -> Dict[str, Any]:
  """Runs `script` (experiments/benchmark.py) once per `SCALING_LAYOUTS` entry; same global batch.

  `args`: the parent's command line (``sys.argv[1:]``); its ``--out`` and ``--scaling`` in any
  form are dropped (`scaling_child_args`) and each child gets its own. Each run times only the
  bare step (no loop, reference or torch). Returns per layout images/s, step times and speed-up
  / efficiency relative to one process with one device.
  """
  import subprocess
  os.makedirs(out_dir, exist_ok=True)
  args = scaling_child_args(args)
  rows = {}
  for name, procs, local in SCALING_LAYOUTS:
    children = []
    # Held while the run lasts: no other local job's coordinator gets this port.
    reservation = distributed.reserve_port() if procs > 1 else None
    port = reservation.getsockname()[1] if reservation else None
    for pid in range(procs):
      env = dict(os.environ)
      env['XLA_FLAGS'] = xla_flags.with_device_count(env.get('XLA_FLAGS', ''), local)
      for k in ('ANP_COORDINATOR_ADDRESS', 'ANP_NUM_PROCESSES', 'ANP_PROCESS_ID'):
        env.pop(k, None)
      if procs > 1:
        env.update(ANP_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', ANP_NUM_PROCESSES=str(procs),
                   ANP_PROCESS_ID=str(pid))
      cmd = [sys.executable, script, *args, '--noloop', '--noreference', '--notorch',
             '--noscaling', f'--out={os.path.join(out_dir, name + ".json")}']
      children.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True))
    try:
      outputs = [c.communicate(timeout=timeout_s)[0] for c in children]
    finally:
      for c in children:
        if c.poll() is None:
          c.kill()
          c.wait()
      if reservation:
        reservation.close()
    if any(c.returncode for c in children):
      raise RuntimeError(f'Scaling run {name} failed:\n' + '\n'.join(o[-3000:] for o in outputs))
    with open(os.path.join(out_dir, name + '.json')) as f:
      r = json.load(f)
    rows[name] = {'processes': procs, 'devices': procs * local, **r['bare'],
                  'compile_s': r['compile_s'], 'load_average': r['environment']['load_average']}
  base = rows[SCALING_LAYOUTS[0][0]]['images_per_s']
  for row in rows.values():
    row['speedup'] = row['images_per_s'] / base
    row['efficiency'] = row['speedup'] / row['devices']
  return rows
