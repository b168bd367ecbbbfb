"""Finding and reading prepared `anp` configs: their folders, builders, and the reports written
beside the TFRecords. Reading needs neither the manual dir nor a scan."""

import json
import os
from typing import Any, Dict, Optional

import tensorflow_datasets as tfds

from anp_jax.data.anp.listing import visible

SUMMARY_FILE = 'summary.json'
VOCAB_FILES = {'label_anp': 'anps.txt', 'label_adjective': 'adjectives.txt',
               'label_noun': 'nouns.txt'}


def read_summary(dataset_dir: str) -> Dict[str, Any]:
  path = os.path.join(dataset_dir, SUMMARY_FILE)
  if not os.path.exists(path):
    return {}
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def stored_short_side(dataset_dir: str) -> Optional[int]:
  """The largest shorter side of the stored images of a prepared config (its ``resize``), or
  None when they keep their source sizes or the preparation predates the record (version 1.0)."""
  return read_summary(dataset_dir).get('stored_short_side_max')


def prepared_dirs(data_dir: str) -> Dict[str, str]:
  """Config name -> dataset dir of every prepared `anp` config under `data_dir`."""
  root = os.path.join(os.path.expanduser(os.fspath(data_dir)), 'anp')
  found = {}
  if not os.path.isdir(root):
    return found
  for name in visible(os.listdir(root)):
    versions = [v for v in visible(os.listdir(os.path.join(root, name)))
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
    raise FileNotFoundError(f'No prepared anp dataset in {data_dir!r}; run `.venv/bin/python -m '
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
      'summary': read_summary(path),
  }