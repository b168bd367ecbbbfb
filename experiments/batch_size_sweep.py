"""Synchronous batch size vs accuracy: a resumable sweep over global batch sizes.

  python experiments/batch_size_sweep.py --preset cpu --out workdirs/bs_sweep
  python experiments/batch_size_sweep.py --preset cpu --out DIR --batch_sizes 64,256,1024 \\
      --rules linear,none --warmup on,off --seeds 0,1 --epochs 6 --target_top1 0.3
  python experiments/batch_size_sweep.py --preset cpu --out DIR --lr_search 0.5,1,2   # Shallue
  python experiments/batch_size_sweep.py --preset paper --out /scratch/bs --config.data_dir=/d/anp
  python experiments/batch_size_sweep.py --preset cpu --out DIR --dry_run   # grid + time estimate
  python experiments/report.py DIR                                          # (also run at the end)

The grid is global batch sizes × (scaling rule, warmup) arms × seeds × learning-rate multipliers,
each trained for the same number of epochs with `anp_jax.trainer.train_and_evaluate` in
``DIR/runs/<name>``. Without ``--rules``/``--warmup`` a preset's own arms are used (for ``cpu``
and ``paper``: linear rule + warmup, linear without warmup, no scaling + warmup — Goyal et al.'s
comparison); with either, the full product of the two lists. ``--lr_search`` multiplies the
preset's ``base_lr`` (before the scaling rule) and the report keeps, per batch size, the rate that
reaches the target in the fewest steps (Shallue et al. 2018: compare batch sizes each at its own
best learning rate, not at one fixed rule).

* ``--stop_at_target`` ends each run at its first evaluation reaching ``--target_top1`` (the
  epoch budget becomes a cap): time-to-accuracy without training past the target.
* **Gradient accumulation** is chosen per batch: when the per-device batch exceeds
  ``--max_per_device_batch``, ``config.grad_accum_steps`` is the smallest count of micro-batches
  that fits and keeps every micro-batch a whole number of ghost-BN groups (with ghost BN this is
  exactly one large batch, see tests/test_train.py). ``--max_per_device_batch 0`` disables it.
* **Validation before any training**: unknown rules / warmup values, an empty grid, a target
  outside (0, 1], batch sizes that do not split over devices × micro-batches × BN groups (all bad
  ones are listed) or do not fit the dataset, and runs in DIR trained with other settings.
* **Resumable**: a run with ``final_metrics.json`` is skipped; an interrupted one continues from
  its checkpoints (saved every ``--checkpoint_every_epochs``). A run whose loss becomes NaN/Inf is
  recorded as diverged (its ``final_metrics.json`` says so) and not retried. Preemption (SIGTERM)
  exits with code 75 like the trainer, so a requeued job picks up where it stopped; a signal that
  arrives after a run's last step (its final evaluation, between runs) stops the sweep before the
  next run (`anp_jax.preemption` keeps the flag for the whole process).
* **Results**: ``DIR/results.csv`` and ``DIR/results.json``, one row per run found under
  ``DIR/runs`` (so sweeps split over several jobs into one DIR add up): batch, rule, warmup,
  seed, lr (peak), final / best top-1, top-5, steps / examples / epochs to the target (the
  first crossing, interpolated linearly between the two evaluations around it, see
  `report.target_crossing`; epochs = examples / train_size; None if never), the step of the
  first evaluation reaching it, wall time (of the invocation that finished the run),
  and B_simple (mean logged tr(Σ) over mean logged |G|² in the second half of the steps the run
  trained, see `anp_jax.research.noise_scale.window_b_simple`). Rows are recomputed from the run
  directories on every invocation, so a new
  ``--target_top1`` needs no retraining. Then ``experiments/report.py`` writes DIR/report.md.

Presets:

* ``tiny``: for tests (about a minute on 2 cores, mostly start-up and compilation) — ResNet-8 width 0.5 at 16 px on 256 generated images (the
  tests' dataset), batches 32, 64 (accumulation above 4 per device), one arm, 0.75 epochs.
* ``cpu``: the experiment on a 2-core machine, ≤ 45 min. ResNet-20 at width 0.5 on the generated
  32-class ANP dataset drawn at 16 px (8,000 train / 1,696 eval images), 2 simulated CPU devices
  (ghost BN over 16 images, so the smallest batch still spans two devices and B_simple is
  measured for every batch), batches 32, 64, ..., 1024, 3 arms, 1 seed — 18 runs — of 10 epochs
  each, nesterov, base lr 0.2 per 256, 1 epoch of warmup, cosine decay, evaluation every half
  epoch, target 25 % ANP top-1 (chance 3.1 %). Measured with the linear rule and warmup
  (``experiments/results/bs_sweep_cpu/``): B=256 reaches it after 96 steps (3.1 epochs) and ends
  at 46.6 %; B=1024 (lr 0.8) after 60 steps (8.6 epochs), ending at 26.7 % — the large-batch loss
  of accuracy at a fixed epoch budget, and far from perfect scaling in steps. No gradient accumulation: on XLA:CPU the accumulation loop runs
  ~6x slower per image (115 vs 685 img/s measured), and 512 per device fits easily.
  Time estimate: ResNet-20 width 1 at 32 px trains at ~120 img/s at batch 128 on this machine
  (90 measured while other jobs loaded it); width 0.5 quarters the FLOPs and 16 px quarters them
  again, which measured 10.4x faster (934 vs 90 img/s side by side), i.e. ~1,250 img/s for the
  bare train step on free cores; with the input pipeline and two simulated devices sharing the
  cores assume 800 img/s. 18 runs x 10 epochs x 8,000 images = 1.44 M images ≈ 1,800 s;
  evaluating every half epoch adds 20 x 1,696 images per run at ~1/3 of the cost of a training
  image (+14 %, ≈ 250 s); compilation and set-up ≈ 20 s per run (360 s). Total ≈ 2,400 s ≈
  40 min on 2 free cores (other jobs on the same cores stretch it proportionally).
  ``--dry_run`` prints the same estimate for any grid.
* ``paper``: ResNet-50 at 224 px on the prepared ``anp`` dataset (MUSA2 recipe's data,
  augmentation and 30-epoch step schedule) with Goyal et al.'s large-batch recipe: SGD momentum
  0.9, lr 0.1 per 256, 5 warmup epochs, ghost BN over 32 images per worker, zero-init last BN γ,
  bf16; batches 256, 512, ..., 8192, at most 256 per device per micro-batch; target 20 % top-1.
  For a GPU cluster (multi-process jobs are set up from SLURM / ANP_* variables, as in main.py).

Any ``--config.<field>=<value>`` overrides the preset's config (e.g. ``--config.model.width=1``,
``--config.synthetic.label_noise=0.1``); the swept fields (batch_size, lr_scaling, seed) are set
by the sweep flags instead. ``--epochs E`` is ``--config.num_epochs=E``.
"""

