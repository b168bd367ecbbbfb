"""Listing the manual dir: the CSV layout and the folder layout, as candidate images.

* ``csv``: a CSV file with one row per image (path relative to the manual dir, ANP name and,
  optionally, the split);
* ``folder``: ``ROOT/<adjective>_<noun>/...``, optionally under split folders
  ``ROOT/train``, ``ROOT/validation``, ``ROOT/test``.

Listing only reads names; whether a file is a usable image is decided by the scan
(`anp_jax.data.anp.selection`).
"""

import csv
import dataclasses
import hashlib
import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from anp_jax.data.anp.options import AnpConfig, split_label

_SPLIT_ALIASES = {'train': 'train', 'training': 'train', 'validation': 'validation',
                  'valid': 'validation', 'val': 'validation', 'dev': 'validation',
                  'test': 'test', 'testing': 'test'}


@dataclasses.dataclass(frozen=True)
class Candidate:
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


def list_csv(manual_dir: str, config: AnpConfig) -> Tuple[List[Candidate], bool]:
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
      split_label(anp, config, where)
      split = (None if split_col is None else
               _split_name(_csv_field(row, split_col, 'split', header, csv_path, line), where))
      path = os.path.normpath(os.path.join(manual_dir, image))
      candidates.append(Candidate(path=path, file_name=image.replace(os.sep, '/'), anp=anp,
                                   split=split, origin=where))
  if not candidates:
    raise ValueError(f'CSV file {csv_path!r} has a header but no image rows.')
  return candidates, split_col is not None


def visible(names: Iterable[str]) -> List[str]:
  return sorted(n for n in names if not n.startswith('.'))


def _class_files(class_dir: str) -> List[str]:
  """Every non-hidden file under `class_dir`, recursively, in sorted order."""
  files = []
  for root, dirs, names in os.walk(class_dir):
    dirs[:] = visible(dirs)
    files.extend(os.path.join(root, n) for n in visible(names))
  return sorted(files)


def list_candidates(manual_dir: str, config: AnpConfig) -> Tuple[str, List[Candidate], bool]:
  """The layout, the candidates in listing order, and whether the source gives splits."""
  layout = resolve_layout(manual_dir, config)
  lister = list_csv if layout == 'csv' else list_folder
  return (layout, *lister(manual_dir, config))


def fingerprint(candidates: Sequence[Candidate]) -> Dict[str, object]:
  """What the listed files were when prepared: their count and a digest of every file's name,
  size and modification time (second), so that adding, removing, replacing or editing a file
  is noticed when the same preparation is asked for again. One ``stat`` per file."""
  digest = hashlib.sha1()
  for cand in sorted(candidates, key=lambda c: (c.file_name, c.anp, c.split or '')):
    try:
      st = os.stat(cand.path)
      size, mtime = st.st_size, int(st.st_mtime)
    except OSError:  # A CSV row naming a missing file: listed, skipped by the scan.
      size, mtime = -1, -1
    digest.update(f'{cand.file_name}\t{cand.anp}\t{cand.split}\t{size}\t{mtime}\n'.encode())
  return {'files': len(candidates), 'sha1': digest.hexdigest()}


def list_folder(manual_dir: str, config: AnpConfig) -> Tuple[List[Candidate], bool]:
  """Candidates from ``ROOT/[split/]<anp>/...`` in sorted order, and whether splits are given."""
  top = [d for d in visible(os.listdir(manual_dir))
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
    class_dirs = [d for d in visible(os.listdir(root)) if os.path.isdir(os.path.join(root, d))]
    for anp in class_dirs:
      class_dir = os.path.join(root, anp)
      split_label(anp, config, f'folder {class_dir}')
      for path in _class_files(class_dir):
        rel = os.path.relpath(path, manual_dir).replace(os.sep, '/')
        candidates.append(Candidate(path=path, file_name=rel, anp=anp, split=split,
                                     origin=f'folder {class_dir}'))
  if not candidates:
    raise ValueError(f'No images found in {manual_dir!r}: expected class folders '
                     f'ROOT/<adjective>{config.separator}<noun>/ (optionally under '
                     'train/validation/test folders) or a CSV file '
                     f'{config.csv_file!r}.')
  return candidates, bool(split_dirs)

