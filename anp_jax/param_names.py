"""Names of a model's variables (``'BasicBlock_0/Conv_0/kernel'``) and the regexes config fields
match against them.

``config.freeze`` and ``config.init_exclude`` are Python regexes that must match a whole name
(`re.fullmatch`), as big_vision's ``dont_load``. A BatchNorm layer is frozen when its ``scale``
is (`is_frozen_batchnorm`): the model (`anp_jax.models.BatchNorm`), the optimizer partition
(`anp_jax.optim`) and the start-up summary all decide it by that one rule. Below the models,
the optimizer and the weight loader, which all import it.
"""

import re
from typing import Any, Dict, List, Sequence, Tuple

import jax

from anp_jax.errors import InitFromError


def path_name(path) -> str:
  """A pytree key path -> ``'BasicBlock_0/Conv_0/kernel'``."""
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', k))) for k in path)


def flatten(tree) -> Dict[str, Any]:
  """{'a': {'b': x}} -> {'a/b': x} (dict leaves only; the order of the tree)."""
  return {path_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def is_head(name: str) -> bool:
  """Whether `name` belongs to a classification head (``head_*``)."""
  return name.split('/', 1)[0].startswith('head_')


def patterns(value) -> Tuple[str, ...]:
  """A config field holding one regex, several, or none ('' / ()) as a tuple of regexes."""
  if not value:
    return ()
  if isinstance(value, str):
    return (value,)
  return tuple(value)


def compile_patterns(config_field: str, value) -> List[re.Pattern]:
  """The regexes of ``config.<config_field>`` compiled; `InitFromError` naming the field."""
  regexes = patterns(value)
  try:
    return [re.compile(p) for p in regexes]
  except re.error as e:
    raise InitFromError(f'config.{config_field}: {e} in {regexes!r}; use Python regexes that '
                        "match whole names, e.g. 'head_.*'.") from e


def matches(compiled: Sequence[re.Pattern], name: str) -> bool:
  """Whether one of the `compiled` regexes matches the whole of `name`."""
  return any(p.fullmatch(name) for p in compiled)


def is_frozen_batchnorm(compiled: Sequence[re.Pattern], module: str) -> bool:
  """Whether the BatchNorm layer `module` (``'BasicBlock_0/BatchNorm_1'``) is frozen: its
  ``scale`` matches config.freeze. A frozen layer normalises with its running statistics in
  training too, and they never change (torchvision's FrozenBatchNorm2d)."""
  return matches(compiled, f'{module}/scale')


def natural(name: str):
  """Sort key: 'layer1.10' after 'layer1.9'."""
  return [int(t) if t.isdigit() else t for t in re.split(r'(\d+)', name)]


def example_names(names: Sequence[str]) -> str:
  """A stem, a block and a head kernel name among `names` (or the first names), for errors that
  show what a pattern should look like."""
  kernels = [n for n in names if n.endswith('/kernel')] or list(names)
  picked = ([n for n in kernels if not is_head(n) and 'Block' not in n][:1]
            + [n for n in kernels if 'Block' in n][:1] + [n for n in kernels if is_head(n)][:1])
  return ', '.join(repr(n) for n in (picked or list(names)[:3]))


def abstract_variables(model, image_size: int):
  """The variables of `model` on ``image_size`` px images as shapes (`jax.eval_shape`): names
  and shapes without computing anything."""
  import jax.numpy as jnp
  x = jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32)
  return jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x)
