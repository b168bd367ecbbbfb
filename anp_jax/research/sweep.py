"""The batch-size sweep: a study on the runner over global batch sizes x (scaling rule, warmup)
arms, with seeds and a learning-rate grid (the logic of ``experiments/batch_size_sweep.py``,
whose docstring documents the command).

A point is one (batch size, rule, warmup) — ``b00032-linear-warmup``, fields ``batch_size``,
``lr_scaling``, ``warmup_epochs`` and the ``grad_accum_steps`` that fits the per-device batch
under ``--max_per_device_batch`` in whole ghost-BN groups (`choose_accum`) — and a run one point
at one lr multiplier and seed (``b00032-linear-warmup-lrx1-s0``, the names of the first sweeps,
so their finished runs are found again). The runner (`anp_jax.research.runner`) trains, resumes,
chooses each point's rate on validation and extends the grid (``--lr_extensions``); this module
adds the sweep's flags, the batch checks that list every bad batch size at once, and its result
columns: the first sweeps' (``results.csv`` / ``results.json``: `CSV_COLUMNS`, read by the
planner and ``experiments/report.py``) with ``best_lr`` marking the chosen rate, plus the
runner's (``point``, ``outcome``, the test split's), and B_simple per run
(`anp_jax.noise_scale.window_b_simple`, mean logged tr(Σ) over mean logged |G|² in the
second half of the steps the run trained). ``sweep.json`` records the settings and every
invocation; the report is `anp_jax.research.sweep_report`.
"""

import dataclasses
import itertools
import math
import os
import sys
import types
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jax
import ml_collections
from absl import flags

from anp_jax import cli, distributed, metrics_io, noise_scale, optim, preemption
from anp_jax.research import runner, study_cli, study_results
from anp_jax.research.study import LrGrid, Study, StudyError

SweepError = StudyError  # Bad sweep input, reported before any training (exit 2).
KIND = 'batch_size_sweep'
PREFIX = 'sweep'  # Presets: anp_jax/configs/sweep_<name>.py.
WARMUP_VALUES = {'on': True, 'off': False}
SWEPT_FIELDS = {'batch_size': '--batch_sizes', 'lr_scaling': '--rules', 'seed': '--seeds'}
# The final metrics of every row (validation and, when evaluated, test).
METRICS = ('anp_top1', 'anp_top5', 'adjective_top1', 'noun_top1')

# Shared with the planner's pilot (`anp_jax.research.planner.load_pilot`), so one run has the same
# steps to target whether it is read as a sweep row or as a pilot.
target_crossing = metrics_io.target_crossing
preset_names = study_cli.preset_names
load_preset = study_cli.load_preset

CSV_COLUMNS = (
    'name', 'batch', 'rule', 'warmup', 'seed', 'lr_mult', 'base_lr', 'lr', 'warmup_epochs',
    'epochs', 'devices', 'per_device_batch', 'accum_steps', 'steps_per_epoch', 'total_steps',
    'status', 'final_step', 'final_top1', 'final_top5', 'final_adjective_top1', 'final_noun_top1',
    'best_top1', 'target_top1', 'steps_to_target', 'examples_to_target', 'epochs_to_target',
    'eval_step_reaching_target', 'wall_time_s', 'b_simple', 'best_lr', 'error',
    # The runner's columns (after the first sweeps' ones, which keep their places).
    'point', 'outcome', 'budget_fraction_at_target', 'late_crossing', 'has_test', 'test_outcome',
    'test_steps_to_target', 'test_examples_to_target', 'test/anp_top1', 'test/anp_top5',
    # B_simple's windows: `b_simple` up to the target crossing (rows without this column: the
    # late window, as the first sweeps measured it), `b_simple_late` the second half.
    'b_simple_late', 'b_simple_window')


