"""`anp`: an Adjective-Noun-Pair image dataset prepared from a local folder (no download).

MVSO (Jou et al., "Visual Affect Around the World: A Large-scale Multilingual Visual Sentiment
Ontology", ACM MM 2015) and VSO (Borth et al., "Large-scale Visual Sentiment Ontology and Detectors
Using Adjective Noun Pairs", ACM MM 2013) are distributed as lists of image URLs per ANP; once the
images are fetched they sit on disk in one of two layouts, both read from the TFDS *manual dir*:

* ``csv``: a CSV file (``AnpConfig.csv_file``, default ``images.csv``) with one row per image:
  the image path relative to the manual dir, the ANP name and, optionally, the split
  (``train`` / ``validation`` / ``test``; ``val``, ``valid`` and ``dev`` also mean validation).
  Column names are configurable (defaults ``image``, ``anp``, ``split``).
* ``folder``: ``ROOT/<adjective>_<noun>/*.jpg``, optionally under split folders
  ``ROOT/train/<anp>/...``, ``ROOT/validation/<anp>/...``, ``ROOT/test/<anp>/...``.

An ANP name is split on the FIRST separator: ``old_school_bus`` is adjective ``old``, noun
``school_bus``. Preparation scans every listed file once (in ``_split_generators``) before anything
is written, so class and split sizes are known up front:

* every image is decoded with PIL and converted to RGB (greyscale, CMYK, palette, RGBA composited on
  white, 16-bit, GIF first frame, EXIF orientation applied); corrupt, truncated, zero-byte and
  non-image files are skipped, never fatal;
* ANPs with fewer than ``min_images_per_anp`` usable images are dropped; at most
  ``max_images_per_anp`` (a seeded sample) are kept;
* byte-identical files (SHA-1) are then stored once, the first in listing order among the images
  that are in the dataset otherwise; an ANP that this takes below ``min_images_per_anp`` is
  dropped too (`scan` says in which order);
* without source splits, each ANP is split train/validation/test by ``split_fractions`` with a
  seeded permutation (stratified: every class appears in every split in proportion).

Images are stored as JPEG with the shorter side at most ``resize`` px; a source JPEG that needs no
resizing, rotation or colour conversion is stored byte for byte (``jpeg_quality`` applies only to
re-encoded images). Next to the TFRecords the dataset dir holds these reports (UTF-8, one entry a
line, tab separated):

  anps.txt, adjectives.txt, nouns.txt   the vocabularies, in label order (sorted)
  skipped_files.txt                     file <TAB> reason
  duplicates.txt                        left-out file <TAB> stored file (same bytes)
  dropped_classes.txt                   anp <TAB> usable images <TAB> reason
  summary.json                          source, options and per-split per-class counts

The config name is derived from every option, so two option sets never share a directory; the
manual dir itself is not an option, use ``source_tag`` to keep two sources in one ``data_dir``.
"""

import collections
import concurrent.futures
import csv
import dataclasses
import hashlib
import io
import itertools
import json
import logging
import math
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow_datasets as tfds
from etils import epath
from PIL import Image, ImageOps, UnidentifiedImageError

from anp_jax.data import filelock

log = logging.getLogger(__name__)

SPLITS = ('train', 'validation', 'test')
LAYOUTS = ('auto', 'csv', 'folder')
_SPLIT_ALIASES = {'train': 'train', 'training': 'train', 'validation': 'validation',
                  'valid': 'validation', 'val': 'validation', 'dev': 'validation',
                  'test': 'test', 'testing': 'test'}
_SUMMARY_FILE = 'summary.json'
_VOCAB_FILES = {'label_anp': 'anps.txt', 'label_adjective': 'adjectives.txt',
                'label_noun': 'nouns.txt'}


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


OPTION_NAMES = ('layout', 'csv_file', 'csv_image_column', 'csv_anp_column', 'csv_split_column',
                'csv_delimiter', 'separator', 'min_images_per_anp', 'max_images_per_anp',
                'split_fractions', 'split_seed', 'resize', 'jpeg_quality', 'source_tag')


def make_config(**options) -> AnpConfig:
  """Builds an `AnpConfig` whose name encodes every option, so option sets never collide.

  The name reads ``[<source_tag>_]<layout>_min<m>_max<n>_r<resize>_q<quality>_<digest>``; the
  digest covers all options, including those not spelled out.
  """
  unknown = sorted(set(options) - set(OPTION_NAMES))
  if unknown:
    raise ValueError(f'Unknown anp option(s) {unknown}; valid options: {list(OPTION_NAMES)}.')
  if 'split_fractions' in options:
    options['split_fractions'] = _parse_fractions(options['split_fractions'])
  probe = AnpConfig(name='probe', **options)
  _validate(probe)
  values = {k: getattr(probe, k) for k in OPTION_NAMES}
  digest = hashlib.sha1(repr(sorted(values.items())).encode()).hexdigest()[:8]
  name = (f'{probe.layout}_min{probe.min_images_per_anp}_max{probe.max_images_per_anp}'
          f'_r{probe.resize}_q{probe.jpeg_quality}_{digest}')
  if probe.source_tag:
    name = f'{probe.source_tag}_{name}'
  return AnpConfig(name=name, description='ANP images prepared from a local manual dir.',
                   **options)


