"""The whole benchmark of one config (`run_benchmark`): what the package docstring lists, as
one JSON-able dict."""

from typing import Any, Callable, Dict, Optional

from anp_jax import flops
from anp_jax.benchmarking.contenders import build_bare_step, build_reference_step
from anp_jax.benchmarking.loop import measure_loop
from anp_jax.benchmarking.machine import (environment, job_peak_flops, measure_peak_flops,
                                          memory_report)
from anp_jax.benchmarking.timing import Contender, interleave, silent


def run_benchmark(config, *, warmup_steps: int = 2, windows: int = 5, steps_per_window: int = 3,
                  loop: bool = True, loop_steps: Optional[int] = None, reference: bool = True,
                  torch_compare: bool = True, torch_reference=None, peak_n: Optional[int] = None,
                  workdir: Optional[str] = None,
                  progress: Callable[[str], None] = silent) -> Dict[str, Any]:
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
  flops_step = flops.train_step_flops(config, bare)
  result['compile_s'] = bare.compile_s
  result['flops_per_image_train'] = flops_step / b
  result['flops_per_image_forward'] = flops.forward_flops_per_image(config, bare)
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