@dataclasses.dataclass(frozen=True)
class SweepPreset:
  """A preset file's get_sweep(): the grid and the budget (the run config is its get_config())."""
  batch_sizes: Tuple[int, ...]
  arms: Tuple[Tuple[str, bool], ...]  # (scaling rule, warmup on?)
  target_top1: float
  max_per_device_batch: int
  checkpoint_every_epochs: float
  cpu_devices: int  # Simulated CPU devices to ask XLA for (0: leave the platform alone).
  images_per_s: float  # Training throughput assumed by the --dry_run estimate (whole job).
  overhead_s: float  # Compilation and set-up per run, for the estimate.
  seeds: Tuple[int, ...] = (0,)
  lr_search: Tuple[float, ...] = (1.0,)
  lr_extensions: int = 0
  images_per_s_per_device: float = 0.0  # When images_per_s is 0: this x the job's devices.
  registration: str = ''  # A registration file (`anp_jax.research.registration`); '': none.

  def throughput(self, devices: int) -> float:
    return self.images_per_s or self.images_per_s_per_device * devices


def preset_config(name: str) -> ml_collections.ConfigDict:
  """The run config of a batch-size sweep preset (before the sweep's per-point fields)."""
  return load_preset(PREFIX, name)[0]


def sweep_preset(name: str) -> SweepPreset:
  return SweepPreset(**load_preset(PREFIX, name)[1])


def point_name(batch: int, rule: str, warmup: bool) -> str:
  """Sorts by batch; stable across invocations, so finished runs are found again."""
  return f'b{batch:05d}-{rule}-{"warmup" if warmup else "nowarmup"}'


def point_fields(base, batch: int, rule: str, warmup: bool, accum: int) -> Dict:
  """The config fields of a point: batch, scaling rule, warmup (the preset's length or none)
  and the gradient accumulation that fits it."""
  return {'batch_size': batch, 'lr_scaling': rule,
          'warmup_epochs': float(base.warmup_epochs) if warmup else 0.0,
          'grad_accum_steps': accum}


@dataclasses.dataclass
class Sweep:
  """Resolved sweep settings (flags over preset defaults)."""
  preset: str
  out: str
  base: ml_collections.ConfigDict
  batch_sizes: List[int]
  arms: List[Tuple[str, bool]]
  seeds: List[int]
  lr: LrGrid
  target_top1: float
  max_per_device_batch: int
  checkpoint_every_epochs: float
  user_fields: frozenset  # Config fields the user set with --config (not recomputed per run).
  stop_at_target: Optional[bool] = None  # The flag; None (not given): the preset's setting.
  lr_from: str = ''  # Another sweep's directory whose chosen rates the points run at.


def define_sweep_flags(fv):
  """The batch-size sweep's flags (besides --preset and --config)."""
  study_cli.define_runner_flags(fv, lr_flag='lr_search')

  def define(kind, name, help_string):
    getattr(flags, f'DEFINE_{kind}')(name, None, help_string, flag_values=fv)
  define('list', 'batch_sizes', 'Global batch sizes.')
  define('list', 'rules', 'Learning-rate scaling rules: linear, sqrt, none.')
  define('list', 'warmup', 'Warmup arms: on, off.')
  define('float', 'epochs', 'Training epochs of every run (= --config.num_epochs).')
  define('float', 'target_top1', 'ANP top-1 fraction (validation) for steps-to-target.')
  define('integer', 'max_per_device_batch',
         'Largest per-device micro-batch; above it, gradient accumulation.')
  define('float', 'checkpoint_every_epochs', 'Checkpoint cadence of every run.')
  define('string', 'lr_from', 'Another sweep\'s directory: each point runs at the rate chosen '
         'there (its points.json; same point names and base lr), instead of --lr_search.')


def parse_args(argv: Sequence[str], doc: str = __doc__):
  """(args, base config, overrides): the flags as a namespace (recorded in sweep.json), the
  preset config with the overrides applied, and the (key, value) overrides."""
  parsed = study_cli.parse_command_line(argv, PREFIX, define_sweep_flags, doc)
  if parsed is None:
    return None
  fv, config, overrides = parsed
  study_cli.out_path(fv.out)  # Required and not empty.
  args = types.SimpleNamespace(
      preset=fv.preset, out=fv.out,
      batch_sizes=study_cli.list_flag(fv, 'batch_sizes', int),
      rules=study_cli.list_flag(fv, 'rules', str), warmup=study_cli.list_flag(fv, 'warmup', str),
      seeds=study_cli.list_flag(fv, 'seeds', int), epochs=fv.epochs, target_top1=fv.target_top1,
      lr_search=study_cli.list_flag(fv, 'lr_search', float), lr_extensions=fv.lr_extensions,
      max_per_device_batch=fv.max_per_device_batch,
      checkpoint_every_epochs=fv.checkpoint_every_epochs, cpu_devices=fv.cpu_devices,
      lr_from=fv.lr_from, confirm_seeds=study_cli.list_flag(fv, 'confirm_seeds', int),
      stop_at_target=fv.stop_at_target, dry_run=fv.dry_run, no_report=fv.no_report, ci=fv.ci,
      seeds_at_once=fv.seeds_at_once)
  return args, config, overrides


