"""A study's wall time predicted from measured costs: what ``--dry_run`` prints.

A study's time is mostly not training when its runs are short (docs/performance.md, "Where a
study's time goes"), so a flat "images / (img/s) + overhead per run" is wrong in both directions:
it misses that the first run of a shape compiles its programs and the other seeds load them from
the persistent compilation cache, and that evaluations and checkpoints have their own rates. The
model here, one term per phase that `anp_jax.phases` measures:

* once per study process: ``start_s`` (process start and imports, until the runner's first
  phase) and ``runner_s`` (planning, results and the report);
* per run: ``run_s`` (config checks, the work folder, dataset open, building the model, the
  final metrics and curves) and ``checkpoint_s`` per checkpoint saved;
* per run and program (``init``: the state; ``train``: the step; ``eval``: the evaluation), the
  compilation (tracing, lowering, XLA's compile): ``compile_miss_s`` for the first run of the
  invocation with that program, ``compile_hit_s`` for a later one (loaded from the cache), each
  x the model's depth relative to ResNet-20 (`depth`: a program's size is its layers');
* training steps: ``train_step_s`` per step and device (each device's share of a step has its
  fixed cost: on one CPU, simulated devices take turns) plus ``train_s_per_image`` per image x
  the model's `work` (relative to ResNet-20, width 1, 32 px: depth x width² x pixels);
* evaluations: ``eval_s_per_image`` x `work` per evaluated image.

Which runs share a program is read from their configs (`program_keys`): the train step bakes in
every setting but the seed (the learning-rate schedule's constants too), the evaluation only
the model, the image size and the devices, the initialisation the model and the seed.

The constants come from a measured file (`COSTS_FILE`, written by `fit` from study profiles:
experiments/measure_costs.py), and are refreshed from a study's own finished runs: the runner
keeps each run's phases in ``runs/<name>/phases.json`` (`PHASES_FILE`), and `refresh` refits
every constant those runs measured, so an interrupted study's remaining runs are estimated from
its own. No JAX here: the dry run's arithmetic and the fits are plain Python.
"""

import dataclasses
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from anp_jax.configs import default as default_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The committed measurement (repository-relative); ANP_COSTS=PATH reads another.
COSTS_FILE = os.path.join('experiments', 'results', 'study_throughput', 'costs.json')
COSTS_ENV = 'ANP_COSTS'
PHASES_FILE = 'phases.json'  # A run's own phases (`anp_jax.phases.section`), in its folder.
PROGRAMS = ('init', 'train', 'eval')
COMPILE_KEYS = ('trace_s', 'lower_s', 'compile_s')  # cache_read_s is inside compile_s.
# Phases of a run that are its fixed cost (besides compilation, steps, evaluations, checkpoints).
FIXED_PHASES = ('runner', 'start', 'dataset', 'build', 'finish')
# Settings that change no compiled program (`anp_jax.research.runner.NEUTRAL_FIELDS` and the
# target); the evaluation's program depends on none of the optimisation's either.
NEUTRAL = ('progress_bar', 'data_dir', 'checkpoint_every_steps', 'checkpoint_every_minutes',
           'async_checkpointing', 'keep_checkpoints', 'log_every_steps', 'keep_best_metric',
           'eval_only', 'target_metric', 'target_value', 'stop_at_target')
EVAL_FIELDS = re.compile(r'^(model\.|image_size$|dataset$|num_|eval|bn_|batch_size$|devices$)')
INIT_FIELDS = re.compile(r'^(model\.|image_size$|dataset$|num_|seed$)')


