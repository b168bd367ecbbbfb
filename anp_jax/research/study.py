"""What a study is: points over config fields, times seeds, times a learning-rate grid.

A **point** is a name and the config fields it sets (``('g016', {'bn_group_size': 16})``; dotted
keys for nested fields, ``'model.width'``): one thing the study compares. Every point is trained
at every **seed** (``config.seed``; the statistics are over seeds) and at every **learning-rate
multiplier** of ``config.base_lr`` (before the batch-size scaling rule). Per point, one rate is
chosen on the validation split (`anp_jax.research.study_results.choose_rates`); a chosen rate at
the edge of the rates tried extends the grid by a factor beyond that edge, at most
``LrGrid.extensions`` times per point, so that the optimum ends interior or the report says it
did not. Other fields may be **tuned** the same way (``tune``, e.g. ``{'warmup_epochs': (0.0,
1.0, 2.0)}``: every point runs at each combination of their values x every rate, and the
combination and rate with the best validation result are chosen together; the rate grid and its
extensions are shared by the combinations). A **run** is one (point, tuned values, multiplier,
seed): its directory ``runs/<name>``.

A study preset is one config file, ``anp_jax/configs/study_<name>.py``: ``get_config()`` the
run config every point starts from (its ``target_metric`` / ``target_value`` the target), and
``get_sweep()`` a dict with ``points`` (any iterable of (name, fields)), ``seeds``, ``lr_grid``,
``lr_extensions``, ``tune``, the time estimate's ``images_per_s`` / ``overhead_s`` and an optional
``registration`` (a JSON file the runner records before the first run and holds the study to:
`anp_jax.research.registration`) (`from_preset`).
Presets are plain config files (the core never imports ``anp_jax.research``).

This module imports no JAX: reports and the planner read studies without it.
"""

import dataclasses
import itertools
import math
import re
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from anp_jax.research import eval_seam


class StudyError(ValueError):
  """Bad study input, reported before any training (exit 2)."""


# The fields the runner itself sets per run: a point may not set them.
AXIS_FIELDS = ('seed', 'base_lr')
_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.+=-]*$')


@dataclasses.dataclass(frozen=True)
class LrGrid:
  """Multipliers of ``config.base_lr`` tried at every point; ``extensions`` factor steps beyond
  the edge where the chosen rate lies (0: the grid as given)."""
  multipliers: Tuple[float, ...] = (1.0,)
  extensions: int = 0
  factor: float = 2.0

  def __post_init__(self):
    mults = tuple(dict.fromkeys(float(m) for m in self.multipliers))
    object.__setattr__(self, 'multipliers', mults)
    if not mults or not all(math.isfinite(m) and m > 0 for m in mults):
      raise StudyError(f'The learning-rate grid needs multipliers > 0, got {list(mults)}.')
    if self.extensions < 0:
      raise StudyError(f'--lr_extensions must be >= 0, got {self.extensions}.')
    if not self.factor > 1:
      raise StudyError(f'The learning-rate extension factor must be > 1, got {self.factor}.')


def default_run_name(point: str, lr_mult: float, seed: int) -> str:
  """``<point>-lrx<multiplier>-s<seed>``: stable across invocations, so a finished run is found
  again (the batch-size sweep's names since its first version)."""
  return f'{point}-lrx{lr_mult:g}-s{seed}'


def tune_label(tune: Mapping[str, Any]) -> str:
  """Tuned values in a run name: {'warmup_epochs': 1.0} -> 'warmup_epochs1' ('' for none)."""
  return '-'.join(f'{k.rsplit(".", 1)[-1]}{v:g}' if isinstance(v, float) else
                  f'{k.rsplit(".", 1)[-1]}{v}' for k, v in tune.items())


