"""The `anp` dataset's preparation options (`AnpConfig`), their checks, and ANP name parsing.

A config's name is derived from every option (`make_config`), so two option sets never share a
directory under ``data_dir``.
"""

import dataclasses
import hashlib
import re
from typing import Tuple

import tensorflow_datasets as tfds

SPLITS = ('train', 'validation', 'test')
LAYOUTS = ('auto', 'csv', 'folder')
# What a class name is: 'anp' (adjective<separator>noun: three heads' labels) or 'class' (any
# name, one label per class, e.g. folders cat/ and dog/: the ANP head only; the adjective and
# noun labels hold one placeholder, NO_LABEL, and training turns those heads off).
LABELS = ('anp', 'class')
NO_LABEL = 'none'


@dataclasses.dataclass
class AnpConfig(tfds.core.BuilderConfig):
  """Preparation options of the `anp` dataset; build one with `make_config` (it names it)."""
  layout: str = 'auto'  # 'csv', 'folder', or 'auto' (csv when csv_file exists, else folder).
  csv_file: str = 'images.csv'  # Relative to the manual dir.
  csv_image_column: str = 'image'
  csv_anp_column: str = 'anp'
  csv_split_column: str = 'split'  # Used when the header has it; '' ignores any split column.
  csv_delimiter: str = ','
  separator: str = '_'  # Between adjective and noun in an ANP name (first occurrence).
  min_images_per_anp: int = 0  # ANPs with fewer usable images are dropped (MVSO papers: 500).
  max_images_per_anp: int = 0  # 0 = no cap; else a seeded sample of this many is kept.
  split_fractions: Tuple[float, float, float] = (0.8, 0.1, 0.1)  # train/validation/test.
  split_seed: int = 0  # Seeds the split assignment and the max_images_per_anp sample.
  resize: int = 256  # Shorter side <= resize px at preparation time; 0 keeps the source size.
  jpeg_quality: int = 90
  source_tag: str = ''  # Free name for the source (e.g. 'mvso_en'); part of the config name.
  labels: str = 'anp'  # 'anp' or 'class' (ordinary class names; see LABELS).


OPTION_NAMES = ('layout', 'csv_file', 'csv_image_column', 'csv_anp_column', 'csv_split_column',
                'csv_delimiter', 'separator', 'min_images_per_anp', 'max_images_per_anp',
                'split_fractions', 'split_seed', 'resize', 'jpeg_quality', 'source_tag', 'labels')
# Options added later, with the value every earlier preparation had: left out of the config
# name's digest at that value, so that earlier preparations keep their names.
_LATER_OPTIONS = {'labels': 'anp'}


def make_config(**options) -> AnpConfig:
  """Builds an `AnpConfig` whose name encodes every option, so option sets never collide.

  The name reads ``[<source_tag>_]<layout>[_classes]_min<m>_max<n>_r<resize>_q<quality>_<digest>``
  (``_classes`` for ``labels='class'``); the digest covers all options, including those not
  spelled out.
  """
  unknown = sorted(set(options) - set(OPTION_NAMES))
  if unknown:
    raise ValueError(f'Unknown anp option(s) {unknown}; valid options: {list(OPTION_NAMES)}.')
  if 'split_fractions' in options:
    options['split_fractions'] = parse_fractions(options['split_fractions'])
  probe = AnpConfig(name='probe', **options)
  _validate(probe)
  values = {k: getattr(probe, k) for k in OPTION_NAMES
            if k not in _LATER_OPTIONS or getattr(probe, k) != _LATER_OPTIONS[k]}
  digest = hashlib.sha1(repr(sorted(values.items())).encode()).hexdigest()[:8]
  kind = '_classes' if probe.labels == 'class' else ''
  name = (f'{probe.layout}{kind}_min{probe.min_images_per_anp}_max{probe.max_images_per_anp}'
          f'_r{probe.resize}_q{probe.jpeg_quality}_{digest}')
  if probe.source_tag:
    name = f'{probe.source_tag}_{name}'
  return AnpConfig(name=name, description='ANP images prepared from a local manual dir.',
                   **options)