@dataclasses.dataclass
class Costs:
  """Measured constants of the model above (seconds); ``sources`` says where each came from."""
  start_s: float = 10.0
  runner_s: float = 1.0
  run_s: float = 1.0
  checkpoint_s: float = 0.2
  compile_miss_s: Dict[str, float] = dataclasses.field(
      default_factory=lambda: {'init': 3.0, 'train': 15.0, 'eval': 3.0})
  compile_hit_s: Dict[str, float] = dataclasses.field(
      default_factory=lambda: {'init': 0.5, 'train': 1.5, 'eval': 0.3})
  train_step_s: float = 0.05
  train_s_per_image: float = 1e-3
  eval_s_per_image: float = 3e-4
  platform: str = 'cpu'
  machine: str = ''
  sources: Dict[str, str] = dataclasses.field(default_factory=dict)

  def to_json(self) -> Dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d: Mapping) -> 'Costs':
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})


def load(path: Optional[str] = None) -> Optional[Costs]:
  """The measured costs (`path`, else ``$ANP_COSTS``, else the committed `COSTS_FILE`); None
  when there is no such file."""
  path = path or os.environ.get(COSTS_ENV) or os.path.join(ROOT, COSTS_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    costs = Costs.from_json(json.load(f))
  costs.sources.setdefault('file', path)
  return costs


# ----------------------------------------------------------------------------------------------
# What a run does: from its config and sizes (`RunShape`), independent of the machine.


def depth(config: Mapping) -> float:
  """The model's depth relative to ResNet-20 (the number in ``model.name``; 1 without one)."""
  digits = re.findall(r'\d+', str(config.get('model', {}).get('name', 'resnet20')))
  return float(digits[0]) / 20.0 if digits else 1.0


def work(config: Mapping) -> float:
  """The model's cost per image relative to ResNet-20, width 1, 32 px: depth x width² x pixels
  (a ResNet's convolutions scale so; the depth is the number in ``model.name``)."""
  model = config.get('model', {})
  width = float(model.get('width', 1.0))
  size = float(config.get('image_size', 32))
  return depth(config) * width ** 2 * (size / 32.0) ** 2


def program_keys(config: Mapping, setup: Mapping) -> Dict[str, str]:
  """Which compiled program each of `PROGRAMS` is, for a run's config (a plain dict) and sizes:
  runs with the same key compile it once per invocation (the later ones load it)."""
  fields = {k: v for k, v in default_config.flat_fields(config).items() if k not in NEUTRAL}
  sizes = {k: setup.get(k) for k in ('devices', 'per_device_batch', 'accum_steps',
                                     'eval_per_process_batch', 'total_steps')}
  def key(pick):
    return json.dumps([sorted((k, repr(v)) for k, v in fields.items() if pick(k)), sizes],
                      sort_keys=True, default=str)
  return {'train': key(lambda k: k != 'seed'),
          'eval': key(lambda k: EVAL_FIELDS.match(k) is not None),
          'init': key(lambda k: INIT_FIELDS.match(k) is not None)}


@dataclasses.dataclass
class RunShape:
  """What a run does, in the model's units."""
  name: str
  steps: int
  images: int  # Training images (steps x global batch).
  eval_images: int  # Images evaluated over the run (every evaluation, every split).
  checkpoints: int
  work: float
  programs: Dict[str, str]
  done_steps: int = 0
  devices: int = 1
  depth: float = 1.0  # Relative to ResNet-20: compilation scales with it.  # Already trained (an interrupted run resumes).


def shape_of(name: str, config: Mapping, setup: Mapping, done_steps: int = 0) -> RunShape:
  """A run's `RunShape` from its config (a dict) and sizes (`anp_jax.setup.Setup` as a dict)."""
  steps = int(setup['total_steps'])
  every = int(setup.get('eval_every_steps') or 0)
  splits = len(config.get('evals') or {}) or 1
  evals = math.ceil(steps / every) if every > 0 else 1
  per_split = (int(setup.get('num_eval_batches', 0)) * int(setup.get('eval_per_process_batch', 0))
               * int(setup.get('process_count', 1)))
  ckpt = int(config.get('checkpoint_every_steps') or 0)
  checkpoints = (steps // ckpt + 1) if ckpt > 0 else 1
  return RunShape(name, steps, steps * int(setup['batch_size']), evals * splits * per_split,
                  checkpoints, work(config), program_keys(config, setup), done_steps,
                  int(setup.get('devices') or 1), depth(config))


# ----------------------------------------------------------------------------------------------
# The estimate.


@dataclasses.dataclass
class Estimate:
  """Seconds of a study (or of the rest of one) by part."""
  parts: Dict[str, float]
  runs: int
  costs: Costs

  @property
  def seconds(self) -> float:
    return sum(self.parts.values())

  def describe(self) -> str:
    shown = ', '.join(f'{k} {v / 60:.1f} min' if v >= 60 else f'{k} {v:.0f} s'
                      for k, v in self.parts.items() if v >= 0.5)
    return shown


def estimate(shapes: Sequence[RunShape], costs: Costs, process: bool = True,
             compiled: Iterable[Tuple[str, str]] = ()) -> Estimate:
  """The wall time of training `shapes` in one study process (`process`: with its start and
  the runner's own time; False: the runs alone, e.g. an extension's). `compiled`: (program,
  key) pairs this invocation will have compiled before (those runs load them)."""
  seen = set(compiled)
  parts = {'start + imports': costs.start_s if process else 0.0,
           'runner': costs.runner_s if process else 0.0,
           'run set-up': 0.0, 'compile': 0.0, 'train steps': 0.0, 'evaluations': 0.0,
           'checkpoints': 0.0}
  for s in shapes:
    left = max(0.0, 1.0 - s.done_steps / s.steps) if s.steps else 0.0
    parts['run set-up'] += costs.run_s
    for program in PROGRAMS:
      key = (program, s.programs[program])
      miss = key not in seen
      seen.add(key)
      parts['compile'] += (costs.compile_miss_s if miss else costs.compile_hit_s)[program] * (
          s.depth)
    parts['train steps'] += left * (s.steps * s.devices * costs.train_step_s
                                    + s.images * s.work * costs.train_s_per_image)
    parts['evaluations'] += left * s.eval_images * s.work * costs.eval_s_per_image
    parts['checkpoints'] += max(1, round(left * s.checkpoints)) * costs.checkpoint_s
  return Estimate(parts, len(shapes), costs)


# ----------------------------------------------------------------------------------------------
# Fitting the constants: from profiles (`anp_jax.phases`) of runs whose shapes are known.


def compile_seconds(phase: Mapping) -> float:
  return sum(float(phase.get(k, 0.0)) for k in COMPILE_KEYS)


def _program_of(phase_name: str) -> Optional[str]:
  if phase_name == 'init':
    return 'init'
  if phase_name == 'train':
    return 'train'
  if phase_name.startswith('eval:'):
    return 'eval'
  return None


def fit(samples: Sequence[Tuple[RunShape, Mapping]], base: Costs,
        start_s: Optional[float] = None, runner_s: Optional[float] = None,
        source: str = '') -> Costs:
  """`base` with every constant that `samples` measure refitted: (shape, phases of that run)
  pairs (a run's `anp_jax.phases.section` ``phases``; the runs in the order they trained, one
  process). ``start_s`` / ``runner_s``: the process's, when measured."""
  costs = Costs.from_json(json.loads(json.dumps(base.to_json())))
  costs.sources = dict(base.sources)
  def note(name):
    costs.sources[name] = source
  if start_s is not None:
    costs.start_s = start_s
    note('start_s')
  if runner_s is not None:
    costs.runner_s = runner_s
    note('runner_s')
  if not samples:
    return costs
  fixed, ckpt, ckpt_n, evals, eval_units = [], 0.0, 0, 0.0, 0.0
  compiles = {(p, m): [] for p in PROGRAMS for m in (True, False)}
  train_rows = []  # (device-steps, image-work, seconds)
  for shape, phases in samples:
    fixed.append(sum(float(phases.get(p, {}).get('seconds', 0.0)) - compile_seconds(
        phases.get(p, {})) for p in FIXED_PHASES))
    c = phases.get('checkpoint', {})
    ckpt += float(c.get('seconds', 0.0))
    ckpt_n += int(c.get('count', 0))
    by_program = {p: [0.0, False, False] for p in PROGRAMS}  # seconds, missed, any compile
    for name, ph in phases.items():
      program = _program_of(name)
      if program is None:
        continue
      entry = by_program[program]
      entry[0] += compile_seconds(ph)
      entry[1] |= bool(ph.get('cache_misses', 0))
      entry[2] |= compile_seconds(ph) > 0
      if program == 'eval':
        evals += float(ph.get('seconds', 0.0)) - compile_seconds(ph)
    for program, (seconds, missed, any_compile) in by_program.items():
      if any_compile:
        compiles[(program, missed)].append(seconds / shape.depth)
    eval_units += shape.eval_images * shape.work
    t = phases.get('train', {})
    train_rows.append((shape.steps * shape.devices, shape.images * shape.work,
                       float(t.get('seconds', 0.0)) - compile_seconds(t)))
  costs.run_s = statistics.median(fixed)
  note('run_s')
  if ckpt_n:
    costs.checkpoint_s = ckpt / ckpt_n
    note('checkpoint_s')
  for (program, missed), values in compiles.items():
    if values:
      (costs.compile_miss_s if missed else costs.compile_hit_s)[program] = (
          statistics.median(values))
      note(f'compile_{"miss" if missed else "hit"}_s.{program}')
  if eval_units > 0:
    costs.eval_s_per_image = max(0.0, evals) / eval_units
    note('eval_s_per_image')
  costs.train_step_s, costs.train_s_per_image = _fit_train(train_rows, costs)
  note('train_step_s')
  note('train_s_per_image')
  return costs


def _fit_train(rows: Sequence[Tuple[float, float, float]], costs: Costs) -> Tuple[float, float]:
  """(seconds per device-step, seconds per image-work) by least squares through the origin over
  runs of `rows` (device-steps, image-work, seconds); with one kind of run (the ratio of steps to
  images the same), the per-step part kept from `costs` and the rest per image."""
  ratios = {round(u / s, 6) for s, u, _ in rows if s}
  if len(ratios) >= 2:
    sxx = sum(s * s for s, _, _ in rows)
    syy = sum(u * u for _, u, _ in rows)
    sxy = sum(s * u for s, u, _ in rows)
    sxt = sum(s * t for s, _, t in rows)
    syt = sum(u * t for _, u, t in rows)
    det = sxx * syy - sxy * sxy
    if det > 0:
      a = (sxt * syy - syt * sxy) / det
      b = (syt * sxx - sxt * sxy) / det
      if a >= 0 and b >= 0:
        return a, b
      if a < 0:  # All per image.
        return 0.0, max(0.0, syt / syy)
      return max(0.0, sxt / sxx), 0.0  # All per step.
  steps = sum(s for s, _, _ in rows)
  units = sum(u for _, u, _ in rows)
  seconds = sum(t for _, _, t in rows)
  per_step = min(costs.train_step_s, seconds / steps if steps else 0.0)
  return per_step, max(0.0, seconds - per_step * steps) / units if units else (
      costs.train_s_per_image)


# ----------------------------------------------------------------------------------------------
# A study folder's own runs.


def run_samples(out: str, names: Iterable[str]) -> List[Tuple[RunShape, Mapping]]:
  """(shape, phases) of the runs `names` under ``out/runs`` that finished in one go with their
  phases recorded (`PHASES_FILE`; a resumed run's phases are only its last part)."""
  samples = []
  for name in names:
    run_dir = os.path.join(out, 'runs', name)
    paths = [os.path.join(run_dir, f) for f in (PHASES_FILE, 'config.json', 'sweep_run.json',
                                                'final_metrics.json')]
    if not all(os.path.exists(p) for p in paths):
      continue
    try:
      phases, config, record, final = [json.load(open(p)) for p in paths]
    except (OSError, ValueError):
      continue
    # A seed group's phases are those of its seeds together (`runner._train_group`).
    if final.get('diverged') or phases.get('resumed') or phases.get('seeds_at_once'):
      continue
    setup = dict(record)
    setup.setdefault('batch_size', record.get('batch'))
    setup.update(phases.get('setup', {}))
    shape = shape_of(name, config, setup)
    if int(final.get('step', shape.steps)) != shape.steps:  # Stopped at the target early.
      shape = dataclasses.replace(shape, steps=int(final['step']),
                                  images=int(final['step']) * int(setup['batch_size']))
    samples.append((shape, phases.get('phases', {})))
  return samples


def refresh(costs: Costs, out: str, names: Iterable[str]) -> Tuple[Costs, int]:
  """`costs` refitted on the finished runs `names` of the study in `out` (their recorded
  phases), and how many runs it used."""
  samples = run_samples(out, names)
  if not samples:
    return costs, 0
  return fit(samples, costs, source=f'{len(samples)} finished run(s) in {out}'), len(samples)


def study_measurement(out: str, profile: Mapping, launch_time: float,
                      exit_time: float) -> Dict:
  """One study process measured: its runs' (shape, phases) samples (from ``out``), its start
  (launch to the first phase) and the time outside its runs (the runner, the report, exit), from
  its ``ANP_PROFILE`` `profile` and the launcher's clock (`launch_time`, `exit_time`: epoch s)."""
  sections = profile.get('sections', [])
  first = float(profile['first_phase_time'])
  return {'samples': run_samples(out, [s['label'] for s in sections]),
          'start_s': first - launch_time,
          'runner_s': (exit_time - first) - sum(float(s['wall_s']) for s in sections),
          'wall_s': exit_time - launch_time, 'runs': len(sections)}


def fit_studies(measurements: Sequence[Mapping], base: Optional[Costs] = None,
                source: str = '') -> Costs:
  """Constants fitted on `study_measurement`s (every run of every study; the start and the
  runner's time their medians)."""
  samples = [s for m in measurements for s in m['samples']]
  return fit(samples, base or Costs(),
             start_s=statistics.median(m['start_s'] for m in measurements),
             runner_s=statistics.median(m['runner_s'] for m in measurements), source=source)


def measure_study(args: Sequence[str], work: str, env: Optional[Dict[str, str]] = None,
              timeout: float = 6 * 3600) -> Dict:
  """experiments/study.py `args` --out WORK/out, a fresh process with an empty compilation cache
  (WORK/xla) and a profile: its `study_measurement`."""
  out, profile = os.path.join(work, 'out'), os.path.join(work, 'profile.json')
  env = dict(os.environ if env is None else env)
  env.pop('JAX_COMPILATION_CACHE_DIR', None)  # The study's own cache, empty.
  env.update(ANP_PROFILE=profile, ANP_COMPILATION_CACHE_DIR=os.path.join(work, 'xla'),
             PYTHONPATH=ROOT)
  launch = time.time()
  done = subprocess.run([sys.executable, os.path.join(ROOT, 'experiments', 'study.py'), *args,
                         '--out', out], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout)
  exit_time = time.time()
  if done.returncode != 0:
    raise RuntimeError(f'study.py {shlex.join(args)} failed ({done.returncode}):\n'
                       f'{done.stdout[-3000:]}\n{done.stderr[-3000:]}')
  with open(profile) as f:
    measured = study_measurement(out, json.load(f), launch, exit_time)
  measured['stdout'] = done.stdout
  with open(os.path.join(work, 'clock.json'), 'w') as f:  # To refit later (`--refit`).
    json.dump({'launch': launch, 'exit': exit_time, 'args': list(args)}, f)
  return measured