import argparse
import ast
import csv
import dataclasses
import itertools
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _p in (ROOT, HERE):  # Runnable as `python experiments/batch_size_sweep.py` without install.
  if _p not in sys.path:
    sys.path.insert(0, _p)

import ml_collections  # noqa: E402

import report  # noqa: E402  (experiments/report.py: metrics reader and the report itself)
from anp_jax import cli, runtime  # noqa: E402  (no JAX)
from anp_jax.research import noise_scale  # noqa: E402  (pure Python, no JAX)


class SweepError(ValueError):
  """Bad sweep input, reported before any training."""


WARMUP_VALUES = {'on': True, 'off': False}
# Fields that do not change what a run computes; they may differ between invocations.
_NEUTRAL_FIELDS = ('progress_bar', 'data_dir', 'checkpoint_every_steps',
                   'checkpoint_every_minutes', 'async_checkpointing', 'keep_checkpoints',
                   'log_every_steps', 'keep_best_metric', 'eval_only')
_SWEPT_FIELDS = {'batch_size': '--batch_sizes', 'lr_scaling': '--rules', 'seed': '--seeds'}

CSV_COLUMNS = (
    'name', 'batch', 'rule', 'warmup', 'seed', 'lr_mult', 'base_lr', 'lr', 'warmup_epochs',
    'epochs', 'devices', 'per_device_batch', 'accum_steps', 'steps_per_epoch', 'total_steps',
    'status', 'final_step', 'final_top1', 'final_top5', 'final_adjective_top1', 'final_noun_top1',
    'best_top1', 'target_top1', 'steps_to_target', 'examples_to_target', 'epochs_to_target',
    'eval_step_reaching_target', 'wall_time_s', 'b_simple', 'best_lr', 'error')


# ----------------------------------------------------------------------------------------------
# Presets.


@dataclasses.dataclass(frozen=True)
class Preset:
  """A sweep's defaults: the grid, the budget and the run config they apply to."""
  batch_sizes: Tuple[int, ...]
  arms: Tuple[Tuple[str, bool], ...]  # (scaling rule, warmup on?)
  epochs: float
  target_top1: float
  max_per_device_batch: int
  checkpoint_every_epochs: float
  cpu_devices: int  # Simulated CPU devices to ask XLA for (0: leave the platform alone).
  images_per_s: float  # Training throughput assumed by the --dry_run estimate (whole job).
  overhead_s: float  # Compilation and set-up per run, for the estimate.
  seeds: Tuple[int, ...] = (0,)
  lr_search: Tuple[float, ...] = (1.0,)


GOYAL_ARMS = (('linear', True), ('linear', False), ('none', True))

