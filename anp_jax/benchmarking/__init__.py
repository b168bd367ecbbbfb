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

FLOPs come from XLA's cost analysis of the step as written (forward + backward + update, per
image; with gradient accumulation, of the same global batch without it: `flops.train_step_flops`);
MFU = achieved FLOP/s / the job's peak FLOP/s, from a large matrix multiplication in the model's
compute dtype timed in the same run on one device (`job_peak_flops`: times the devices on
accelerators, the host's own on CPU, where simulated devices share its cores).

One module per concern, every public name re-exported here: `timing` (alternating windows,
ratios per round), `machine` (peak FLOP/s, memory, environment), `contenders` (the bare step and
the plain JAX reference, `flop_counts`), `loop` (the full training loop), `run` (`run_benchmark`),
`report` (table, JSON), `scaling` (1 x 1, 1 x 2 and 2 x 1 processes x devices on one machine).
"""

from anp_jax.benchmarking.contenders import (BareStep, build_bare_step, build_reference_step,
                                             flop_counts, head_sizes, synthetic_batch)
from anp_jax.benchmarking.loop import RUN_FILES, check_loop_workdir, measure_loop
from anp_jax.benchmarking.machine import (environment, job_peak_flops, measure_peak_flops,
                                          memory_report)
from anp_jax.benchmarking.report import REQUIRED_KEYS, table, write_json
from anp_jax.benchmarking.run import run_benchmark
from anp_jax.benchmarking.scaling import (SCALING_LAYOUTS, SCALING_OWN_BOOLS, SCALING_OWN_FLAGS,
                                          scaling_child_args, scaling_runs)
from anp_jax.benchmarking.timing import Contender, Timing, interleave

__all__ = [
    'BareStep', 'Contender', 'REQUIRED_KEYS', 'RUN_FILES', 'SCALING_LAYOUTS', 'SCALING_OWN_BOOLS',
    'SCALING_OWN_FLAGS', 'Timing', 'build_bare_step', 'build_reference_step', 'check_loop_workdir',
    'environment', 'flop_counts', 'head_sizes', 'interleave', 'job_peak_flops', 'measure_loop',
    'measure_peak_flops', 'memory_report', 'run_benchmark', 'scaling_child_args', 'scaling_runs',
    'synthetic_batch', 'table', 'write_json',
]
