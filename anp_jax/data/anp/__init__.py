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
  seeded permutation (stratified: every class appears in every split in proportion); with them,
  a validation or test split the source does not give is carved the same way from each ANP's
  source train images (MUSA2 gives train and test: validation is carved), and ``summary.json``
  says where each split comes from (``split_origin``).

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
import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

import tensorflow_datasets as tfds
from etils import epath

from anp_jax.data import filelock
from anp_jax.data.anp.images import encode_jpeg, ordered_map
from anp_jax.data.anp.listing import Candidate, fingerprint, list_candidates
from anp_jax.data.anp.options import OPTION_NAMES, make_config, split_label
from anp_jax.data.anp.prepared import SUMMARY_FILE, VOCAB_FILES, read_summary
from anp_jax.data.anp.selection import Progress, ScanResult, scan

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# The builder.


def _write_lines(path: epath.Path, rows: Iterable[Sequence[Any]]):
  text = ''.join('\t'.join(str(x) for x in row) + '\n' for row in rows)
  path.write_text(text, encoding='utf-8')


class Anp(tfds.core.GeneratorBasedBuilder):
  """ANP images from a local manual dir (CSV list or class folders); see the module docstring."""

  VERSION = tfds.core.Version('1.1.0')
  RELEASE_NOTES = {
      '1.0.0': 'First version: CSV and folder layouts, validated and de-duplicated.',
      '1.1.0': 'A validation or test split the source does not give is carved from its train '
               'split (stratified per ANP, seeded); summary.json records each split\'s origin '
               'and the stored image size.',
  }
  BUILDER_CONFIGS = [make_config()]
  MANUAL_DOWNLOAD_INSTRUCTIONS = """\
  Put the images in the manual dir, either listed in a CSV file (columns: image path relative to
  the manual dir, ANP name, optional split) or as folders ROOT/<adjective>_<noun>/*.jpg, optionally
  under ROOT/train, ROOT/validation and ROOT/test. Then run
    .venv/bin/python -m anp_jax.data.prepare --manual_dir ROOT --data_dir DATA_DIR
  """

  def __init__(self, *, num_workers: Optional[int] = None, **kwargs):
    """`num_workers` threads decode images (default: up to 8 CPUs); output does not depend on it."""
    self._num_workers = num_workers or min(8, os.cpu_count() or 1)
    super().__init__(**kwargs)

  # anp_jax's own lines instead of TFDS's "Downloading and preparing dataset Unknown size ...".
  def _log_download_bytes(self):
    print(f'anp_jax | preparing {self.data_dir}', flush=True)
    self._start = time.time()

  def _log_download_done(self):
    took = time.time() - getattr(self, '_start', time.time())
    print(f'anp_jax | prepared in {took:.0f} s', flush=True)

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
      adj, noun = split_label(anp, config)
      labels[anp] = (i, adj_index[adj], noun_index[noun])
    return {split: self._generate_examples(split, items, labels)
            for split, items in result.splits.items()}

  def _write_reports(self, manual_dir: str, result: ScanResult):
    """Writes vocabularies, skip / duplicate / drop lists and summary.json into the dataset dir."""
    out = epath.Path(self.data_dir)
    for key, values in (('label_anp', result.anps), ('label_adjective', result.adjectives),
                        ('label_noun', result.nouns)):
      _write_lines(out / VOCAB_FILES[key], ([v] for v in values))
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
        'split_origin': result.split_origin,
        'config_name': self.builder_config.name,
        'options': {k: getattr(self.builder_config, k) for k in OPTION_NAMES},
        # 'class': one label per class, no adjectives or nouns (pipeline.dataset_meta reads it).
        'labels': self.builder_config.labels,
        'num_listed': result.num_listed,
        # The listed files as prepared: `prepare` refuses to reuse this after they changed.
        'source_fingerprint': result.source_fingerprint,
        'num_skipped': len(result.skipped),
        'num_duplicates': len(result.duplicates),
        'dropped_classes': dict(result.dropped),
        'capped_classes': result.capped,
        'num_anps': len(result.anps),
        'num_adjectives': len(result.adjectives),
        'num_nouns': len(result.nouns),
        'split_sizes': {s: len(v) for s, v in result.splits.items()},
        # The training pipeline reads this (`prepared.stored_short_side`).
        'stored_short_side_max': self.builder_config.resize or None,
        'class_counts': counts,
    }
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, ensure_ascii=False),
                                     encoding='utf-8')
    log.info('anp: %d ANPs; splits %s; %d files skipped, %d duplicates, %d ANPs dropped.',
             len(result.anps), summary['split_sizes'], len(result.skipped),
             len(result.duplicates), len(result.dropped))

  def _generate_examples(self, split: str, items: Sequence[Candidate],
                         labels: Dict[str, Tuple[int, int, int]]):
    config = self.builder_config
    progress = Progress(f'writing {split}: %s / {len(items):,} images')

    def encode(cand: Candidate) -> bytes:
      try:
        with open(cand.path, 'rb') as f:
          return encode_jpeg(f.read(), config.resize, config.jpeg_quality)
      except Exception as e:  # pylint: disable=broad-except
        raise RuntimeError(f'{cand.path!r} passed the scan but failed to re-encode ({e}); did '
                           'it change during preparation? Prepare again.') from e

    for i, (cand, jpeg) in enumerate(zip(items, ordered_map(encode, items, self._num_workers))):
      progress.update(i)
      anp, adj, noun = labels[cand.anp]
      yield cand.file_name, {'image': jpeg, 'label_anp': anp, 'label_adjective': adj,
                             'label_noun': noun, 'file_name': cand.file_name}