PRESETS = {
    'tiny': Preset(batch_sizes=(32, 64), arms=(('linear', True),), epochs=0.75,
                   target_top1=0.2, max_per_device_batch=4, checkpoint_every_epochs=0.25,
                   cpu_devices=8, images_per_s=2000.0, overhead_s=10.0),
    # No accumulation on CPU (512 per device is the largest batch over 2 devices): XLA:CPU runs
    # the accumulation loop's convolutions ~6x slower per image (115 vs 685 img/s measured).
    'cpu': Preset(batch_sizes=(32, 64, 128, 256, 512, 1024), arms=GOYAL_ARMS, epochs=10.0,
                  target_top1=0.25, max_per_device_batch=512, checkpoint_every_epochs=1.0,
                  cpu_devices=2, images_per_s=800.0, overhead_s=20.0),
    'paper': Preset(batch_sizes=(256, 512, 1024, 2048, 4096, 8192), arms=GOYAL_ARMS, epochs=30.0,
                    target_top1=0.2, max_per_device_batch=256, checkpoint_every_epochs=1.0,
                    cpu_devices=0, images_per_s=0.0, overhead_s=120.0),
}
# The paper estimate assumes ~1,000 img/s per GPU (ResNet-50, bf16, 224 px): scaled by devices.
PAPER_IMAGES_PER_S_PER_DEVICE = 1000.0


def preset_config(name: str) -> ml_collections.ConfigDict:
  """The run config of a preset (before the sweep's per-run fields)."""
  from anp_jax.configs import default, musa2_resnet50
  if name == 'tiny':
    c = default.get_config()
    # The same generated dataset as tests/conftest.py's tiny_config (8 ANPs, 16 px).
    c.synthetic.update(dict(num_adjectives=4, num_nouns=4, num_pairs=8, image_size=16,
                            train_per_class=32, eval_per_class=13, label_noise=0.0, seed=0))
    c.image_size = 16
    c.model.name, c.model.width = 'resnet8', 0.5
    c.base_lr, c.base_batch_size = 0.1, 32
    c.eval_batch_size = 32
    c.bn_mode, c.bn_group_size = 'ghost', 4
    c.warmup_epochs = 0.25
    c.eval_every_epochs = 0.5
    c.progress_bar = False
    c.checkpoint_every_minutes = 0
    c.async_checkpointing = False
    return c
  if name == 'cpu':
    c = default.get_config()
    c.synthetic.image_size = 16
    c.synthetic.train_per_class, c.synthetic.eval_per_class = 250, 53
    c.image_size = 16
    c.crop_padding = 2
    c.model.name, c.model.width = 'resnet20', 0.5
    c.bn_mode, c.bn_group_size = 'ghost', 16
    c.optimizer = 'nesterov'
    c.base_lr, c.base_batch_size = 0.2, 256
    c.warmup_epochs = 1.0
    c.schedule = 'cosine'
    c.eval_batch_size = 256
    c.eval_every_epochs = 0.5
    c.checkpoint_every_minutes = 0
    return c
  if name == 'paper':
    c = musa2_resnet50.get_config()
    c.optimizer, c.momentum, c.weight_decay = 'sgd', 0.9, 1e-4
    c.base_lr, c.base_batch_size = 0.1, 256
    c.warmup_epochs = 5.0
    c.bn_mode, c.bn_group_size = 'ghost', 32
    c.model.zero_init_last_bn = True
    c.eval_batch_size = 1024
    c.eval_every_epochs = 1.0
    c.progress_bar = False
    return c
  raise SweepError(f'Unknown preset {name!r}; choose one of {sorted(PRESETS)}.')


# ----------------------------------------------------------------------------------------------
# Command line.


def _list(kind, what):
  def parse(text):
    items = [t.strip() for t in text.split(',') if t.strip()]
    try:
      return [kind(t) for t in items]
    except ValueError:
      raise argparse.ArgumentTypeError(f'{what} must be a comma-separated list of '
                                       f'{kind.__name__}s, got {text!r}.') from None
  return parse


def parse_args(argv: Sequence[str]):
  """(args, overrides) with overrides a list of (dotted config key, raw value)."""
  parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--preset', default='cpu', choices=sorted(PRESETS))
  parser.add_argument('--out', required=True, help='Sweep directory (runs/, results.*, report).')
  parser.add_argument('--batch_sizes', type=_list(int, '--batch_sizes'))
  parser.add_argument('--rules', type=_list(str, '--rules'), help='linear, sqrt, none.')
  parser.add_argument('--warmup', type=_list(str, '--warmup'), help='on, off.')
  parser.add_argument('--seeds', type=_list(int, '--seeds'))
  parser.add_argument('--epochs', type=float, help='Training epochs of every run.')
  parser.add_argument('--target_top1', type=float, help='ANP top-1 fraction for steps-to-target.')
  parser.add_argument('--lr_search', type=_list(float, '--lr_search'),
                      help='Multipliers of base_lr tried per batch size (best one reported).')
  parser.add_argument('--max_per_device_batch', type=int,
                      help='Largest per-device micro-batch; above it, gradient accumulation.')
  parser.add_argument('--checkpoint_every_epochs', type=float)
  parser.add_argument('--cpu_devices', type=int,
                      help='Simulated CPU devices (XLA flag, set before JAX starts); 0: none.')
  parser.add_argument('--stop_at_target', action='store_true',
                      help='Stop each run at the first evaluation reaching --target_top1 '
                           '(time-to-accuracy; the epoch budget becomes a cap).')
  parser.add_argument('--dry_run', action='store_true',
                      help='Validate, print the grid and the time estimate; train nothing.')
  parser.add_argument('--no_report', action='store_true', help='Skip experiments/report.py.')
  return parse_with_overrides(parser, argv)


