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

A study on the runner (`anp_jax.research.runner`): an arm is a point (its config fields:
`RunSpec.fields`), trained at every seed (``--seeds``) and every multiplier m of ``--lr_grid``
times the preset's ``base_lr`` (run ``<arm>[-lrx<m>][-s<seed>]``: ``-lrx1`` and ``-s0`` left
out, the names of the first single-rate, single-seed results).

**Per-arm learning rate** (Shallue et al. 2018 tune it per batch size; here per arm, since
staleness and infrequent averaging change the best step size): the runner's choice on the
validation split (`study_results.choose_rates`): a rate with a diverged seed is never chosen;
the fewest mean examples to ``--target_top1`` over seeds that all reached it (every run of an arm
has the same examples per update, so fewest steps is fewest examples); else the best mean final
top-1. A choice at the edge of the rates tried extends the grid x2 beyond it, at most
``--lr_extensions`` times per arm (an arm whose every rate had a diverged seed downwards); the
summary marks an arm still at the edge. ``results.json`` has one record per arm at its chosen
rate (its first seed's curve, the statistics over seeds under ``statistics``, the grid's runs
under ``lr_grid``), ``grid.json`` every run, ``points.json`` / ``points.csv`` the statistics per
arm over seeds.

Predicted wall time: each arm is mapped to the seed paper's cluster (`perfmodel.minotauro`)
training ResNet-50 on the MUSA2 ANP training split; `predicted_epoch` gives its epoch time.
"""

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

import ml_collections
from absl import flags

from anp_jax import cli, metrics_io, plotting, reporting
from anp_jax.research import perfmodel as pm
from anp_jax.research import registration, runner, stats, study_cli, study_results
from anp_jax.research.study import LrGrid, Study, StudyError

ANP_TRAIN_IMAGES = pm.MUSA2_TRAIN_IMAGES  # MUSA2's published training split (docs/references.md).
PAPER_PER_DEVICE_BATCH = 32
PREFIX = 'sync_async_mixed'  # Presets: anp_jax/configs/sync_async_mixed_<name>.py.
DEVICES_PER_NODE = 4  # MinoTauro: 4 K80 devices per node.


ExperimentError = StudyError  # Bad input, reported before any training (exit 2).


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
  seeds: Sequence[int] = (0,)
  target_top1: float = 0.25
  images_per_s: float = 400.0
  overhead_s: float = 20.0
  # Momentum of the async arms: plain, and/or compensated for asynchrony's implicit momentum.
  compensate: Sequence[bool] = (False,)
  # Images per device of the mapped cluster: > 0 trains every arm with the examples per update
  # it has there (`RunSpec.batch`), 0 every arm at config.batch_size (an unmapped proxy).
  device_batch: int = 0
  sync_devices: int = 16
  # Arms that need other simulated devices than the rest (local SGD over K nodes needs K | the
  # devices, set before JAX starts): the parts one command runs, each in a process of its own
  # (`part_commands`), as flags added to the command line, e.g. ({'nodes': ''}, {'workers': '',
  # 'mixed': '', 'cpu_devices': '4'}). Every part writes into the same --out; the last one's
  # results and summary cover every arm there.
  parts: Sequence[Dict[str, str]] = ()
  registration: str = ''  # A registration file (`anp_jax.research.registration`); '': none.


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One arm: a method and its parameters."""
  method: str  # 'sync', 'async', 'mixed', 'local_sgd'
  workers: int = 0
  aware: bool = False
  nodes: int = 0
  sync_every: int = 1
  compensate: bool = False  # async_sgd.momentum='compensate' (Mitliagkas et al. 2016).

  @property
  def name(self) -> str:
    if self.method == 'sync':
      return 'sync'
    suffix = ('-aware' if self.aware else '') + ('-comp' if self.compensate else '')
    if self.method == 'async':
      return f'async-{self.workers:02d}' + suffix
    if self.method == 'mixed':
      return f'mixed-n{self.workers:02d}' + suffix
    return f'local-n{self.nodes}-h{self.sync_every:02d}'

  @property
  def fields(self) -> Dict[str, Any]:
    """The config fields of the arm (a mixed arm trains as N asynchronous workers, each a
    synchronous group)."""
    if self.method in ('async', 'mixed'):
      return {'method': 'async', 'async_sgd.staleness': 'simulated',
              'async_sgd.workers': self.workers, 'async_sgd.max_tau': 2 * self.workers,
              'async_sgd.staleness_aware_lr': self.aware,
              'async_sgd.momentum': 'compensate' if self.compensate else 'keep'}
    if self.method == 'local_sgd':
      return {'method': 'local_sgd', 'local_sgd.nodes': self.nodes,
              'local_sgd.sync_every': self.sync_every}
    return {'method': 'sync'}

  def batch(self, device_batch: int, sync_devices: int) -> int:
    """Examples per update on the mapped cluster (`device_batch` images per device): sync
    all-reduces `sync_devices` devices' batches; an async worker is one device; a mixed worker
    one node of sync_devices / N devices; a local-SGD step is every node's step (each node
    DEVICES_PER_NODE devices)."""
    if self.method == 'sync':
      return sync_devices * device_batch
    if self.method == 'async':
      return device_batch
    if self.method == 'mixed':
      return mixed_worker_devices(self.workers, sync_devices) * device_batch
    return self.nodes * DEVICES_PER_NODE * device_batch

  def staleness(self) -> float:
    """Mean staleness in updates (N - 1 for N asynchronous workers; 0 otherwise)."""
    return float(self.workers - 1) if self.method in ('async', 'mixed') else 0.0

  def devices(self, sync_devices: int) -> int:
    """Devices of the predicted cluster: what "the same cluster size" compares."""
    if self.method in ('sync', 'mixed'):  # Mixed: the sync cluster split into workers.
      return sync_devices
    if self.method == 'async':
      return self.workers
    return self.nodes * DEVICES_PER_NODE


