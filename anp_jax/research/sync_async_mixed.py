"""Synchronous vs simulated asynchronous and mixed-asynchronous vs local SGD, each arm at its own
best learning rate.

The logic of ``experiments/sync_async_mixed.py`` (its docstring documents the command). Arms:

* ``sync``: synchronous SGD (``config.method='sync'``).
* ``async-N[-aware]``: simulated asynchronous SGD with the staleness of N workers from the event
  simulation (`anp_jax.research.perfmodel.staleness_sampler`, mean N - 1, step-time CV 0.1),
  history ``max_tau = 2N``; ``-aware`` divides each step by max(tau, 1) (Zhang et al. 2016).
* ``mixed-nNN[-aware]``: the seed paper's mixed-asynchronous SGD on the synchronous arm's cluster
  (``sync_devices`` devices) split into N workers of ``sync_devices / N`` devices, synchronous
  inside a worker and asynchronous across workers: trained as ``async-N`` is (one step's batch
  plays one worker's mini-batch, the staleness of N workers, mean N - 1), predicted with
  ``perfmodel.predict(method='mixed')`` on N nodes of ``sync_devices / N`` devices.
* ``local-nK-hH``: local SGD over K nodes, parameters and BN statistics averaged every H steps.

**Per-arm learning rate** (Shallue et al. 2018 tune it per batch size; here per arm, since
staleness and infrequent averaging change the best step size): every arm is trained at each
multiplier m of ``--lr_grid`` times the preset's ``base_lr`` (run ``<arm>-lrx<m>``, or just
``<arm>`` for m = 1, the name of earlier single-lr results). The chosen multiplier of an arm is
`sweep.select_best_lr`'s: the fewest examples to ``--target_top1`` (the interpolated first
crossing, `sweep.target_crossing`; every run of an arm has the same examples per update, so
fewest steps is fewest examples); if no multiplier of the arm reaches the target, the best final
top-1; a diverged (NaN/Inf) grid point is never chosen. ``results.json`` has one record per arm
at its chosen rate (the grid's rates and outcomes in ``lr_grid``), ``grid.json`` every grid
point.

**Adaptive grid**: a chosen multiplier at the edge of its arm's grid (the lowest or the highest
tried) says the best rate may lie beyond it; with ``--lr_extensions E`` (preset
``lr_extensions``) such an arm also runs at half the lowest (or twice the highest) multiplier, and
again after that, at most E times per arm. An arm whose every grid point diverged is extended
downwards. The summary marks an arm still at the edge after its extensions.

Predicted wall time: each arm is mapped to the seed paper's cluster (`perfmodel.minotauro`)
training ResNet-50 on the MUSA2 ANP training split; `predicted_epoch` gives its epoch time.
"""

import dataclasses
import json
import os
import sys
from typing import Dict, List, Optional, Sequence

import jax
import ml_collections
from absl import flags

from anp_jax import cli, distributed, metrics_io, optim, plotting, preemption, reporting
from anp_jax.setup import resolve_setup, validate_config
from anp_jax.research import perfmodel as pm
from anp_jax.research import sweep

ANP_TRAIN_IMAGES = pm.MUSA2_TRAIN_IMAGES  # MUSA2's published training split (docs/references.md).
PAPER_PER_DEVICE_BATCH = 32
PREFIX = 'sync_async_mixed'  # Presets: anp_jax/configs/sync_async_mixed_<name>.py.
DEVICES_PER_NODE = 4  # MinoTauro: 4 K80 devices per node.


class ExperimentError(sweep.SweepError):
  """Bad input, reported before any training (exit 2)."""