def parse_with_overrides(parser: argparse.ArgumentParser, argv: Sequence[str]):
  """(args, overrides): the parser's flags, plus every ``--config.x.y=value`` as (key, raw).

  Anything else left over is a usage error from `parser`. Shared by the experiment scripts.
  """
  args, rest = parser.parse_known_args(list(argv))
  overrides = []
  for item in rest:
    if not item.startswith('--config.') or '=' not in item:
      parser.error(f'unrecognized argument {item!r} (config overrides are --config.x.y=value)')
    key, raw = item[len('--config.'):].split('=', 1)
    overrides.append((key, raw))
  return args, overrides


def _parse_value(raw: str, old, key: str):
  """`raw` converted to the type of the config field's current value."""
  try:
    if isinstance(old, bool):
      low = raw.lower()
      if low not in ('true', 'false', '1', '0', 'yes', 'no'):
        raise ValueError
      return low in ('true', '1', 'yes')
    if isinstance(old, int):
      return int(raw)
    if isinstance(old, float):
      return float(raw)
    if isinstance(old, str):
      return raw
    if isinstance(old, (tuple, list)):
      value = ast.literal_eval(raw)
      return tuple(value) if isinstance(value, (tuple, list)) else (value,)
    try:
      return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      return raw
  except (ValueError, SyntaxError):
    raise SweepError(f'--config.{key}={raw!r}: expected {type(old).__name__} (like the '
                     f'current value {old!r}).') from None


def apply_overrides(config, overrides, auto_accum: bool):
  """Applies --config.x=y in order; refuses unknown fields and the ones the sweep varies."""
  for key, raw in overrides:
    if key in _SWEPT_FIELDS:
      raise SweepError(f'--config.{key} is what the sweep varies; use {_SWEPT_FIELDS[key]}.')
    if key == 'grad_accum_steps' and auto_accum:
      raise SweepError('--config.grad_accum_steps is chosen per batch size by the sweep; pass '
                       '--max_per_device_batch 0 to set it yourself.')
    node, parts = config, key.split('.')
    for i, part in enumerate(parts):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        raise SweepError(cli.unknown_field_message(key, cli.config_fields(config)))
      if i < len(parts) - 1:
        node = node[part]
    try:
      node[parts[-1]] = _parse_value(raw, node[parts[-1]], key)
    except TypeError as e:  # ml_collections' own type check.
      raise SweepError(f'--config.{key}={raw!r}: {e}') from None
  return config


# ----------------------------------------------------------------------------------------------
# The grid.


@dataclasses.dataclass(frozen=True)
class RunSpec:
  batch: int
  rule: str
  warmup: bool
  seed: int
  lr_mult: float = 1.0

  @property
  def name(self) -> str:
    """Sorts by batch; stable across invocations, so finished runs are found again."""
    return (f'b{self.batch:05d}-{self.rule}-{"warmup" if self.warmup else "nowarmup"}-'
            f'lrx{self.lr_mult:g}-s{self.seed}')


@dataclasses.dataclass
class Plan:
  """A grid point made concrete: its config and the sizes the trainer will derive."""
  spec: RunSpec
  config: ml_collections.ConfigDict
  setup: object  # anp_jax.setup.Setup


@dataclasses.dataclass
class Sweep:
  """Resolved sweep settings (flags over preset defaults)."""
  preset: str
  out: str
  base: ml_collections.ConfigDict
  grid: List[RunSpec]
  target_top1: float
  max_per_device_batch: int
  checkpoint_every_epochs: float
  user_fields: frozenset  # Config fields the user set with --config (not recomputed per run).


def _unique(items):
  return list(dict.fromkeys(items))


