"""Prepares the `anp` TFDS dataset from a local folder and reports what went in.

  python -m anp_jax.data.prepare --manual_dir /data/mvso_images --data_dir ~/tensorflow_datasets \\
      --min_images_per_anp 500 --resize_short_side 256 --contact_sheet /tmp/anp_sheet.png

The manual dir holds either a CSV list (``--csv_file``, default ``images.csv``) or class folders
``ROOT/<adjective>_<noun>/`` (see `anp_jax.data.anp`). After preparing, this prints the classes,
examples per split, the smallest and largest class per split, and how many files were skipped,
de-duplicated or dropped with their classes; the per-file lists sit in the dataset dir. The
printed ``--config.anp.config_name`` selects this preparation for training when `data_dir` holds
several.
"""

import argparse
import collections
import os
import sys
import textwrap
from typing import Dict, List, Optional, Sequence

from anp_jax import cli, runtime

# TensorFlow (~6 s to import, with start-up noise) is imported only once the arguments are
# known to be good, so `--help` and usage errors are immediate.
anp = tfds = None


def _import_tensorflow():
  """Imports TensorFlow, TFDS and the `anp` builder into this module (once)."""
  global anp, tfds
  if anp is not None:
    return
  runtime.hide_gpus_from_tensorflow()  # Preparation never needs an accelerator.
  import tensorflow_datasets
  from anp_jax.data import anp as anp_module
  anp, tfds = anp_module, tensorflow_datasets


class _Unknown:
  """Placeholder defaults for the first parse (before TensorFlow): every value is None."""

  def __getattr__(self, name):
    return None


