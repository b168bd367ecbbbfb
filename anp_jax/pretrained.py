"""Fine-tuning from pretrained weights: ``config.init_from``, ``init_exclude``, ``freeze``,
``backbone_lr_multiplier``.

``config.init_from`` (empty: train from scratch) names a local file or directory; nothing is
downloaded. Three sources are understood:

* an anp_jax run: its workdir, its ``checkpoints`` folder or one ``checkpoints/<step>`` folder.
  Parameters and BatchNorm statistics are taken (a local-SGD run's node replicas are averaged),
  not the optimizer state or the step;
* a torchvision / timm ResNet state dict (v1.5 naming: ``conv1``, ``bn1``, ``layerN.M.convK``,
  ``layerN.M.bnK``, ``layerN.M.downsample.0/1``, ``fc``) as ``.safetensors`` (read through the
  ``safetensors`` package's NumPy API: PyTorch is not needed) or ``.pth``/``.pt`` (PyTorch is
  imported only then). Conv kernels OIHW -> HWIO, the ``fc`` matrix is transposed, BN
  ``weight``/``bias`` -> ``scale``/``bias`` and ``running_mean``/``running_var`` -> the
  ``batch_stats`` collection; ``num_batches_tracked`` has no counterpart and is ignored.

Everything is read and checked on the host (`load`) before anything compiles: a missing or
unreadable file, an unknown format, another architecture (the first mismatching names and shapes
are listed) and non-finite values are `InitFromError` (a ValueError: exit code 2). Heads
(``head_*``) whose shape differs from the file's (1000 ImageNet classes vs N ANPs) or that the
file lacks keep their fresh initialisation; ``config.init_exclude`` (regexes that must match a
whole name such as ``head_anp/kernel`` or ``BasicBlock_0/BatchNorm_0/mean``, as big_vision's
``dont_load``) keeps any other name fresh. `LoadedWeights.report` is the start-up line.

`place` writes the loaded values into a fresh state with the state's own shardings (jit, pmap,
local SGD's node axis, async's parameter history), so every process of a job reads the same file
and ends with the same state. The trainer calls it only for a fresh run: a checkpoint in the
workdir wins (resume), and ``init_from`` is part of the checkpoint identity.

Fine-tuning knobs (they also work without ``init_from``):

* ``config.freeze``: a regex (full match on parameter names); matching parameters get a zero
  update (`optax.multi_transform` with `optax.set_to_zero`), and the BatchNorm layers whose
  ``scale`` is frozen behave as torchvision's ``FrozenBatchNorm2d``: they normalise with their
  running statistics in training too (`anp_jax.models.BatchNorm`), which never change.
* ``config.backbone_lr_multiplier``: the parameters loaded from ``init_from`` train at
  ``multiplier x`` the schedule's rate; re-initialised heads at the full rate.
"""

import dataclasses
import json
import os
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np
import optax

from anp_jax import cli, collectives, models, optim, runtime
from anp_jax.errors import InitFromError
from anp_jax.param_names import (abstract_variables, compile_patterns, example_names,  # noqa: F401
                                 flatten, is_frozen_batchnorm, is_head, matches, natural,
                                 path_name)

TORCH_EXTENSIONS = ('.pth', '.pt')
SAFETENSORS_EXTENSIONS = ('.safetensors',)
PIP_TORCH = ('pip install torch --index-url https://download.pytorch.org/whl/cpu  '
             '(or convert the file once, elsewhere, to .safetensors: see the README)')
# How many mismatching names an architecture error lists.
MAX_LISTED = 8


# ----------------------------------------------------------------------------------------------
# Checks.


def validate(config) -> None:
  """Cheap checks of the fine-tuning fields (no file is read; exit code 2 on failure)."""
  compile_patterns('init_exclude', config.init_exclude)
  if not isinstance(config.freeze, str):
    raise InitFromError(f"config.freeze={config.freeze!r}: use one regex string (alternatives "
                        "with '|', e.g. 'conv_init/.*|bn_init/.*'); '' freezes nothing.")
  compile_patterns('freeze', config.freeze)
  mult = config.backbone_lr_multiplier
  if not (isinstance(mult, (int, float)) and mult >= 0):
    raise InitFromError(f'config.backbone_lr_multiplier={mult!r}: use a number >= 0 (the '
                        'fraction of the learning rate for loaded parameters).')
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
    _source_kind(path)