# ----------------------------------------------------------------------------------------------
# Preparing.


def prepare(manual_dir: str, data_dir: str, *, overwrite: bool = False,
            num_workers: Optional[int] = None, **config_options) -> Anp:
  """Prepares `anp` from `manual_dir` into `data_dir` (once) and returns the builder.

  `config_options` are `AnpConfig` fields (see `OPTION_NAMES`). An already prepared config is
  reused unless `overwrite`, when the manual dir still lists the same files (`summary.json`'s
  ``source_fingerprint``: names, sizes, modification times); files added, removed or changed
  since raise, as does a preparation from another manual dir (the config name does not encode
  the source: set `source_tag` to keep both). The manual dir is listed first (names only), so
  that a folder that cannot be prepared fails before anything is written; a preparation that
  fails later removes what it created (folders, the lock file), so nothing is left behind.
  """
  manual_dir = os.path.abspath(os.path.expanduser(os.fspath(manual_dir)))
  data_dir = os.path.abspath(os.path.expanduser(os.fspath(data_dir)))
  if not os.path.isdir(manual_dir):
    raise FileNotFoundError(f'anp manual dir {manual_dir!r} does not exist or is not a folder.')
  config = make_config(**config_options)
  _, candidates, _ = list_candidates(manual_dir, config)
  lock_path = os.path.join(data_dir, '.anp_prepare.lock')
  new_data_dir, new_lock = not os.path.exists(data_dir), not os.path.exists(lock_path)
  os.makedirs(data_dir, exist_ok=True)
  try:
    # Concurrent callers wait (told who holds the lock once the wait gets long; no time-out: a
    # preparation takes as long as the photos need), then reuse the result.
    with filelock.exclusive(lock_path, f'preparing anp/{config.name} in {data_dir}'), \
        _quiet_tfds():
      anp_root = os.path.join(data_dir, 'anp')
      config_root = os.path.join(anp_root, config.name)
      new_anp_root = not os.path.exists(anp_root)
      before = set(os.listdir(config_root)) if os.path.isdir(config_root) else None
      try:
        return _prepare_locked(manual_dir, data_dir, config, candidates, overwrite,
                               num_workers)
      except BaseException:
        if new_anp_root:
          shutil.rmtree(anp_root, ignore_errors=True)
        elif before is None:
          shutil.rmtree(config_root, ignore_errors=True)
        elif os.path.isdir(config_root):
          for entry in set(os.listdir(config_root)) - before:
            shutil.rmtree(os.path.join(config_root, entry), ignore_errors=True)
        raise
  except BaseException:
    if new_lock and not filelock.holders(lock_path):
      with contextlib.suppress(OSError):
        os.remove(lock_path)
    if new_data_dir:
      with contextlib.suppress(OSError):
        os.rmdir(data_dir)  # Only when empty: nobody else wrote there meanwhile.
    raise