_ARM = re.compile(r'^(?:(sync)|(async|mixed)-n?(\d+)((?:-aware)?)((?:-comp)?)|'
                  r'local-n(\d+)-h(\d+))$')


def parse_arm(name: str) -> Optional[RunSpec]:
  """The arm of a point name (`RunSpec.name`), or None: runs of other invocations in the same
  directory are read back with their arm."""
  m = _ARM.match(name)
  if m is None:
    return None
  if m.group(1):
    return RunSpec('sync')
  if m.group(2):
    return RunSpec(m.group(2), workers=int(m.group(3)), aware=bool(m.group(4)),
                   compensate=bool(m.group(5)))
  return RunSpec('local_sgd', nodes=int(m.group(6)), sync_every=int(m.group(7)))


def grid(workers, aware, nodes, sync_every, mixed=(), mixed_aware=(False,),
         compensate=(False,)) -> List[RunSpec]:
  runs = [RunSpec('sync')]
  runs += [RunSpec('async', workers=n, aware=a, compensate=c) for n in workers for a in aware
           for c in compensate]
  runs += [RunSpec('mixed', workers=n, aware=a) for n in mixed for a in mixed_aware]
  runs += [RunSpec('local_sgd', nodes=k, sync_every=h) for k in nodes for h in sync_every]
  return runs


def run_name(arm: str, lr_mult: float, seed: int) -> str:
  """``<arm>[-lrx<m>][-s<seed>]``: x1 and seed 0 unmarked, the first results' names."""
  return arm + ('' if lr_mult == 1 else f'-lrx{lr_mult:g}') + ('' if seed == 0 else f'-s{seed}')


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
  study_cli.define_runner_flags(fv, lr_flag='lr_grid')

  def define(kind, name, default, help_string):
    getattr(flags, f'DEFINE_{kind}')(name, default, help_string, flag_values=fv)
  define('float', 'epochs', None, 'Training epochs of every run (= --config.num_epochs).')
  define('list', 'workers', None, 'Asynchronous worker counts N.')
  define('list', 'nodes', None, 'Local-SGD node counts.')
  define('list', 'sync_every', None, 'Local-SGD averaging periods H.')
  define('list', 'mixed', None, 'Mixed-asynchronous worker counts N (the sync cluster split into '
         'N workers of sync_devices / N devices).')
  flags.DEFINE_enum('aware', None, ['both', 'on', 'off'],
                    'Staleness-aware lr arms of the async and mixed runs.', flag_values=fv)
  flags.DEFINE_enum('compensate', None, ['both', 'on', 'off'],
                    'Async arms with momentum compensated for asynchrony (Mitliagkas et al. '
                    '2016).', flag_values=fv)
  define('integer', 'sync_devices', None, 'Devices of the predicted synchronous cluster.')
  define('integer', 'device_batch', None, 'Images per device of the mapped cluster: each arm '
         'trains with its examples per update there; 0: every arm at config.batch_size.')
  define('float', 'target_top1', None, 'ANP top-1 fraction (validation): the lr choice is the '
         'fewest examples to it.')


@dataclasses.dataclass
class Experiment:
  """Resolved settings: the base config, the arms, the study's axes, the target and the paths."""
  preset: Preset
  base: ml_collections.ConfigDict
  arms: List[RunSpec]
  lr: LrGrid
  seeds: List[int]
  target_top1: float
  sync_devices: int
  cpu_devices: int
  opts: runner.Options
  device_batch: int = 0
  # A fresh-seed confirmation of the study in selection_out (`runner.confirmation_study`): its
  # opts.out is selection_out/confirmation.
  confirm_seeds: Sequence[int] = ()
  selection_out: str = ''

  def fields(self, spec: RunSpec) -> Dict[str, Any]:
    """The config fields of an arm's runs: its method's, and its examples per update on the
    mapped cluster (`RunSpec.batch`) unless the proxy is unmapped (``device_batch`` 0)."""
    if not self.device_batch:
      return spec.fields
    return {**spec.fields, 'batch_size': spec.batch(self.device_batch, self.sync_devices)}

  @property
  def out(self) -> str:
    return self.opts.out

  @property
  def arm(self) -> Dict[str, RunSpec]:
    return {a.name: a for a in self.arms}