@dataclasses.dataclass(frozen=True)
class RunKey:
  """One run of a study: a point with its tuned values (`tune`, also in `fields`) at one
  learning-rate multiplier and seed."""
  name: str
  point: str
  fields: Mapping[str, Any]
  lr_mult: float
  seed: int
  tune: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Study:
  """A study: its points, seeds and rate grid, its target, and how it reads and writes results.

  ``kind`` marks its ``--out`` directory (one directory holds one kind of study). The target is
  a validation accuracy (``target_metric``, e.g. 'eval/anp_top1') and ``target_value``; runs are
  compared on steps to it and on the final ``metrics`` (names without a prefix, e.g.
  'anp_top1'), published on the test split when the runs evaluated one. The optional callables
  let a study keep its own result formats (the batch-size sweep and sync/async/mixed do): 
  ``summarize(run_dir, record) -> row``, ``write(out, rows, points) -> [paths]``,
  ``report(out) -> path``, ``record_extra(run) -> dict`` (more keys in the run's record), and
  ``fields_of_record(record) -> fields`` (records written before they held their fields).
  """
  kind: str
  points: Tuple[Tuple[str, Mapping[str, Any]], ...]
  target_value: float
  target_metric: str = eval_seam.DEFAULT_TARGET_METRIC
  seeds: Tuple[int, ...] = (0,)
  lr: LrGrid = LrGrid()
  tune: Tuple[Tuple[str, Tuple[Any, ...]], ...] = ()  # Fields chosen with the rate, per point.
  # Per point, multipliers that replace `lr`'s grid (e.g. the rate another study chose for it).
  point_lr: Tuple[Tuple[str, Tuple[float, ...]], ...] = ()
  metrics: Tuple[str, ...] = ('anp_top1',)
  run_name: Callable[[str, float, int], str] = default_run_name
  checkpoint_every_epochs: float = 1.0
  log_every_epochs: float = 0.25
  images_per_s: float = 0.0
  overhead_s: float = 20.0
  cpu_devices: int = 0
  title: str = ''
  read_other_runs: bool = True  # Results include runs under --out that this invocation did not
  # plan (studies split over jobs add up); False: only the planned ones.
  summarize: Optional[Callable] = None
  write: Optional[Callable] = None
  report: Optional[Callable] = None
  record_extra: Optional[Callable] = None
  fields_of_record: Optional[Callable] = None
  # The study's registration file (repository-relative JSON: what it measures and how it is
  # judged), recorded in --out before its first run (`anp_jax.research.registration`); '': none.
  registration: str = ''

  def __post_init__(self):
    points = tuple((str(name), dict(fields)) for name, fields in self.points)
    object.__setattr__(self, 'points', points)
    object.__setattr__(self, 'seeds', tuple(dict.fromkeys(int(s) for s in self.seeds)))
    if not points:
      raise StudyError('The study has no points: give at least one (name, {field: value}).')
    if not self.seeds:
      raise StudyError('The study has no seeds: give at least one.')
    names = [name for name, _ in points]
    bad = [n for n in names if not _NAME.match(n)]
    if bad:
      raise StudyError(f'Point names become directory names: use letters, digits and _ . + = -, '
                       f'got {bad}.')
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
      raise StudyError(f'Point names must be unique, got {repeated} more than once.')
    point_lr = tuple((str(k), LrGrid(tuple(v)).multipliers) for k, v in (
        self.point_lr.items() if isinstance(self.point_lr, Mapping) else self.point_lr))
    object.__setattr__(self, 'point_lr', point_lr)
    unknown = sorted({k for k, _ in point_lr} - set(names))
    if unknown:
      raise StudyError(f'Learning rates are given for {unknown}, which are not points of the '
                       f'study ({names}).')
    tune = tuple((str(k), tuple(v)) for k, v in (self.tune.items() if isinstance(
        self.tune, Mapping) else self.tune))
    object.__setattr__(self, 'tune', tune)
    for field, values in tune:
      if not values:
        raise StudyError(f'The tuned field {field!r} has no values.')
      if field in AXIS_FIELDS:
        raise StudyError(f'{field!r} is an axis of the study (seeds, lr_grid), not a tuned field.')
    for name, fields in points:
      both = sorted(set(fields) & {f for f, _ in tune})
      if both:
        raise StudyError(f'Point {name!r} sets {both}, which the study tunes: a field is either '
                         'compared (a point field) or tuned (chosen per point), not both.')
      axes = sorted(set(fields) & set(AXIS_FIELDS))
      if axes:
        raise StudyError(f'Point {name!r} sets {axes}: seeds and the learning rate are the '
                         'study\'s own axes (seeds, lr_grid), not point fields.')
    if not self.target_metric.startswith(eval_seam.VALIDATION_PREFIX) or not (
        self.target_metric.endswith('top1') or self.target_metric.endswith('top5')):
      raise StudyError(f'The target metric {self.target_metric!r} must be a validation accuracy '
                       "such as 'eval/anp_top1' (choices are made on the validation split).")
    value = self.target_value
    if not (isinstance(value, (int, float)) and 0.0 < value <= 1.0):
      raise StudyError(f'The target {value} is an unreachable target: an accuracy is a fraction '
                       'in (0, 1] (e.g. 0.25 for 25 %).')

  @property
  def point_fields(self) -> Dict[str, Mapping[str, Any]]:
    return dict(self.points)

  def grid_of(self, point: str) -> Tuple[float, ...]:
    """The multipliers a point starts from: its own (`point_lr`) or the study's grid."""
    return dict(self.point_lr).get(point, self.lr.multipliers)

  def settings(self) -> List[Dict[str, Any]]:
    """Every combination of the tuned fields' values ([{}] when nothing is tuned)."""
    fields = [f for f, _ in self.tune]
    return [dict(zip(fields, combo)) for combo in itertools.product(*(v for _, v in self.tune))]

  def runs(self, extended: Optional[Mapping[str, Sequence[float]]] = None) -> List[RunKey]:
    """Every run, point by point and tuned setting by setting: the grid's multipliers, then the
    point's extensions."""
    extended = extended or {}
    keys = []
    for point, fields in self.points:
      grid = self.grid_of(point)
      mults = list(grid) + [m for m in extended.get(point, ()) if m not in grid]
      for tune in self.settings():
        label = '-'.join(filter(None, (point, tune_label(tune))))
        for mult in mults:
          for seed in self.seeds:
            keys.append(RunKey(self.run_name(label, mult, seed), point, {**fields, **tune}, mult,
                               seed, tune))
    names = [k.name for k in keys]
    if len(set(names)) != len(names):
      raise StudyError('Two runs of the study get the same directory name: make run_name '
                       'depend on the point, the multiplier and the seed.')
    bad = sorted({n for n in names if not _NAME.match(n)})
    if bad:
      raise StudyError(f'Run names become directory names: use letters, digits and _ . + = -, '
                       f'got {bad[:3]} (tuned values in a name?).')
    return keys


