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
import json
import logging
import os
import shutil
import tempfile
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

import tensorflow_datasets as tfds
from etils import epath

from anp_jax.data import filelock
from anp_jax.data.anp.images import encode_jpeg, ordered_map
from anp_jax.data.anp.listing import Candidate
from anp_jax.data.anp.options import OPTION_NAMES, make_config, parse_anp
from anp_jax.data.anp.prepared import SUMMARY_FILE, VOCAB_FILES, read_summary
from anp_jax.data.anp.selection import ScanResult, scan

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
        'num_listed': result.num_listed,
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

  def _generate_examples(self, items: Sequence[Candidate], labels: Dict[str, Tuple[int, int,
                                                                                       int]]):
    config = self.builder_config

    def encode(cand: Candidate) -> bytes:
      try:
        with open(cand.path, 'rb') as f:
          return encode_jpeg(f.read(), config.resize, config.jpeg_quality)
      except Exception as e:  # pylint: disable=broad-except
        raise RuntimeError(f'{cand.path!r} passed the scan but failed to re-encode ({e}); did '
                           'it change during preparation? Prepare again.') from e

    for cand, jpeg in zip(items, ordered_map(encode, items, self._num_workers)):
      anp, adj, noun = labels[cand.anp]
      yield cand.file_name, {'image': jpeg, 'label_anp': anp, 'label_adjective': adj,
                             'label_noun': noun, 'file_name': cand.file_name}


# ----------------------------------------------------------------------------------------------
# Preparing.


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
        source = read_summary(dataset_dir).get('manual_dir')
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