def resolve(argv: Sequence[str], doc: str = __doc__) -> Optional[Experiment]:
  """The experiment of `argv`; ExperimentError on bad input (touches no device)."""
  parsed = study_cli.parse_command_line(argv, PREFIX, define_flags, doc)
  if parsed is None:
    return None
  fv, config, overrides = parsed
  preset = Preset(**study_cli.load_preset(PREFIX, fv.preset)[1])
  out = study_cli.out_path(fv.out)
  base = ml_collections.ConfigDict(config.to_dict())
  keys = [k for k, _ in overrides]
  for key in keys:
    if key.split('.')[0] in ('method', 'async_sgd', 'local_sgd', 'batch_size', 'seed'):
      raise ExperimentError(f'--config.{key} is set per run by the experiment; use its flags.')
  if fv.epochs is not None and 'num_epochs' not in keys:  # An explicit override wins.
    base.num_epochs = fv.epochs
  if not base.num_epochs > 0:
    raise ExperimentError(f'--epochs must be > 0, got {base.num_epochs}.')
  given = lambda name: study_cli.list_flag(fv, name, int)
  workers = preset.workers if given('workers') is None else given('workers')
  nodes = preset.nodes if given('nodes') is None else given('nodes')
  every = preset.sync_every if given('sync_every') is None else given('sync_every')
  mixed = preset.mixed if given('mixed') is None else given('mixed')
  both = {'both': (False, True), 'on': (True,), 'off': (False,)}
  choice = None if fv.aware is None else both[fv.aware]
  aware = preset.aware if choice is None else choice
  mixed_aware = preset.mixed_aware if choice is None else choice
  compensate = preset.compensate if fv.compensate is None else both[fv.compensate]
  sync_devices = preset.sync_devices if fv.sync_devices is None else fv.sync_devices
  device_batch = preset.device_batch if fv.device_batch is None else fv.device_batch
  if (any(n < 1 for n in workers) or any(k < 1 for k in nodes) or any(h < 1 for h in every)
      or any(n < 1 for n in mixed)):
    raise ExperimentError(f'--workers, --nodes, --sync_every and --mixed must be >= 1, got '
                          f'{workers}, {nodes}, {every}, {mixed}.')
  if sync_devices < 1:
    raise ExperimentError(f'--sync_devices must be >= 1, got {sync_devices}.')
  if device_batch < 0:
    raise ExperimentError(f'--device_batch must be >= 0 (0: every arm at config.batch_size), '
                          f'got {device_batch}.')
  for n in mixed:
    mixed_worker_devices(n, sync_devices)
  extensions = preset.lr_extensions if fv.lr_extensions is None else fv.lr_extensions
  mults = study_cli.list_flag(fv, 'lr_grid', float)
  lr = LrGrid(tuple(preset.lr_grid if mults is None else mults), int(extensions))
  seeds = study_cli.list_flag(fv, 'seeds', int)
  confirm = study_cli.list_flag(fv, 'confirm_seeds', int) or []
  selection_out = ''
  if confirm:
    if seeds is not None or mults is not None:
      raise ExperimentError('--confirm_seeds reruns the rates chosen in --out with new seeds: '
                            'drop --seeds and --lr_grid.')
    selection_out, out = out, os.path.join(out, study_results.CONFIRMATION_DIR)
    seeds, lr = confirm, LrGrid((1.0,), 0)
  target = preset.target_top1 if fv.target_top1 is None else fv.target_top1
  if not 0.0 < target <= 1.0:
    raise ExperimentError(f'--target_top1={target} is an unreachable target: top-1 accuracy is '
                          'a fraction in (0, 1] (e.g. 0.25 for 25 %).')
  if runner.stops_at_target(base, fv.stop_at_target) and base.eval_every_epochs <= 0:
    raise ExperimentError('--stop_at_target needs periodic evaluation (eval_every_epochs > 0).')
  opts = runner.Options(out=out, preset=fv.preset, stop_at_target=fv.stop_at_target, ci=fv.ci,
                        dry_run=fv.dry_run, report=not fv.no_report, user_fields=frozenset(keys),
                        seeds_at_once=fv.seeds_at_once,
                        invocation={'argv': list(argv),
                                    'overrides': study_cli.override_args(overrides)})
  return Experiment(preset=preset, base=base,
                    arms=grid(workers, aware, nodes, every, mixed, mixed_aware, compensate),
                    lr=lr, seeds=list(preset.seeds if seeds is None else seeds),
                    target_top1=float(target), sync_devices=sync_devices,
                    cpu_devices=preset.cpu_devices if fv.cpu_devices is None else fv.cpu_devices,
                    opts=opts, device_batch=device_batch, confirm_seeds=tuple(confirm),
                    selection_out=selection_out)


def study(ex: Experiment) -> Study:
  """The experiment as a runner study: one point per arm. Its results read every run in the
  directory (arms trained by other invocations too, e.g. the local-SGD arms on other devices:
  the runner refuses runs there trained with other settings)."""
  st = Study(kind=PREFIX, points=tuple((a.name, ex.fields(a)) for a in ex.arms),
               target_value=ex.target_top1, seeds=tuple(ex.seeds), lr=ex.lr,
               metrics=('anp_top1', 'loss'), run_name=run_name, checkpoint_every_epochs=1.0,
               # At least 4 training-log records per epoch.
               log_every_epochs=0.25, images_per_s=ex.preset.images_per_s,
               overhead_s=ex.preset.overhead_s, cpu_devices=ex.cpu_devices,
               title='Sync vs simulated async and mixed-asynchronous vs local SGD',
               summarize=lambda run_dir, record: summarize(ex, run_dir, record),
               write=lambda out, rows, points: write_results(ex, rows, points),
               report=lambda out: write_summary(ex), registration=ex.preset.registration)
  if ex.confirm_seeds:
    st = runner.confirmation_study(st, ex.selection_out, ex.confirm_seeds)
  return st


def plan_runs(ex: Experiment, devices: int):
  """(runs, dataset meta): every run's config and setup, checked before training."""
  return runner.plan_runs(study(ex), ex.base, ex.opts, devices)


# ----------------------------------------------------------------------------------------------
# Results.


