"""Synchronous vs simulated asynchronous vs local SGD: accuracy per epoch and per predicted hour.

  python experiments/sync_async_mixed.py --preset cpu --out workdirs/sam        # ~15-20 min
  python experiments/sync_async_mixed.py --preset tiny --out /tmp/sam           # ~75 s (CI)
  python experiments/sync_async_mixed.py --preset cpu --out DIR --epochs 8 --workers 4,16 \\
      --nodes 4 --sync_every 1,8 --config.base_lr=0.1

Every run trains with `anp_jax.trainer.train_and_evaluate` in ``DIR/runs/<name>`` on the generated
ANP dataset, with the same model, schedule, number of epochs and examples per update (the global
batch of one step):

* ``sync``: synchronous SGD (``config.method='sync'``).
* ``async-N[-aware]``: simulated asynchronous SGD with the staleness of N workers from the
  event simulation (`anp_jax.research.perfmodel.staleness_sampler`, mean N - 1, step-time CV 0.1), history
  ``max_tau = 2N``; ``-aware`` divides each step by max(tau, 1) (Zhang et al. 2016). One step's
  batch plays one worker's mini-batch.
* ``local-nK-hH``: local SGD over K nodes (a (node, device) mesh), parameters and BN statistics
  averaged every H steps (H = 1 is synchronous SGD up to float rounding).

Predicted wall time: each run is mapped to the seed paper's cluster (`perfmodel.minotauro`: K80
devices, 4 per node, FDR InfiniBand) training ResNet-50 on the MUSA2 ANP training split
(307,406 images) with 32 images per device/worker, and `perfmodel.predict` gives its epoch time:
``sync`` on ``--sync_devices`` devices (all-reduce), ``async-N`` on N device workers against one
parameter server (``method='async'``), ``local-nK-hH`` on K nodes x 4 devices
(``method='mixed', mixed_mode='local_sgd', local_steps=H``). Accuracy at epoch e is plotted at
e x epoch time. Caveat, stated in the summary too: the accuracy curves come from the small proxy
(same examples per update for every method); the times are the paper-scale predictions. The proxy
measures what staleness and infrequent averaging cost per epoch; the model what they save.

Resumable: a run with ``final_metrics.json`` is skipped; an interrupted one continues from its
checkpoints; a run directory trained with other settings is an error. Results:
``DIR/results.json`` (one record per run: settings, eval curve, final/best top-1, predicted
epoch time and cluster), ``DIR/accuracy_vs_epochs.png``, ``DIR/accuracy_vs_time.png`` and
``DIR/summary.md``.

Presets: ``cpu`` — ResNet-20 width 0.5 at 16 px (8,000 train / 1,696 eval images, 32 ANPs) on 4
simulated CPU devices, batch 128 (ghost BN over 16), nesterov, base lr 0.2 per 256, 1 warmup
epoch, cosine, 4 epochs, evaluation every half epoch; runs: sync, async N = 4, 8, 16 with and
without staleness-aware lr, local SGD over 4 nodes with H = 1, 4, 16 (10 runs). ``tiny`` — the
tests' dataset and ResNet-8, sync + async-4 + local-n2-h2, half an epoch each.
"""

import argparse
import dataclasses
import json
import os
import sys
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _p in (ROOT, HERE):
  if _p not in sys.path:
    sys.path.insert(0, _p)

import ml_collections  # noqa: E402

from anp_jax import plotting, runtime  # noqa: E402

import batch_size_sweep as bss  # noqa: E402  (config presets, overrides, resumable-run checks)
import report  # noqa: E402

ANP_TRAIN_IMAGES = 307_406  # MUSA2: 384,258 images, 80 % for training (shared/REFERENCES.md).
PAPER_PER_DEVICE_BATCH = 32


class ExperimentError(ValueError):
  """Bad input, reported before any training."""


@dataclasses.dataclass(frozen=True)
class Preset:
  base: str  # batch_size_sweep preset whose config this one starts from.
  batch: int
  epochs: float
  workers: Sequence[int]
  nodes: Sequence[int]
  sync_every: Sequence[int]
  aware: Sequence[bool]
  cpu_devices: int


