"""`synthetic_anp`: a procedurally drawn Adjective-Noun-Pair dataset, generated locally.

Nouns are object kinds (shapes), adjectives are visual attributes of the object (colour, texture,
size, style, blur, ...). Like MVSO, only a subset of all adjective x noun pairs exists as classes,
so the ANP head must learn the combination while the adjective and noun heads see shared factors.
Every image also has a cluttered background, distractor blobs, random placement, scale, rotation
and colour jitter, and the training split can carry label noise — learnable by a small ResNet, but
not trivially.

Three splits: ``train``, ``validation`` (for every choice: learning rate, warmup, stopping) and a
held-out ``test`` (for the accuracies that get reported), by default as large as validation.

Everything is a pure function of the builder config: example ``i`` of class ``c`` in split ``s`` is
drawn from its own `numpy.random.Generator` seeded with ``(seed, s, c, i)`` (``s``: 0 train,
1 validation, 2 test), so generation is deterministic whatever the order or the machine, and the
test split added no change to a training or validation example.
"""

import dataclasses
import hashlib
import logging
import sys
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow_datasets as tfds

NOUNS = ('circle', 'square', 'triangle', 'cross', 'ring', 'diamond', 'star', 'hexagon',
         'crescent', 'bar', 'heart', 'arrow')
ADJECTIVES = ('red', 'green', 'blue', 'yellow', 'striped', 'dotted', 'checkered', 'tiny',
              'huge', 'outlined', 'blurry', 'faded', 'noisy', 'dark')

_COLOURS = {'red': (0.85, 0.12, 0.1), 'green': (0.1, 0.7, 0.15), 'blue': (0.12, 0.25, 0.9),
            'yellow': (0.92, 0.85, 0.1)}
SPLITS = ('train', 'validation', 'test')
# Seconds between progress lines while the dataset is generated (the demo's takes ~40 s).
PROGRESS_EVERY_S = 5.0


class _DropCustomConfigWarning(logging.Filter):
  """TFDS warns 'Using custom data configuration: <400 characters>' for every config it does not
  list in BUILDER_CONFIGS, i.e. every run here (configs are derived from the run's options)."""

  def filter(self, record):
    return not str(record.msg).startswith('Using custom data configuration')


logging.getLogger('absl').addFilter(_DropCustomConfigWarning())


@dataclasses.dataclass
class SyntheticAnpConfig(tfds.core.BuilderConfig):
  """Options of the generated dataset; the config name is derived from them."""
  num_adjectives: int = 8
  num_nouns: int = 8
  num_pairs: int = 32
  image_size: int = 32
  train_per_class: int = 300
  eval_per_class: int = 50
  test_per_class: Optional[int] = None  # None or 0: eval_per_class.
  label_noise: float = 0.0  # Fraction of training labels replaced by a random other ANP.
  seed: int = 0


def make_config(**kwargs) -> SyntheticAnpConfig:
  """Builds a config whose name encodes every option, so option sets never collide on disk.

  ``test_per_class=None`` (or 0, the config's default) becomes ``eval_per_class`` first: the same
  dataset has one name."""
  if not kwargs.get('test_per_class'):
    kwargs['test_per_class'] = kwargs.get('eval_per_class',
                                          SyntheticAnpConfig.eval_per_class)
  probe = SyntheticAnpConfig(name='probe', **kwargs)
  fields = {f.name: getattr(probe, f.name) for f in dataclasses.fields(SyntheticAnpConfig)
            if f.name in kwargs or f.name in _OPTION_NAMES}
  _validate(probe)
  digest = hashlib.sha1(repr(sorted(fields.items())).encode()).hexdigest()[:8]
  name = (f'a{probe.num_adjectives}n{probe.num_nouns}p{probe.num_pairs}_s{probe.image_size}'
          f'_{probe.train_per_class}x{probe.eval_per_class}x{probe.test_per_class}_{digest}')
  return SyntheticAnpConfig(name=name, description='Generated ANP dataset.', **kwargs)