def summarize(ex: Experiment, run_dir: str, record: Optional[Dict]) -> Optional[Dict]:
  """One run's row: the runner's (`study_results.summarize_run`) with the arm, its eval curve
  (epochs, top-1, loss and predicted hours) and its predicted cluster and epoch time, under the
  first results' names (``name`` the arm, ``run`` the run, ``devices`` the predicted cluster's,
  ``train_devices`` those it trained on)."""
  row = study_results.summarize_run(run_dir, 'eval/anp_top1', ex.target_top1, record,
                                    ('anp_top1', 'loss'))
  if row is None:
    return None
  spec = ex.arm.get(row['point']) or parse_arm(row['point'])
  if spec is None:
    raise ExperimentError(f'{run_dir} is not a run of this experiment (point '
                          f'{row["point"]!r} names no arm).')
  epoch_s, cluster = predicted_epoch(spec, ex.sync_devices)
  evals = [r for r in study_results.finite_evals(metrics_io.read_metrics(run_dir))
           if 'eval/anp_top1' in r]
  per_epoch = row['steps_per_epoch']
  curve = [{'epoch': r['step'] / per_epoch, 'top1': r['eval/anp_top1'], 'loss': r['eval/loss'],
            'hours': r['step'] / per_epoch * epoch_s / 3600,
            **({'test_top1': r['test/anp_top1']} if 'test/anp_top1' in r else {})}
           for r in evals]
  row.update(dataclasses.asdict(spec), name=spec.name, run=row['name'], arm=spec.name,
             steps=row['total_steps'], final_top1=row['eval/anp_top1'],
             final_loss=row['eval/loss'], best_top1=row['best/eval/anp_top1'],
             diverged=row['status'] == 'diverged', predicted_epoch_s=epoch_s,
             predicted_cluster=cluster, curve=curve, train_devices=row['devices'],
             devices=spec.devices(ex.sync_devices), target_top1=ex.target_top1,
             staleness=spec.staleness(), staleness_examples=spec.staleness() * row['batch'])
  return row


GRID_KEYS = ('run', 'lr_mult', 'seed', 'lr', 'status', 'outcome', 'final_top1', 'best_top1',
             'steps_to_target', 'examples_to_target', 'test_outcome', 'test_examples_to_target',
             'test/anp_top1')


def choose(records: List[Dict], points: Sequence[Dict] = ()) -> List[Dict]:
  """Per arm, the record of its chosen rate's first seed, with every run under ``lr_grid``, the
  choice (``lr_chosen``, ``lr_edge``, ``best_lr``) and, from `points`, its statistics over
  seeds under ``statistics``. An arm without a choice (every rate had a diverged seed) shows
  its first run."""
  choices = study_results.choose_rates(records, lambda r: r['arm'],
                                       lambda r: r.get('final_top1'))
  statistics = {p['point']: p for p in points}
  chosen = []
  for arm in dict.fromkeys(r['arm'] for r in records):
    members = [r for r in records if r['arm'] == arm]
    c = choices[arm]
    at = [r for r in members if study_results.is_chosen(r, c)]
    best = min(at, key=lambda r: r.get('seed', 0)) if at else members[0]
    cells = [{k: r.get(k) for k in GRID_KEYS}
             for r in sorted(members, key=lambda r: (r['lr_mult'], r.get('seed', 0)))]
    chosen.append({**best, 'lr_grid': cells, 'lr_chosen': c['lr_mult'] is not None,
                   'lr_edge': c['edge'], 'best_lr': c['lr_mult'] is not None,
                   'statistics': statistics.get(arm)})
  return chosen


def plot(rows, out: str):
  plt = plotting.pyplot()
  paths = []
  for key, xlabel, fname in (('epoch', 'epochs', 'accuracy_vs_epochs.png'),
                             ('hours', 'predicted wall time on MinoTauro (h, ResNet-50)',
                              'accuracy_vs_time.png')):
    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    test = all('test_top1' in c for r in rows for c in r['curve'])
    for r in rows:
      style = {'sync': '-', 'async': '--', 'mixed': '-.'}.get(r['method'], ':')
      ax.plot([c[key] for c in r['curve']],
              [100 * c['test_top1' if test else 'top1'] for c in r['curve']], style,
              marker='o', markersize=3, label=f'{r["name"]} (lr {r["lr"]:.3g})')
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f'{"test" if test else "validation"} ANP top-1 (%), first seed')
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


def _grid_cell(mult: float, cells: Sequence[Dict]) -> str:
  """What one rate's seeds did: 'x0.5: 34.20 %, 12,800' (one seed), 'x1: diverged', or the
  counts over several seeds."""
  if len(cells) == 1:
    g = cells[0]
    outcome = ('diverged' if g['status'] == 'diverged' else
               f'{_pct(g["final_top1"])}, {_examples(g["examples_to_target"])}')
    return f'x{mult:g}: {outcome}'
  outcomes = [study_results.outcome_of(g) for g in cells]
  counts = ', '.join(f'{outcomes.count(k)} {k}' for k in ('reached', 'missed', 'diverged',
                                                          'unfinished') if k in outcomes)
  return f'x{mult:g}: {len(cells)} seeds, {counts}'


def chosen_runs(arm: Dict, grid_rows: Sequence[Dict]) -> List[Dict]:
  """The runs (grid.json rows) of an arm at its chosen rate, one per seed."""
  if not arm['lr_chosen']:
    return []
  return sorted((g for g in grid_rows if g['arm'] == arm['name']
                 and float(g['lr_mult']) == float(arm['lr_mult'])), key=lambda g: g['seed'])


def _split(runs: Sequence[Dict]) -> str:
  """'test_' when every run evaluated the test split (published figures), else ''."""
  return 'test_' if runs and all(g.get('has_test') for g in runs) else ''


def equal_examples_epoch(arms: Sequence[Dict], grid_rows: Sequence[Dict]) -> Optional[float]:
  """The most epochs every chosen run of every arm was evaluated at (runs stopped at the target
  end early): where all arms are compared at equal examples."""
  ends = [max(c['epoch'] for c in g['curve']) for a in arms for g in chosen_runs(a, grid_rows)
          if g['curve']]
  return min(ends) if ends else None


def top1_at(run: Dict, epoch: float) -> Optional[float]:
  """A run's top-1 (test when evaluated) at its evaluation closest below `epoch`."""
  before = [c for c in run['curve'] if c['epoch'] <= epoch + 1e-9]
  if not before:
    return None
  c = max(before, key=lambda c: c['epoch'])
  return c.get('test_top1', c['top1'])