def _parse_fractions(value) -> Tuple[float, float, float]:
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
  fr = _parse_fractions(c.split_fractions)
  if any(f < 0 for f in fr) or fr[0] <= 0 or abs(sum(fr) - 1.0) > 1e-6:
    raise ValueError(f'anp split_fractions (train, validation, test) must be >= 0 with '
                     f'train > 0 and sum to 1, got {fr}.')
  if c.source_tag and not re.fullmatch(r'[a-z0-9][a-z0-9_]*', c.source_tag):
    raise ValueError(f'anp source_tag must be lower-case letters, digits and _, got '
                     f'{c.source_tag!r}.')


# Characters an ANP name must not hold: label files are read back one name a line, stripped, and
# the reports are tab separated.
_CONTROL = re.compile(r'[\x00-\x1f\x7f-\x9f\u2028\u2029]')


def parse_anp(name: str, separator: str = '_', where: str = '') -> Tuple[str, str]:
  """Splits ``adjective<sep>noun`` on the first separator; raises naming the ANP and `where`."""
  at = f' ({where})' if where else ''
  if name != name.strip() or _CONTROL.search(name):
    # Refused, not stripped: TFDS strips the names in the label file it reads back, so
    # 'happy_dog ' beside 'happy_dog' would load as one name twice, and stripping here would
    # silently merge two folders that the user kept apart.
    raise ValueError(f'ANP {name!r}{at} has whitespace at either end or a control character '
                     '(tab, newline): label files cannot hold it. Rename it (the folder or the '
                     'CSV field) without them.')
  idx = name.find(separator)
  if idx <= 0 or idx + len(separator) >= len(name):
    raise ValueError(f'ANP {name!r}{at} is not of the form adjective{separator}noun: it needs a '
                     f'non-empty adjective and noun around the separator {separator!r}.')
  return name[:idx], name[idx + len(separator):]


# ----------------------------------------------------------------------------------------------
# Images.


def _open(data: bytes, draft: int) -> Tuple[Image.Image, Tuple[int, int]]:
  """Decodes `data` (first frame) and returns it with its full size; JPEGs decode in the DCT
  domain at the smallest scale that keeps both sides >= `draft` px (when `draft` > 0)."""
  img = Image.open(io.BytesIO(data))
  size = img.size
  if draft and img.format == 'JPEG':
    img.draft('RGB', (draft, draft))
  img.load()
  return img, size


def _orientation(img: Image.Image) -> int:
  try:
    return int(img.getexif().get(0x0112, 1))
  except Exception:  # pylint: disable=broad-except  # Malformed EXIF: treat as upright.
    return 1