_OPTION_NAMES = ('num_adjectives', 'num_nouns', 'num_pairs', 'image_size', 'train_per_class',
                 'eval_per_class', 'test_per_class', 'label_noise', 'seed')


def _validate(c: SyntheticAnpConfig):
  if not 1 <= c.num_adjectives <= len(ADJECTIVES):
    raise ValueError(f'synthetic.num_adjectives must be in [1, {len(ADJECTIVES)}], '
                     f'got {c.num_adjectives}.')
  if not 1 <= c.num_nouns <= len(NOUNS):
    raise ValueError(f'synthetic.num_nouns must be in [1, {len(NOUNS)}], got {c.num_nouns}.')
  max_pairs = c.num_adjectives * c.num_nouns
  lo = max(c.num_adjectives, c.num_nouns)
  if not lo <= c.num_pairs <= max_pairs:
    raise ValueError(f'synthetic.num_pairs must be in [{lo}, {max_pairs}] (every adjective and '
                     f'noun in at least one pair), got {c.num_pairs}.')
  if c.image_size < 16:
    raise ValueError(f'synthetic.image_size must be >= 16, got {c.image_size}.')
  if min(c.train_per_class, c.eval_per_class, c.test_per_class) < 1:
    raise ValueError('synthetic.train_per_class, eval_per_class and test_per_class must be '
                     f'>= 1, got {c.train_per_class}, {c.eval_per_class}, {c.test_per_class}.')
  if not 0.0 <= c.label_noise < 1.0:
    raise ValueError(f'synthetic.label_noise must be in [0, 1), got {c.label_noise}.')
  if c.label_noise and c.num_pairs < 2:
    # A noisy label is another ANP, drawn from the num_pairs - 1 others.
    raise ValueError(f'synthetic.label_noise={c.label_noise} needs num_pairs >= 2 (a noisy label '
                     f'is another ANP), got num_pairs={c.num_pairs}; set label_noise to 0 or '
                     'raise num_pairs (with num_adjectives or num_nouns).')


def choose_pairs(num_adjectives: int, num_nouns: int, num_pairs: int,
                 seed: int) -> List[Tuple[int, int]]:
  """Picks the ANP classes: every adjective and noun appears at least once, the rest at random."""
  rng = np.random.default_rng([seed, 7919])
  cover = max(num_adjectives, num_nouns)
  adj_order, noun_order = rng.permutation(num_adjectives), rng.permutation(num_nouns)
  pairs = {(int(adj_order[i % num_adjectives]), int(noun_order[i % num_nouns]))
           for i in range(cover)}
  rest = [(a, n) for a in range(num_adjectives) for n in range(num_nouns) if (a, n) not in pairs]
  extra = rng.permutation(len(rest))[:num_pairs - len(pairs)]
  pairs.update(rest[i] for i in extra)
  return sorted(pairs)