def comparisons(arms: Sequence[Dict], grid_rows: Sequence[Dict], reference: str = 'sync'
                ) -> List[Dict]:
  """Every arm against `reference`, each at its own chosen rate: the ratio of their mean
  examples to the target (published split; only when every seed of both reached it: a censored
  mean has no interval) with `stats.ratio_interval`, and the difference of their top-1 at equal
  examples (`equal_examples_epoch`) with `stats.difference_interval`."""
  by = {a['name']: a for a in arms}
  if reference not in by:
    return []
  epoch = equal_examples_epoch(arms, grid_rows)
  ref_runs = chosen_runs(by[reference], grid_rows)
  key = _split(ref_runs) + 'examples_to_target'
  out = []
  for a in arms:
    if a['name'] == reference:
      continue
    runs = chosen_runs(a, grid_rows)
    item = {'arm': a['name'], 'staleness_examples': a.get('staleness_examples'),
            'examples_ratio': None, 'top1_difference': None, 'epoch': epoch}
    values = [g.get(key) for g in runs]
    ref = [g.get(key) for g in ref_runs]
    if runs and ref_runs and None not in values + ref:
      item['examples_ratio'] = stats.ratio_interval(values, ref)
    if epoch is not None and runs and ref_runs:
      at = [top1_at(g, epoch) for g in runs]
      at_ref = [top1_at(g, epoch) for g in ref_runs]
      if None not in at + at_ref:
        item['top1_difference'] = stats.difference_interval(at, at_ref)
    out.append(item)
  return out


def _spread_of(summary: Optional[Dict]) -> Optional[Dict]:
  """{'mean', 'sd', 'cv', 'n', 'detectable'} of a statistics summary over seeds (the runner's
  `stats.censored_summary` / `stats.value_summary`), or None unless every seed has a value
  ('complete') and there are at least two."""
  if not summary or summary.get('kind') != 'complete' or summary.get('sd') is None or (
      summary['n'] < 2):
    return None
  mean, sd, n = summary['mean'], summary['sd'], summary['n']
  return {'n': n, 'mean': mean, 'sd': sd, 'cv': sd / mean if mean else None,
          'detectable': stats.detectable_difference(sd, n, n)}


def noise_floor(arms: Sequence[Dict]) -> List[Dict]:
  """Per arm at its chosen rate, how much its seeds differ, read from the runner's statistics
  over those seeds (``arm['statistics']``, the same figures as the main table): examples to the
  target on the published split (only when every seed reached it) and the final top-1 on it
  (only when no seed diverged), each with the smallest difference of two such means that a
  95 % interval could tell from 0 (`stats.detectable_difference`, this arm's SD)."""
  out = []
  for a in arms:
    point = a.get('statistics')
    if not a.get('lr_chosen') or not point or point.get('seeds', 0) < 2:
      continue
    test = point.get('published_split') == 'test'
    final = point.get('final') or {}
    out.append({'arm': a['name'], 'n': point['seeds'],
                'examples': _spread_of(point['test_examples_to_target' if test
                                             else 'examples_to_target']),
                'top1': _spread_of(final.get('test/anp_top1' if test else 'eval/anp_top1'))})
  return out


def multiple_comparisons(compared: Sequence[Dict], arms: Sequence[Dict],
                         grid_rows: Sequence[Dict], reference: str = 'sync') -> List[Dict]:
  """The arm-against-sync ratios of `comparisons` as one family: each Welch p-value adjusted by
  Holm over the family (`stats.holm`), each interval at the Bonferroni level that makes them
  hold together (`stats.simultaneous_level`), and the alternative model with one pooled
  variance of log examples over every arm (`stats.pooled_log_ratios`: more degrees of freedom,
  on the assumption that every arm's seeds spread alike; each arm's CV beside it says how far
  that holds)."""
  family = [c for c in compared if c['examples_ratio']]
  if not family:
    return []
  by = {a['name']: a for a in arms}
  ref_runs = chosen_runs(by[reference], grid_rows)
  key = _split(ref_runs) + 'examples_to_target'
  values = {reference: [g[key] for g in ref_runs]}
  for c in family:
    values[c['arm']] = [g[key] for g in chosen_runs(by[c['arm']], grid_rows)]
  level = stats.simultaneous_level(stats.LEVEL, len(family))
  holm = stats.holm([c['examples_ratio']['p'] for c in family])
  pooled = stats.pooled_log_ratios(values, reference)
  out = []
  for c, adjusted in zip(family, holm):
    v = values[c['arm']]
    spread = stats.spread(v) if len(v) > 1 else None
    out.append({'arm': c['arm'], 'ratio': c['examples_ratio'], 'p': c['examples_ratio']['p'],
                'p_holm': adjusted,
                'simultaneous': stats.ratio_interval(v, values[reference], level),
                'pooled': pooled['ratios'][c['arm']], 'cv': spread and spread['cv']})
  return [{'family': len(family), 'level': level, 'pooled_sd': pooled['sd'],
           'pooled_df': pooled['df'], 'reference_cv': stats.spread(values[reference])['cv']
           if len(values[reference]) > 1 else None}] + out


