"""Which listed images go into the dataset: the scan of the manual dir, class thresholds, the
seeded per-ANP sample, de-duplication by content, and the stratified split assignment."""

import collections
import dataclasses
import hashlib
import logging
import math
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from anp_jax.data.anp.images import inspect_file, ordered_map
from anp_jax.data.anp.listing import Candidate, fingerprint, list_candidates
from anp_jax.data.anp.options import SPLITS, AnpConfig, parse_fractions, split_label

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 5.0  # How often a long step of the preparation says how far it got.


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
  splits: Dict[str, List[Candidate]]
  anps: List[str]
  adjectives: List[str]
  nouns: List[str]
  skipped: List[Tuple[str, str]]  # (file_name, reason)
  duplicates: List[Tuple[str, str]]  # (dropped file_name, kept file_name)
  dropped: List[Tuple[str, int]]  # (anp, usable images)
  capped: Dict[str, int]  # anp -> images left out by max_images_per_anp
  split_origin: Dict[str, str]  # split -> where its images come from (for summary.json)
  source_fingerprint: Dict[str, object]  # `listing.fingerprint` of the listed files.


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
  layout, candidates, source_splits = list_candidates(manual_dir, config)
  print(f'anp_jax | scanning {len(candidates):,} files in {manual_dir} ({layout} layout): each '
        'is decoded once', flush=True)

  skipped = []
  usable: List[Tuple[Candidate, str]] = []  # (candidate, sha1) of every usable file, listed.
  # Per ANP its distinct images: the first copy of each byte string, (listing position, copy).
  distinct: Dict[str, Dict[str, Tuple[int, Candidate]]] = collections.defaultdict(dict)
  results = ordered_map(lambda c: inspect_file(c.path, config.resize), candidates, num_workers)
  progress = Progress(f'scanned %s / {len(candidates):,} files')
  for i, (cand, (digest, reason)) in enumerate(zip(candidates, results)):
    progress.update(i)
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
  samples: Dict[str, List[Tuple[int, Candidate, str]]] = {}
  rest: Dict[str, List[Tuple[int, Candidate, str]]] = {}  # Left out by the cap, in order.
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
  print(f'anp_jax | scanned {len(candidates):,} files in {progress.elapsed():.0f} s: '
        f'{len(usable):,} usable, {len(skipped):,} skipped; {len(dropped)} of '
        f'{len(distinct)} classes dropped (< min_images_per_anp={config.min_images_per_anp} '
        'usable images, or each image kept in another class)', flush=True)
  for anp, n in dropped:
    log.info('anp: dropped ANP %r: %d usable images < min_images_per_anp=%d.', anp, n,
             config.min_images_per_anp)
  kept: Dict[str, Candidate] = {}  # sha1 -> the copy in the dataset.
  for digest, h in holders.items():
    first = next((i for i, anp in sorted(h) if anp in alive), None)
    if first is not None:
      kept[digest] = candidates[first]
  # 4. An ANP whose sample lost copies to others is topped up from the rest of its order (ANPs
  # in name order) with bytes that no ANP stores: max_images_per_anp stays a cap, not a loss.
  stored: Dict[str, List[Candidate]] = {}
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

  listed_splits = {c.split for c in candidates} if source_splits else set()
  splits, split_origin = assign_splits({anp: stored[anp] for anp in sorted(alive)},
                                       listed_splits, parse_fractions(config.split_fractions),
                                       config.split_seed)
  if 'train' not in splits:
    print(f'anp_jax | warning: the source has no train images; splits: {sorted(splits)}.',
          flush=True)

  anps = sorted(alive)
  pairs = [split_label(a, config) for a in anps]
  return ScanResult(layout=layout, source_splits=source_splits, num_listed=len(candidates),
                    splits=splits, anps=anps, adjectives=sorted({a for a, _ in pairs}),
                    nouns=sorted({n for _, n in pairs}), skipped=skipped,
                    duplicates=duplicates, dropped=dropped, capped=capped,
                    split_origin=split_origin, source_fingerprint=fingerprint(candidates))


class Progress:
  """A line ``anp_jax | <what>`` every `every_s` seconds of a long loop (preparation takes
  minutes to hours: the user sees it move; a log that is not a terminal gets whole lines)."""

  def __init__(self, what: str, every_s: Optional[float] = None):
    self.what = what
    self.every_s = PROGRESS_EVERY_S if every_s is None else every_s
    self.start = self.last = time.time()

  def update(self, done: int) -> None:
    if time.time() - self.last >= self.every_s:
      self.last = time.time()
      print(f'anp_jax | {self.what % f"{done:,}"}', flush=True)

  def elapsed(self) -> float:
    return time.time() - self.start


def assign_splits(stored: Dict[str, List[Candidate]], listed_splits: Set[str],
                  fractions: Sequence[float], seed: int
                  ) -> Tuple[Dict[str, List[Candidate]], Dict[str, str]]:
  """Each ANP's images (in its seeded order) into splits; returns them (by file name) and where
  each split comes from.

  Without splits in the source (`listed_splits` empty) every ANP is cut by `fractions` (train,
  validation, test). With them, each image keeps its source split, and a validation or test
  split that the source does not give at all (MUSA2 gives train and test only) is carved from
  each ANP's source train images, in proportion to its fraction (e.g. 0.8 / 0.1 / 0.1 with a
  given test split: 1/9 of each ANP's train images become validation); a fraction of 0 carves
  nothing. Both cuts are stratified per ANP and seeded by the order (``split_seed``).
  """
  share = dict(zip(SPLITS, fractions))
  splits: Dict[str, List[Candidate]] = {s: [] for s in SPLITS}
  if not listed_splits:
    cut, cut_fractions = list(SPLITS), list(fractions)
    origin = {s: f'assigned: {share[s]:g} of each ANP (seed {seed})' for s in SPLITS}
  else:
    carved = [s for s in SPLITS[1:] if s not in listed_splits and share[s] > 0
              and 'train' in listed_splits]
    cut = ['train', *carved]
    total = sum(share[s] for s in cut)
    cut_fractions = [share[s] / total for s in cut]
    origin = {s: 'source' for s in SPLITS if s in listed_splits}
    if carved:
      origin['train'] = f'source, less the images carved into {" and ".join(carved)}'
    for s in carved:
      origin[s] = (f'carved from the source train split: {share[s] / total:.4g} of each ANP\'s '
                   f'train images (seed {seed})')
  for anp, items in stored.items():
    if listed_splits:
      for c in items:
        if c.split != 'train':
          splits[c.split].append(c)
      items = [c for c in items if c.split == 'train']
    start = 0
    for split, count in zip(cut, allocate(len(items), cut_fractions)):
      splits[split].extend(items[start:start + count])
      start += count
  splits = {s: sorted(v, key=lambda c: c.file_name) for s, v in splits.items() if v}
  return splits, {s: origin[s] for s in splits}

