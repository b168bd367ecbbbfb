"""Reading ``config.init_from`` on the host, as {name: numpy array} in the source's own naming.

* an anp_jax run (`read_anp_jax`): its workdir, its ``checkpoints`` folder or one
  ``checkpoints/<step>`` folder; parameters and BatchNorm statistics ('params/..',
  'batch_stats/..'), a local-SGD run's node replicas averaged; not the optimizer state or step;
* a torchvision-style state dict as ``.safetensors`` (`read_safetensors`, through the
  ``safetensors`` package's NumPy API: PyTorch is not needed) or ``.pth``/``.pt``
  (`read_torch`: PyTorch is imported only then).

Every failure (missing, unreadable, unknown format) is an `InitFromError` naming the fix.
"""

import json
import os
from typing import Dict

import jax
import numpy as np

from anp_jax import collectives, reporting
from anp_jax.errors import InitFromError
from anp_jax.param_names import flatten

TORCH_EXTENSIONS = ('.pth', '.pt')
SAFETENSORS_EXTENSIONS = ('.safetensors',)
PIP_TORCH = ('pip install torch --index-url https://download.pytorch.org/whl/cpu  '
             '(or convert the file once, elsewhere, to .safetensors: see docs/fine-tuning.md)')


def source_kind(path: str) -> str:
  """'anp_jax' (a folder), 'safetensors' or 'torch' by the file name; InitFromError else."""
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
    with reporting.hidden_log_messages(reporting.ORBAX_ITEM_METADATA):
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


def read_source(path: str, kind: str) -> Dict[str, np.ndarray]:
  """The arrays of `path`, a source of `kind` (`source_kind`)."""
  if kind == 'anp_jax':
    return read_anp_jax(path)
  return read_safetensors(path) if kind == 'safetensors' else read_torch(path)
