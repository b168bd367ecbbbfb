"""Matching ``config.init_from`` to a model (`load`) and writing it into a state (`place`).

Everything is read and checked on the host before anything compiles: a missing or unreadable
file, an unknown format, another architecture (the first mismatching names and shapes are
listed) and non-finite values are `InitFromError` (exit code 2). Heads (``head_*``) whose shape
differs from the file's (1000 ImageNet classes vs N ANPs) or that the file lacks keep their
fresh initialisation; ``config.init_exclude`` (regexes that must match a whole name such as
``head_anp/kernel`` or ``BasicBlock_0/BatchNorm_0/mean``, as big_vision's ``dont_load``) keeps
any other name fresh. `LoadedWeights.report` is the start-up line.

`place` writes the loaded values into a fresh state with the state's own shardings (jit, pmap,
local SGD's node axis, async's parameter history), so every process of a job reads the same file
and ends with the same state.
"""

import dataclasses
import os
from typing import Dict, List, Optional

import jax
import numpy as np

from anp_jax.errors import InitFromError
from anp_jax.param_names import (abstract_variables, compile_patterns, example_names, flatten,
                                 is_head, matches, natural, path_name)
from anp_jax.pretrained.sources import read_source, source_kind
from anp_jax.pretrained.torchvision_names import (from_torch_layout, guess_torchvision_arch,
                                                  torchvision_name)

# How many mismatching names an architecture error lists.
MAX_LISTED = 8


def validate(config) -> None:
  """Cheap checks of ``config.init_from`` and ``init_exclude`` (no file is read; exit code 2).
  ``config.freeze`` and ``backbone_lr_multiplier`` are the optimizer's (`optim.validate`)."""
  compile_patterns('init_exclude', config.init_exclude)
  mult = config.backbone_lr_multiplier
  source = config.init_from
  if mult != 1.0 and not source:
    raise InitFromError('config.backbone_lr_multiplier applies to parameters loaded from '
                        'config.init_from, which is empty; set init_from or leave the '
                        'multiplier at 1.0.')
  if source:
    path = os.path.expanduser(source)
    if not os.path.exists(path):
      raise InitFromError(f'config.init_from={source!r} does not exist. Give the path of a '
                          'downloaded .safetensors/.pth state dict or of an anp_jax workdir '
                          '(nothing is downloaded at run time).')
    source_kind(path)


# ----------------------------------------------------------------------------------------------
# Matching a source to the model.


@dataclasses.dataclass
class LoadedWeights:
  """Host arrays to write into a fresh state, and what was (not) taken from the source."""
  source: str
  kind: str  # 'anp_jax', 'safetensors' or 'torch'.
  values: Dict[str, np.ndarray]  # 'params/..' / 'batch_stats/..' -> array in the model's layout.
  reinitialised: List[str]  # Model names kept fresh: heads of another shape or not in the file.
  excluded: List[str]  # Model names kept fresh by config.init_exclude.
  ignored: List[str]  # Source names not used.
  report: str

  @property
  def loaded_params(self) -> set:
    return {n.split('/', 1)[1] for n in self.values if n.startswith('params/')}


def load(config, model, image_size: Optional[int] = None) -> LoadedWeights:
  """Reads config.init_from and matches it to `model` (abstract init: nothing compiles)."""
  source = config.init_from
  path = os.path.expanduser(source)
  validate(config)
  kind = source_kind(path)
  raw = read_source(path, kind)
  if kind == 'anp_jax':
    source_name = lambda name: name
    transform = lambda v: v
  else:
    source_name = lambda name: torchvision_name(config.model.name, name)
    transform = from_torch_layout
  target = abstract_variables(model, image_size or config.image_size)
  flat_target = {}
  for collection in ('params', 'batch_stats'):
    for name, leaf in flatten(target.get(collection, {})).items():
      flat_target[f'{collection}/{name}'] = leaf
  exclude = compile_patterns('init_exclude', config.init_exclude)
  shorts = [n.split('/', 1)[1] for n in flat_target]
  for pattern in exclude:
    if not any(pattern.fullmatch(n) for n in shorts):
      raise InitFromError(
          f"config.init_exclude pattern '{pattern.pattern}' matches no name of the model "
          f'(a regex that must match a whole model name such as {example_names(shorts)}; '
          "e.g. 'head_.*' or 'BasicBlock_0/.*').")

  values, reinit, excluded, used = {}, [], [], set()
  mismatched, missing = [], []
  # In the source's natural order (conv1, bn1, layer1.0..., fc), so errors list the first ones.
  order = sorted(flat_target, key=lambda n: natural(source_name(n) or n))
  for name in order:
    leaf = flat_target[name]
    src = source_name(name)
    short = name.split('/', 1)[1]
    if src is not None:
      used.add(src)
    if matches(exclude, short):
      excluded.append(short)
      continue
    if src is None or src not in raw:
      if is_head(short):
        reinit.append((short, None))
      else:
        missing.append(f'{src or short} (model {short} {tuple(leaf.shape)})')
      continue
    value = transform(raw[src])
    if tuple(value.shape) != tuple(leaf.shape):
      if is_head(short):
        reinit.append((short, (value.shape, leaf.shape)))
      else:
        mismatched.append(f'{src}: file {tuple(raw[src].shape)} -> {tuple(value.shape)} vs model '
                          f'{short} {tuple(leaf.shape)}')
      continue
    values[name] = np.asarray(value)
  unknown = [n for n in sorted(raw, key=natural)
             if n not in used and not n.endswith('num_batches_tracked')
             and not is_head(n.split('/', 1)[-1]) and not n.startswith('fc.')]
  if mismatched or missing or unknown:
    _raise_architecture(config, source, kind, raw, mismatched, missing, unknown)

  bad = [n for n, v in values.items()
         if np.issubdtype(v.dtype, np.floating) and not np.all(np.isfinite(v))]
  if bad:
    raise InitFromError(f'config.init_from={source!r} holds non-finite values (NaN/Inf) in '
                        f'{len(bad)} array(s): {", ".join(bad[:MAX_LISTED])}'
                        f'{" ..." if len(bad) > MAX_LISTED else ""}. Use a healthy checkpoint.')
  for name, leaf in flat_target.items():
    if name in values:
      values[name] = values[name].astype(leaf.dtype)
  values = {n: values[n] for n in flat_target if n in values}  # The model's (tree) order.

  loaded_sources = {source_name(n) for n in values}
  ignored = [n for n in sorted(raw, key=natural) if n not in loaded_sources]
  report = _report(source, kind, values, reinit, excluded, ignored)
  return LoadedWeights(source=source, kind=kind, values=values,
                       reinitialised=[n for n, _ in reinit], excluded=excluded, ignored=ignored,
                       report=report)


