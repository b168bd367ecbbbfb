"""``python -m anp_jax.pretrained FILE --model resnet50 [--to-safetensors OUT]``: check a weight
file against a model (the start-up report, or the error a run would stop with) and optionally
write a .safetensors copy of a .pth file."""

import argparse
import math
import os
import sys

import numpy as np

from anp_jax import cli, models, runtime
from anp_jax.configs import default
from anp_jax.errors import InitFromError
from anp_jax.pretrained.loading import load
from anp_jax.pretrained.sources import read_source, source_kind
from anp_jax.pretrained.torchvision_names import resnet_names


def main(argv=None) -> int:
  """``python -m anp_jax.pretrained FILE --model resnet50 [--to-safetensors OUT]``."""
  parser = argparse.ArgumentParser(prog='python -m anp_jax.pretrained', description=main.__doc__)
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
      kind = source_kind(os.path.expanduser(args.source))
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
    raw = read_source(args.source, kind)
    try:
      save_file({k: np.ascontiguousarray(v) for k, v in raw.items()}, args.out)
    except OSError as e:
      return usage(f'--to-safetensors={args.out}: cannot write it ({e}).')
    print(f'wrote {args.out}')
  return 0


if __name__ == '__main__':
  runtime.configure(tensorflow=False)
  raise SystemExit(main())
