"""Prepares the `anp` TFDS dataset from a local folder and reports what went in.

  .venv/bin/python -m anp_jax.data.prepare --manual_dir /data/mvso_images \\
      --data_dir ~/tensorflow_datasets --min_images_per_anp 500 --resize_short_side 256 \\
      --contact_sheet /tmp/anp_sheet.png
  .venv/bin/python -m anp_jax.data.prepare --manual_dir /data/pets --labels class  # cat/, dog/

The manual dir holds either a CSV list (``--csv_file``, default ``images.csv``) or class folders
``ROOT/<adjective>_<noun>/`` (see `anp_jax.data.anp`); ``--labels class`` takes any class names
(one label per class, the ANP head only). ``--data_dir`` defaults to where training looks
($ANP_DATA_DIR, else ~/tensorflow_datasets). It says how far the scan and the writing got every
few seconds; after preparing, it prints the classes, examples per split, the smallest and largest
class per split, and how many files were skipped, de-duplicated or dropped with their classes;
the per-file lists sit in the dataset dir. The printed training flags (``--config.anp.config_name``
selects this preparation when `data_dir` holds several) train on it. The same command again
reuses the preparation if the folder's files are unchanged, and refuses (exit 2) if files were
added, removed or changed since: ``--overwrite`` prepares again.
"""

import collections
import os
import sys
import textwrap
from typing import Dict, List, Optional, Sequence

from absl import flags

from anp_jax import cli, runtime

# TensorFlow (~6 s to import, with start-up noise) is imported only once the flags are known to
# be good, so `--help` and usage errors are immediate. TFDS and the `anp` builder's module import
# without it (under a second: TFDS imports TensorFlow when first used), so the flags' choices are
# checked against the builder's own lists before it.
anp = tfds = None
_tensorflow_ready = False


def _import_builder():
  """Imports TFDS and the `anp` builder into this module (once), not TensorFlow."""
  global anp, tfds
  if anp is None:
    import tensorflow_datasets
    from anp_jax.data import anp as anp_module
    anp, tfds = anp_module, tensorflow_datasets


def _import_tensorflow():
  """`_import_builder`, and TensorFlow with no GPU (preparation never needs an accelerator;
  once, before TensorFlow runs anything)."""
  global _tensorflow_ready
  _import_builder()
  if not _tensorflow_ready:
    runtime.hide_gpus_from_tensorflow()
    _tensorflow_ready = True


# The preparation options (`anp_jax.data.anp.options.AnpConfig`) default to None here: a flag
# left out keeps the builder's default (said in its help), which needs TensorFlow to look up.
_BUILDER_DEFAULT = " (default: the builder's, {})"


def _flags() -> flags.FlagValues:
  """The command line's flags, in a FlagValues of their own: `main` may run several times in one
  process (the tests), each parse from scratch, and nothing is added to absl's global flags."""
  fv = flags.FlagValues()
  kw = dict(flag_values=fv)
  flags.DEFINE_string('manual_dir', None, 'Folder with the images (and the CSV).', **kw)
  flags.DEFINE_string('data_dir', None, 'TFDS data dir to write the dataset to (default: where '
                      'training looks, $ANP_DATA_DIR, else ~/tensorflow_datasets).', **kw)
  flags.DEFINE_string('layout', None, 'auto, csv or folder (see anp_jax.data.anp)'
                      + _BUILDER_DEFAULT.format('auto: csv when --csv_file exists'), **kw)
  flags.DEFINE_string('csv_file', None, 'CSV list, relative to --manual_dir'
                      + _BUILDER_DEFAULT.format('images.csv'), **kw)
  flags.DEFINE_string('csv_image_column', None, 'CSV column of the image paths'
                      + _BUILDER_DEFAULT.format('image'), **kw)
  flags.DEFINE_string('csv_anp_column', None, 'CSV column of the ANP names'
                      + _BUILDER_DEFAULT.format('anp'), **kw)
  flags.DEFINE_string('csv_split_column', None, "CSV column with train/validation/test; '' "
                      'ignores it' + _BUILDER_DEFAULT.format('split'), **kw)
  flags.DEFINE_string('csv_delimiter', None, 'CSV delimiter' + _BUILDER_DEFAULT.format(','), **kw)
  flags.DEFINE_string('separator', None, 'Between adjective and noun in an ANP name (first '
                      'occurrence)' + _BUILDER_DEFAULT.format('_'), **kw)
  flags.DEFINE_integer('min_images_per_anp', None, 'Drop ANPs with fewer usable images (the '
                       'MVSO papers use 500)' + _BUILDER_DEFAULT.format(0), **kw)
  flags.DEFINE_integer('max_images_per_anp', None, 'Keep at most this many images per ANP (a '
                       'seeded sample); 0 = all' + _BUILDER_DEFAULT.format(0), **kw)
  flags.DEFINE_string('split_fractions', None, 'train,validation,test fractions when the source '
                      'has no splits' + _BUILDER_DEFAULT.format('0.8,0.1,0.1'), **kw)
  flags.DEFINE_integer('split_seed', None, 'Seed of the split assignment and of the '
                       '--max_images_per_anp sample' + _BUILDER_DEFAULT.format(0), **kw)
  flags.DEFINE_integer('resize_short_side', None, 'Store photos with the shorter side at most '
                       'this many px (e.g. 256 or 160: the smaller, the cheaper every decode in '
                       'training; input_backend tf_device and dali need a bound); 0 keeps the '
                       'source size' + _BUILDER_DEFAULT.format(256), **kw)
  flags.DEFINE_alias('resize', 'resize_short_side', flag_values=fv)
  flags.DEFINE_integer('jpeg_quality', None, 'Quality of the JPEGs that preparation encodes '
                       '(resized or converted images; a source JPEG that needs no change is '
                       'stored as it is)' + _BUILDER_DEFAULT.format(90), **kw)
  flags.DEFINE_string('labels', None, "anp: class names are <adjective>_<noun> (three heads' "
                      'labels); class: ordinary class names (cat/, dog/), one label per class, '
                      'trained with the adjective and noun heads off'
                      + _BUILDER_DEFAULT.format('anp'), **kw)
  flags.DEFINE_string('source_tag', None, 'Name of the source, part of the config name (e.g. '
                      "mvso_en)" + _BUILDER_DEFAULT.format("''"), **kw)
  flags.DEFINE_bool('overwrite', False, 'Prepare again even if prepared (needed when the '
                    "folder's files changed since).", **kw)
  flags.DEFINE_integer('num_workers', None, 'Decoding threads (default: up to 8 CPUs); does not '
                       'change the output.', **kw)
  flags.DEFINE_string('contact_sheet', '', 'Write a PNG grid of sample images with their ANP '
                      'labels here.', **kw)
  flags.DEFINE_string('contact_split', 'train', 'The split the contact sheet shows.', **kw)
  flags.DEFINE_integer('contact_rows', 4, 'Rows of the contact sheet.', **kw)
  flags.DEFINE_integer('contact_cols', 8, 'Columns of the contact sheet.', **kw)
  return fv