def multiplicity_lines(compared: Sequence[Dict], arms: Sequence[Dict],
                       grid_rows: Sequence[Dict]) -> List[str]:
  """The summary's section on the arms compared with sync as one family (see
  `multiple_comparisons`)."""
  rows = multiple_comparisons(compared, arms, grid_rows)
  if not rows:
    return []
  head, rows = rows[0], rows[1:]
  fmt = lambda r: f'{r["ratio"]:.2f} [{r["low"]:.2f}, {r["high"]:.2f}]'
  lines = ['## The arms against sync as one family', '',
           f'The {head["family"]} ratios above are {head["family"]} comparisons: each alone at '
           '95 %, some would exclude 1 by chance. Two corrections: Holm\'s step-down '
           'adjustment of the Welch p-values, with intervals at the Bonferroni level '
           f'{100 * head["level"]:.2f} % that hold together; and one model with a pooled '
           f'variance of log examples over every arm (SD {head["pooled_sd"]:.3f}, '
           f'{head["pooled_df"]} degrees of freedom; ratios of geometric means), which assumes '
           'every arm\'s seeds spread alike: each arm\'s CV of examples is beside it (sync\'s: '
           + (f'{100 * head["reference_cv"]:.0f} %' if head['reference_cv'] is not None else '—')
           + ').', '',
           '| arm | ratio [95 %] | p (Welch) | p (Holm) | simultaneous interval | pooled-variance '
           'ratio [95 %] | p (pooled, Holm) | CV |', '|---|---|---|---|---|---|---|---|']
  for r in rows:
    lines.append(f'| {r["arm"]} | {fmt(r["ratio"])} | {r["p"]:.3f} | {r["p_holm"]:.3f} | '
                 f'[{r["simultaneous"]["low"]:.2f}, {r["simultaneous"]["high"]:.2f}] | '
                 f'{fmt(r["pooled"])} | {r["pooled"]["p_holm"]:.3f} | '
                 + ('—' if r['cv'] is None else f'{100 * r["cv"]:.0f} %') + ' |')
  return lines + ['']


def confirmation_lines(out: str) -> List[str]:
  """A fresh-seed confirmation (``out/confirmation``) beside the selection: per arm its
  examples to the target and final top-1 over both sets of seeds, and each arm against sync on
  the confirmation runs alone (figures from runs that chose nothing). [] without one."""
  from anp_jax.research import study_report
  lines = study_report.confirmation_section(out, (
      ('examples to the target', lambda p: study_report.published(p, 'examples_to_target'),
       ',.0f', 1.0),
      ('final top-1 (%)', lambda p: study_report.published_final(p), '.1f', 100.0)), name='arm')
  confirmed = os.path.join(out, study_results.CONFIRMATION_DIR)
  if not lines or not os.path.exists(os.path.join(confirmed, 'grid.json')):
    return lines
  rows = study_results.read_json(os.path.join(confirmed, 'results.json'))
  grid = study_results.read_json(os.path.join(confirmed, 'grid.json'))
  compared = comparisons(rows, grid)
  if compared:
    lines += ['Each arm against sync on the confirmation runs (ratio of mean examples to the '
              'target, 95 % interval):', '', '| arm | examples to target / sync |', '|---|---|']
    lines += [f'| {c["arm"]} | ' + (_interval(c['examples_ratio'], 'ratio', '.2f')
                                    if c['examples_ratio'] else 'censored') + ' |'
              for c in compared]
    lines += [''] + multiplicity_lines(compared, rows, grid)
  return lines


def _replace_flag(argv: Sequence[str], name: str, value: Optional[str]) -> List[str]:
  """``argv`` with flag ``--name`` (``--name X`` or ``--name=X``) set to ``value``, or dropped
  when ``value`` is None."""
  out, skip = [], False
  for i, a in enumerate(argv):
    if skip:
      skip = False
      continue
    if a == f'--{name}':
      skip = True
      continue
    if a.startswith(f'--{name}='):
      continue
    out.append(a)
  return out + ([f'--{name}={value}'] if value is not None else [])


def rewrite_summary(out: str) -> str:
  """Writes ``out/summary.md`` again from its results (no training): the experiment as its last
  recorded invocation resolved it (``study.json``), in this directory (a ``confirmation/``
  directory as the confirmation of its parent)."""
  out = os.path.normpath(out)
  invocation = study_results.read_json(os.path.join(out, 'study.json'))['invocations'][-1]
  confirming = os.path.basename(out) == study_results.CONFIRMATION_DIR
  argv = _replace_flag(invocation['argv'], 'out', os.path.dirname(out) if confirming else out)
  if not confirming:
    argv = _replace_flag(argv, 'confirm_seeds', None)
  return write_summary(resolve(argv + list(invocation.get('overrides', []))))


def _shown_path(path: str) -> str:
  """A directory as a report names it: relative to the working directory when inside it (a
  committed report carries no machine's absolute path), else as given."""
  rel = os.path.relpath(path)
  return path if rel.startswith('..') else rel


def _interval(x: Optional[Dict], key: str, spec: str, scale: float = 1.0) -> str:
  if x is None:
    return '—'
  low = '' if x['low'] is None else (f' [{format(scale * x["low"], spec)}, '
                                     f'{format(scale * x["high"], spec)}]')
  return format(scale * x[key], spec) + low


