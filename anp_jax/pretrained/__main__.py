"""``.venv/bin/python -m anp_jax.pretrained --source=FILE --model=resnet50
[--to_safetensors=OUT]``: check a
weight file against a model (the start-up report, or the error a run would stop with) and
optionally write a .safetensors copy of a .pth file."""

import math
import os
import sys

import numpy as np
from absl import app, flags

from anp_jax import cli, models, runtime
from anp_jax.configs import default
from anp_jax.errors import InitFromError
from anp_jax.pretrained.loading import load
from anp_jax.pretrained.sources import read_source, source_kind
from anp_jax.pretrained.torchvision_names import resnet_names

FLAGS = flags.FLAGS
flags.DEFINE_string('source', None, 'A .safetensors / .pth file or an anp_jax workdir.')
flags.DEFINE_enum('model', 'resnet50', resnet_names(), 'The ResNet the file should fit.')
flags.DEFINE_float('width', 1.0, 'Channel multiplier of the model.')
flags.DEFINE_integer('num_anps', 553, 'ANP classes of the model (its head is re-initialised).')
flags.DEFINE_integer('image_size', 224, 'Image size of the model.')
flags.DEFINE_string('to_safetensors', '', 'Also write the (torchvision-named, float32) state '
                    'dict of a .pth / .safetensors file here.')


def main(argv) -> int:
  """Checks `--source` against `--model` and optionally converts it (absl `main`)."""
  if (rc := cli.refuse_extra_arguments(argv)) is not None:
    return rc
  args = FLAGS
  def usage(message: str) -> int:
    print(f'ERROR: {message}', file=sys.stderr, flush=True)
    return 2

  if not args.source:
    return usage('--source is required: the .safetensors / .pth file or anp_jax workdir to '
                 'check.')
  # Before the (possibly long) load: what the flags alone say is wrong.
  for flag, value, low in (('--num_anps', args.num_anps, 1), ('--image_size', args.image_size, 1)):
    if value < low:
      return usage(f'{flag}={value} is out of range: use an integer >= {low}.')
  if not (args.width > 0 and math.isfinite(args.width)):
    return usage(f'--width={args.width} is out of range: use a number > 0 (1.0: the standard '
                 'widths).')
  out = os.path.expanduser(args.to_safetensors) if args.to_safetensors else ''
  if out:
    try:
      kind = source_kind(os.path.expanduser(args.source))
    except InitFromError as e:
      return usage(str(e))
    if kind not in ('safetensors', 'torch'):
      return usage(f'--to_safetensors converts torchvision-style files (.safetensors, .pth/.pt) '
                   f'only, not the {kind} workdir {args.source!r}; drop --to_safetensors.')
    message = cli.output_file_error('--to_safetensors', out, 'safetensors file',
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
  if out:
    from safetensors.numpy import save_file
    # `kind` is 'safetensors' or 'torch': anything else was refused before the load.
    raw = read_source(args.source, kind)
    try:
      save_file({k: np.ascontiguousarray(v) for k, v in raw.items()}, out)
    except OSError as e:
      return usage(f'--to_safetensors={out}: cannot write it ({e}).')
    print(f'wrote {out}')
  return 0


if __name__ == '__main__':
  runtime.configure(tensorflow=False)
  app.run(main, flags_parser=cli.absl_flags_parser())