def resolve(args, overrides) -> Sweep:
  """Flags + preset → grid and base config; SweepError on bad input (touches no device)."""
  from anp_jax import optim
  preset = PRESETS[args.preset]
  max_pd = preset.max_per_device_batch if args.max_per_device_batch is None else (
      args.max_per_device_batch)
  if max_pd < 0:
    raise SweepError(f'--max_per_device_batch must be >= 0 (0 disables accumulation), got '
                     f'{max_pd}.')
  base = preset_config(args.preset)
  base.num_epochs = preset.epochs
  base.num_train_steps = -1
  apply_overrides(base, overrides, auto_accum=max_pd > 0)
  if args.epochs is not None:
    base.num_epochs = float(args.epochs)
  if base.num_train_steps <= 0 and not base.num_epochs > 0:
    raise SweepError(f'--epochs must be > 0, got {base.num_epochs}.')

  target = preset.target_top1 if args.target_top1 is None else args.target_top1
  if not (isinstance(target, (int, float)) and 0.0 < target <= 1.0):
    raise SweepError(f'--target_top1={target} is an unreachable target: top-1 accuracy is a '
                     'fraction in (0, 1] (e.g. 0.3 for 30 %).')
  if getattr(args, 'stop_at_target', False):
    if base.eval_every_epochs <= 0:
      raise SweepError('--stop_at_target needs periodic evaluation (eval_every_epochs > 0).')
    base.stop_at_metric, base.stop_at_value = 'eval/anp_top1', float(target)

  batch_sizes = preset.batch_sizes if args.batch_sizes is None else args.batch_sizes
  seeds = preset.seeds if args.seeds is None else args.seeds
  lr_mults = preset.lr_search if args.lr_search is None else args.lr_search
  bad_batch = [b for b in batch_sizes if b <= 0]
  if bad_batch:
    raise SweepError(f'Batch sizes must be positive, got {bad_batch}.')
  bad_lr = [m for m in lr_mults if not m > 0]
  if bad_lr:
    raise SweepError(f'--lr_search multipliers must be > 0, got {bad_lr}.')
  if args.rules is None and args.warmup is None:
    arms = list(preset.arms)
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
  grid = [RunSpec(b, r, w, s, m) for b in sorted(set(batch_sizes)) for r, w in arms
          for s in _unique(seeds) for m in _unique(lr_mults)]
  if not grid:
    raise SweepError('The grid is empty: give at least one batch size, rule, warmup value, seed '
                     'and learning-rate multiplier.')
  ckpt = preset.checkpoint_every_epochs if args.checkpoint_every_epochs is None else (
      args.checkpoint_every_epochs)
  if ckpt < 0:
    raise SweepError(f'--checkpoint_every_epochs must be >= 0, got {ckpt}.')
  return Sweep(preset=args.preset, out=os.path.abspath(os.path.expanduser(args.out)), base=base,
               grid=grid, target_top1=float(target), max_per_device_batch=max_pd,
               checkpoint_every_epochs=ckpt, user_fields=frozenset(k for k, _ in overrides))