# ----------------------------------------------------------------------------------------------
# Reading sources (host numpy).


def _source_kind(path: str) -> str:
  if os.path.isdir(path):
    return 'anp_jax'
  lower = path.lower()
  if lower.endswith(SAFETENSORS_EXTENSIONS):
    return 'safetensors'
  if lower.endswith(TORCH_EXTENSIONS):
    return 'torch'
  raise InitFromError(f'config.init_from={path!r}: unknown format. Use a .safetensors or '
                      '.pth/.pt torchvision-style ResNet state dict, or an anp_jax workdir / '
                      'checkpoint folder.')


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
  """A .safetensors file as {name: numpy array}, without PyTorch."""
  try:
    from safetensors.numpy import load_file
  except ImportError as e:
    raise InitFromError('Reading .safetensors needs the safetensors package: pip install '
                        'safetensors (see requirements.txt).') from e
  try:
    return dict(load_file(path))
  except Exception as e:  # Truncated or not a safetensors file at all.
    raise InitFromError(f'config.init_from={path!r} is not a readable .safetensors file '
                        f'({type(e).__name__}: {e}).') from e


def read_torch(path: str) -> Dict[str, np.ndarray]:
  """A .pth/.pt state dict (optionally under 'state_dict'/'model', 'module.' prefixes) as numpy."""
  try:
    import torch
  except ImportError as e:
    raise InitFromError(f'config.init_from={path!r} is a PyTorch file, and PyTorch is not '
                        f'installed. Install it: {PIP_TORCH}.') from e
  try:
    obj = torch.load(path, map_location='cpu', weights_only=True)
  except Exception as e:
    raise InitFromError(f'config.init_from={path!r} is not a readable PyTorch state dict '
                        f'({type(e).__name__}: {e}).') from e
  for key in ('state_dict', 'model', 'model_state_dict'):
    if isinstance(obj, dict) and isinstance(obj.get(key), dict):
      obj = obj[key]
  if not isinstance(obj, dict) or not all(torch.is_tensor(v) for v in obj.values()):
    raise InitFromError(f'config.init_from={path!r} does not hold a state dict of tensors '
                        f'(found {type(obj).__name__}); save model.state_dict().')
  out = {}
  for name, t in obj.items():
    name = name[len('module.'):] if name.startswith('module.') else name
    t = t.detach().cpu()
    if t.is_floating_point() and t.dtype != torch.float64:
      t = t.float()  # bfloat16/float16 files: numpy has no bfloat16.
    out[name] = t.numpy()
  return out


def find_checkpoint(path: str) -> str:
  """An anp_jax workdir / checkpoints folder / step folder -> the step folder to read."""
  candidates = [path, os.path.join(path, 'checkpoints')]
  if os.path.isdir(os.path.join(path, 'state')):
    return path
  for folder in candidates:
    if os.path.isdir(folder):
      steps = [int(n) for n in os.listdir(folder)
               if n.isdigit() and os.path.isdir(os.path.join(folder, n, 'state'))]
      if steps:
        return os.path.join(folder, str(max(steps)))
  raise InitFromError(f'config.init_from={path!r} is a folder without anp_jax checkpoints '
                      '(expected WORKDIR/checkpoints/<step>/state). Give a workdir of a run that '
                      'saved a checkpoint, or a .safetensors/.pth file.')


def read_anp_jax(path: str) -> Dict[str, np.ndarray]:
  """Params and BN statistics of an anp_jax checkpoint as {'params/..': array, ...}."""
  import orbax.checkpoint as ocp
  step_dir = find_checkpoint(path)
  method = 'sync'
  try:
    with open(os.path.join(step_dir, 'meta', 'metadata')) as f:
      method = json.load(f).get('identity', {}).get('method', 'sync')
  except (OSError, ValueError):
    pass
  try:
    checkpointer = ocp.PyTreeCheckpointer()
    state_dir = os.path.join(step_dir, 'state')
    tree = checkpointer.metadata(state_dir).item_metadata.tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    state = checkpointer.restore(state_dir, restore_args=args)
  except Exception as e:
    raise InitFromError(f'config.init_from={path!r}: the checkpoint {step_dir} could not be '
                        f'read ({type(e).__name__}: {e}).') from e
  out = {}
  for collection in ('params', 'batch_stats'):
    for name, value in flatten(state.get(collection) or {}).items():
      value = np.asarray(value)
      if method == 'local_sgd':  # One replica per node: their average.
        value = collectives.replica_mean(value)
      out[f'{collection}/{name}'] = value
  return out