def _raise_architecture(config, source, kind, raw, mismatched, missing, unknown):
  if kind == 'anp_jax':
    hint = ('Use the model (config.model.name, width) of the run that wrote it, or exclude the '
            'differing names with config.init_exclude.')
  else:
    hint = (f'The file looks like {guess_torchvision_arch(list(raw))} (width as saved); set '
            'config.model.name (and width 1.0 for torchvision files) to match it.')
  lines = []
  for title, items in (('shape mismatches', mismatched), ('missing from the file', missing),
                       ('not in the model', unknown)):
    if items:
      more = f' ... ({len(items)} in all)' if len(items) > MAX_LISTED else ''
      lines.append(f'{title}: ' + '; '.join(items[:MAX_LISTED]) + more)
  raise InitFromError(f'config.init_from={source!r} does not fit config.model.name='
                      f'{config.model.name!r} (width {config.model.width}): '
                      + ' | '.join(lines) + f'. {hint}')


def _report(source, kind, values, reinit, excluded, ignored) -> str:
  count = sum(int(np.prod(v.shape)) for n, v in values.items() if n.startswith('params/'))
  parts = [f'init_from {source} ({kind}): loaded {len(values)} arrays '
           f'({count / 1e6:.3g} M parameters)']
  heads = {}
  for name, shapes in reinit:
    module = name.rsplit('/', 1)[0]
    if shapes is not None and name.endswith('kernel'):
      heads[module] = f'{module} ({shapes[1][-1]} vs {shapes[0][-1]} classes)'
    heads.setdefault(module, module)
  if heads:
    parts.append('re-initialised ' + ', '.join(
        heads[m] for m in sorted(heads, key=lambda m: (m != 'head_anp', m))))
  if excluded:
    modules = sorted({n.rsplit('/', 1)[0] for n in excluded})
    parts.append(f'kept fresh by init_exclude {len(excluded)} arrays ('
                 + ', '.join(modules[:MAX_LISTED]) + (' ...' if len(modules) > MAX_LISTED else '')
                 + ')')
  if ignored:
    tracked = [n for n in ignored if n.endswith('num_batches_tracked')]
    other = [n for n in ignored if n not in tracked]
    items = other[:MAX_LISTED] + (['...'] if len(other) > MAX_LISTED else [])
    if tracked:
      items.append(f'{len(tracked)} x num_batches_tracked')
    parts.append(f'ignored {len(ignored)} source arrays (' + ', '.join(items) + ')')
  return '; '.join(parts)


# ----------------------------------------------------------------------------------------------
# Writing into a state.


def _place_like(value: np.ndarray, like) -> jax.Array:
  """`value` broadcast to `like`'s shape (leading replica/node/history axes), placed with its
  sharding; every process passes the same value."""
  full = np.broadcast_to(np.asarray(value, like.dtype), like.shape)
  return jax.make_array_from_callback(like.shape, like.sharding, lambda index: full[index])


def place(state, loaded: LoadedWeights):
  """`state` (any executor's layout) with the loaded parameters and BN statistics written in.

  The async parameter history (all slots hold the initial parameters) is rewritten too; the
  optimizer state of a fresh run does not depend on the parameter values (zeros).
  """
  def replace(tree, collection):
    if tree is None:
      return None
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    new = []
    for path, leaf in flat:
      value = loaded.values.get(f'{collection}/{path_name(path)}')
      new.append(leaf if value is None else _place_like(value, leaf))
    return jax.tree_util.tree_unflatten(treedef, new)

  return state.replace(params=replace(state.params, 'params'),
                       batch_stats=replace(state.batch_stats, 'batch_stats'),
                       history=replace(getattr(state, 'history', None), 'params'))