@dataclasses.dataclass(frozen=True)
class Preset:
  """A preset file's get_sweep(): the arms, the lr grid, the target and the estimate's speed."""
  workers: Sequence[int]
  nodes: Sequence[int]
  sync_every: Sequence[int]
  aware: Sequence[bool]
  cpu_devices: int
  lr_grid: Sequence[float] = (1.0,)
  mixed: Sequence[int] = ()  # Mixed-asynchronous worker counts N (sync_devices / N devices each).
  mixed_aware: Sequence[bool] = (False,)
  lr_extensions: int = 0  # Factor-2 steps beyond the grid's edge per arm (see the docstring).
  target_top1: float = 0.25
  images_per_s: float = 400.0
  overhead_s: float = 20.0


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One arm: a method and its parameters."""
  method: str  # 'sync', 'async', 'mixed', 'local_sgd'
  workers: int = 0
  aware: bool = False
  nodes: int = 0
  sync_every: int = 1

  @property
  def name(self) -> str:
    if self.method == 'sync':
      return 'sync'
    if self.method == 'async':
      return f'async-{self.workers:02d}' + ('-aware' if self.aware else '')
    if self.method == 'mixed':
      return f'mixed-n{self.workers:02d}' + ('-aware' if self.aware else '')
    return f'local-n{self.nodes}-h{self.sync_every:02d}'

  def devices(self, sync_devices: int) -> int:
    """Devices of the predicted cluster: what "the same cluster size" compares."""
    if self.method in ('sync', 'mixed'):  # Mixed: the sync cluster split into workers.
      return sync_devices
    if self.method == 'async':
      return self.workers
    return self.nodes * DEVICES_PER_NODE


@dataclasses.dataclass(frozen=True)
class GridPoint:
  """An arm at one learning-rate multiplier."""
  arm: RunSpec
  lr_mult: float = 1.0

  @property
  def name(self) -> str:
    return self.arm.name if self.lr_mult == 1 else f'{self.arm.name}-lrx{self.lr_mult:g}'


def grid(workers, aware, nodes, sync_every, mixed=(), mixed_aware=(False,)) -> List[RunSpec]:
  runs = [RunSpec('sync')]
  runs += [RunSpec('async', workers=n, aware=a) for n in workers for a in aware]
  runs += [RunSpec('mixed', workers=n, aware=a) for n in mixed for a in mixed_aware]
  runs += [RunSpec('local_sgd', nodes=k, sync_every=h) for k in nodes for h in sync_every]
  return runs


def run_config(base, spec: RunSpec, lr_mult: float = 1.0) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(base.to_dict())
  c.method = spec.method
  c.base_lr = float(base.base_lr) * lr_mult
  if spec.method in ('async', 'mixed'):  # Mixed: N asynchronous workers, each a synchronous group.
    c.method = 'async'
    c.async_sgd.staleness = 'simulated'
    c.async_sgd.workers = spec.workers
    c.async_sgd.max_tau = 2 * spec.workers
    c.async_sgd.staleness_aware_lr = spec.aware
  elif spec.method == 'local_sgd':
    c.local_sgd.nodes = spec.nodes
    c.local_sgd.sync_every = spec.sync_every
  return c


def mixed_worker_devices(workers: int, sync_devices: int) -> int:
  """Devices of one mixed-asynchronous worker: the sync cluster split evenly (ExperimentError if
  it does not split, or a worker would not fit one MinoTauro node)."""
  if workers < 1 or sync_devices % workers or sync_devices // workers > DEVICES_PER_NODE:
    raise ExperimentError(
        f'--mixed {workers}: a mixed worker is one node of --sync_devices / N devices; N must '
        f'divide {sync_devices} and leave at most {DEVICES_PER_NODE} devices per worker (a '
        f'MinoTauro node), e.g. N = {max(1, -(-sync_devices // DEVICES_PER_NODE))} … '
        f'{sync_devices}.')
  return sync_devices // workers


def predict_arm(spec: RunSpec, sync_devices: int) -> pm.Prediction:
  """`perfmodel.predict` of an arm on MinoTauro for ResNet-50 on the ANP split."""
  workload = pm.resnet50(dataset_size=ANP_TRAIN_IMAGES)
  b = PAPER_PER_DEVICE_BATCH

  def cluster(devices):
    nodes = max(1, devices // DEVICES_PER_NODE)
    return pm.minotauro(nodes=nodes, devices_per_node=min(DEVICES_PER_NODE, devices))

  if spec.method == 'sync':
    return pm.predict(cluster(sync_devices), workload, b, method='sync')
  if spec.method == 'async':
    return pm.predict(cluster(spec.workers), workload, b, method='async')
  if spec.method == 'mixed':  # One worker = one node of sync_devices / N devices.
    d = mixed_worker_devices(spec.workers, sync_devices)
    return pm.predict(pm.minotauro(nodes=spec.workers, devices_per_node=d), workload, b,
                      method='mixed')
  return pm.predict(pm.minotauro(nodes=spec.nodes, devices_per_node=DEVICES_PER_NODE), workload,
                    b, method='mixed', mixed_mode='local_sgd', local_steps=spec.sync_every)


def predicted_epoch(spec: RunSpec, sync_devices: int):
  """(seconds per epoch, cluster description) on MinoTauro for ResNet-50 on the ANP split."""
  p = predict_arm(spec, sync_devices)
  return p.epoch_time, f'{p.nodes}x{p.devices_per_node} K80, {p.description}'


# ----------------------------------------------------------------------------------------------
# Command line.


def define_flags(fv):
  def define(kind, name, default, help_string):
    getattr(flags, f'DEFINE_{kind}')(name, default, help_string, flag_values=fv)
  define('string', 'out', None, 'Experiment directory (runs/, results.json, summary.md). Required.')
  define('float', 'epochs', None, 'Training epochs of every run (= --config.num_epochs).')
  define('list', 'workers', None, 'Asynchronous worker counts N.')
  define('list', 'nodes', None, 'Local-SGD node counts.')
  define('list', 'sync_every', None, 'Local-SGD averaging periods H.')
  define('list', 'mixed', None, 'Mixed-asynchronous worker counts N (the sync cluster split into '
         'N workers of sync_devices / N devices).')
  flags.DEFINE_enum('aware', None, ['both', 'on', 'off'],
                    'Staleness-aware lr arms of the async and mixed runs.', flag_values=fv)
  define('integer', 'sync_devices', 16, 'Devices of the predicted synchronous cluster.')
  define('integer', 'cpu_devices', None, 'Simulated CPU devices (XLA flag); 0: none.')
  define('list', 'lr_grid', None, 'Multipliers of base_lr tried per arm (best one reported).')
  define('integer', 'lr_extensions', None, 'Most factor-2 steps an arm whose best multiplier is '
         'at the edge of its grid is extended by (0: none).')
  define('float', 'target_top1', None, 'ANP top-1 fraction: the lr choice is the fewest examples '
         'to it.')
  define('bool', 'dry_run', False, 'Validate, print the grid and the time estimate; train nothing.')


@dataclasses.dataclass
class Experiment:
  """Resolved settings: the base config, the grid, the target and the paths."""
  preset: Preset
  base: ml_collections.ConfigDict
  arms: List[RunSpec]
  lr_grid: List[float]
  target_top1: float
  sync_devices: int
  out: str
  dry_run: bool
  cpu_devices: int
  lr_extensions: int = 0
  # Config fields set with --config (the runner's checkpoint and log cadences give way to them).
  user_fields: frozenset = frozenset()
  # Multipliers added beyond the grid's edge, per arm name, in the order they were added.
  extended: Dict[str, List[float]] = dataclasses.field(default_factory=dict)

  @property
  def points(self) -> List[GridPoint]:
    return [GridPoint(arm, m) for arm in self.arms
            for m in list(self.lr_grid) + self.extended.get(arm.name, [])]


def resolve(argv: Sequence[str], doc: str = __doc__) -> Optional[Experiment]:
  """The experiment of `argv`; ExperimentError on bad input (touches no device)."""
  parsed = sweep.parse_command_line(argv, PREFIX, define_flags, doc)
  if parsed is None:
    return None
  fv, config, overrides = parsed
  preset = Preset(**sweep.load_preset(PREFIX, fv.preset)[1])
  if fv.out is None:
    raise ExperimentError('--out is required: the experiment directory.')
  base = ml_collections.ConfigDict(config.to_dict())
  keys = [k for k, _ in overrides]
  for key in keys:
    if key.split('.')[0] in ('method', 'async_sgd', 'local_sgd', 'batch_size'):
      raise ExperimentError(f'--config.{key} is set per run by the experiment; use its flags.')
  if fv.epochs is not None and 'num_epochs' not in keys:  # An explicit override wins.
    base.num_epochs = fv.epochs
  if not base.num_epochs > 0:
    raise ExperimentError(f'--epochs must be > 0, got {base.num_epochs}.')
  given = lambda name: sweep.list_flag(fv, name, int)
  workers = preset.workers if given('workers') is None else given('workers')
  nodes = preset.nodes if given('nodes') is None else given('nodes')
  every = preset.sync_every if given('sync_every') is None else given('sync_every')
  mixed = preset.mixed if given('mixed') is None else given('mixed')
  choice = None if fv.aware is None else {
      'both': (False, True), 'on': (True,), 'off': (False,)}[fv.aware]
  aware = preset.aware if choice is None else choice
  mixed_aware = preset.mixed_aware if choice is None else choice
  if (any(n < 1 for n in workers) or any(k < 1 for k in nodes) or any(h < 1 for h in every)
      or any(n < 1 for n in mixed)):
    raise ExperimentError(f'--workers, --nodes, --sync_every and --mixed must be >= 1, got '
                          f'{workers}, {nodes}, {every}, {mixed}.')
  if fv.sync_devices < 1:
    raise ExperimentError(f'--sync_devices must be >= 1, got {fv.sync_devices}.')
  for n in mixed:
    mixed_worker_devices(n, fv.sync_devices)
  extensions = preset.lr_extensions if fv.lr_extensions is None else fv.lr_extensions
  if extensions < 0:
    raise ExperimentError(f'--lr_extensions must be >= 0, got {extensions}.')
  mults = sweep.list_flag(fv, 'lr_grid', float)
  mults = list(dict.fromkeys(preset.lr_grid if mults is None else mults))
  if not mults or any(not m > 0 for m in mults):
    raise ExperimentError(f'--lr_grid needs multipliers > 0, got {mults}.')
  target = preset.target_top1 if fv.target_top1 is None else fv.target_top1
  if not 0.0 < target <= 1.0:
    raise ExperimentError(f'--target_top1={target} is an unreachable target: top-1 accuracy is '
                          'a fraction in (0, 1] (e.g. 0.25 for 25 %).')
  if not (fv.out or '').strip():  # '' would be the current directory.
    raise ExperimentError('--out is empty: give the directory for the runs and results.')
  return Experiment(preset=preset, base=base,
                    arms=grid(workers, aware, nodes, every, mixed, mixed_aware),
                    lr_grid=mults, target_top1=float(target), sync_devices=fv.sync_devices,
                    out=os.path.abspath(os.path.expanduser(fv.out)), dry_run=fv.dry_run,
                    cpu_devices=preset.cpu_devices if fv.cpu_devices is None else fv.cpu_devices,
                    lr_extensions=int(extensions), user_fields=frozenset(keys))


def plan_runs(ex: Experiment, devices: int):
  """(grid runs, dataset meta): every grid point's config and setup, checked before training."""
  sweep.claim_out_dir(ex.out, 'sync_async_mixed', write=False)
  meta = sweep.dataset_meta(ex.base)
  runs = []
  for point in ex.points:
    config = run_config(ex.base, point.arm, point.lr_mult)
    try:
      validate_config(config)
      setup = resolve_setup(config, meta.train_size, meta.eval_size, devices=devices)
    except ValueError as e:
      raise ExperimentError(f'Run {point.name}: {e}') from None
    # Defaults of the cadences, not requirements: results are read from the evaluations and
    # final metrics, whatever was logged or checkpointed, so an explicit --config value wins
    # (as in the batch-size sweep). Unset: a checkpoint per epoch (a killed run loses at most
    # an epoch) and at least 4 training-log records per epoch.
    sweep.default_cadences(config, setup, ex.user_fields, checkpoint_epochs=1.0,
                           log_epochs=0.25, log_cap=int(config.log_every_steps))
    sweep.check_existing(os.path.join(ex.out, 'runs', point.name), config)
    runs.append(sweep.GridRun(point.name, config, setup))
  return runs, meta