def _shape_mask(noun: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
  """Boolean mask of a unit-size shape in rotated, centred coordinates (u, v)."""
  r = np.sqrt(u * u + v * v)
  phi = np.arctan2(v, u)
  if noun == 'circle':
    return r < 0.9
  if noun == 'square':
    return np.maximum(np.abs(u), np.abs(v)) < 0.75
  if noun == 'triangle':
    return (v < 0.6) & (np.abs(u) * 1.7 < (v + 0.95))
  if noun == 'cross':
    return ((np.abs(u) < 0.28) & (np.abs(v) < 0.95)) | ((np.abs(v) < 0.28) & (np.abs(u) < 0.95))
  if noun == 'ring':
    return (r < 0.95) & (r > 0.55)
  if noun == 'diamond':
    return np.abs(u) + np.abs(v) < 0.95
  if noun == 'star':
    return r < 0.45 + 0.45 * np.maximum(0.0, np.cos(5 * phi))
  if noun == 'hexagon':
    q = np.abs(u)
    return (q * 0.866 + np.abs(v) * 0.5 < 0.8) & (np.abs(v) < 0.8)
  if noun == 'crescent':
    return (r < 0.9) & (np.sqrt((u - 0.4) ** 2 + v * v) > 0.7)
  if noun == 'bar':
    return (np.abs(u) < 0.95) & (np.abs(v) < 0.3)
  if noun == 'heart':
    x, y = u * 1.2, -v * 1.2 + 0.25
    return (x * x + y * y - 0.6) ** 3 - x * x * y ** 3 < 0
  if noun == 'arrow':
    head = (u > 0.1) & (np.abs(v) < (0.95 - u) * 1.0)
    shaft = (u <= 0.1) & (u > -0.9) & (np.abs(v) < 0.22)
    return head | shaft
  raise ValueError(noun)


def _random_colour(rng) -> np.ndarray:
  return rng.uniform(0.15, 0.95, size=3)


def _blur(img: np.ndarray, passes: int) -> np.ndarray:
  """Cheap separable [1 2 1]/4 blur, repeated."""
  for _ in range(passes):
    p = np.pad(img, ((1, 1), (1, 1), (0, 0)), mode='edge')
    img = (p[:-2] + 2 * p[1:-1] + p[2:]) / 4
    img = (img[:, :-2] + 2 * img[:, 1:-1] + img[:, 2:]) / 4
  return img


def render(adjective: str, noun: str, size: int, rng: np.random.Generator) -> np.ndarray:
  """Draws one `size` x `size` RGB uint8 image of `adjective` `noun`."""
  yy, xx = (np.mgrid[0:size, 0:size].astype(np.float32) + 0.5) / size * 2 - 1  # [-1, 1]
  # Background: smooth random colour field plus mild noise ("clutter").
  corners = rng.uniform(0.0, 1.0, size=(2, 2, 3))
  wy, wx = (yy[..., None] + 1) / 2, (xx[..., None] + 1) / 2
  bg = ((1 - wy) * ((1 - wx) * corners[0, 0] + wx * corners[0, 1]) +
        wy * ((1 - wx) * corners[1, 0] + wx * corners[1, 1]))
  bg = 0.25 + 0.5 * bg
  img = bg + rng.normal(0, 0.03, size=bg.shape)
  # Distractor blobs in random colours.
  for _ in range(rng.integers(1, 4)):
    cx, cy, rad = rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(0.05, 0.18)
    blob = (xx - cx) ** 2 + (yy - cy) ** 2 < rad ** 2
    img[blob] = _random_colour(rng)

  scale = {'tiny': rng.uniform(0.2, 0.3), 'huge': rng.uniform(0.78, 0.92)}.get(
      adjective, rng.uniform(0.42, 0.62))
  cx, cy = rng.uniform(-1 + scale, 1 - scale, size=2) * 0.9
  theta = rng.uniform(-0.5, 0.5)
  u = ((xx - cx) * np.cos(theta) + (yy - cy) * np.sin(theta)) / scale
  v = (-(xx - cx) * np.sin(theta) + (yy - cy) * np.cos(theta)) / scale
  mask = _shape_mask(noun, u, v)

  colour = (np.asarray(_COLOURS[adjective]) + rng.normal(0, 0.05, 3)
            if adjective in _COLOURS else _random_colour(rng))
  fill = np.broadcast_to(colour, img.shape).copy()
  if adjective in ('striped', 'dotted', 'checkered'):
    other = np.clip(1.0 - colour + rng.normal(0, 0.1, 3), 0, 1)
    period = rng.uniform(0.22, 0.32)
    if adjective == 'striped':
      pattern = np.sin((u * np.cos(1.0) + v * np.sin(1.0)) * np.pi / period * scale) > 0
    elif adjective == 'dotted':
      pattern = (np.sin(u * np.pi / period * scale) * np.sin(v * np.pi / period * scale)) > 0.5
    else:
      pattern = (np.sin(u * np.pi / period * scale) * np.sin(v * np.pi / period * scale)) > 0
    fill[pattern] = other
  if adjective == 'outlined':
    inner = _shape_mask(noun, u * 1.35, v * 1.35)
    mask = mask & ~inner
  if adjective == 'faded':
    fill = 0.65 * bg + 0.35 * fill
  if adjective == 'dark':
    fill = fill * 0.3
  img[mask] = fill[mask]
  if adjective == 'blurry':
    img = _blur(img, passes=max(2, size // 10))
  if adjective == 'noisy':
    img = img + rng.normal(0, 0.22, size=img.shape)
  return (np.clip(img, 0, 1) * 255).round().astype(np.uint8)


class SyntheticAnp(tfds.core.GeneratorBasedBuilder):
  """Procedurally generated ANP images; see the module docstring."""

  VERSION = tfds.core.Version('1.0.0')
  BUILDER_CONFIGS = [make_config()]

  def _info(self) -> tfds.core.DatasetInfo:
    c = self.builder_config
    pairs = choose_pairs(c.num_adjectives, c.num_nouns, c.num_pairs, c.seed)
    adjectives, nouns = ADJECTIVES[:c.num_adjectives], NOUNS[:c.num_nouns]
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(c.image_size, c.image_size, 3)),
            'label_anp': tfds.features.ClassLabel(
                names=[f'{adjectives[a]}_{nouns[n]}' for a, n in pairs]),
            'label_adjective': tfds.features.ClassLabel(names=list(adjectives)),
            'label_noun': tfds.features.ClassLabel(names=list(nouns)),
        }),
        description=__doc__,
    )

  def split_sizes(self) -> Dict[str, int]:
    """{split: examples} the generation writes (known before it: `_split_generators`)."""
    c = self.builder_config
    return {'train': c.num_pairs * c.train_per_class,
            'validation': c.num_pairs * c.eval_per_class,
            'test': c.num_pairs * c.test_per_class}

  # anp_jax's own lines instead of TFDS's "Downloading and preparing dataset Unknown size ...".
  def _log_download_bytes(self):
    c = self.builder_config
    total = sum(self.split_sizes().values())
    print(f'anp_jax | generating the {self.name} dataset ({total:,} images of {c.image_size} px, '
          f'{c.num_pairs} ANPs; first use only) in {self.data_dir}', flush=True)
    self._generation_start = time.time()

  def _log_download_done(self):
    took = time.time() - getattr(self, '_generation_start', time.time())
    print(f'anp_jax | dataset generated in {took:.0f} s', flush=True)

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing is downloaded.
    c = self.builder_config
    return {'train': self._generate_examples('train', c.train_per_class),
            'validation': self._generate_examples('validation', c.eval_per_class),
            'test': self._generate_examples('test', c.test_per_class)}

  def _generate_examples(self, split: str, per_class: int):
    c = self.builder_config
    pairs = choose_pairs(c.num_adjectives, c.num_nouns, c.num_pairs, c.seed)
    split_id = SPLITS.index(split)
    total, last = len(pairs) * per_class, time.time()
    for cls, (a, n) in enumerate(pairs):
      for i in range(per_class):
        if time.time() - last >= PROGRESS_EVERY_S:
          last = time.time()
          print(f'anp_jax | generating {split}: {cls * per_class + i:,}/{total:,} images',
                file=sys.stdout, flush=True)
        rng = np.random.default_rng([c.seed, split_id, cls, i])
        image = render(ADJECTIVES[a], NOUNS[n], c.image_size, rng)
        label, adj, noun = cls, a, n
        if split == 'train' and c.label_noise and rng.uniform() < c.label_noise:
          label = int((cls + rng.integers(1, len(pairs))) % len(pairs))
          adj, noun = pairs[label]
        yield f'{split}_{cls}_{i}', {'image': image, 'label_anp': label,
                                     'label_adjective': adj, 'label_noun': noun}


def builder_config(**options) -> SyntheticAnpConfig:
  """`make_config(**options)`, or the equal config registered in `SyntheticAnp.BUILDER_CONFIGS`:
  TFDS refuses a new config object named like a registered one ("Cannot name a custom
  BuilderConfig the same as an available BuilderConfig"), and the defaults' name is registered."""
  config = make_config(**options)
  registered = SyntheticAnp.builder_configs.get(config.name)
  # The name encodes every option; equality also guards the fields it does not (description).
  return registered if registered == config else config