def choose_accum(per_device: int, max_micro: int, group: int) -> Optional[int]:
  """Fewest micro-batches k with per_device/k ≤ max_micro and a whole number of BN groups each."""
  for k in range(max(1, -(-per_device // max_micro)), per_device + 1):
    if per_device % k == 0 and (per_device // k) % group == 0:
      return k
  return None


def batch_problems(batch_sizes: Sequence[int], devices: int, max_micro: int, bn_mode: str,
                   bn_group: int, fixed_accum: int = 1) -> Dict[int, str]:
  """Batch size → why it cannot be split over `devices` x micro-batches x BN groups."""
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


def make_run_config(base, spec: RunSpec, accum_steps: int) -> ml_collections.ConfigDict:
  """The run's config: the base with the grid point's batch, rule, warmup, seed and lr."""
  c = ml_collections.ConfigDict(base.to_dict())
  c.batch_size = spec.batch
  c.lr_scaling = spec.rule
  c.warmup_epochs = float(base.warmup_epochs) if spec.warmup else 0.0
  c.seed = spec.seed
  c.base_lr = float(base.base_lr) * spec.lr_mult
  c.grad_accum_steps = accum_steps
  return c


def plan_runs(sw: Sweep, devices: Optional[int] = None):
  """(plans, dataset meta): every grid point's config and sizes, checked before any training."""
  import jax
  from anp_jax.data import pipeline
  from anp_jax.setup import resolve_setup, validate_config
  base = sw.base
  devices = jax.device_count() if devices is None else devices
  try:
    validate_config(base)
  except (ValueError, FileNotFoundError) as e:
    raise SweepError(f'The preset config with your overrides is invalid: {e}') from e
  batches = sorted({s.batch for s in sw.grid})
  problems = batch_problems(batches, devices, sw.max_per_device_batch, base.bn_mode,
                            base.bn_group_size, int(base.grad_accum_steps))
  if problems:
    group = base.bn_group_size if base.bn_mode == 'ghost' else 1
    listing = '; '.join(f'{b}: {why}' for b, why in sorted(problems.items()))
    raise SweepError(
        f'These batch sizes do not fit {devices} device(s) x micro-batch x BN group: {listing}. '
        f'Global batches must be multiples of devices x bn_group_size = {devices * group} '
        f'(and, with accumulation, of devices x the micro-batch); ok here: '
        f'{[b for b in batches if b not in problems] or "none"}.')
  try:
    builder = pipeline.get_builder(base)
    meta = pipeline.dataset_meta(builder, base)
  except (FileNotFoundError, ValueError) as e:
    raise SweepError(f'The dataset {base.dataset!r} is not usable: {e}') from e
  plans, unfit = [], {}
  for spec in sw.grid:
    per_device = spec.batch // devices
    if sw.max_per_device_batch > 0:
      group = base.bn_group_size if base.bn_mode == 'ghost' else 1
      accum = choose_accum(per_device, sw.max_per_device_batch, group)
    else:
      accum = int(base.grad_accum_steps)
    config = make_run_config(base, spec, accum)
    try:
      setup = resolve_setup(config, meta.train_size, meta.eval_size, devices=devices)
    except ValueError as e:
      unfit[spec.batch] = str(e)
      continue
    if 'checkpoint_every_steps' not in sw.user_fields:
      config.checkpoint_every_steps = (setup.steps(sw.checkpoint_every_epochs, minimum=1)
                                       if sw.checkpoint_every_epochs > 0 else 0)
    if 'log_every_steps' not in sw.user_fields:
      # ~10 logs per epoch: enough B_simple samples in the second half of short runs.
      config.log_every_steps = max(1, min(int(base.log_every_steps),
                                          setup.steps(0.1, rounding='floor')))
    plans.append(Plan(spec, config, setup))
  if unfit:
    listing = '; '.join(f'{b}: {why}' for b, why in sorted(unfit.items()))
    raise SweepError(f'These batch sizes do not fit the dataset {meta.name} '
                     f'({meta.train_size} training examples): {listing}')
  for plan in plans:
    check_existing(os.path.join(sw.out, 'runs', plan.spec.name), plan.config)
  return plans, meta


def _flatten(d, prefix=''):
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


def check_existing(run_dir: str, config):
  """A run directory already trained with other settings is an error, not silently reused."""
  path = os.path.join(run_dir, 'config.json')
  if not os.path.exists(path):
    return
  with open(path) as f:
    old = _flatten(json.load(f))
  new = _flatten(json.loads(config.to_json_best_effort()))
  # A field added to the config after that run was trained counts as its default value there.
  from anp_jax.configs import default
  defaults = _flatten(json.loads(default.get_config().to_json_best_effort()))
  old.update({k: defaults[k] for k in new if k not in old and k in defaults})
  diff = {k: (old.get(k), new.get(k)) for k in set(old) | set(new)
          if k not in _NEUTRAL_FIELDS and old.get(k) != new.get(k)}
  if diff:
    detail = ', '.join(f'{k}: {a!r} there vs {b!r} now' for k, (a, b) in sorted(diff.items()))
    raise SweepError(f'{run_dir} was trained with other settings ({detail}). Use another --out, '
                     'or the settings of that sweep.')


def estimate_seconds(plans: Sequence[Plan], eval_size: int, images_per_s: float,
                     overhead_s: float) -> float:
  """Rough wall time: training images + evaluations (at 1/3 the cost) + per-run overhead."""
  total = 0.0
  for p in plans:
    s = p.setup
    evals = -(-s.total_steps // s.eval_every_steps)
    total += (s.total_steps * s.batch_size + evals * eval_size / 3) / images_per_s + overhead_s
  return total


# ----------------------------------------------------------------------------------------------
# Results.


def summarize_run(run_dir: str, target: float) -> Optional[Dict]:
  """One results row from a run directory's files (None if the sweep never started it)."""
  spec_path = os.path.join(run_dir, 'sweep_run.json')
  if not os.path.exists(spec_path):
    return None
  with open(spec_path) as f:
    info = json.load(f)
  final = None
  if os.path.exists(os.path.join(run_dir, 'final_metrics.json')):
    with open(os.path.join(run_dir, 'final_metrics.json')) as f:
      final = json.load(f)
  records = report.read_metrics(run_dir)
  evals = [r for r in records if 'eval/anp_top1' in r]
  total = info['total_steps']
  # Steps are interpolated between the evaluations around the crossing (see report.py).
  reached = report.target_crossing(evals, target)
  # Examples per pass; sweeps recorded before train_size was stored: steps_per_epoch * batch.
  train_size = info.get('train_size') or info['steps_per_epoch'] * info['batch']
  # The second half of what the run trained: with --stop_at_target that ends at the step the run
  # stopped at, not at the budget (a window after the budget's half would often be empty).
  last = max((r['step'] for r in records), default=total)
  b_simple = noise_scale.window_b_simple(records, start_step=last / 2, end_step=last)
  if final is None:
    status = 'incomplete'
  elif final.get('diverged'):
    status = 'diverged'
  else:
    status = 'finished'
  ok = status == 'finished'
  row = {k: info[k] for k in ('name', 'batch', 'rule', 'warmup', 'seed', 'lr_mult', 'base_lr',
                              'lr', 'warmup_epochs', 'epochs', 'devices', 'per_device_batch',
                              'accum_steps', 'steps_per_epoch', 'total_steps')}
  row.update(
      status=status,
      final_step=final.get('step') if final else (records[-1]['step'] if records else 0),
      final_top1=final.get('eval/anp_top1') if ok else None,
      final_top5=final.get('eval/anp_top5') if ok else None,
      final_adjective_top1=final.get('eval/adjective_top1') if ok else None,
      final_noun_top1=final.get('eval/noun_top1') if ok else None,
      best_top1=max((r['eval/anp_top1'] for r in evals), default=None),
      target_top1=target,
      steps_to_target=reached['step'] if reached else None,
      examples_to_target=reached['step'] * info['batch'] if reached else None,
      epochs_to_target=reached['step'] * info['batch'] / train_size if reached else None,
      eval_step_reaching_target=reached['eval_step'] if reached else None,
      wall_time_s=final.get('wall_time_s') if final else None,
      b_simple=b_simple,
      best_lr=True,
      error=final.get('error') if final else None)
  return row


def select_best_lr(rows: List[Dict]) -> List[Dict]:
  """Marks, per (batch, rule, warmup), the lr multiplier with the fewest mean steps to target.

  A multiplier competes on steps only if all its seeds finished and reached the target; if none
  does, the best mean final top-1 wins (Shallue et al.'s per-batch-size tuning).
  """
  groups = {}
  for r in rows:
    groups.setdefault((r['batch'], r['rule'], r['warmup']), []).append(r)
  for members in groups.values():
    by_mult = {}
    for r in members:
      by_mult.setdefault(r['lr_mult'], []).append(r)

    def score(mult):
      runs = by_mult[mult]
      if all(r['status'] == 'finished' for r in runs):
        if all(r['steps_to_target'] is not None for r in runs):
          return (0, sum(r['steps_to_target'] for r in runs) / len(runs), 0.0)
        return (1, 0.0, -sum(r['final_top1'] for r in runs) / len(runs))
      return (2, 0.0, 0.0)

    best = min(by_mult, key=score)
    if score(best)[0] == 2:
      best = None  # Nothing finished: no choice to make yet.
    for r in members:
      r['best_lr'] = r['lr_mult'] == best if best is not None else len(by_mult) == 1
  return rows


def collect_results(out: str, target: float) -> List[Dict]:
  runs_dir = os.path.join(out, 'runs')
  rows = []
  if os.path.isdir(runs_dir):
    for name in sorted(os.listdir(runs_dir)):
      row = summarize_run(os.path.join(runs_dir, name), target)
      if row is not None:
        rows.append(row)
  return select_best_lr(rows)


def _atomic_write(path: str, text: str):
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)


def write_results(out: str, rows: List[Dict]):
  import io
  buf = io.StringIO()
  writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction='ignore')
  writer.writeheader()
  for r in rows:
    writer.writerow({k: '' if r.get(k) is None else r[k] for k in CSV_COLUMNS})
  _atomic_write(os.path.join(out, 'results.csv'), buf.getvalue())
  _atomic_write(os.path.join(out, 'results.json'), json.dumps(rows, indent=2))


# ----------------------------------------------------------------------------------------------
# Running.


def _simulate_cpu_devices(n: int):
  """Asks XLA for n host devices; effective only before JAX's backends start (else ignored)."""
  flags = os.environ.get('XLA_FLAGS', '')
  if n > 0 and 'xla_force_host_platform_device_count' not in flags:
    os.environ['XLA_FLAGS'] = f'{flags} --xla_force_host_platform_device_count={n}'.strip()


def _run_one(plan: Plan, run_dir: str, index: int, count: int, is_main: bool):
  """Trains one grid point (or continues it); records divergence as a finished outcome."""
  from anp_jax import errors, optim, trainer
  spec, setup = plan.spec, plan.setup
  if is_main:
    os.makedirs(run_dir, exist_ok=True)
    info = {'name': spec.name, 'batch': spec.batch, 'rule': spec.rule,
            'warmup': 'on' if spec.warmup else 'off', 'seed': spec.seed,
            'lr_mult': spec.lr_mult, 'base_lr': float(plan.config.base_lr),
            'lr': float(optim.scaled_lr(plan.config)),
            'warmup_epochs': float(plan.config.warmup_epochs),
            'epochs': setup.total_steps * setup.batch_size / setup.train_size,
            'train_size': setup.train_size, 'devices': setup.devices,
            'per_device_batch': setup.per_device_batch, 'accum_steps': setup.accum_steps,
            'steps_per_epoch': setup.steps_per_epoch, 'total_steps': setup.total_steps,
            'eval_every_steps': setup.eval_every_steps}
    _atomic_write(os.path.join(run_dir, 'sweep_run.json'), json.dumps(info, indent=2))
  ckpt_dir = os.path.join(run_dir, 'checkpoints')
  resuming = os.path.isdir(ckpt_dir) and any(n.isdigit() for n in os.listdir(ckpt_dir))
  if is_main:
    print(f'[{index}/{count}] {spec.name}: {"resuming" if resuming else "training"} — '
          f'{setup.describe()}', flush=True)
  try:
    result = trainer.train_and_evaluate(plan.config, run_dir)
  except errors.NonFiniteLossError as e:
    if is_main:
      step = max((r['step'] for r in report.read_metrics(run_dir)), default=0)
      _atomic_write(os.path.join(run_dir, 'final_metrics.json'),
                    json.dumps({'diverged': True, 'step': step, 'error': str(e)}, indent=2))
      print(f'[{index}/{count}] {spec.name}: diverged ({e})', flush=True)
    return
  except errors.Preempted:
    if is_main:
      print(f'[{index}/{count}] {spec.name}: preempted; rerun the same command to continue.',
            flush=True)
    raise
  if is_main:
    fe = result.final_eval
    print(f'[{index}/{count}] {spec.name}: done in {result.wall_time_s:.0f} s, ANP top-1 '
          f'{100 * fe["eval/anp_top1"]:.2f} %', flush=True)


def sweep(argv: Sequence[str]) -> List[Dict]:
  """Runs (or continues) the sweep of `argv`; returns the results rows. Raises SweepError."""
  args, overrides = parse_args(argv)
  preset = PRESETS[args.preset]
  _simulate_cpu_devices(preset.cpu_devices if args.cpu_devices is None else args.cpu_devices)
  from anp_jax import distributed
  distributed.initialize()  # Multi-process jobs (SLURM / ANP_* variables); no-op otherwise.
  import jax
  from anp_jax import preemption
  preemption.install()  # From here on, SIGTERM/SIGUSR1 mean "checkpoint and exit 75".
  sw = resolve(args, overrides)
  from anp_jax import optim
  plans, meta = plan_runs(sw)
  is_main = jax.process_index() == 0
  out = sw.out
  names = [p.spec.name for p in plans]
  done = [n for n in names if os.path.exists(os.path.join(out, 'runs', n, 'final_metrics.json'))]
  if is_main:
    todo = [p for p in plans if p.spec.name not in done]
    ips = preset.images_per_s or PAPER_IMAGES_PER_S_PER_DEVICE * jax.device_count()
    eta = estimate_seconds(todo, meta.eval_size, ips, preset.overhead_s)
    print(f'Sweep {out}: {len(plans)} runs ({len(done)} finished earlier), '
          f'{jax.device_count()} device(s), target top-1 {sw.target_top1:g}; '
          f'estimated {eta / 60:.0f} min for the rest at ~{ips:.0f} img/s.', flush=True)
    for p in plans:
      s = p.setup
      print(f'  {p.spec.name}: lr {optim.scaled_lr(p.config):.4g}, {s.total_steps} '
            f'steps ({s.steps_per_epoch}/epoch), {s.per_device_batch}/device'
            + (f' = {s.accum_steps} x {s.per_device_micro_batch}' if s.accum_steps > 1 else '')
            + (' [finished]' if p.spec.name in done else ''), flush=True)
  if args.dry_run:
    return []
  if is_main:
    os.makedirs(out, exist_ok=True)
    _record_invocation(out, args, overrides, sw, jax.device_count())
  for i, plan in enumerate(plans, 1):
    run_dir = os.path.join(out, 'runs', plan.spec.name)
    if plan.spec.name in done:
      if is_main:
        print(f'[{i}/{len(plans)}] {plan.spec.name}: finished earlier, skipped.', flush=True)
      continue
    # A signal that came after the previous run's last step check (its final evaluation, its
    # plots, this loop) is still pending: stop before starting another run.
    preemption.exit_if_requested(f'[{i}/{len(plans)}] {plan.spec.name}')
    _run_one(plan, run_dir, i, len(plans), is_main)
  rows = []
  if is_main:
    rows = collect_results(out, sw.target_top1)
    write_results(out, rows)
    print(f'Results: {os.path.join(out, "results.csv")} ({len(rows)} runs)', flush=True)
    if not args.no_report:
      print(f'Report: {report.make_report(out)}', flush=True)
  return rows


def _record_invocation(out, args, overrides, sw: Sweep, devices: int):
  """DIR/sweep.json: the settings of the sweep (for the report) and every invocation."""
  path = os.path.join(out, 'sweep.json')
  record = {}
  if os.path.exists(path):
    with open(path) as f:
      record = json.load(f)
  base = sw.base
  record.update(preset=sw.preset, devices=devices, epochs=base.num_epochs,
                model=f'{base.model.name} width {base.model.width}', image_size=base.image_size,
                dataset=base.dataset, target_top1=sw.target_top1)
  record.setdefault('invocations', []).append(
      {'time': time.time(), 'args': vars(args),
       'overrides': [f'--config.{k}={v}' for k, v in overrides]})
  _atomic_write(path, json.dumps(record, indent=2, default=str))


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  try:
    sweep(argv)
  except SweepError as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return 2
  return 0


if __name__ == '__main__':
  runtime.configure()
  sys.exit(main())