def write_summary(ex: Experiment) -> str:
  """``summary.md`` of the per-arm ``results.json`` (the study's report)."""
  rows = study_results.read_json(os.path.join(ex.out, 'results.json'))
  grid_rows = study_results.read_json(os.path.join(ex.out, 'grid.json'))
  base, sync_devices = ex.base, ex.sync_devices
  grid_text = ', '.join(f'{m:g}' for m in ex.lr.multipliers)
  sizes = sorted({r['devices'] for r in rows})
  several = len(ex.seeds) > 1
  split = 'test' if all(_split(chosen_runs(r, grid_rows)) for r in rows if r['lr_chosen']) else (
      'validation')
  batches = sorted({r['batch'] for r in rows})
  per_update = (f'{batches[0]} examples per update' if len(batches) == 1 else
                'each arm with its examples per update on the mapped cluster (' + ', '.join(
                    f'{r["name"]} {r["batch"]}' for r in rows) + ')')
  lines = ['# Sync vs simulated async and mixed-asynchronous vs local SGD', '',
           f'Proxy: {base.model.name} width {base.model.width}, {base.image_size} px generated '
           f'ANP data, {per_update}, {base.num_epochs:g} epochs at most, {base.optimizer}, base '
           f'lr {base.base_lr:g} per {base.base_batch_size} ({base.lr_scaling} rule: the centre '
           f'of the grid), {base.schedule} schedule, BN {base.bn_mode}'
           + (f' over {base.bn_group_size}' if base.bn_mode == 'ghost' else '')
           + f'; seeds {ex.seeds}.',
           f'Predicted time: ResNet-50 on {ANP_TRAIN_IMAGES:,} ANP training images, '
           f'{PAPER_PER_DEVICE_BATCH} images per K80 device/worker on MinoTauro; sync on '
           f'{sync_devices} devices. The accuracy curves come from the proxy, the times from '
           '`anp_jax.research.perfmodel` (see the script docstring).',
           ('Cluster size: every arm on ' + f'{sizes[0]} devices.' if len(sizes) == 1 else
            'Cluster sizes differ between arms (' + ', '.join(
                f'{r["name"]}: {r["devices"]}' for r in rows) + ' devices): compare with care.'),
           '', registration.describe(ex.out), '',
           f'Learning rate per arm: base lr x {{{grid_text}}}, chosen on validation: a rate with '
           'a diverged seed is never chosen; among the others, the fewest mean examples to '
           f'{100 * ex.target_top1:g} % ANP top-1 (interpolated first crossing) over seeds that '
           'all reached it, else the best mean final top-1. '
           + (f'An arm whose chosen multiplier was the lowest (highest) of its grid also ran at '
              f'half (twice) that, at most {ex.lr.extensions} time(s).'
              if ex.lr.extensions else ''),
           f'Published figures on the {split} split.'
           + (' Runs stop at the later of their validation and test crossings of the target.'
              if runner.stops_at_target(ex.base, ex.opts.stop_at_target) else ''), '']
  if several:
    lines += ['With several seeds, the figures are over the seeds at the chosen rate: '
              + stats.describe_method(ex.opts.ci) + ' "≥ X (k/n reached, ...)" is a lower bound '
              'where a seed missed the target or diverged.', '']
  lines += ['| run | examples / update | mean staleness (updates; examples) | final top-1 | '
            'best top-1 | predicted epoch | time for the run | cluster | chosen lr | lr grid '
            '(seeds on validation) | '
            'examples to target |',
            '|---|---|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    top1 = 'diverged' if r['diverged'] else _pct(r['final_top1'])
    examples = _examples(r['examples_to_target'])
    point = r.get('statistics')
    if several and point:
      final = point['final']
      top1 = stats.format_summary(final.get('test/anp_top1') or final.get('eval/anp_top1'),
                                  '.2f', 100) + ' %'
      examples = stats.format_summary(point['test_examples_to_target'] or
                                      point['examples_to_target'], ',.0f')
    best = '' if r['best_top1'] is None else _pct(r['best_top1'])
    by_mult = {}
    for g in r['lr_grid']:
      by_mult.setdefault(g['lr_mult'], []).append(g)
    cells = [_grid_cell(m, gs) for m, gs in by_mult.items()]
    chosen = f'{r["lr"]:.4g} (x{r["lr_mult"]:g})' if r['lr_chosen'] else 'none (diverged seeds)'
    if r['lr_chosen'] and r['lr_edge']:
      chosen += ', edge of the grid'  # The best rate may lie beyond it: widen the grid.
    stale = r.get('staleness', 0.0)
    lines.append(f'| {r["name"]} | {r["batch"]} | {stale:g}; {stale * r["batch"]:,.0f} | {top1} '
                 f'| {best} | {r["predicted_epoch_s"] / 60:.1f} min | '
                 f'{r["epochs"] * r["predicted_epoch_s"] / 3600:.2f} h | '
                 f'{r["predicted_cluster"]} | {chosen} | {"; ".join(cells)} | {examples} |')
  lines += ['', '"final top-1": at the end of each run (its stop at the target, else its budget); '
            '"time for the run": the whole budget at the predicted epoch time.']
  missed = [r['name'] for r in rows if r['examples_to_target'] is None]
  if missed:
    lines += ['', (f'Not every seed reached {100 * ex.target_top1:g} % ANP top-1 (validation) at '
                   f'the rate chosen in the selection: {", ".join(missed)}.' if ex.confirm_seeds
                   else f'Did not reach {100 * ex.target_top1:g} % ANP top-1 at any learning '
                   f'rate of the grid: {", ".join(missed)}.')]
  edge = [f'{r["name"]} (every rate had a diverged seed)' if not r['lr_chosen'] else
          f'{r["name"]} ({"lowest" if r["lr_edge"] == "low" else "highest"}, x{r["lr_mult"]:g})'
          for r in rows if r['lr_edge']]
  if edge:
    lines += ['', (f'Best rate still at the edge of its grid after at most {ex.lr.extensions} '
                   'factor-2 extension(s) per arm' if ex.lr.extensions else
                   'Best rate at the edge of its grid (`--lr_extensions` widens it)')
              + f' (the optimum may lie beyond): {", ".join(edge)}.']
  elif rows and all(len({g['lr_mult'] for g in r['lr_grid']}) > 1 for r in rows):
    lines += ['', 'Every arm\'s chosen rate is interior to its grid (a neighbour on each side was '
              'tried and did worse or diverged).']
  compared = comparisons(rows, grid_rows) if several else []
  if ex.confirm_seeds:
    lines += ['', 'This is the fresh-seed confirmation of the study in '
              f'`{_shown_path(ex.selection_out)}`: every arm at the rate chosen there, seeds '
              f'{ex.seeds} '
              '(none of the selection\'s).', '']
  if compared:
    epoch = compared[0]['epoch']
    lines += ['', '## Each arm against sync, both at their own chosen rate', '',
              f'Examples to {100 * ex.target_top1:g} % top-1 ({split} split) as a ratio of the '
              'means (arm / sync; 95 % interval by the delta method on the log scale with '
              'Welch\'s degrees of freedom; only when every seed of both reached the target), '
              f'and the top-1 difference at equal examples ({epoch:g} epochs, the most every '
              'chosen run trained; Welch\'s t interval, percentage points). An interval that '
              'contains 1 (ratio) or 0 (difference) is no measured difference.', '',
              '| arm | staleness (examples) | examples to target / sync | top-1 − sync at '
              f'{epoch:g} epochs (points) |', '|---|---|---|---|']
    for c in compared:
      ratio = c['examples_ratio']
      lines.append(f'| {c["arm"]} | {c["staleness_examples"] or 0:,.0f} | '
                   + (_interval(ratio, 'ratio', '.2f') if ratio else 'censored: see above')
                   + f' | {_interval(c["top1_difference"], "diff", "+.1f", 100)} |')
  if compared:
    lines += [''] + multiplicity_lines(compared, rows, grid_rows)
  floor = noise_floor(rows) if several else []
  if floor:
    lines += ['', '## Noise floor: seed-to-seed spread at each arm\'s chosen rate', '',
              f'The same configuration with another seed (initialisation, data order, '
              f'augmentation): standard deviation over seeds ({split} split), its coefficient of '
              'variation, and the smallest true difference between two such means (as many '
              'seeds each) that a 95 % interval separates from 0 with 80 % power '
              '(`stats.detectable_difference`; the interval\'s half-width, detected half the '
              'time, is 1/1.34 of it at 3 + 3 seeds); a difference in the tables above smaller '
              'than that is within the noise.', '',
              '| arm | seeds | examples to target: SD (CV); detectable | final top-1: SD; '
              'detectable (points) |', '|---|---|---|---|']
    for f in floor:
      ex_ = f['examples']
      t1 = f['top1']
      lines.append(
          f'| {f["arm"]} | {f["n"]} | '
          + ('— (a seed missed the target)' if ex_ is None else
             f'{ex_["sd"]:,.0f} ({100 * ex_["cv"]:.0f} %); {ex_["detectable"]:,.0f}')
          + ' | ' + ('— (a seed diverged)' if t1 is None else
                     f'{100 * t1["sd"]:.2f}; {100 * t1["detectable"]:.1f}') + ' |')
  lines += [''] + confirmation_lines(ex.out)
  lines += ['', '![accuracy vs epochs](accuracy_vs_epochs.png)',
            '![accuracy vs predicted time](accuracy_vs_time.png)', '']
  path = os.path.join(ex.out, 'summary.md')
  study_results.write_text_atomic(path, '\n'.join(lines))
  return path


def write_results(ex: Experiment, rows: List[Dict], points: List[Dict]) -> List[str]:
  """grid.json (every run), results.json (one record per arm at its chosen rate), points.* and
  the plots."""
  paths = [os.path.join(ex.out, 'grid.json'), os.path.join(ex.out, 'results.json')]
  per_arm = choose([dict(r) for r in rows], points)
  reporting.write_json_atomic(paths[0], rows)
  reporting.write_json_atomic(paths[1], per_arm)
  paths += study_results.write_points(ex.out, points)
  return paths + plot(per_arm, ex.out)


# ----------------------------------------------------------------------------------------------
# The command.


SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'experiments',
                      'sync_async_mixed.py')