# ----------------------------------------------------------------------------------------------
# Results.


def summarize(out: str, point: GridPoint, config, setup, sync_devices: int,
              target: float) -> Optional[Dict]:
  """One grid point's record (None while it has not finished)."""
  run_dir = os.path.join(out, 'runs', point.name)
  if not sweep.is_finished(run_dir):
    return None
  with open(os.path.join(run_dir, 'final_metrics.json')) as f:
    final = json.load(f)
  spec = point.arm
  evals = [r for r in metrics_io.read_metrics(run_dir) if 'eval/anp_top1' in r]
  epoch_s, cluster = predicted_epoch(spec, sync_devices)
  curve = [{'epoch': r['step'] / setup.steps_per_epoch, 'top1': r['eval/anp_top1'],
            'loss': r['eval/loss'], 'hours': r['step'] / setup.steps_per_epoch * epoch_s / 3600}
           for r in evals]
  diverged = bool(final.get('diverged'))
  reached = None if diverged else sweep.target_crossing(evals, target)
  steps = reached['step'] if reached else None
  return {'name': spec.name, **dataclasses.asdict(spec), 'batch': setup.batch_size,
          'steps': setup.total_steps, 'epochs': setup.total_steps / setup.steps_per_epoch,
          'final_top1': None if diverged else final.get('eval/anp_top1'),
          'final_loss': None if diverged else final.get('eval/loss'),
          'best_top1': max((c['top1'] for c in curve), default=None),
          'diverged': diverged, 'wall_time_s': final.get('wall_time_s'),
          'predicted_epoch_s': epoch_s, 'predicted_cluster': cluster, 'curve': curve,
          # The learning-rate grid (added with it; the keys above are the earlier format).
          'run': point.name, 'arm': spec.name, 'lr_mult': point.lr_mult,
          'base_lr': float(config.base_lr), 'lr': float(optim.scaled_lr(config)),
          'devices': spec.devices(sync_devices),
          'status': 'diverged' if diverged else 'finished', 'error': final.get('error'),
          'target_top1': target, 'steps_to_target': steps,
          'examples_to_target': steps * setup.batch_size if reached else None,
          'epochs_to_target': steps * setup.batch_size / setup.train_size if reached else None}