# ----------------------------------------------------------------------------------------------
# torchvision naming.

_BN_LEAF = {'scale': 'weight', 'bias': 'bias', 'mean': 'running_mean', 'var': 'running_var'}


def resnet_names() -> List[str]:
  """The registered models that torchvision's ResNet naming fits (the 'resnet' family)."""
  return [n for n in models.names() if models.spec(n).family == 'resnet']


def _resnet_arch(name: str):
  """The `resnet.ResNetArch` of registered model `name`; InitFromError if it is no ResNet."""
  spec = models.spec(name)
  if spec.family != 'resnet':
    raise InitFromError(f'config.model.name={name!r} is not a ResNet: torchvision-style weight '
                        f'files fit the ResNet family only ({", ".join(resnet_names())}); use '
                        'an anp_jax run of this model as config.init_from.')
  return spec.arch


def torchvision_name(arch: str, collection_name: str) -> Optional[str]:
  """anp_jax name (``'params/BasicBlock_3/Conv_0/kernel'``) -> torchvision's, or None (no
  counterpart: the adjective and noun heads)."""
  stage_sizes = _resnet_arch(arch).stage_sizes
  _, name = collection_name.split('/', 1)
  parts = name.split('/')
  leaf = parts[-1]
  if parts[0] == 'conv_init':
    return 'conv1.weight'
  if parts[0] == 'bn_init':
    return 'bn1.' + _BN_LEAF[leaf]
  if parts[0] == 'head_anp':
    return 'fc.' + {'kernel': 'weight', 'bias': 'bias'}[leaf]
  if parts[0].startswith('head_'):
    return None
  block = re.fullmatch(r'(?:BasicBlock|BottleneckBlock)_(\d+)', parts[0])
  if not block or len(parts) != 3:
    raise InitFromError(f'No torchvision name for the parameter {collection_name!r}.')
  k = int(block.group(1))
  stage = 0
  while k >= stage_sizes[stage]:
    k -= stage_sizes[stage]
    stage += 1
  prefix = f'layer{stage + 1}.{k}.'
  module = parts[1]
  if module == 'conv_proj':
    return prefix + 'downsample.0.weight'
  if module == 'norm_proj':
    return prefix + 'downsample.1.' + _BN_LEAF[leaf]
  index = int(module.rsplit('_', 1)[1]) + 1
  if module.startswith('Conv_'):
    return f'{prefix}conv{index}.weight'
  return f'{prefix}bn{index}.' + _BN_LEAF[leaf]


def _relayout(value: np.ndarray, conv_axes) -> np.ndarray:
  if value.ndim == 4:
    return np.transpose(value, conv_axes)
  if value.ndim == 2:
    return value.T
  return value


def from_torch_layout(value: np.ndarray) -> np.ndarray:
  """OIHW conv kernels -> HWIO; (out, in) Linear weights -> (in, out) Dense kernels."""
  return _relayout(value, (2, 3, 1, 0))


def to_torch_layout(value: np.ndarray) -> np.ndarray:
  """The inverse of `from_torch_layout`: HWIO -> OIHW, (in, out) -> (out, in)."""
  return _relayout(value, (3, 2, 0, 1))


def to_torchvision(arch: str, variables) -> Dict[str, np.ndarray]:
  """anp_jax variables -> a torchvision-named state dict (numpy), e.g. to export a fine-tuned
  backbone; `load` inverts it. The adjective/noun heads have no torchvision name and are
  dropped."""
  out = {}
  for collection in ('params', 'batch_stats'):
    for name, value in flatten(variables.get(collection, {})).items():
      tv = torchvision_name(arch, f'{collection}/{name}')
      if tv is not None:
        out[tv] = np.ascontiguousarray(to_torch_layout(np.asarray(value, np.float32)))
  return out