def part_commands(argv: Sequence[str]) -> List[List[str]]:
  """The commands that run the preset of `argv` part by part (`Preset.parts`), or [] when it has
  one part or the command line sets a part's flags itself (then it is one of the parts)."""
  if any(a in cli.HELP_FLAGS for a in argv):
    return []
  name = cli._config_spec(list(argv), 'preset', 'cpu')
  try:
    preset = Preset(**study_cli.load_preset(PREFIX, name)[1])
  except (StudyError, TypeError, OSError):
    return []  # The single invocation reports it.
  flags_ = {f for part in preset.parts for f in part}
  given = {a.split('=')[0].lstrip('-') for a in argv if a.startswith('-')}
  if not preset.parts or given & (flags_ | {f'no{f}' for f in flags_}):
    return []
  return [[sys.executable, os.path.abspath(SCRIPT), *argv,
           *(f'--{k}={v}' for k, v in part.items())] for part in preset.parts]


def run_parts(commands: Sequence[Sequence[str]]) -> int:
  """Runs the parts in turn (each a process of its own: its simulated devices are set before
  JAX starts); stops at the first that fails and returns its exit code (75: preempted, the same
  command again resumes), else 0."""
  for i, command in enumerate(commands):
    print(f'sync_async_mixed: part {i + 1} of {len(commands)}: '
          f'{" ".join(shlex.quote(c) for c in command[1:])}', flush=True)
    rc = subprocess.call(list(command))
    if rc:
      return rc
  return 0


def main(argv: Sequence[str], doc: str = __doc__) -> int:
  """Runs (or continues) the experiment of `argv`; 2 on bad input, 75 when preempted. A preset
  with parts (`Preset.parts`) runs each in a process of its own, one after the other."""
  commands = part_commands(argv)
  if commands:
    return run_parts(commands)

  def resolved():
    ex = resolve(argv, doc)
    return None if ex is None else (study(ex), ex.base, ex.opts, ex.cpu_devices)
  return study_cli.run_command(resolved)