def _to_rgb(img: Image.Image) -> Image.Image:
  """Any PIL mode -> RGB: alpha, and a PNG tRNS colour key (palette, greyscale or RGB), is
  composited on white; high bit depths are rescaled."""
  if img.mode == 'RGB' and 'transparency' not in img.info:
    return img
  if img.mode in ('I;16', 'I;16L', 'I;16B', 'I;16N', 'I', 'F'):
    arr = np.asarray(img, dtype=np.float64)
    if img.mode.startswith('I;16') or (img.mode == 'I' and arr.max(initial=0) > 255):
      arr = arr / 257.0
    elif img.mode == 'F' and arr.max(initial=0) <= 1.0:
      arr = arr * 255.0
    img = Image.fromarray(np.clip(arr, 0, 255).round().astype(np.uint8), 'L')
  if img.mode in ('RGBA', 'LA', 'PA', 'La', 'RGBa') or (
      img.mode in ('P', 'L', 'RGB') and 'transparency' in img.info):
    rgba = img.convert('RGBA')
    background = Image.new('RGBA', rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert('RGB')
  return img.convert('RGB')


def _shrink(img: Image.Image, resize: int) -> Image.Image:
  w, h = img.size
  if not resize or min(w, h) <= resize:
    return img
  scale = resize / min(w, h)
  size = (max(1, round(w * scale)), max(1, round(h * scale)))
  if min(size) != resize:  # Rounding must not leave the shorter side above the limit.
    size = (resize, size[1]) if w <= h else (size[0], resize)
  return img.resize(size, Image.Resampling.LANCZOS)


def _upright_rgb(img: Image.Image) -> Image.Image:
  if _orientation(img) != 1:
    try:
      img = ImageOps.exif_transpose(img)
    except Exception:  # pylint: disable=broad-except  # Unusable EXIF: keep the stored pixels.
      pass
  return _to_rgb(img)


def decode_rgb(data: bytes, resize: int = 0) -> Image.Image:
  """Decodes image bytes to an upright RGB image whose shorter side is <= `resize` (0: keep)."""
  img, _ = _open(data, resize)
  return _shrink(_upright_rgb(img), resize)


def encode_jpeg(data: bytes, resize: int, quality: int) -> bytes:
  """The stored JPEG for source bytes: the source itself when nothing needs changing."""
  img, size = _open(data, resize)
  if (img.format == 'JPEG' and img.mode == 'RGB' and _orientation(img) == 1 and
      (not resize or min(size) <= resize)):
    return data
  out = io.BytesIO()
  _shrink(_upright_rgb(img), resize).save(out, format='JPEG', quality=quality)
  return out.getvalue()


def _clean(message: str) -> str:
  return re.sub(r' <[^>]*at 0x[0-9a-fA-F]+>', '', str(message)).strip() or 'unknown error'


def inspect_file(path: str, draft: int = 0) -> Tuple[Optional[str], Optional[str]]:
  """Returns ``(sha1, None)`` for a usable image, ``(None, reason)`` for one to skip."""
  if not os.path.lexists(path):
    return None, 'missing file'
  if not os.path.isfile(path):
    return None, 'missing file (not a regular file)'
  try:
    with open(path, 'rb') as f:
      data = f.read()
  except OSError as e:
    return None, f'unreadable file ({e.strerror or _clean(e)})'
  if not data:
    return None, 'empty file (0 bytes)'
  try:
    img = _upright_rgb(_open(data, draft)[0])  # Everything `encode_jpeg` does but the resize.
    if min(img.size) < 1:
      return None, 'empty image (0 pixels)'
  except UnidentifiedImageError:
    return None, 'not an image (unrecognised format)'
  except Image.DecompressionBombError as e:
    return None, f'image too large ({_clean(e)})'
  except Exception as e:  # pylint: disable=broad-except  # Any decoder failure means "skip".
    msg = _clean(e)
    kind = 'truncated image' if 'truncat' in msg.lower() else 'corrupt image'
    return None, f'{kind} ({type(e).__name__}: {msg})'
  return hashlib.sha1(data).hexdigest(), None


def _ordered_map(fn: Callable, items: Iterable, workers: int) -> Iterator:
  """`map(fn, items)` on a thread pool (PIL and hashlib release the GIL), bounded in memory."""
  if workers <= 1:
    yield from map(fn, items)
    return
  it = iter(items)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    window = collections.deque(pool.submit(fn, x) for x in itertools.islice(it, 4 * workers))
    while window:
      result = window.popleft().result()
      for x in itertools.islice(it, 1):
        window.append(pool.submit(fn, x))
      yield result


# ----------------------------------------------------------------------------------------------
# Listing and scanning the manual dir.


@dataclasses.dataclass(frozen=True)
class _Candidate:
  """One listed image: where it is, what it is, and where it was listed (for messages)."""
  path: str  # Absolute path.
  file_name: str  # As stored in the dataset: the CSV field, or the path under the manual dir.
  anp: str
  split: Optional[str]  # From the source, or None when the builder assigns splits.
  origin: str  # E.g. 'images.csv line 7' or the folder.


def _split_name(value: str, where: str) -> str:
  split = _SPLIT_ALIASES.get(value.strip().lower())
  if split is None:
    raise ValueError(f'{where}: unknown split {value!r}; use one of '
                     f'{sorted(set(_SPLIT_ALIASES))}.')
  return split


def resolve_layout(manual_dir: str, config: AnpConfig) -> str:
  """'csv' or 'folder' for `config.layout`; 'auto' is csv when `config.csv_file` exists."""
  if config.layout != 'auto':
    return config.layout
  return 'csv' if os.path.isfile(os.path.join(manual_dir, config.csv_file)) else 'folder'


def _csv_field(row: Sequence[str], col: int, what: str, header: Sequence[str], csv_path: str,
               line: int) -> str:
  value = row[col].strip() if col < len(row) else ''
  if not value:
    raise ValueError(f'{csv_path}: line {line} has an empty or missing {what} field (column '
                     f'{header[col]!r}): {list(row)}.')
  return value


def list_csv(manual_dir: str, config: AnpConfig) -> Tuple[List[_Candidate], bool]:
  """Candidates from the CSV, in row order, and whether the CSV carries splits."""
  csv_path = os.path.join(manual_dir, config.csv_file)
  if not os.path.isfile(csv_path):
    raise FileNotFoundError(f'CSV file {csv_path!r} not found (anp csv_file='
                            f'{config.csv_file!r}, layout={config.layout!r}).')
  with open(csv_path, newline='', encoding='utf-8-sig') as f:
    reader = csv.reader(f, delimiter=config.csv_delimiter)
    header = next(reader, None)
    if header is None:
      raise ValueError(f'CSV file {csv_path!r} is empty: it needs a header row with the columns '
                       f'{config.csv_image_column!r} and {config.csv_anp_column!r}.')
    header = [h.strip() for h in header]
    missing = [c for c in (config.csv_image_column, config.csv_anp_column) if c not in header]
    if missing:
      raise ValueError(f'CSV file {csv_path!r} lacks the column(s) {missing}; its header is '
                       f'{header}. Set csv_image_column / csv_anp_column to the right names.')
    image_col = header.index(config.csv_image_column)
    anp_col = header.index(config.csv_anp_column)
    split_col = (header.index(config.csv_split_column)
                 if config.csv_split_column and config.csv_split_column in header else None)
    candidates = []
    for row in reader:
      line = reader.line_num
      if not any(cell.strip() for cell in row):
        continue
      where = f'{config.csv_file} line {line}'
      image = _csv_field(row, image_col, 'image path', header, csv_path, line)
      anp = _csv_field(row, anp_col, 'ANP', header, csv_path, line)
      parse_anp(anp, config.separator, where)
      split = (None if split_col is None else
               _split_name(_csv_field(row, split_col, 'split', header, csv_path, line), where))
      path = os.path.normpath(os.path.join(manual_dir, image))
      candidates.append(_Candidate(path=path, file_name=image.replace(os.sep, '/'), anp=anp,
                                   split=split, origin=where))
  if not candidates:
    raise ValueError(f'CSV file {csv_path!r} has a header but no image rows.')
  return candidates, split_col is not None


def _visible(names: Iterable[str]) -> List[str]:
  return sorted(n for n in names if not n.startswith('.'))


def _class_files(class_dir: str) -> List[str]:
  """Every non-hidden file under `class_dir`, recursively, in sorted order."""
  files = []
  for root, dirs, names in os.walk(class_dir):
    dirs[:] = _visible(dirs)
    files.extend(os.path.join(root, n) for n in _visible(names))
  return sorted(files)


def list_folder(manual_dir: str, config: AnpConfig) -> Tuple[List[_Candidate], bool]:
  """Candidates from ``ROOT/[split/]<anp>/...`` in sorted order, and whether splits are given."""
  top = [d for d in _visible(os.listdir(manual_dir))
         if os.path.isdir(os.path.join(manual_dir, d))]
  split_dirs = [d for d in top if d.lower() in _SPLIT_ALIASES]
  if split_dirs:
    others = [d for d in top if d not in split_dirs]
    if others:
      raise ValueError(f'{manual_dir!r} mixes split folders {split_dirs} with other folders '
                       f'{others}; put every ANP folder under a split folder, or none.')
    seen = {}
    for d in split_dirs:
      split = _SPLIT_ALIASES[d.lower()]
      if split in seen:
        raise ValueError(f'{manual_dir!r} has two folders for split {split!r}: '
                         f'{seen[split]!r} and {d!r}.')
      seen[split] = d
    roots = [(os.path.join(manual_dir, d), _SPLIT_ALIASES[d.lower()]) for d in split_dirs]
  else:
    roots = [(manual_dir, None)]
  candidates = []
  for root, split in roots:
    class_dirs = [d for d in _visible(os.listdir(root)) if os.path.isdir(os.path.join(root, d))]
    for anp in class_dirs:
      class_dir = os.path.join(root, anp)
      parse_anp(anp, config.separator, f'folder {class_dir}')
      for path in _class_files(class_dir):
        rel = os.path.relpath(path, manual_dir).replace(os.sep, '/')
        candidates.append(_Candidate(path=path, file_name=rel, anp=anp, split=split,
                                     origin=f'folder {class_dir}'))
  if not candidates:
    raise ValueError(f'No images found in {manual_dir!r}: expected class folders '
                     f'ROOT/<adjective>{config.separator}<noun>/ (optionally under '
                     'train/validation/test folders) or a CSV file '
                     f'{config.csv_file!r}.')
  return candidates, bool(split_dirs)


def allocate(n: int, fractions: Sequence[float]) -> List[int]:
  """Splits `n` items by `fractions` (largest remainder); every positive fraction gets >= 1
  item when `n` allows, so small classes still reach every split."""
  exact = [n * f for f in fractions]
  counts = [int(math.floor(e)) for e in exact]
  order = sorted(range(len(fractions)), key=lambda i: (-(exact[i] - counts[i]), i))
  for i in order[:n - sum(counts)]:
    counts[i] += 1
  positive = [i for i, f in enumerate(fractions) if f > 0]
  if n >= len(positive):
    for i in positive:
      if counts[i] == 0:
        donor = max(range(len(counts)), key=lambda j: (counts[j], -j))
        counts[donor] -= 1
        counts[i] += 1
  return counts


def _stable_seed(text: str) -> int:
  return int.from_bytes(hashlib.sha1(text.encode('utf-8')).digest()[:8], 'little')


@dataclasses.dataclass
class ScanResult:
  """What one scan of the manual dir found: kept examples per split and what was left out."""
  layout: str
  source_splits: bool
  num_listed: int
  splits: Dict[str, List[_Candidate]]
  anps: List[str]
  adjectives: List[str]
  nouns: List[str]
  skipped: List[Tuple[str, str]]  # (file_name, reason)
  duplicates: List[Tuple[str, str]]  # (dropped file_name, kept file_name)
  dropped: List[Tuple[str, int]]  # (anp, usable images)
  capped: Dict[str, int]  # anp -> images left out by max_images_per_anp


def scan(manual_dir: str, config: AnpConfig, num_workers: int = 1) -> ScanResult:
  """Lists and validates every image, fixes the classes and their samples, then de-duplicates.

  The order keeps every report true: bytes listed more than once are stored once, as the first
  copy in listing order among the images that are otherwise in the dataset, so a kept copy is
  never in a dropped ANP nor left out by ``max_images_per_anp`` (de-duplicating first lost such
  images from every ANP, and named a file not in the dataset as kept).

  1. ANPs with fewer distinct usable images than ``min_images_per_anp`` are dropped.
  2. Each other ANP keeps a seeded sample of at most ``max_images_per_anp`` distinct images; its
     seeded order also assigns the splits.
  3. Among the samples, a byte string stays with its first copy. An ANP this takes below the
     minimum (or to no image at all) is dropped, one at a time, fewest images first: its copies
     go back to the next ANP that has them, which only raises the others' counts.
  4. An ANP that lost sampled copies to others is topped up to ``max_images_per_anp`` from the
     rest of its order, with bytes no ANP stores yet.

  ``capped`` counts each ANP's distinct images that are nowhere in the dataset because of the
  cap; ``duplicates`` pairs every other usable file whose bytes are stored with the stored copy.
  """
  layout = resolve_layout(manual_dir, config)
  lister = list_csv if layout == 'csv' else list_folder
  candidates, source_splits = lister(manual_dir, config)
  log.info('anp: scanning %d listed files in %s (%s layout).', len(candidates), manual_dir,
           layout)

  skipped = []
  usable: List[Tuple[_Candidate, str]] = []  # (candidate, sha1) of every usable file, listed.
  # Per ANP its distinct images: the first copy of each byte string, (listing position, copy).
  distinct: Dict[str, Dict[str, Tuple[int, _Candidate]]] = collections.defaultdict(dict)
  results = _ordered_map(lambda c: inspect_file(c.path, config.resize), candidates, num_workers)
  for i, (cand, (digest, reason)) in enumerate(zip(candidates, results)):
    if i and i % 10000 == 0:
      log.info('anp: scanned %d / %d files.', i, len(candidates))
    if reason is not None:
      where = f' ({cand.origin})' if layout == 'csv' else ''
      skipped.append((cand.file_name, reason + where))
      continue
    usable.append((cand, digest))
    distinct[cand.anp].setdefault(digest, (i, cand))

  if not usable:
    sample = '; '.join(f'{f}: {r}' for f, r in skipped[:5])
    raise ValueError(f'No usable images in {manual_dir!r}: all {len(candidates)} listed files '
                     f'were skipped (e.g. {sample}).')
  # 1. Too few distinct images: no sample and no de-duplication can change that.
  dropped = {anp: len(d) for anp, d in distinct.items() if len(d) < config.min_images_per_anp}
  # 2. The samples, in their seeded order.
  samples: Dict[str, List[Tuple[int, _Candidate, str]]] = {}
  rest: Dict[str, List[Tuple[int, _Candidate, str]]] = {}  # Left out by the cap, in order.
  for anp in sorted(set(distinct) - set(dropped)):
    items = sorted(((i, c, d) for d, (i, c) in distinct[anp].items()),
                   key=lambda x: x[1].file_name)
    rng = np.random.default_rng([config.split_seed, _stable_seed(anp)])
    items = [items[j] for j in rng.permutation(len(items))]
    cap = config.max_images_per_anp or len(items)
    samples[anp], rest[anp] = items[:cap], items[cap:]
  # 3. De-duplication among the samples. Only bytes in several samples can change hands: each
  # round recounts those (`shared`) on top of the images only one ANP has (`own`).
  holders: Dict[str, List[Tuple[int, str]]] = collections.defaultdict(list)
  for anp, items in samples.items():
    for i, _, digest in items:
      holders[digest].append((i, anp))
  own = collections.Counter(h[0][1] for h in holders.values() if len(h) == 1)
  shared = [sorted(h) for h in holders.values() if len(h) > 1]
  alive = set(samples)
  while True:
    counts = collections.Counter({anp: own[anp] for anp in alive})
    for h in shared:
      first = next((anp for _, anp in h if anp in alive), None)
      if first is not None:
        counts[first] += 1
    below = [anp for anp in alive if counts[anp] < max(1, config.min_images_per_anp)]
    if not below:
      break
    worst = min(below, key=lambda anp: (counts[anp], anp))
    dropped[worst] = counts[worst]
    alive.remove(worst)
  dropped = sorted(dropped.items())
  if not alive:
    largest = max(n for _, n in dropped)
    raise ValueError(f'Every ANP in {manual_dir!r} has fewer than min_images_per_anp='
                     f'{config.min_images_per_anp} usable images (the largest has {largest}); '
                     'lower min_images_per_anp.')
  for anp, n in dropped:
    log.warning('anp: dropped ANP %r: %d usable images < min_images_per_anp=%d.', anp, n,
                config.min_images_per_anp)
  kept: Dict[str, _Candidate] = {}  # sha1 -> the copy in the dataset.
  for digest, h in holders.items():
    first = next((i for i, anp in sorted(h) if anp in alive), None)
    if first is not None:
      kept[digest] = candidates[first]
  # 4. An ANP whose sample lost copies to others is topped up from the rest of its order (ANPs
  # in name order) with bytes that no ANP stores: max_images_per_anp stays a cap, not a loss.
  stored: Dict[str, List[_Candidate]] = {}
  capped = {}
  for anp in sorted(alive):
    items = [c for _, c, digest in samples[anp] if kept[digest] is c]
    for _, c, digest in rest[anp]:
      if len(items) >= config.max_images_per_anp:
        break
      if digest not in kept:
        kept[digest] = c
        items.append(c)
    stored[anp] = items
    left_out = sum(1 for _, _, digest in rest[anp] if digest not in kept)
    if left_out:
      capped[anp] = left_out
  # Every other usable file with bytes in the dataset is reported with the copy that has them
  # (the others are in dropped ANPs, or left out by max_images_per_anp).
  duplicates = [(cand.file_name, kept[digest].file_name) for cand, digest in usable
                if digest in kept and kept[digest] is not cand]

  splits: Dict[str, List[_Candidate]] = {s: [] for s in SPLITS}
  fractions = _parse_fractions(config.split_fractions)
  for anp in sorted(alive):
    items = stored[anp]
    if source_splits:
      for c in items:
        splits[c.split].append(c)
    else:
      start = 0
      for split, count in zip(SPLITS, allocate(len(items), fractions)):
        splits[split].extend(items[start:start + count])
        start += count
  splits = {s: sorted(v, key=lambda c: c.file_name) for s, v in splits.items() if v}
  if 'train' not in splits:
    log.warning('anp: the source has no train images; splits: %s.', sorted(splits))

  anps = sorted(alive)
  pairs = [parse_anp(a, config.separator) for a in anps]
  return ScanResult(layout=layout, source_splits=source_splits, num_listed=len(candidates),
                    splits=splits, anps=anps, adjectives=sorted({a for a, _ in pairs}),
                    nouns=sorted({n for _, n in pairs}), skipped=skipped,
                    duplicates=duplicates, dropped=dropped, capped=capped)


# ----------------------------------------------------------------------------------------------
# The builder.


def _write_lines(path: epath.Path, rows: Iterable[Sequence[Any]]):
  text = ''.join('\t'.join(str(x) for x in row) + '\n' for row in rows)
  path.write_text(text, encoding='utf-8')


class Anp(tfds.core.GeneratorBasedBuilder):
  """ANP images from a local manual dir (CSV list or class folders); see the module docstring."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'First version: CSV and folder layouts, validated and de-duplicated.'}
  BUILDER_CONFIGS = [make_config()]
  MANUAL_DOWNLOAD_INSTRUCTIONS = """\
  Put the images in the manual dir, either listed in a CSV file (columns: image path relative to
  the manual dir, ANP name, optional split) or as folders ROOT/<adjective>_<noun>/*.jpg, optionally
  under ROOT/train, ROOT/validation and ROOT/test. Then run
    python -m anp_jax.data.prepare --manual_dir ROOT --data_dir DATA_DIR
  """

  def __init__(self, *, num_workers: Optional[int] = None, **kwargs):
    """`num_workers` threads decode images (default: up to 8 CPUs); output does not depend on it."""
    self._num_workers = num_workers or min(8, os.cpu_count() or 1)
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    # Label names are only known after the scan: `_split_generators` sets them, and a prepared
    # dataset restores them from its label files.
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(None, None, 3), encoding_format='jpeg'),
            'label_anp': tfds.features.ClassLabel(),
            'label_adjective': tfds.features.ClassLabel(),
            'label_noun': tfds.features.ClassLabel(),
            'file_name': tfds.features.Text(),
        }),
        supervised_keys=('image', 'label_anp'),
        description=__doc__,
    )

  def _split_generators(self, dl_manager):
    try:
      manual_dir = os.fspath(dl_manager.manual_dir)
    except AssertionError as e:
      raise FileNotFoundError(f'anp manual dir missing or empty: {e}') from e
    config = self.builder_config
    result = scan(manual_dir, config, self._num_workers)
    features = self.info.features
    features['label_anp'].names = result.anps
    features['label_adjective'].names = result.adjectives
    features['label_noun'].names = result.nouns
    self._write_reports(manual_dir, result)
    adj_index = {a: i for i, a in enumerate(result.adjectives)}
    noun_index = {n: i for i, n in enumerate(result.nouns)}
    labels = {}
    for i, anp in enumerate(result.anps):
      adj, noun = parse_anp(anp, config.separator)
      labels[anp] = (i, adj_index[adj], noun_index[noun])
    return {split: self._generate_examples(items, labels)
            for split, items in result.splits.items()}

  def _write_reports(self, manual_dir: str, result: ScanResult):
    """Writes vocabularies, skip / duplicate / drop lists and summary.json into the dataset dir."""
    out = epath.Path(self.data_dir)
    for key, values in (('label_anp', result.anps), ('label_adjective', result.adjectives),
                        ('label_noun', result.nouns)):
      _write_lines(out / _VOCAB_FILES[key], ([v] for v in values))
    _write_lines(out / 'skipped_files.txt', result.skipped)
    _write_lines(out / 'duplicates.txt', result.duplicates)
    minimum = self.builder_config.min_images_per_anp
    _write_lines(out / 'dropped_classes.txt',
                 ((a, n, f'fewer than min_images_per_anp={minimum}' if n < minimum else
                   'no images of its own (each is kept in another ANP)')
                  for a, n in result.dropped))
    counts = {split: dict(sorted(collections.Counter(c.anp for c in items).items()))
              for split, items in result.splits.items()}
    summary = {
        'manual_dir': os.path.abspath(manual_dir),
        'layout': result.layout,
        'source_splits': result.source_splits,
        'config_name': self.builder_config.name,
        'options': {k: getattr(self.builder_config, k) for k in OPTION_NAMES},
        'num_listed': result.num_listed,
        'num_skipped': len(result.skipped),
        'num_duplicates': len(result.duplicates),
        'dropped_classes': dict(result.dropped),
        'capped_classes': result.capped,
        'num_anps': len(result.anps),
        'num_adjectives': len(result.adjectives),
        'num_nouns': len(result.nouns),
        'split_sizes': {s: len(v) for s, v in result.splits.items()},
        'class_counts': counts,
    }
    (out / _SUMMARY_FILE).write_text(json.dumps(summary, indent=1, ensure_ascii=False),
                                     encoding='utf-8')
    log.info('anp: %d ANPs; splits %s; %d files skipped, %d duplicates, %d ANPs dropped.',
             len(result.anps), summary['split_sizes'], len(result.skipped),
             len(result.duplicates), len(result.dropped))

  def _generate_examples(self, items: Sequence[_Candidate], labels: Dict[str, Tuple[int, int,
                                                                                       int]]):
    config = self.builder_config

    def encode(cand: _Candidate) -> bytes:
      try:
        with open(cand.path, 'rb') as f:
          return encode_jpeg(f.read(), config.resize, config.jpeg_quality)
      except Exception as e:  # pylint: disable=broad-except
        raise RuntimeError(f'{cand.path!r} passed the scan but failed to re-encode ({e}); did '
                           'it change during preparation? Prepare again.') from e

    for cand, jpeg in zip(items, _ordered_map(encode, items, self._num_workers)):
      anp, adj, noun = labels[cand.anp]
      yield cand.file_name, {'image': jpeg, 'label_anp': anp, 'label_adjective': adj,
                             'label_noun': noun, 'file_name': cand.file_name}


# ----------------------------------------------------------------------------------------------
# Preparing and loading.


def prepare(manual_dir: str, data_dir: str, *, overwrite: bool = False,
            num_workers: Optional[int] = None, **config_options) -> Anp:
  """Prepares `anp` from `manual_dir` into `data_dir` (once) and returns the builder.

  `config_options` are `AnpConfig` fields (see `OPTION_NAMES`). An already prepared config is
  reused unless `overwrite`; reusing one prepared from another manual dir raises, because the
  config name does not encode the source (set `source_tag` to keep both).
  """
  manual_dir = os.path.abspath(os.path.expanduser(os.fspath(manual_dir)))
  data_dir = os.path.abspath(os.path.expanduser(os.fspath(data_dir)))
  if not os.path.isdir(manual_dir):
    raise FileNotFoundError(f'anp manual dir {manual_dir!r} does not exist or is not a folder.')
  config = make_config(**config_options)
  os.makedirs(data_dir, exist_ok=True)
  # Concurrent callers wait (told who holds the lock once the wait gets long; no time-out: a
  # preparation takes as long as the photos need), then reuse the result.
  with filelock.exclusive(os.path.join(data_dir, '.anp_prepare.lock'),
                          f'preparing anp/{config.name} in {data_dir}'):
    # TFDS refuses a new config object named like a registered one (the default options).
    config = Anp.builder_configs.get(config.name, config)
    make = lambda: Anp(config=config, data_dir=data_dir, file_format='tfrecord',
                       num_workers=num_workers)
    builder = make()
    dataset_dir = builder.data_dir
    if os.path.exists(os.path.join(dataset_dir, 'dataset_info.json')):
      if overwrite:
        shutil.rmtree(dataset_dir)
        builder = make()
      else:
        source = _read_summary(dataset_dir).get('manual_dir')
        if source and os.path.realpath(source) != os.path.realpath(manual_dir):  # Symlinks too.
          raise ValueError(f'{dataset_dir!r} was prepared from {source!r}, not {manual_dir!r}; '
                           'pass overwrite=True (--overwrite), another data_dir, or a '
                           'source_tag to keep both.')
        log.info('anp: reusing %s.', dataset_dir)
    # Nothing is downloaded: a throw-away download dir keeps TFDS's empty folders out of
    # data_dir.
    with tempfile.TemporaryDirectory(prefix='anp_downloads_') as download_dir:
      builder.download_and_prepare(
          download_dir=download_dir,
          download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  return builder


def _read_summary(dataset_dir: str) -> Dict[str, Any]:
  path = os.path.join(dataset_dir, _SUMMARY_FILE)
  if not os.path.exists(path):
    return {}
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def prepared_dirs(data_dir: str) -> Dict[str, str]:
  """Config name -> dataset dir of every prepared `anp` config under `data_dir`."""
  root = os.path.join(os.path.expanduser(os.fspath(data_dir)), 'anp')
  found = {}
  if not os.path.isdir(root):
    return found
  for name in _visible(os.listdir(root)):
    versions = [v for v in _visible(os.listdir(os.path.join(root, name)))
                if os.path.exists(os.path.join(root, name, v, 'dataset_info.json'))]
    if versions:
      best = max(versions, key=lambda v: tuple(int(x) if x.isdigit() else -1
                                               for x in v.split('.')))
      found[name] = os.path.join(root, name, best)
  return found


def dataset_dir(data_dir: str, config_name: Optional[str] = None) -> str:
  """The dataset dir of a prepared config: `data_dir` itself when it is one, else
  ``data_dir/anp/<config_name>/<version>``; `config_name` may be omitted when only one exists."""
  data_dir = os.path.expanduser(os.fspath(data_dir))
  if os.path.exists(os.path.join(data_dir, 'dataset_info.json')):
    return data_dir
  found = prepared_dirs(data_dir)
  if config_name:
    if config_name not in found:
      raise FileNotFoundError(f'No prepared anp config {config_name!r} in {data_dir!r}; '
                              f'prepared: {sorted(found) or "none"}.')
    return found[config_name]
  if not found:
    raise FileNotFoundError(f'No prepared anp dataset in {data_dir!r}; run `python -m '
                            'anp_jax.data.prepare --manual_dir DIR --data_dir '
                            f'{data_dir}` first.')
  if len(found) > 1:
    raise ValueError(f'{data_dir!r} holds several prepared anp configs {sorted(found)}; choose '
                     'one (config.anp.config_name / config_name=).')
  return next(iter(found.values()))


def load_builder(data_dir: str, config_name: Optional[str] = None) -> tfds.core.DatasetBuilder:
  """A read-only builder for a prepared config (needs no manual dir, nor the scan)."""
  return tfds.builder_from_directory(dataset_dir(data_dir, config_name))


def load_info(data_dir: str, config_name: Optional[str] = None) -> tfds.core.DatasetInfo:
  """The `tfds.core.DatasetInfo` (features with label names, split sizes) of a prepared config."""
  return load_builder(data_dir, config_name).info


def builder_from_config(config, data_dir: str) -> tfds.core.DatasetBuilder:
  """The training pipeline's entry point: ``config.anp.config_name`` under `data_dir`."""
  return load_builder(data_dir, config.anp.config_name or None)


def read_report(data_dir: str, config_name: Optional[str] = None) -> Dict[str, Any]:
  """The reports written next to a prepared config, parsed: vocabularies, skipped files,
  duplicates, dropped classes and the summary."""
  path = dataset_dir(data_dir, config_name)

  def rows(name):
    file = os.path.join(path, name)
    if not os.path.exists(file):
      return []
    with open(file, encoding='utf-8') as f:
      return [tuple(line.rstrip('\n').split('\t')) for line in f if line.strip()]

  return {
      'dataset_dir': path,
      'anps': [r[0] for r in rows('anps.txt')],
      'adjectives': [r[0] for r in rows('adjectives.txt')],
      'nouns': [r[0] for r in rows('nouns.txt')],
      'skipped': rows('skipped_files.txt'),
      'duplicates': rows('duplicates.txt'),
      'dropped': [(r[0], int(r[1])) for r in rows('dropped_classes.txt')],
      'summary': _read_summary(path),
  }