def parse_fractions(value) -> Tuple[float, float, float]:
  if isinstance(value, str):
    value = [v for v in re.split(r'[,/\s]+', value.strip()) if v]
  try:
    fractions = tuple(float(v) for v in value)
  except (TypeError, ValueError) as e:
    raise ValueError(f'anp split_fractions must be three numbers (train, validation, test), '
                     f'got {value!r}.') from e
  if len(fractions) != 3:
    raise ValueError(f'anp split_fractions must be three numbers (train, validation, test), '
                     f'got {value!r}.')
  return fractions


def _validate(c: AnpConfig):
  """Rejects option values that cannot describe a dataset, naming the option."""
  if c.layout not in LAYOUTS:
    raise ValueError(f'anp layout must be one of {LAYOUTS}, got {c.layout!r}.')
  if c.labels not in LABELS:
    raise ValueError(f'anp labels must be one of {LABELS}, got {c.labels!r}.')
  if not c.separator:
    raise ValueError('anp separator must be a non-empty string.')
  if not c.csv_image_column or not c.csv_anp_column:
    raise ValueError('anp csv_image_column and csv_anp_column must be non-empty.')
  if len(c.csv_delimiter) != 1:
    raise ValueError(f'anp csv_delimiter must be one character, got {c.csv_delimiter!r}.')
  for key in ('min_images_per_anp', 'max_images_per_anp', 'resize'):
    if not isinstance(getattr(c, key), int) or getattr(c, key) < 0:
      raise ValueError(f'anp {key} must be an integer >= 0, got {getattr(c, key)!r}.')
  if c.max_images_per_anp and c.max_images_per_anp < c.min_images_per_anp:
    raise ValueError(f'anp max_images_per_anp={c.max_images_per_anp} is below '
                     f'min_images_per_anp={c.min_images_per_anp}.')
  if not 1 <= c.jpeg_quality <= 100:
    raise ValueError(f'anp jpeg_quality must be in [1, 100], got {c.jpeg_quality}.')
  fr = parse_fractions(c.split_fractions)
  if any(f < 0 for f in fr) or fr[0] <= 0 or abs(sum(fr) - 1.0) > 1e-6:
    raise ValueError(f'anp split_fractions (train, validation, test) must be >= 0 with '
                     f'train > 0 and sum to 1, got {fr}.')
  if c.source_tag and not re.fullmatch(r'[a-z0-9][a-z0-9_]*', c.source_tag):
    raise ValueError(f'anp source_tag must be lower-case letters, digits and _, got '
                     f'{c.source_tag!r}.')


# Characters an ANP name must not hold: label files are read back one name a line, stripped, and
# the reports are tab separated.
_CONTROL = re.compile(r'[\x00-\x1f\x7f-\x9f\u2028\u2029]')


def check_name(name: str, where: str = '') -> None:
  """Raises naming the class and `where` when label files cannot hold `name`."""
  if name != name.strip() or _CONTROL.search(name):
    # Refused, not stripped: TFDS strips the names in the label file it reads back, so
    # 'happy_dog ' beside 'happy_dog' would load as one name twice, and stripping here would
    # silently merge two folders that the user kept apart.
    at = f' ({where})' if where else ''
    raise ValueError(f'ANP {name!r}{at} has whitespace at either end or a control character '
                     '(tab, newline): label files cannot hold it. Rename it (the folder or the '
                     'CSV field) without them.')


def parse_anp(name: str, separator: str = '_', where: str = '') -> Tuple[str, str]:
  """Splits ``adjective<sep>noun`` on the first separator; raises naming the ANP and `where`."""
  check_name(name, where)
  at = f' ({where})' if where else ''
  idx = name.find(separator)
  if idx <= 0 or idx + len(separator) >= len(name):
    raise ValueError(f'ANP {name!r}{at} is not of the form adjective{separator}noun: it needs a '
                     f'non-empty adjective and noun around the separator {separator!r}. For '
                     'ordinary class names (folders such as cat/ and dog/: one label each, no '
                     'adjective or noun) prepare with --labels=class.')
  return name[:idx], name[idx + len(separator):]


def split_label(name: str, config: 'AnpConfig', where: str = '') -> Tuple[str, str]:
  """The (adjective, noun) of a class name: `parse_anp` for ``labels='anp'``; for ordinary
  class names (``labels='class'``) the placeholder pair, after the same checks of the name."""
  if config.labels == 'class':
    check_name(name, where)
    return NO_LABEL, NO_LABEL
  return parse_anp(name, config.separator, where)