def _parser(defaults=None) -> argparse.ArgumentParser:
  """The CLI; without `defaults` (the first, TensorFlow-free parse) values default to None."""
  if defaults is None and anp is not None:
    defaults = anp.options.AnpConfig(name='defaults')
  defaults = defaults or _Unknown()
  p = argparse.ArgumentParser(prog='python -m anp_jax.data.prepare', description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--manual_dir', required=True, help='Folder with the images (and the CSV).')
  p.add_argument('--data_dir', required=True, help='TFDS data dir to write the dataset to.')
  p.add_argument('--layout', choices=anp.options.LAYOUTS if anp else None, default=defaults.layout,
                 help='csv or folder (see anp_jax.data.anp).')
  p.add_argument('--csv_file', default=defaults.csv_file,
                 help='CSV list, relative to --manual_dir.')
  p.add_argument('--csv_image_column', default=defaults.csv_image_column)
  p.add_argument('--csv_anp_column', default=defaults.csv_anp_column)
  p.add_argument('--csv_split_column', default=defaults.csv_split_column,
                 help="Column with train/validation/test; '' ignores it.")
  p.add_argument('--csv_delimiter', default=defaults.csv_delimiter)
  p.add_argument('--separator', default=defaults.separator,
                 help='Between adjective and noun in an ANP name (first occurrence).')
  p.add_argument('--min_images_per_anp', type=int, default=defaults.min_images_per_anp,
                 help='Drop ANPs with fewer usable images (the MVSO papers use 500).')
  p.add_argument('--max_images_per_anp', type=int, default=defaults.max_images_per_anp,
                 help='Keep at most this many images per ANP (a seeded sample); 0 = all.')
  p.add_argument('--split_fractions',
                 default=','.join(str(f) for f in defaults.split_fractions or ()),
                 help='train,validation,test fractions when the source has no splits.')
  p.add_argument('--split_seed', type=int, default=defaults.split_seed)
  p.add_argument('--resize_short_side', '--resize', dest='resize', type=int,
                 default=defaults.resize,
                 help='Store photos with the shorter side at most this many px (e.g. 256 or '
                      '160: the smaller, the cheaper every decode in training); 0 keeps the '
                      'source size.')
  p.add_argument('--jpeg_quality', type=int, default=defaults.jpeg_quality,
                 help='Quality of the JPEGs that preparation encodes (resized or converted '
                      'images; a source JPEG that needs no change is stored as it is).')
  p.add_argument('--source_tag', default=defaults.source_tag,
                 help='Name of the source, part of the config name (e.g. mvso_en).')
  p.add_argument('--overwrite', action='store_true', help='Prepare again even if prepared.')
  p.add_argument('--num_workers', type=int, default=None,
                 help='Decoding threads (default: up to 8 CPUs); does not change the output.')
  p.add_argument('--contact_sheet', default='',
                 help='Write a PNG grid of sample images with their ANP labels here.')
  p.add_argument('--contact_split', default='train')
  p.add_argument('--contact_rows', type=int, default=4)
  p.add_argument('--contact_cols', type=int, default=8)
  return p


def _sample_examples(builder, split: str, count: int, max_read: int = 4096) -> List[Dict]:
  """Up to `count` decoded examples of `split`, taken round-robin over ANPs (deterministic)."""
  _import_tensorflow()
  if split not in builder.info.splits:
    raise ValueError(f'--contact_split={split!r} is not a split of the dataset; it has '
                     f'{list(builder.info.splits)}.')
  by_class = collections.OrderedDict()
  ds = builder.as_dataset(split=split, shuffle_files=False).take(max_read)
  for ex in tfds.as_numpy(ds):
    by_class.setdefault(int(ex['label_anp']), []).append(ex)
  picked, queues = [], [collections.deque(v) for v in by_class.values()]
  while len(picked) < count and any(queues):
    for q in queues:
      if q and len(picked) < count:
        picked.append(q.popleft())
  return picked


def write_contact_sheet(builder, path: str, split: str = 'train', rows: int = 4,
                        cols: int = 8) -> int:
  """Draws a rows x cols grid of `split` images titled with their ANP; returns images drawn."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  examples = _sample_examples(builder, split, rows * cols)
  names = builder.info.features['label_anp'].names
  fig = Figure(figsize=(cols * 1.7, rows * 1.9), dpi=100)
  FigureCanvasAgg(fig)
  for i in range(rows * cols):
    ax = fig.add_subplot(rows, cols, i + 1)
    ax.set_axis_off()
    if i < len(examples):
      ax.imshow(examples[i]['image'])
      ax.set_title(names[int(examples[i]['label_anp'])], fontsize=7)
  fig.suptitle(f'{builder.info.full_name} / {split}', fontsize=9)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, format='png')
  return len(examples)


def _print_report(builder, out=None):
  """Prints classes, split sizes, per-class extremes and the skip / duplicate / drop counts."""
  _import_tensorflow()
  out = out or sys.stdout
  info = builder.info
  report = anp.prepared.read_report(builder.data_dir)
  summary = report['summary']
  feats = info.features
  print(f'Prepared {info.full_name} at {builder.data_dir}', file=out)
  if summary:
    how = ('splits from the source' if summary['source_splits'] else
           f"splits assigned: fractions {summary['options']['split_fractions']}, seed "
           f"{summary['options']['split_seed']}")
    print(f"  source: {summary['manual_dir']} ({summary['layout']} layout, {how})", file=out)
    for split, origin in summary.get('split_origin', {}).items():  # Absent before version 1.1.
      print(f'    {split}: {origin}', file=out)
    side = summary['options']['resize']
    print(f"  stored images: JPEG, shorter side {f'<= {side} px' if side else 'as in the source'}"
          f" (re-encoded at quality {summary['options']['jpeg_quality']})", file=out)
  print(f'  training flags: --config.dataset=anp --config.data_dir={builder.data_dir_root} '
        f'--config.anp.config_name={builder.builder_config.name}', file=out)
  print(f"  classes: {feats['label_anp'].num_classes} ANPs, "
        f"{feats['label_adjective'].num_classes} adjectives, "
        f"{feats['label_noun'].num_classes} nouns", file=out)
  for title, key in (('ANPs', 'label_anp'), ('adjectives', 'label_adjective'),
                     ('nouns', 'label_noun')):
    print(textwrap.fill(', '.join(feats[key].names), width=100,
                        initial_indent=f'    {title}: ', subsequent_indent='      '), file=out)
  print(f"  {'split':<12}{'examples':>10}{'classes':>9}{'min/class':>11}{'max/class':>11}",
        file=out)
  counts = summary.get('class_counts', {})
  for split, split_info in info.splits.items():
    per_class = counts.get(split, {})
    lo = min(per_class.items(), key=lambda kv: (kv[1], kv[0])) if per_class else ('-', 0)
    hi = max(per_class.items(), key=lambda kv: (kv[1], kv[0])) if per_class else ('-', 0)
    print(f'  {split:<12}{split_info.num_examples:>10}{len(per_class):>9}{lo[1]:>11}{hi[1]:>11}'
          f'   (min: {lo[0]}, max: {hi[0]})', file=out)
  skipped = report['skipped']
  reasons = collections.Counter(r[1].split(' (')[0] for r in skipped if len(r) > 1)
  print(f'  skipped files: {len(skipped)}' +
        (f" ({', '.join(f'{n} {r}' for r, n in reasons.most_common())})" if skipped else '') +
        f"  -> {os.path.join(builder.data_dir, 'skipped_files.txt')}", file=out)
  print(f"  duplicates (same bytes, first kept): {len(report['duplicates'])}"
        f"  -> {os.path.join(builder.data_dir, 'duplicates.txt')}", file=out)
  dropped = report['dropped']
  print(f'  dropped classes (< min_images_per_anp): {len(dropped)}' +
        (': ' + ', '.join(f'{a} ({n})' for a, n in dropped[:20]) +
         (' ...' if len(dropped) > 20 else '') if dropped else ''), file=out)


def _check_contact_sheet(args) -> str:
  """What is wrong with the --contact_* flags ('' if nothing); creates the sheet's folder."""
  if not args.contact_sheet:
    return ''
  if args.contact_split not in anp.options.SPLITS:
    return (f'--contact_split={args.contact_split!r} is not a split; use one of '
            f'{", ".join(anp.options.SPLITS)}.')
  for flag in ('contact_rows', 'contact_cols'):
    if getattr(args, flag) < 1:
      return f'--{flag}={getattr(args, flag)} is out of range: use an integer >= 1.'
  args.contact_sheet = os.path.expanduser(args.contact_sheet)
  return cli.output_file_error('--contact_sheet', args.contact_sheet, 'PNG file',
                               'contact_sheet.png')


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Parses `argv` (without the program name), prepares, prints the report; returns 0."""
  if anp is None:
    _parser().parse_args(argv)  # --help and usage errors before TensorFlow is imported.
    _import_tensorflow()
  args = _parser().parse_args(argv)
  data_dir = os.path.expanduser(args.data_dir)
  message = (f'--data_dir={args.data_dir} is a file, not a folder: give the TFDS data dir to write '
             'the dataset to.' if os.path.exists(data_dir) and not os.path.isdir(data_dir)
             else _check_contact_sheet(args))
  if message:  # Before the preparation (minutes), not after it.
    print(f'prepare: error: {message}', file=sys.stderr, flush=True)
    return 2
  options = {k: getattr(args, k) for k in anp.options.OPTION_NAMES}
  builder = anp.prepare(args.manual_dir, args.data_dir, overwrite=args.overwrite,
                        num_workers=args.num_workers, **options)
  _print_report(builder)
  if args.contact_sheet:
    n = write_contact_sheet(builder, args.contact_sheet, args.contact_split, args.contact_rows,
                            args.contact_cols)
    print(f'  contact sheet: {n} images -> {args.contact_sheet}')
  return 0


if __name__ == '__main__':
  try:
    sys.exit(main(sys.argv[1:]))
  except (ValueError, OSError) as e:  # Bad input (a --data_dir that is a file, ...): what to fix.
    print(f'prepare: error: {e}', file=sys.stderr)
    sys.exit(2)