def _prepare_locked(manual_dir: str, data_dir: str, config, candidates: Sequence[Candidate],
                    overwrite: bool, num_workers: Optional[int]) -> Anp:
  """`prepare`'s work under the lock: reuse (when the source is unchanged) or prepare."""
  # TFDS refuses a new config object named like a registered one (the default options).
  config = Anp.builder_configs.get(config.name, config)
  make = lambda: Anp(config=config, data_dir=data_dir, file_format='tfrecord',
                     num_workers=num_workers)
  builder = make()
  dataset_dir = builder.data_dir
  if os.path.exists(os.path.join(dataset_dir, 'dataset_info.json')):
    if overwrite:
      print(f'anp_jax | --overwrite: removing {dataset_dir}', flush=True)
      shutil.rmtree(dataset_dir)
      builder = make()
    else:
      _check_reusable(dataset_dir, manual_dir, candidates)
      return builder
  # Nothing is downloaded: a throw-away download dir keeps TFDS's empty folders out of data_dir.
  with tempfile.TemporaryDirectory(prefix='anp_downloads_') as download_dir:
    builder.download_and_prepare(
        download_dir=download_dir,
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  return builder


def _check_reusable(dataset_dir: str, manual_dir: str, candidates: Sequence[Candidate]) -> None:
  """Says that `dataset_dir` is reused, or raises when its source is another folder or its
  files changed since it was prepared (with the fix: --overwrite)."""
  summary = read_summary(dataset_dir)
  source = summary.get('manual_dir')
  if source and os.path.realpath(source) != os.path.realpath(manual_dir):  # Symlinks too.
    raise ValueError(f'{dataset_dir!r} was prepared from {source!r}, not {manual_dir!r}; '
                     'pass overwrite=True (--overwrite), another data_dir, or a source_tag to '
                     'keep both.')
  recorded = summary.get('source_fingerprint')
  if recorded is None:  # Prepared before the fingerprint was recorded.
    print(f'anp_jax | reusing {dataset_dir} (prepared before file lists were recorded: changes '
          'to the folder since are not detected; --overwrite prepares again)', flush=True)
    return
  now = fingerprint(candidates)
  if now != recorded:
    change = (f'the folder now has {now["files"]:,}' if now['files'] != recorded['files'] else
              'the folder has as many, but names, sizes or modification times differ')
    raise ValueError(f'{dataset_dir!r} was prepared from {recorded["files"]:,} files of '
                     f'{manual_dir}; {change}: pass --overwrite (overwrite=True) to prepare it '
                     'again (or a new --source_tag to keep both).')
  print(f'anp_jax | reusing {dataset_dir}: prepared from the same {now["files"]:,} files '
        '(--overwrite prepares again)', flush=True)


class _TfdsLines(logging.Filter):
  """Drops TFDS's INFO and WARNING records (through absl's logger): during a preparation they
  are a 400-character config dump ("Using custom data configuration") and notes about folders
  the user never sees; anp_jax prints its own lines."""

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR or 'tensorflow_datasets' not in record.pathname


@contextlib.contextmanager
def _quiet_tfds():
  """TFDS's own output off for a preparation: its progress bars (empty, nested bars in a log
  that is not a terminal) and its INFO / WARNING lines; anp_jax's progress lines replace them."""
  tfds.display_progress_bar(False)
  quiet = _TfdsLines()
  absl_logger = logging.getLogger('absl')
  absl_logger.addFilter(quiet)
  try:
    yield
  finally:
    absl_logger.removeFilter(quiet)