def _unique(items):
  return list(dict.fromkeys(items))


def resolve(args, base, overrides) -> Sweep:
  """Flags + preset → the sweep's settings; SweepError on bad input (touches no device)."""
  preset = sweep_preset(args.preset)
  base = ml_collections.ConfigDict(base.to_dict())  # Unlocked, ours.
  max_pd = preset.max_per_device_batch if args.max_per_device_batch is None else (
      args.max_per_device_batch)
  if max_pd < 0:
    raise SweepError(f'--max_per_device_batch must be >= 0 (0 disables accumulation), got '
                     f'{max_pd}.')
  for key, _ in overrides:
    if key in SWEPT_FIELDS:
      raise SweepError(f'--config.{key} is what the sweep varies; use {SWEPT_FIELDS[key]}.')
    if key == 'grad_accum_steps' and max_pd > 0:
      raise SweepError('--config.grad_accum_steps is chosen per batch size by the sweep; pass '
                       '--max_per_device_batch 0 to set it yourself.')
  if args.epochs is not None:
    base.num_epochs = float(args.epochs)
  if base.num_train_steps <= 0 and not base.num_epochs > 0:
    raise SweepError(f'--epochs must be > 0, got {base.num_epochs}.')
  target = preset.target_top1 if args.target_top1 is None else args.target_top1
  if not (isinstance(target, (int, float)) and 0.0 < target <= 1.0):
    raise SweepError(f'--target_top1={target} is an unreachable target: top-1 accuracy is a '
                     'fraction in (0, 1] (e.g. 0.3 for 30 %).')
  if runner.stops_at_target(base, args.stop_at_target) and base.eval_every_epochs <= 0:
    raise SweepError('--stop_at_target needs periodic evaluation (eval_every_epochs > 0).')
  batch_sizes = preset.batch_sizes if args.batch_sizes is None else args.batch_sizes
  seeds = preset.seeds if args.seeds is None else args.seeds
  mults = preset.lr_search if args.lr_search is None else args.lr_search
  extensions = preset.lr_extensions if args.lr_extensions is None else args.lr_extensions
  out = study_cli.out_path(args.out)
  if getattr(args, 'confirm_seeds', None):
    # A fresh-seed confirmation: every point at the rate this sweep chose (its points.json, as
    # --lr_from reads another's), with seeds none of its runs used, into --out/confirmation.
    if args.lr_from or args.seeds is not None or args.lr_search is not None:
      raise SweepError('--confirm_seeds reruns the rates chosen in --out with new seeds: drop '
                       '--lr_from, --seeds and --lr_search.')
    used = sorted({s for p in study_results.read_json(os.path.join(out, 'points.json'))
                   for s in p.get('seed_list') or ()} & set(args.confirm_seeds)
                  ) if os.path.exists(os.path.join(out, 'points.json')) else []
    if used:
      raise SweepError(f'--confirm_seeds {used}: seeds the selection runs used; a confirmation '
                       'needs fresh ones.')
    args.lr_from, seeds = out, args.confirm_seeds
    out = os.path.join(out, study_results.CONFIRMATION_DIR)
  if getattr(args, 'lr_from', None):
    if args.lr_search is not None:
      raise SweepError('--lr_from takes each point\'s rate from another sweep; --lr_search '
                       'would be ignored: give one of the two.')
    mults = (1.0,)  # Unused: every point has its own rate.
    extensions = 0 if args.lr_extensions is None else args.lr_extensions
  bad_batch = [b for b in batch_sizes if b <= 0]
  if bad_batch:
    raise SweepError(f'Batch sizes must be positive, got {bad_batch}.')
  bad_lr = [m for m in mults if not m > 0]
  if bad_lr:
    raise SweepError(f'--lr_search multipliers must be > 0, got {bad_lr}.')
  if args.rules is None and args.warmup is None:
    arms = [tuple(a) for a in preset.arms]
  else:
    rules = args.rules if args.rules is not None else _unique(r for r, _ in preset.arms)
    warm = args.warmup if args.warmup is not None else _unique(
        'on' if w else 'off' for _, w in preset.arms)
    unknown = [r for r in rules if r not in optim.SCALING_RULES]
    if unknown:
      raise SweepError(f'--rules: unknown scaling rule(s) {unknown}; choose from '
                       f'{list(optim.SCALING_RULES)}.')
    unknown = [w for w in warm if w not in WARMUP_VALUES]
    if unknown:
      raise SweepError(f'--warmup: unknown value(s) {unknown}; use on and/or off.')
    arms = list(itertools.product(_unique(rules), [WARMUP_VALUES[w] for w in _unique(warm)]))
  if any(w for _, w in arms) and not base.warmup_epochs > 0:
    raise SweepError('Warmup "on" needs config.warmup_epochs > 0 (the warmup length); got '
                     f'{base.warmup_epochs}.')
  if not (batch_sizes and arms and seeds and mults):
    raise SweepError('The grid is empty: give at least one batch size, rule, warmup value, seed '
                     'and learning-rate multiplier.')
  ckpt = preset.checkpoint_every_epochs if args.checkpoint_every_epochs is None else (
      args.checkpoint_every_epochs)
  if ckpt < 0:
    raise SweepError(f'--checkpoint_every_epochs must be >= 0, got {ckpt}.')
  return Sweep(preset=args.preset, out=out, base=base,
               batch_sizes=sorted(set(batch_sizes)), arms=arms, seeds=_unique(seeds),
               lr=LrGrid(tuple(mults), int(extensions)), target_top1=float(target),
               max_per_device_batch=max_pd, checkpoint_every_epochs=ckpt,
               user_fields=frozenset(k for k, _ in overrides),
               stop_at_target=args.stop_at_target,
               lr_from=os.path.abspath(os.path.expanduser(args.lr_from)) if getattr(
                   args, 'lr_from', None) else '')