# Flag -> `AnpConfig` option, where the names differ.
_OPTION_OF_FLAG = {'resize_short_side': 'resize'}


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
  print(f'  training flags: {training_flags(builder)}', file=out)
  plain = (summary or {}).get('labels') == 'class'
  if plain:
    print(f"  classes: {feats['label_anp'].num_classes} (--labels class: one label per class, "
          'no adjectives or nouns)', file=out)
  else:
    print(f"  classes: {feats['label_anp'].num_classes} ANPs, "
          f"{feats['label_adjective'].num_classes} adjectives, "
          f"{feats['label_noun'].num_classes} nouns", file=out)
  for title, key in (('classes' if plain else 'ANPs', 'label_anp'),
                     *(() if plain else (('adjectives', 'label_adjective'),
                                         ('nouns', 'label_noun')))):
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


def training_flags(builder) -> str:
  """The `anp_jax.main` flags that train on this preparation (its heads included)."""
  flags_ = (f'--config.dataset=anp --config.data_dir={builder.data_dir_root} '
            f'--config.anp.config_name={builder.builder_config.name}')
  if builder.builder_config.labels == 'class':
    flags_ += ' --config.model.adjective_head=False --config.model.noun_head=False'
  return flags_


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


def _usage(message: str) -> int:
  print(f'ERROR: {message}', file=sys.stderr, flush=True)
  return cli.EXIT_USAGE


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Parses `argv` (without the program name; default: the command line), prepares, prints the
  report; returns 0, or 2 after one line saying what to change."""
  argv = sys.argv[1:] if argv is None else list(argv)
  fv = _flags()
  if any(a in cli.HELP_FLAGS for a in argv):  # Before TensorFlow is imported.
    print(__doc__.rstrip() + '\n\nFlags:\n' + fv.get_help())
    return 0
  try:
    rest = fv(['prepare'] + argv)
  except flags.Error as e:
    text = ' '.join(str(e).split()).rstrip('.')
    return _usage(f"{text}{'' if text.endswith('?') else '.'} Fix the flag (--help lists them).")
  if (rc := cli.refuse_extra_arguments(rest)) is not None:
    return rc
  if not fv.manual_dir:
    return _usage('--manual_dir is required: the folder with the images (and the CSV).')
  if fv.data_dir is None:  # Where training looks by default (config.data_dir's default).
    from anp_jax.configs import default
    fv.data_dir = default.default_data_dir()
  if not fv.data_dir.strip():
    return _usage('--data_dir is empty: give the TFDS data dir to write the dataset to.')
  _import_builder()
  for name, choices in (('layout', anp.options.LAYOUTS), ('labels', anp.options.LABELS)):
    if fv[name].value is not None and fv[name].value not in choices:
      return _usage(f'--{name}={fv[name].value!r} is unknown; use one of {", ".join(choices)}.')
  data_dir = os.path.expanduser(fv.data_dir)
  message = (f'--data_dir={fv.data_dir} is a file, not a folder: give the TFDS data dir to write '
             'the dataset to.' if os.path.exists(data_dir) and not os.path.isdir(data_dir)
             else _check_contact_sheet(fv))
  if message:  # Before the preparation (minutes), not after it.
    return _usage(message)
  _import_tensorflow()
  options = {}
  for name in (*anp.options.OPTION_NAMES, 'resize_short_side'):
    if name in fv and name != 'resize' and fv[name].value is not None:
      options[_OPTION_OF_FLAG.get(name, name)] = fv[name].value
  builder = anp.prepare(fv.manual_dir, fv.data_dir, overwrite=fv.overwrite,
                        num_workers=fv.num_workers, **options)
  _print_report(builder)
  if fv.contact_sheet:
    n = write_contact_sheet(builder, fv.contact_sheet, fv.contact_split, fv.contact_rows,
                            fv.contact_cols)
    print(f'  contact sheet: {n} images -> {fv.contact_sheet}')
  return 0


if __name__ == '__main__':
  try:
    sys.exit(main())
  except (ValueError, OSError) as e:  # Bad input (a --data_dir that is a file, ...): what to fix.
    print(f'ERROR: {e}', file=sys.stderr)
    sys.exit(cli.EXIT_USAGE)