# Keys of a preset's get_sweep() dict and the Study fields they fill.
PRESET_KEYS = ('points', 'seeds', 'lr_grid', 'lr_extensions', 'lr_factor', 'tune', 'metrics',
               'checkpoint_every_epochs', 'log_every_epochs', 'images_per_s', 'overhead_s',
               'cpu_devices', 'title', 'registration')


def from_preset(kind: str, sweep: Mapping[str, Any], config, *, seeds=None, lr_grid=None,
                lr_extensions=None) -> Study:
  """The Study of a preset: its get_sweep() dict (`PRESET_KEYS`), the target of its config
  (``target_metric`` / ``target_value``), and the command line's seeds / rate grid when given.
  """
  unknown = sorted(set(sweep) - set(PRESET_KEYS))
  if unknown:
    raise StudyError(f'get_sweep() returned unknown keys {unknown}; known: {list(PRESET_KEYS)}.')
  if 'points' not in sweep:
    raise StudyError('get_sweep() must return "points": (name, {config field: value}) pairs.')
  metric, value = eval_seam.target(config)
  if value is None:
    raise StudyError('The preset config has no target: set config.target_value (a validation '
                     'accuracy in (0, 1]), e.g. --config.target_value=0.25.')
  lr = LrGrid(tuple(sweep.get('lr_grid', (1.0,)) if lr_grid is None else lr_grid),
              int(sweep.get('lr_extensions', 0) if lr_extensions is None else lr_extensions),
              float(sweep.get('lr_factor', 2.0)))
  other = {k: sweep[k] for k in ('tune', 'metrics', 'checkpoint_every_epochs', 'log_every_epochs',
                                 'images_per_s', 'overhead_s', 'cpu_devices', 'title',
                                 'registration') if k in sweep}
  return Study(kind=kind, points=tuple(_pairs(sweep['points'])), target_metric=metric,
               target_value=value, seeds=tuple(sweep.get('seeds', (0,)) if seeds is None
                                               else seeds), lr=lr, **other)


def _pairs(points: Iterable) -> List[Tuple[str, Mapping[str, Any]]]:
  out = []
  for item in points:
    if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], Mapping)):
      raise StudyError(f'A point is a (name, {{config field: value}}) pair, got {item!r}.')
    out.append((item[0], item[1]))
  return out