def choose_accum(per_device: int, max_micro: int, group: int) -> Optional[int]:
  """Fewest micro-batches k with per_device/k ≤ max_micro and a whole number of BN groups each."""
  for k in range(max(1, -(-per_device // max_micro)), per_device + 1):
    if per_device % k == 0 and (per_device // k) % group == 0:
      return k
  return None


def batch_problems(batch_sizes: Sequence[int], devices: int, max_micro: int, bn_mode: str,
                   bn_group: int, fixed_accum: int = 1) -> Dict[int, str]:
  """Batch size → why it cannot be split over `devices` x micro-batches x BN groups.

  Every bad batch size at once, before any run (`setup.resolve_setup` then checks each run's
  full setup, including the dataset, and stops at its first problem).
  """
  group = bn_group if bn_mode == 'ghost' else 1
  problems = {}
  for b in batch_sizes:
    if b % devices:
      problems[b] = f'not a multiple of the {devices} devices'
      continue
    per_device = b // devices
    if max_micro > 0:
      if choose_accum(per_device, max_micro, group) is None:
        problems[b] = (f'per-device batch {per_device} has no split into micro-batches of at '
                       f'most {max_micro} that are multiples of bn_group_size={group}')
    elif per_device % fixed_accum or (per_device // fixed_accum) % group:
      problems[b] = (f'per-device batch {per_device} does not split into {fixed_accum} '
                     f'micro-batch(es) that are multiples of bn_group_size={group}')
  return problems


def accumulation(sw: Sweep, batch: int, devices: int) -> int:
  """The gradient accumulation of a batch size (the config's when --max_per_device_batch 0)."""
  base = sw.base
  if sw.max_per_device_batch <= 0:
    return int(base.grad_accum_steps)
  group = base.bn_group_size if base.bn_mode == 'ghost' else 1
  return choose_accum(batch // devices, sw.max_per_device_batch, group)


# ----------------------------------------------------------------------------------------------
# Rows: the first sweeps' columns on the runner's.


def _legacy_point(record: Dict) -> str:
  """The point of a record written before records named it."""
  return point_name(int(record['batch']), record['rule'], record['warmup'] in ('on', True))


def summarize_run(run_dir: str, target: float, record: Optional[Dict] = None) -> Optional[Dict]:
  """One results row from a run directory's files (None if the sweep never started it): the
  runner's row (`study_results.summarize_run`) with the first sweeps' columns."""
  row = study_results.summarize_run(run_dir, 'eval/anp_top1', target, record, METRICS)
  if row is None:
    return None
  row.setdefault('point', _legacy_point(row))
  row['fields'] = row.get('fields') or {}
  records = metrics_io.read_metrics(run_dir)
  row.update(final_top1=row['eval/anp_top1'], final_top5=row['eval/anp_top5'],
             final_adjective_top1=row['eval/adjective_top1'],
             final_noun_top1=row['eval/noun_top1'], best_top1=row['best/eval/anp_top1'],
             target_top1=target, **b_simple_columns(records, row))
  return row


def b_simple_columns(records, row: Dict) -> Dict:
  """A run's gradient noise scale in two windows (issue 32, item 4).

  ``b_simple``: the window that matters, every logged step up to the run's (validation)
  crossing of the target, None when it never reached it; ``b_simple_late``: the second half of
  what the run trained (with --stop_at_target that ends at the step it stopped at, not at the
  budget); ``b_simple_window``: 'to_target'. B_simple grows during training, so the late window
  reads higher than the one the steps to target were spent in.
  """
  last = max((r['step'] for r in records), default=row['total_steps'])
  reached = study_results.outcome_of(row) == 'reached' and row.get('steps_to_target') is not None
  return {'b_simple': (noise_scale.window_b_simple(records, end_step=row['steps_to_target'])
                       if reached else None),
          'b_simple_late': noise_scale.window_b_simple(records, start_step=last / 2,
                                                       end_step=last),
          'b_simple_window': 'to_target'}


def select_best_lr(rows: List[Dict], key: Callable[[Dict], object] = None) -> List[Dict]:
  """Marks (``best_lr``), per group of `key` (default: batch, rule, warmup), the rows of the
  chosen lr multiplier: `study_results.choose_rates` on the final validation top-1 (a rate with
  a diverged or unfinished seed is never chosen; fewest mean steps over seeds that all reached
  the target; else best mean final top-1; ties to the higher top-1, then the smaller
  multiplier). A group with no candidate rate has no ``best_lr`` row."""
  key = key or (lambda r: (r['batch'], r['rule'], r['warmup']))
  choices = study_results.choose_rates(rows, key, lambda r: r.get('final_top1'))
  for r in rows:
    r['best_lr'] = study_results.is_chosen(r, choices[key(r)])
  return rows


def collect_results(out: str, target: float) -> List[Dict]:
  """One row per run found under ``out/runs`` (sweeps split over several jobs add up)."""
  runs_dir = os.path.join(out, 'runs')
  rows = []
  if os.path.isdir(runs_dir):
    for name in sorted(os.listdir(runs_dir)):
      row = summarize_run(os.path.join(runs_dir, name), target)
      if row is not None:
        rows.append(row)
  return select_best_lr(rows)


def write_results(out: str, rows: List[Dict], points: List[Dict]) -> List[str]:
  """``results.csv`` (`CSV_COLUMNS`) / ``results.json`` with ``best_lr``, and ``points.*``."""
  rows = select_best_lr(sorted(rows, key=lambda r: r['name']))
  return study_results.write_results(out, rows, points, CSV_COLUMNS)


# ----------------------------------------------------------------------------------------------
# Rates chosen by another sweep.


def rates_from(source: str, points: Sequence[Tuple[str, Dict]], base) -> Dict[str, Tuple[float]]:
  """Per point, the multiplier another sweep (directory `source`) chose for the point of the same
  name on validation: e.g. the Goyal curve at a fixed example budget, each batch size at the rate
  the Shallue sweep tuned. SweepError listing every point `source` has no settled choice for, and
  every point whose peak rate would differ from the one trained there (another base lr or rule:
  a multiplier means nothing across them)."""
  path = os.path.join(source, 'points.json')
  if not os.path.exists(path):
    raise SweepError(f'--lr_from={source}: {path} does not exist (the directory of a finished '
                     'sweep whose rates to reuse).')
  chosen = {p['point']: p for p in study_results.read_json(path)}
  problems, out = [], {}
  for name, fields in points:
    p = chosen.get(name)
    if p is None or not p.get('lr_chosen') or p.get('lr_pending'):
      why = 'not a point there' if p is None else (
          'its choice is provisional' if p and p.get('lr_pending') else 'no rate chosen there')
      problems.append(f'{name} ({why})')
      continue
    config = ml_collections.ConfigDict(base.to_dict())
    runner.apply_fields(config, dict(fields), f'Point {name!r}')
    config.base_lr = float(base.base_lr) * float(p['lr_mult'])
    peak = optim.scaled_lr(config)
    if not math.isclose(peak, float(p['lr']), rel_tol=1e-9):
      problems.append(f'{name} (peak lr {peak:.6g} here vs {float(p["lr"]):.6g} there: another '
                      'base_lr or scaling rule)')
      continue
    out[name] = (float(p['lr_mult']),)
  if problems:
    raise SweepError(f'--lr_from={source} gives no usable rate for: {"; ".join(problems)}.')
  return out


# ----------------------------------------------------------------------------------------------
# The study and the command.


def build_study(sw: Sweep, devices: int, preset: SweepPreset,
                make_report: Optional[Callable[[str], str]] = None) -> Study:
  """The sweep as a runner study on `devices` devices (SweepError listing every batch size that
  does not split over them)."""
  base = sw.base
  problems = batch_problems(sw.batch_sizes, devices, sw.max_per_device_batch, base.bn_mode,
                            base.bn_group_size, int(base.grad_accum_steps))
  if problems:
    group = base.bn_group_size if base.bn_mode == 'ghost' else 1
    listing = '; '.join(f'{b}: {why}' for b, why in sorted(problems.items()))
    raise SweepError(
        f'These batch sizes do not fit {devices} device(s) x micro-batch x BN group: {listing}. '
        f'Global batches must be multiples of devices x bn_group_size = {devices * group} '
        f'(and, with accumulation, of devices x the micro-batch); ok here: '
        f'{[b for b in sw.batch_sizes if b not in problems] or "none"}.')
  points = [(point_name(b, rule, warm),
             point_fields(base, b, rule, warm, accumulation(sw, b, devices)))
            for b in sw.batch_sizes for rule, warm in sw.arms]

  def record_extra(run):
    return {'rule': run.config.lr_scaling, 'warmup': 'on' if run.config.warmup_epochs else 'off'}

  def fields_of_record(record, config):
    return point_fields(base, int(record['batch']), record['rule'],
                        record['warmup'] in ('on', True), int(config.get('grad_accum_steps', 1)))

  point_lr = rates_from(sw.lr_from, points, base) if sw.lr_from else {}
  return Study(kind=KIND, points=tuple(points), target_value=sw.target_top1, seeds=sw.seeds,
               lr=sw.lr, point_lr=point_lr, metrics=METRICS,
               checkpoint_every_epochs=sw.checkpoint_every_epochs,
               # ~10 logs per epoch: enough B_simple samples in the second half of short runs.
               log_every_epochs=0.1, images_per_s=preset.throughput(devices),
               overhead_s=preset.overhead_s, title='Batch-size sweep',
               summarize=lambda run_dir, record: summarize_run(run_dir, sw.target_top1, record),
               write=write_results, report=make_report, record_extra=record_extra,
               fields_of_record=fields_of_record, registration=preset.registration)


def options(sw: Sweep, args, overrides, report: bool) -> runner.Options:
  return runner.Options(out=sw.out, preset=sw.preset, stop_at_target=sw.stop_at_target,
                        ci=args.ci, dry_run=args.dry_run, report=report,
                        seeds_at_once=getattr(args, 'seeds_at_once', 'auto'),
                        user_fields=sw.user_fields, record_file='sweep.json',
                        invocation={'args': vars(args),
                                    'overrides': study_cli.override_args(overrides)})


def plan_runs(sw: Sweep, devices: Optional[int] = None, args=None):
  """(runs, dataset meta): every run's config and sizes, checked before any training."""
  devices = jax.device_count() if devices is None else devices
  preset = sweep_preset(sw.preset)
  study = build_study(sw, devices, preset)
  args = args or types.SimpleNamespace(ci='t', dry_run=True)
  return runner.plan_runs(study, sw.base, options(sw, args, [], False), devices)


def synthetic_meta(config):
  """The sizes `runner.plan_runs` needs of a generated (``synthetic_anp``) dataset, from the
  config alone (`pipeline.planned_meta`: without generating it); None for a prepared dataset,
  whose sizes only its preparation knows."""
  if config.dataset != 'synthetic_anp':
    return None
  from anp_jax.data import pipeline
  return pipeline.planned_meta(config)


def dry_run_estimate(preset: str) -> Optional[Dict[str, float]]:
  """What ``--preset PRESET --dry_run`` estimates (`runner.estimate_study`: every run trains
  its whole budget, so an upper bound under ``--stop_at_target``) on the preset's simulated
  devices: ``runs``, ``minutes``, ``extension_runs`` (the most the rate extensions add) and
  ``extension_minutes``; None when the preset's dataset must be prepared first. The --help text
  and the presets' docstrings quote these numbers (tests/test_sweep.py checks them)."""
  import tempfile
  with tempfile.TemporaryDirectory() as out:
    args, config, overrides = parse_args(['--preset', preset, '--out', out])
    meta = synthetic_meta(config)
    if meta is None:
      return None
    sw = resolve(args, config, overrides)
    spec = sweep_preset(preset)
    devices = spec.cpu_devices or 1
    study = build_study(sw, devices, spec)
    runs, _ = runner.plan_runs(study, sw.base, options(sw, args, [], False), devices, meta=meta)
    est = runner.estimate_study(study, runs, out, meta.eval_size, platform='cpu')
  more = study.lr.extensions * len(study.points) * len(study.seeds)
  return {'runs': len(runs), 'extension_runs': more,
          'extension_minutes': more * est.per_extension_s / 60, 'minutes': est.seconds / 60}


ESTIMATES = '{dry_run_estimates}'  # In a --help text: the presets' `dry_run_estimate`s.


def estimates_text(presets: Sequence[str] = ('tiny', 'cpu', 'cpu:goyal')) -> str:
  """One line per preset: its `dry_run_estimate`, as the --help text gives it."""
  lines = []
  for name in presets:
    e = dry_run_estimate(name)
    more = (f' + up to {e["extension_minutes"]:.0f} min for {e["extension_runs"]} extension '
            'runs' if e['extension_runs'] else '')
    minutes = f'{e["minutes"]:.0f}' if e['minutes'] >= 1 else '< 1'
    lines.append(f'  {name}: {e["runs"]} runs, {minutes} min{more}')
  return '\n'.join(lines)


def sweep(argv: Sequence[str], make_report: Optional[Callable[[str], str]] = None,
          doc: str = __doc__) -> List[Dict]:
  """Runs (or continues) the sweep of `argv`; returns the results rows. Raises SweepError.

  `make_report(out)` (experiments/report.py's) writes the report at the end unless --no_report.
  """
  preemption.install()  # From here on, SIGTERM/SIGUSR1 mean "checkpoint and exit 75".
  if ESTIMATES in doc and any(a in cli.HELP_FLAGS for a in argv):
    doc = doc.replace(ESTIMATES, estimates_text())
  parsed = parse_args(argv, doc)
  if parsed is None:
    return []
  args, config, overrides = parsed
  preset = sweep_preset(args.preset)
  study_cli.simulate_cpu_devices(preset.cpu_devices if args.cpu_devices is None else
                              args.cpu_devices)
  distributed.initialize()  # Multi-process jobs (SLURM / ANP_* variables); no-op otherwise.
  sw = resolve(args, config, overrides)
  study = build_study(sw, jax.device_count(), preset, make_report)
  report = make_report is not None and not args.no_report
  rows = runner.run_study(study, sw.base, options(sw, args, overrides, report))
  if args.dry_run and sw.stop_at_target and jax.process_index() == 0:
    print('With --stop_at_target each run ends at its target: the minutes above, every run '
          'training its whole budget, are an upper bound.', flush=True)
  return select_best_lr(sorted(rows, key=lambda r: r['name']))


def main(argv: Sequence[str], make_report: Optional[Callable[[str], str]] = None,
         doc: str = __doc__) -> int:
  """`sweep` with bad input as ``ERROR: ...`` on stderr and exit code 2."""
  try:
    sweep(argv, make_report, doc)
  except SweepError as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  return 0