def guess_torchvision_arch(names: Sequence[str]) -> str:
  """'resnet50' etc. from the block counts of a torchvision state dict (for error messages)."""
  blocks: Dict[int, set] = {}
  for n in names:
    m = re.match(r'layer(\d+)\.(\d+)\.', n)
    if m:
      blocks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
  sizes = tuple(len(blocks[s]) for s in sorted(blocks))
  kind = 'bottleneck' if any('.conv3.' in n for n in names) else 'basic'
  for name in resnet_names():
    arch = models.spec(name).arch
    if tuple(arch.stage_sizes) == sizes and arch.block == kind:
      return name
  return f'an unknown ResNet ({kind} blocks per stage {sizes})'


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
  kind = _source_kind(path)
  if kind == 'anp_jax':
    raw = read_anp_jax(path)
    source_name = lambda name: name
    transform = lambda v: v
  else:
    raw = read_safetensors(path) if kind == 'safetensors' else read_torch(path)
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
  unknown = [n for n in sorted(raw, key=natural) if n not in used and not n.endswith('num_batches_tracked')
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


def freeze_summary(config, model, image_size: Optional[int] = None) -> str:
  """The start-up line of config.freeze ('' if unset); `InitFromError` (exit 2) if it matches
  no parameter, e.g. torchvision names ('layer1\\..*') or a pattern without '/.*', which
  would otherwise train everything without a word."""
  freeze = compile_patterns('freeze', config.freeze)
  if not freeze:
    return ''
  variables = abstract_variables(model, image_size or config.image_size)
  params = flatten(variables['params'])
  frozen = {n: leaf for n, leaf in params.items() if matches(freeze, n)}
  if not frozen:
    raise InitFromError(
        f'config.freeze={config.freeze!r} matches no parameter: it must match whole anp_jax '
        f'names such as {example_names(sorted(params, key=natural))} (not torchvision names); '
        "e.g. 'conv_init/.*|bn_init/.*|BasicBlock_0/.*'.")
  count = sum(int(np.prod(leaf.shape)) for leaf in frozen.values())
  total = sum(int(np.prod(leaf.shape)) for leaf in params.values())
  frozen_bn = sorted({n.rsplit('/', 1)[0] for n in flatten(variables.get('batch_stats', {}))
                      if is_frozen_batchnorm(freeze, n.rsplit('/', 1)[0])})
  return (f'freeze {config.freeze!r}: {len(frozen)} of {len(params)} parameter arrays '
          f'({count:,} of {total:,} parameters) get no update; {len(frozen_bn)} BatchNorm '
          'layers normalise with their running statistics, in training too, and keep them')


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


# ----------------------------------------------------------------------------------------------
# Optimizer partition and frozen BN statistics.

FROZEN, BACKBONE, FULL = 'frozen', 'backbone', 'full'


def param_labels(config, loaded: Optional[LoadedWeights] = None) -> Callable:
  """params -> a tree of FROZEN / BACKBONE (loaded, scaled rate) / FULL labels."""
  freeze = compile_patterns('freeze', config.freeze)
  mult = float(config.backbone_lr_multiplier)
  backbone = loaded.loaded_params if (loaded is not None and mult != 1.0) else set()

  def labels(params):
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    out = []
    for path, _ in flat:
      name = path_name(path)
      out.append(FROZEN if matches(freeze, name) else BACKBONE if name in backbone else FULL)
    return jax.tree_util.tree_unflatten(treedef, out)
  return labels


def create_optimizer(config, schedule: optax.Schedule,
                     loaded: Optional[LoadedWeights] = None) -> optax.GradientTransformation:
  """`optim.create_optimizer`, partitioned by `param_labels` when freeze / a multiplier is set
  (otherwise exactly it, with the same optimizer-state layout).

  ``config.grad_clip_norm`` clips once, by the global norm of the trained parameters' gradients
  (frozen ones have none, as with PyTorch's ``requires_grad=False``), before the partition:
  clipping each group by its own norm would change the heads' rate relative to the backbone's
  whenever the backbone's gradient is the large one.
  """
  mult = float(config.backbone_lr_multiplier)
  if not config.freeze and (mult == 1.0 or loaded is None):
    return optim.create_optimizer(config, schedule)
  labels = param_labels(config, loaded)
  transforms = {FULL: optim.create_optimizer(config, schedule, clip=False),
                FROZEN: optax.set_to_zero(),
                BACKBONE: optim.create_optimizer(config, lambda step: mult * schedule(step),
                                                 clip=False)}
  tx = optax.multi_transform(transforms, labels)
  if config.grad_clip_norm:
    drop_frozen = optax.multi_transform(
        {FULL: optax.identity(), BACKBONE: optax.identity(), FROZEN: optax.set_to_zero()}, labels)
    tx = optax.chain(drop_frozen, optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx


def keep_frozen_params(config, old_params, new_params):
  """Parameters matching config.freeze as they were in ``old_params``: local SGD's node average
  of n equal float32 copies, (x + ... + x) / n, is not x when n is not a power of two, and
  frozen parameters must not move at all. Static: decided from names at trace time."""
  freeze = compile_patterns('freeze', config.freeze)
  if not freeze:
    return new_params
  return jax.tree_util.tree_map_with_path(
      lambda path, old, new: old if matches(freeze, path_name(path)) else new,
      old_params, new_params)


def keep_frozen_stats(config, old_stats, new_stats):
  """Running statistics of frozen BatchNorm layers (`is_frozen_batchnorm`) as they were in
  ``old_stats``. A frozen layer never updates them (`anp_jax.models.BatchNorm`), but averaging
  n equal float32 copies (over devices, micro-batches or local SGD's nodes) is not bit-exact
  when n is not a power of two. Static: decided from names at trace time."""
  freeze = compile_patterns('freeze', config.freeze)
  if not freeze:
    return new_stats

  def pick(path, old, new):
    return old if is_frozen_batchnorm(freeze, path_name(path).rsplit('/', 1)[0]) else new
  return jax.tree_util.tree_map_with_path(pick, old_stats, new_stats)


# ----------------------------------------------------------------------------------------------
# Command line: check or convert a file.


def main(argv=None) -> int:
  """``python -m anp_jax.pretrained FILE --model resnet50 [--to-safetensors OUT]``."""
  import argparse
  import math
  import sys
  from anp_jax.configs import default
  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument('source', help='.safetensors/.pth file or anp_jax workdir')
  parser.add_argument('--model', default='resnet50', choices=resnet_names())
  parser.add_argument('--width', type=float, default=1.0)
  parser.add_argument('--num_anps', type=int, default=553)
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--to-safetensors', dest='out', default='',
                      help='also write the (torchvision-named, float32) state dict here')
  args = parser.parse_args(argv)

  def usage(message: str) -> int:
    print(f'ERROR: {message}', file=sys.stderr, flush=True)
    return 2

  # Before the (possibly long) load: what the flags alone say is wrong.
  for flag, value, low in (('--num_anps', args.num_anps, 1), ('--image_size', args.image_size, 1)):
    if value < low:
      return usage(f'{flag}={value} is out of range: use an integer >= {low}.')
  if not (args.width > 0 and math.isfinite(args.width)):
    return usage(f'--width={args.width} is out of range: use a number > 0 (1.0: the standard '
                 'widths).')
  if args.out:
    args.out = os.path.expanduser(args.out)
    try:
      kind = _source_kind(os.path.expanduser(args.source))
    except InitFromError as e:
      return usage(str(e))
    if kind not in ('safetensors', 'torch'):
      return usage(f'--to-safetensors converts torchvision-style files (.safetensors, .pth/.pt) '
                   f'only, not the {kind} workdir {args.source!r}; drop --to-safetensors.')
    message = cli.output_file_error('--to-safetensors', args.out, 'safetensors file',
                                    'model.safetensors')
    if message:
      return usage(message)
  config = default.get_config()
  config.update(dict(init_from=args.source, init_exclude=(), freeze='',
                     backbone_lr_multiplier=1.0, image_size=args.image_size))
  config.model.update(dict(name=args.model, width=args.width))
  model = models.create_model(config, models.Heads(args.num_anps))
  try:
    loaded = load(config, model)
  except InitFromError as e:
    print(f'ERROR: {e}')
    return 2
  print(loaded.report)
  if args.out:
    from safetensors.numpy import save_file
    # `kind` is 'safetensors' or 'torch': anything else was refused before the load.
    raw = read_safetensors(args.source) if kind == 'safetensors' else read_torch(args.source)
    try:
      save_file({k: np.ascontiguousarray(v) for k, v in raw.items()}, args.out)
    except OSError as e:
      return usage(f'--to-safetensors={args.out}: cannot write it ({e}).')
    print(f'wrote {args.out}')
  return 0


if __name__ == '__main__':
  runtime.configure(tensorflow=False)
  raise SystemExit(main())