def choose(records: List[Dict]) -> List[Dict]:
  """Per arm, the record at its chosen rate, with the whole grid under ``lr_grid``."""
  sweep.select_best_lr(records, key=lambda r: r['arm'])
  chosen = []
  for arm in dict.fromkeys(r['arm'] for r in records):
    members = [r for r in records if r['arm'] == arm]
    best = next((r for r in members if r['best_lr'] and r['status'] == 'finished'), None)
    chosen_ok = best is not None
    if best is None:  # Every grid point diverged: report the arm as diverged.
      best = members[0]
    grid_cells = [{k: r[k] for k in ('run', 'lr_mult', 'lr', 'status', 'final_top1',
                                     'best_top1', 'steps_to_target', 'examples_to_target')}
                  for r in sorted(members, key=lambda r: r['lr_mult'])]
    mults = sorted(r['lr_mult'] for r in members)
    edge = None  # The best rate may lie beyond the grid: below its lowest or above its highest.
    if not chosen_ok:
      edge = 'low'  # Every point diverged: smaller rates are the way on.
    elif len(mults) > 1 and best['lr_mult'] in (mults[0], mults[-1]):
      edge = 'low' if best['lr_mult'] == mults[0] else 'high'
    chosen.append({**best, 'lr_grid': grid_cells, 'lr_chosen': chosen_ok, 'lr_edge': edge})
  return chosen