PRESETS = {
    'cpu': Preset(base='cpu', batch=128, epochs=4.0, workers=(4, 8, 16), nodes=(4,),
                  sync_every=(1, 4, 16), aware=(False, True), cpu_devices=4),
    'tiny': Preset(base='tiny', batch=32, epochs=0.5, workers=(4,), nodes=(2,), sync_every=(2,),
                   aware=(False,), cpu_devices=8),
}


@dataclasses.dataclass(frozen=True)
class RunSpec:
  method: str  # 'sync', 'async', 'local_sgd'
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
    return f'local-n{self.nodes}-h{self.sync_every:02d}'


def grid(workers, aware, nodes, sync_every) -> List[RunSpec]:
  runs = [RunSpec('sync')]
  runs += [RunSpec('async', workers=n, aware=a) for n in workers for a in aware]
  runs += [RunSpec('local_sgd', nodes=k, sync_every=h) for k in nodes for h in sync_every]
  return runs


def run_config(base, spec: RunSpec) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(base.to_dict())
  c.method = spec.method
  if spec.method == 'async':
    c.async_sgd.staleness = 'simulated'
    c.async_sgd.workers = spec.workers
    c.async_sgd.max_tau = 2 * spec.workers
    c.async_sgd.staleness_aware_lr = spec.aware
  elif spec.method == 'local_sgd':
    c.local_sgd.nodes = spec.nodes
    c.local_sgd.sync_every = spec.sync_every
  return c


