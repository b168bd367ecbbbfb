"""Helpers shared by the planner's tests: the planner's command line as a user runs it, a pilot
workdir written from parameters, and sweep rows that follow S(B) = S_min (1 + B_crit / B)."""

import json
import math
import subprocess
import sys

import numpy as np

from anp_jax import noise_scale
from conftest import subprocess_env


def plan_cli(*args):
  """``python -m anp_jax.research.planner ARGS``, the planner's command line, as a user runs it."""
  return subprocess.run([sys.executable, '-m', 'anp_jax.research.planner', *args],
                        env=subprocess_env(), capture_output=True, text=True, timeout=600)


def write_pilot(path, batch=64, trace=200.0, reach_step=40, steps=40, noise=True, drift=0.0,
                 evals=None, **config):
  """A pilot workdir: noise EMAs every 2 steps (B_simple = trace / 1, drifting), evals every 10
  (top-1 0.1, then 0.5 from `reach_step`), or at the steps of `evals` ({step: top-1}); the
  default config (5 epochs of 32 x 250 generated images) with `config`'s recorded fields (e.g.
  method)."""
  from anp_jax.configs import default
  path.mkdir(parents=True, exist_ok=True)
  recorded = default.get_config().to_dict()  # A config.json as the trainer writes it.
  recorded.update({'batch_size': batch, 'image_size': 16, **config})
  recorded['model'].update(name='resnet8', width=0.5)
  (path / 'config.json').write_text(json.dumps(recorded))
  lines = []
  for s in range(2, steps + 1, 2):
    r = {'step': s, 'train/loss': 1.0}
    if noise:
      r.update({noise_scale.G2_FIELD: 1.0, noise_scale.TRACE_FIELD: trace + drift * s})
    lines.append(r)
  if evals is None:
    evals = {s: 0.5 if s >= reach_step else 0.1 for s in range(10, steps + 1, 10)}
  for s, top1 in evals.items():
    lines.append({'step': s, 'eval/anp_top1': top1})
  (path / 'metrics.jsonl').write_text(''.join(json.dumps(l) + '\n' for l in lines))
  return str(path)


def sweep_rows(s_min=120.0, b_crit=200.0, batches=(32, 64, 128, 256, 512, 1024), jitter=0.0):
  rng = np.random.default_rng(0)
  return [{'batch': b, 'rule': 'linear', 'warmup': 'on', 'best_lr': True, 'status': 'finished',
           'steps_to_target': s_min * (1 + b_crit / b) * math.exp(jitter * rng.normal()),
           'b_simple': 250.0 + b / 10, 'target_top1': 0.25} for b in batches]