def extensions(rows: List[Dict], base_grid: Sequence[float], limit: int) -> Dict[str, float]:
  """Per arm at the edge of its grid, the next multiplier to try (a factor 2 beyond the edge).

  ``rows`` are `choose`'s; an arm already extended ``limit`` times beyond ``base_grid`` (its
  multipliers outside [min, max] of the base grid) gets none: the report says it is still at
  the edge.
  """
  lo, hi = min(base_grid), max(base_grid)
  out = {}
  for r in rows:
    mults = [g['lr_mult'] for g in r['lr_grid']]
    done = sum(1 for m in mults if m < lo or m > hi)
    if r['lr_edge'] is None or done >= limit:
      continue
    out[r['arm']] = min(mults) / 2 if r['lr_edge'] == 'low' else max(mults) * 2
  return out


def plot(rows, out: str):
  plt = plotting.pyplot()
  paths = []
  for key, xlabel, fname in (('epoch', 'epochs', 'accuracy_vs_epochs.png'),
                             ('hours', 'predicted wall time on MinoTauro (h, ResNet-50)',
                              'accuracy_vs_time.png')):
    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    for r in rows:
      style = {'sync': '-', 'async': '--', 'mixed': '-.'}.get(r['method'], ':')
      ax.plot([c[key] for c in r['curve']], [100 * c['top1'] for c in r['curve']], style,
              marker='o', markersize=3, label=f'{r["name"]} (lr {r["lr"]:.3g})')
    ax.set_xlabel(xlabel)
    ax.set_ylabel('eval ANP top-1 (%)')
    if key == 'hours':
      ax.set_xscale('log')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    paths.append(plotting.save_figure(fig, os.path.join(out, fname)))
  return paths


def _pct(x) -> str:
  return '—' if x is None else f'{100 * x:.2f} %'


def _examples(x) -> str:
  return 'not reached' if x is None else f'{x:,.0f}'