def predicted_epoch(spec: RunSpec, sync_devices: int):
  """(seconds per epoch, cluster description) on MinoTauro for ResNet-50 on the ANP split."""
  from anp_jax.research import perfmodel as pm
  workload = pm.resnet50(dataset_size=ANP_TRAIN_IMAGES)
  b = PAPER_PER_DEVICE_BATCH

  def cluster(devices):
    nodes = max(1, devices // 4)
    return pm.minotauro(nodes=nodes, devices_per_node=min(4, devices))

  if spec.method == 'sync':
    p = pm.predict(cluster(sync_devices), workload, b, method='sync')
  elif spec.method == 'async':
    p = pm.predict(cluster(spec.workers), workload, b, method='async')
  else:
    p = pm.predict(pm.minotauro(nodes=spec.nodes, devices_per_node=4), workload, b,
                   method='mixed', mixed_mode='local_sgd', local_steps=spec.sync_every)
  return p.epoch_time, f'{p.nodes}x{p.devices_per_node} K80, {p.description}'


def parse_args(argv):
  def ints(text):
    return [int(t) for t in text.split(',') if t.strip()]
  p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--preset', default='cpu', choices=sorted(PRESETS))
  p.add_argument('--out', required=True)
  p.add_argument('--epochs', type=float)
  p.add_argument('--workers', type=ints, help='Asynchronous worker counts N.')
  p.add_argument('--nodes', type=ints, help='Local-SGD node counts.')
  p.add_argument('--sync_every', type=ints, help='Local-SGD averaging periods H.')
  p.add_argument('--aware', choices=('both', 'on', 'off'),
                 help='Staleness-aware lr arms of the async runs.')
  p.add_argument('--sync_devices', type=int, default=16,
                 help='Devices of the predicted synchronous cluster.')
  p.add_argument('--cpu_devices', type=int)
  return bss.parse_with_overrides(p, argv)


def resolve(args, overrides):
  """(base config, runs) from the preset and flags; ExperimentError on bad input."""
  preset = PRESETS[args.preset]
  base = bss.preset_config(preset.base)
  base.batch_size = preset.batch
  base.num_epochs = preset.epochs if args.epochs is None else args.epochs
  base.num_train_steps = -1
  base.eval_every_epochs = 0.25 if args.preset == 'tiny' else 0.5
  base.checkpoint_every_minutes = 0
  base.progress_bar = False
  for key, _ in overrides:
    if key.split('.')[0] in ('method', 'async_sgd', 'local_sgd', 'batch_size'):
      raise ExperimentError(f'--config.{key} is set per run by the experiment; use its flags.')
  try:
    bss.apply_overrides(base, overrides, auto_accum=False)
  except bss.SweepError as e:
    raise ExperimentError(str(e)) from None
  if not base.num_epochs > 0:
    raise ExperimentError(f'--epochs must be > 0, got {base.num_epochs}.')
  workers = preset.workers if args.workers is None else args.workers
  nodes = preset.nodes if args.nodes is None else args.nodes
  every = preset.sync_every if args.sync_every is None else args.sync_every
  aware = preset.aware if args.aware is None else {
      'both': (False, True), 'on': (True,), 'off': (False,)}[args.aware]
  if any(n < 1 for n in workers) or any(k < 1 for k in nodes) or any(h < 1 for h in every):
    raise ExperimentError(f'--workers, --nodes and --sync_every must be >= 1, got {workers}, '
                          f'{nodes}, {every}.')
  if args.sync_devices < 1:
    raise ExperimentError(f'--sync_devices must be >= 1, got {args.sync_devices}.')
  return base, grid(workers, aware, nodes, every)


def plan(base, runs: Sequence[RunSpec], devices: int):
  """Per run: its config and setup, validated (and checked against an existing directory)."""
  from anp_jax.data import pipeline
  from anp_jax.setup import resolve_setup, validate_config
  builder = pipeline.get_builder(base)
  meta = pipeline.dataset_meta(builder, base)
  plans = []
  for spec in runs:
    config = run_config(base, spec)
    try:
      validate_config(config)
      setup = resolve_setup(config, meta.train_size, meta.eval_size, devices=devices)
    except ValueError as e:
      raise ExperimentError(f'Run {spec.name}: {e}') from None
    config.checkpoint_every_steps = setup.steps(1.0, minimum=1)
    config.log_every_steps = max(1, min(int(config.log_every_steps),
                                        setup.steps(0.25, rounding='floor')))
    plans.append((spec, config, setup))
  return plans


def summarize(out: str, spec: RunSpec, setup, sync_devices: int) -> Optional[Dict]:
  run_dir = os.path.join(out, 'runs', spec.name)
  final_path = os.path.join(run_dir, 'final_metrics.json')
  if not os.path.exists(final_path):
    return None
  with open(final_path) as f:
    final = json.load(f)
  evals = [r for r in report.read_metrics(run_dir) if 'eval/anp_top1' in r]
  epoch_s, cluster = predicted_epoch(spec, sync_devices)
  curve = [{'epoch': r['step'] / setup.steps_per_epoch, 'top1': r['eval/anp_top1'],
            'loss': r['eval/loss'], 'hours': r['step'] / setup.steps_per_epoch * epoch_s / 3600}
           for r in evals]
  return {'name': spec.name, **dataclasses.asdict(spec), 'batch': setup.batch_size,
          'steps': setup.total_steps, 'epochs': setup.total_steps / setup.steps_per_epoch,
          'final_top1': final.get('eval/anp_top1'), 'final_loss': final.get('eval/loss'),
          'best_top1': max((c['top1'] for c in curve), default=None),
          'diverged': bool(final.get('diverged')), 'wall_time_s': final.get('wall_time_s'),
          'predicted_epoch_s': epoch_s, 'predicted_cluster': cluster, 'curve': curve}


def plot(rows, out: str):
  plt = plotting.pyplot()
  paths = []
  for key, xlabel, fname in (('epoch', 'epochs', 'accuracy_vs_epochs.png'),
                             ('hours', 'predicted wall time on MinoTauro (h, ResNet-50)',
                              'accuracy_vs_time.png')):
    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    for r in rows:
      style = '-' if r['method'] == 'sync' else ('--' if r['method'] == 'async' else ':')
      ax.plot([c[key] for c in r['curve']], [100 * c['top1'] for c in r['curve']], style,
              marker='o', markersize=3, label=r['name'])
    ax.set_xlabel(xlabel)
    ax.set_ylabel('eval ANP top-1 (%)')
    if key == 'hours':
      ax.set_xscale('log')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    paths.append(plotting.save_figure(fig, os.path.join(out, fname)))
  return paths


def write_summary(rows, out: str, base, sync_devices: int) -> str:
  lines = ['# Sync vs simulated async vs local SGD', '',
           f'Proxy: {base.model.name} width {base.model.width}, {base.image_size} px generated '
           f'ANP data, {rows[0]["batch"] if rows else "?"} examples per update, '
           f'{base.num_epochs:g} epochs, {base.optimizer}, base lr {base.base_lr:g} per '
           f'{base.base_batch_size} ({base.lr_scaling}), {base.schedule} schedule.',
           f'Predicted time: ResNet-50 on {ANP_TRAIN_IMAGES:,} ANP training images, '
           f'{PAPER_PER_DEVICE_BATCH} images per K80 device/worker on MinoTauro; sync on '
           f'{sync_devices} devices. The accuracy curves come from the proxy, the times from '
           '`anp_jax.research.perfmodel` (see the script docstring).', '',
           '| run | final top-1 | best top-1 | predicted epoch | time for the run | cluster |',
           '|---|---|---|---|---|---|']
  for r in rows:
    top1 = 'diverged' if r['diverged'] else f'{100 * r["final_top1"]:.2f} %'
    best = '' if r['best_top1'] is None else f'{100 * r["best_top1"]:.2f} %'
    lines.append(f'| {r["name"]} | {top1} | {best} | {r["predicted_epoch_s"] / 60:.1f} min | '
                 f'{r["epochs"] * r["predicted_epoch_s"] / 3600:.2f} h | '
                 f'{r["predicted_cluster"]} |')
  lines += ['', '![accuracy vs epochs](accuracy_vs_epochs.png)',
            '![accuracy vs predicted time](accuracy_vs_time.png)', '']
  path = os.path.join(out, 'summary.md')
  bss._atomic_write(path, '\n'.join(lines))
  return path


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  try:
    args, overrides = parse_args(argv)
    preset = PRESETS[args.preset]
    bss._simulate_cpu_devices(preset.cpu_devices if args.cpu_devices is None
                              else args.cpu_devices)
    from anp_jax import distributed
    distributed.initialize()
    import jax
    from anp_jax import errors, preemption, trainer
    preemption.install()  # From here on, SIGTERM/SIGUSR1 mean "checkpoint and exit 75".
    base, runs = resolve(args, overrides)
    plans = plan(base, runs, jax.device_count())
    out = os.path.abspath(os.path.expanduser(args.out))
    for spec, config, _ in plans:
      bss.check_existing(os.path.join(out, 'runs', spec.name), config)
  except (ExperimentError, bss.SweepError) as e:
    print(f'ERROR: {e}', file=sys.stderr, flush=True)
    return 2
  is_main = jax.process_index() == 0
  for i, (spec, config, setup) in enumerate(plans, 1):
    run_dir = os.path.join(out, 'runs', spec.name)
    if os.path.exists(os.path.join(run_dir, 'final_metrics.json')):
      if is_main:
        print(f'[{i}/{len(plans)}] {spec.name}: finished earlier, skipped.', flush=True)
      continue
    preemption.exit_if_requested(f'[{i}/{len(plans)}] {spec.name}')  # A signal between runs.
    if is_main:
      print(f'[{i}/{len(plans)}] {spec.name}: {setup.describe()}', flush=True)
    try:
      result = trainer.train_and_evaluate(config, run_dir)
    except errors.NonFiniteLossError as e:
      if is_main:
        bss._atomic_write(os.path.join(run_dir, 'final_metrics.json'),
                          json.dumps({'diverged': True, 'error': str(e)}))
        print(f'[{i}/{len(plans)}] {spec.name}: diverged ({e})', flush=True)
      continue
    if is_main:
      print(f'[{i}/{len(plans)}] {spec.name}: ANP top-1 '
            f'{100 * result.final_eval["eval/anp_top1"]:.2f} % in {result.wall_time_s:.0f} s',
            flush=True)
  if is_main:
    rows = [r for r in (summarize(out, s, st, args.sync_devices) for s, _, st in plans) if r]
    bss._atomic_write(os.path.join(out, 'results.json'), json.dumps(rows, indent=2))
    plot(rows, out)
    print(f'Summary: {write_summary(rows, out, base, args.sync_devices)}', flush=True)
  return 0


if __name__ == '__main__':
  runtime.configure()
  sys.exit(main())
