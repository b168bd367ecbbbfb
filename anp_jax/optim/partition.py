"""The fine-tuning partition: ``config.freeze`` and ``config.backbone_lr_multiplier``.

* ``config.freeze``: one regex (full match on parameter names, `anp_jax.param_names`);
  matching parameters get a zero update (`optax.multi_transform` with `optax.set_to_zero`). The
  BatchNorm layers whose ``scale`` is frozen behave as torchvision's ``FrozenBatchNorm2d``: the
  model normalises with their running statistics in training too (`anp_jax.models.BatchNorm`),
  and `keep_frozen_stats` keeps those statistics bit-exact.
* ``config.backbone_lr_multiplier``: the parameters loaded from ``config.init_from``
  (`anp_jax.pretrained`) train at ``multiplier x`` the schedule's rate; re-initialised heads at
  the full rate.

`create_optimizer` is the optimizer of every run: without freeze or multiplier exactly
`base_optimizer` (same optimizer-state layout).
"""

from typing import Callable, Collection, Optional

import jax
import numpy as np
import optax

from anp_jax.errors import InitFromError
from anp_jax.optim.optimizers import base_optimizer
from anp_jax.param_names import (abstract_variables, compile_patterns, example_names, flatten,
                                 is_frozen_batchnorm, matches, natural, path_name)

FROZEN, BACKBONE, FULL = 'frozen', 'backbone', 'full'


def validate(config) -> None:
  """Cheap checks of ``config.freeze`` and ``config.backbone_lr_multiplier`` (exit code 2)."""
  if not isinstance(config.freeze, str):
    raise InitFromError(f"config.freeze={config.freeze!r}: use one regex string (alternatives "
                        "with '|', e.g. 'conv_init/.*|bn_init/.*'); '' freezes nothing.")
  compile_patterns('freeze', config.freeze)
  mult = config.backbone_lr_multiplier
  if not (isinstance(mult, (int, float)) and mult >= 0):
    raise InitFromError(f'config.backbone_lr_multiplier={mult!r}: use a number >= 0 (the '
                        'fraction of the learning rate for loaded parameters).')


def param_labels(config, loaded_params: Optional[Collection[str]] = None) -> Callable:
  """params -> a tree of FROZEN / BACKBONE (loaded, scaled rate) / FULL labels.

  ``loaded_params``: names of the parameters loaded from config.init_from
  (`pretrained.LoadedWeights.loaded_params`), the backbone when the multiplier is not 1.
  """
  freeze = compile_patterns('freeze', config.get('freeze', ''))
  mult = float(config.get('backbone_lr_multiplier', 1.0))
  backbone = set(loaded_params) if (loaded_params is not None and mult != 1.0) else set()

  def labels(params):
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    out = []
    for path, _ in flat:
      name = path_name(path)
      out.append(FROZEN if matches(freeze, name) else BACKBONE if name in backbone else FULL)
    return jax.tree_util.tree_unflatten(treedef, out)
  return labels


def create_optimizer(config, schedule: optax.Schedule,
                     loaded_params: Optional[Collection[str]] = None
                     ) -> optax.GradientTransformation:
  """`base_optimizer`, partitioned by `param_labels` when config.freeze or a multiplier (with
  ``loaded_params``) is set; otherwise exactly `base_optimizer`, with its optimizer-state
  layout.

  ``config.grad_clip_norm`` clips once, by the global norm of the trained parameters' gradients
  (frozen ones have none, as with PyTorch's ``requires_grad=False``), before the partition:
  clipping each group by its own norm would change the heads' rate relative to the backbone's
  whenever the backbone's gradient is the large one.
  """
  mult = float(config.get('backbone_lr_multiplier', 1.0))
  if not config.get('freeze', '') and (mult == 1.0 or loaded_params is None):
    return base_optimizer(config, schedule)
  labels = param_labels(config, loaded_params)
  transforms = {FULL: base_optimizer(config, schedule, clip=False),
                FROZEN: optax.set_to_zero(),
                BACKBONE: base_optimizer(config, lambda step: mult * schedule(step), clip=False)}
  tx = optax.multi_transform(transforms, labels)
  if config.grad_clip_norm:
    drop_frozen = optax.multi_transform(
        {FULL: optax.identity(), BACKBONE: optax.identity(), FROZEN: optax.set_to_zero()}, labels)
    tx = optax.chain(drop_frozen, optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx


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