def write_summary(rows, out: str, ex: Experiment) -> str:
  base, sync_devices = ex.base, ex.sync_devices
  grid_text = ', '.join(f'{m:g}' for m in ex.lr_grid)
  sizes = sorted({r['devices'] for r in rows})
  lines = ['# Sync vs simulated async and mixed-asynchronous vs local SGD', '',
           f'Proxy: {base.model.name} width {base.model.width}, {base.image_size} px generated '
           f'ANP data, {rows[0]["batch"] if rows else "?"} examples per update, '
           f'{base.num_epochs:g} epochs, {base.optimizer}, base lr {base.base_lr:g} per '
           f'{base.base_batch_size} ({base.lr_scaling}), {base.schedule} schedule.',
           f'Predicted time: ResNet-50 on {ANP_TRAIN_IMAGES:,} ANP training images, '
           f'{PAPER_PER_DEVICE_BATCH} images per K80 device/worker on MinoTauro; sync on '
           f'{sync_devices} devices. The accuracy curves come from the proxy, the times from '
           '`anp_jax.research.perfmodel` (see the script docstring).',
           ('Cluster size: every arm on ' + f'{sizes[0]} devices.' if len(sizes) == 1 else
            'Cluster sizes differ between arms (' + ', '.join(
                f'{r["name"]}: {r["devices"]}' for r in rows) + ' devices): compare with care.'),
           '',
           f'Learning rate per arm: base lr x {{{grid_text}}}; chosen = the fewest examples to '
           f'{100 * ex.target_top1:g} % ANP top-1 (interpolated first crossing), else the best '
           'final top-1; diverged grid points are never chosen. '
           + (f'An arm whose chosen multiplier was the lowest (highest) of its grid also ran at '
              f'half (twice) that, at most {ex.lr_extensions} time(s).'
              if ex.lr_extensions else ''), '',
           '| run | final top-1 | best top-1 | predicted epoch | time for the run | cluster | '
           'chosen lr | lr grid | examples to target |',
           '|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    top1 = 'diverged' if r['diverged'] else _pct(r['final_top1'])
    best = '' if r['best_top1'] is None else _pct(r['best_top1'])
    cells = []
    for g in r['lr_grid']:
      outcome = ('diverged' if g['status'] == 'diverged' else
                 f'{_pct(g["final_top1"])}, {_examples(g["examples_to_target"])}')
      cells.append(f'x{g["lr_mult"]:g}: {outcome}')
    chosen = f'{r["lr"]:.4g} (x{r["lr_mult"]:g})' if r['lr_chosen'] else 'none (all diverged)'
    if r['lr_chosen'] and r['lr_edge']:
      chosen += ', edge of the grid'  # The best rate may lie beyond it: widen the grid.
    lines.append(f'| {r["name"]} | {top1} | {best} | {r["predicted_epoch_s"] / 60:.1f} min | '
                 f'{r["epochs"] * r["predicted_epoch_s"] / 3600:.2f} h | '
                 f'{r["predicted_cluster"]} | {chosen} | {"; ".join(cells)} | '
                 f'{_examples(r["examples_to_target"])} |')
  missed = [r['name'] for r in rows if r['examples_to_target'] is None]
  if missed:
    lines += ['', f'Did not reach {100 * ex.target_top1:g} % ANP top-1 at any learning rate of '
              f'the grid: {", ".join(missed)}.']
  edge = [f'{r["name"]} (all diverged)' if not r['lr_chosen'] else
          f'{r["name"]} ({"lowest" if r["lr_edge"] == "low" else "highest"}, x{r["lr_mult"]:g})'
          for r in rows if r['lr_edge']]
  if edge:
    lines += ['', (f'Best rate still at the edge of its grid after at most {ex.lr_extensions} '
                   'factor-2 extension(s) per arm' if ex.lr_extensions else
                   'Best rate at the edge of its grid (`--lr_extensions` widens it)')
              + f' (the optimum may lie beyond): {", ".join(edge)}.']
  elif rows and all(len(r['lr_grid']) > 1 for r in rows):
    lines += ['', 'Every arm\'s chosen rate is interior to its grid (a neighbour on each side was '
              'tried and did worse or diverged).']
  lines += ['', '![accuracy vs epochs](accuracy_vs_epochs.png)',
            '![accuracy vs predicted time](accuracy_vs_time.png)', '']
  path = os.path.join(out, 'summary.md')
  sweep.write_text_atomic(path, '\n'.join(lines))
  return path


def collect(ex: Experiment, runs: Sequence[sweep.GridRun]):
  """(every finished grid point's record, one record per arm at its chosen rate)."""
  records = []
  for point, run in zip(ex.points, runs):
    r = summarize(ex.out, point, run.config, run.setup, ex.sync_devices, ex.target_top1)
    if r is not None:
      records.append(r)
  return records, choose([dict(r) for r in records])


def pending_extensions(ex: Experiment, runs: Sequence[sweep.GridRun]) -> Dict[str, float]:
  """`extensions` of the arms whose planned grid points have all finished (for --dry_run)."""
  unfinished = {p.arm.name for p, r in zip(ex.points, runs)
                if not sweep.is_finished(os.path.join(ex.out, 'runs', r.name))}
  _, rows = collect(ex, runs)
  return extensions([r for r in rows if r['arm'] not in unfinished], ex.lr_grid,
                    ex.lr_extensions)


# ----------------------------------------------------------------------------------------------
# The command.


def main(argv: Sequence[str], doc: str = __doc__) -> int:
  """Runs (or continues) the experiment of `argv`; 2 on bad input, 75 when preempted."""
  preemption.install()  # From here on, SIGTERM/SIGUSR1 mean "checkpoint and exit 75".
  try:
    ex = resolve(argv, doc)
    if ex is None:
      return 0
    sweep.simulate_cpu_devices(ex.cpu_devices)
    distributed.initialize()
    runs, meta = plan_runs(ex, jax.device_count())
  except sweep.SweepError as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  is_main = jax.process_index() == 0
  if is_main:
    todo = [r for r in runs if not sweep.is_finished(os.path.join(ex.out, 'runs', r.name))]
    eta = sweep.estimate_seconds(todo, meta.eval_size, ex.preset.images_per_s,
                                 ex.preset.overhead_s)
    print(f'{ex.out}: {len(runs)} runs ({len(runs) - len(todo)} finished earlier), '
          f'{len(ex.arms)} arms x lr multipliers {ex.lr_grid}, {jax.device_count()} device(s), '
          f'target top-1 {ex.target_top1:g}; estimated {eta / 60:.0f} min for the rest at '
          f'~{ex.preset.images_per_s:.0f} img/s.', flush=True)
    if ex.lr_extensions:
      print(f'Arms whose best rate is at the edge of their grid run again at half (twice) it, '
            f'at most {ex.lr_extensions} time(s) each: up to '
            f'{ex.lr_extensions * len(ex.arms)} more runs.', flush=True)
  if ex.dry_run:
    if is_main and ex.lr_extensions:
      more = pending_extensions(ex, runs)
      if more:
        print('From the finished runs, the first extension: ' + ', '.join(
            f'{arm} x{mult:g}' for arm, mult in more.items()) + '.', flush=True)
    return 0
  if is_main:
    sweep.claim_out_dir(ex.out, 'sync_async_mixed', write=True)
  try:
    todo = runs
    for round_ in range(ex.lr_extensions + 1):
      sweep.run_grid(todo, ex.out, is_main)
      # Every process decides the next round from the same files (written by process 0).
      distributed.barrier(f'sync_async_mixed_round_{round_}')
      records, rows = collect(ex, runs)
      if is_main:
        write_results(ex, records, rows)
      more = extensions(rows, ex.lr_grid, ex.lr_extensions)
      if not more:
        break
      for arm, mult in more.items():
        ex.extended.setdefault(arm, []).append(mult)
      if is_main:
        print('Best rate at the edge of its grid; extending: ' + ', '.join(
            f'{arm} x{mult:g}' for arm, mult in more.items()), flush=True)
      planned, _ = plan_runs(ex, jax.device_count())
      known = {r.name for r in runs}
      todo, runs = [r for r in planned if r.name not in known], planned
  except sweep.SweepError as e:  # A directory of an extension trained with other settings.
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return cli.EXIT_USAGE
  return 0


def write_results(ex: Experiment, records: List[Dict], rows: List[Dict]):
  """grid.json, results.json, the plots and summary.md (`collect`'s records and rows)."""
  reporting.write_json_atomic(os.path.join(ex.out, 'grid.json'), records)
  reporting.write_json_atomic(os.path.join(ex.out, 'results.json'), rows)
  plot(rows, ex.out)
  print(f'Summary: {write_summary(rows, ex.out, ex)}', flush=True)
