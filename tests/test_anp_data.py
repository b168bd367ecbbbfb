"""The `anp` TFDS builder on a tiny generated manual dir: both layouts, every image mode, bad files,
reports, stratified deterministic splits, and every bad-input error naming its file or row."""

import collections
import csv
import io
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from anp_jax.data import anp, prepare as prepare_cli
from anp_jax.data.anp import images, options, prepared, selection

# 6 kept ANPs x 12 images; 'tiny_cat' has 3 and is dropped by MIN. 'old_school_bus' checks the
# first-separator rule: adjective 'old', noun 'school_bus'.
ANPS = ('happy_dog', 'happy_street', 'dark_street', 'dark_forest', 'old_school_bus', 'old_dog')
SMALL_ANP, SMALL_COUNT = 'tiny_cat', 3
PER_CLASS, MIN, RESIZE = 12, 5, 40
# One image of every kind, cycled per class: (file suffix, PIL mode to save, format).
KINDS = (('jpg', 'RGB', 'JPEG'), ('png', 'RGB', 'PNG'), ('gif', 'P', 'GIF'),
         ('jpg', 'L', 'JPEG'), ('png', 'L', 'PNG'), ('jpg', 'CMYK', 'JPEG'),
         ('png', 'RGBA', 'PNG'), ('png', 'P', 'PNG'))
# Extra files that must be skipped: name -> expected reason prefix.
BAD = {'happy_dog/corrupt.png': 'corrupt image', 'dark_street/truncated.jpg': 'truncated image',
       'dark_forest/empty.jpg': 'empty file', 'old_dog/notes.txt': 'not an image'}
DUPLICATE = ('old_dog/copy_of_happy_dog.jpg', 'happy_dog/img_00.jpg')  # (dropped, kept)


def photo(seed: int, height: int, width: int) -> np.ndarray:
  """A photo-like RGB image: a smooth colour gradient with a few filled shapes and noise."""
  rng = np.random.default_rng(seed)
  yy, xx = np.mgrid[0:height, 0:width] / max(height, width)
  corners = rng.uniform(0, 255, (2, 2, 3))
  img = ((1 - yy)[..., None] * ((1 - xx)[..., None] * corners[0, 0] + xx[..., None] *
                                corners[0, 1]) +
         yy[..., None] * ((1 - xx)[..., None] * corners[1, 0] + xx[..., None] * corners[1, 1]))
  for _ in range(3):
    cy, cx, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.1, 0.3)
    mask = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
    if rng.uniform() < 0.5:
      mask = (np.abs(yy - cy) < r) & (np.abs(xx - cx) < r)
    img[mask] = rng.uniform(0, 255, 3)
  img += rng.normal(0, 6, img.shape)
  return np.clip(img, 0, 255).astype(np.uint8)


def encode(array: np.ndarray, mode: str, fmt: str) -> bytes:
  img = Image.fromarray(array)
  if mode == 'RGBA':
    alpha = np.full(array.shape[:2], 255, np.uint8)
    alpha[: array.shape[0] // 3] = 90
    img.putalpha(Image.fromarray(alpha))
  elif mode == 'P':
    img = img.convert('P', palette=Image.Palette.ADAPTIVE, colors=64)
  elif mode != 'RGB':
    img = img.convert(mode)
  out = io.BytesIO()
  img.save(out, format=fmt, **({'quality': 92} if fmt == 'JPEG' else {}))
  return out.getvalue()


def write_class(root: str, anp_name: str, count: int, seed: int, prefix: str = 'img'):
  """Writes `count` images of every kind in turn into ``root/anp_name``; returns their names."""
  os.makedirs(os.path.join(root, anp_name), exist_ok=True)
  names = []
  for i in range(count):
    suffix, mode, fmt = KINDS[i % len(KINDS)]
    h, w = ((48, 64), (64, 48), (48, 48), (72, 96))[i % 4]
    name = f'{anp_name}/{prefix}_{i:02d}.{suffix}'
    with open(os.path.join(root, name), 'wb') as f:
      f.write(encode(photo(seed * 1000 + i, h, w), mode, fmt))
    names.append(name)
  return names


def write_csv(path: str, rows, header=('image', 'anp')):
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)


@pytest.fixture(scope='module')
def manual_dir(tmp_path_factory):
  """ROOT/<anp>/ folders with every image kind, bad files, a duplicate, and images.csv."""
  root = str(tmp_path_factory.mktemp('manual'))
  listed = []
  for k, name in enumerate(ANPS + (SMALL_ANP,)):
    listed += write_class(root, name, SMALL_COUNT if name == SMALL_ANP else PER_CLASS, k)
  good_jpeg = encode(photo(99, 48, 64), 'RGB', 'JPEG')
  png = bytearray(encode(photo(98, 48, 64), 'RGB', 'PNG'))
  idat = png.find(b'IDAT')
  png[idat + 20:idat + 60] = bytes(40)
  contents = {'happy_dog/corrupt.png': bytes(png),
              'dark_street/truncated.jpg': good_jpeg[:len(good_jpeg) // 2],
              'dark_forest/empty.jpg': b'',
              'old_dog/notes.txt': b'adjective noun pairs\n'}
  for name, data in contents.items():
    with open(os.path.join(root, name), 'wb') as f:
      f.write(data)
  shutil.copyfile(os.path.join(root, DUPLICATE[1]), os.path.join(root, DUPLICATE[0]))
  with open(os.path.join(root, 'happy_dog', '.DS_Store'), 'wb') as f:  # Hidden: ignored.
    f.write(b'\0\1')
  listed += sorted(BAD) + [DUPLICATE[0], 'happy_dog/missing.jpg']
  write_csv(os.path.join(root, 'images.csv'), [(n, n.split('/')[0]) for n in listed])
  return root


@pytest.fixture(scope='module')
def folder_builder(manual_dir, tmp_path_factory):
  return anp.prepare(manual_dir, str(tmp_path_factory.mktemp('folder_data')), layout='folder',
                     min_images_per_anp=MIN, resize=RESIZE, num_workers=2)


def read_split(builder, split, decode=True):
  """[(file_name, anp name, adjective, noun, image)] of a split, in stored order."""
  feats = builder.info.features
  decoders = None if decode else {'image': tfds.decode.SkipDecoding()}
  ds = builder.as_dataset(split=split, shuffle_files=False, decoders=decoders)
  return [(ex['file_name'].decode(), feats['label_anp'].int2str(ex['label_anp']),
           feats['label_adjective'].int2str(ex['label_adjective']),
           feats['label_noun'].int2str(ex['label_noun']), ex['image'])
          for ex in tfds.as_numpy(ds)]


def test_folder_layout_counts_labels_and_vocabularies(folder_builder):
  info = folder_builder.info
  feats = info.features
  assert feats['label_anp'].names == sorted(ANPS)
  assert feats['label_adjective'].names == ['dark', 'happy', 'old']
  assert feats['label_noun'].names == ['dog', 'forest', 'school_bus', 'street']
  assert feats['image'].shape == (None, None, 3)
  assert {s: info.splits[s].num_examples for s in info.splits} == {
      'train': 60, 'validation': 6, 'test': 6}
  report = prepared.read_report(folder_builder.data_dir)
  assert report['anps'] == sorted(ANPS)
  assert report['adjectives'] == feats['label_adjective'].names
  assert report['nouns'] == feats['label_noun'].names
  assert report['dropped'] == [(SMALL_ANP, SMALL_COUNT)]
  with open(os.path.join(folder_builder.data_dir, 'dropped_classes.txt')) as f:
    assert f.read().startswith(f'{SMALL_ANP}\t{SMALL_COUNT}\tfewer than min_images_per_anp=5')
  for split in info.splits:
    for file_name, anp_name, adj, noun, image in read_split(folder_builder, split):
      assert file_name.split('/')[0] == anp_name  # Labels follow the folder.
      assert anp_name == f'{adj}_{noun}'
      assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
      assert min(image.shape[:2]) <= RESIZE
      assert file_name not in BAD and file_name != DUPLICATE[0]


def test_every_image_kind_is_stored_as_rgb(folder_builder):
  examples = {}
  for split in folder_builder.info.splits:
    for file_name, *_, image in read_split(folder_builder, split):
      examples[file_name] = image
  kinds = collections.Counter(KINDS[int(n.rsplit('_', 1)[1][:2]) % len(KINDS)][:2]
                              for n in examples)
  assert set(kinds) == {k[:2] for k in KINDS}  # JPEG, PNG, GIF, L, CMYK, RGBA and P all kept.
  grey = examples['happy_dog/img_03.jpg']  # Saved as greyscale: the channels stay equal.
  assert np.abs(grey[..., 0].astype(int) - grey[..., 2].astype(int)).max() <= 8
  rgba = examples['happy_dog/img_06.png']  # Top third is 35 % opaque: composited on white.
  assert rgba[:8].mean() > 160
  assert examples['happy_dog/img_03.jpg'].shape[:2] == (40, 53)  # 48 x 64, shorter side 40.


def test_skipped_and_duplicate_reports(folder_builder):
  report = prepared.read_report(folder_builder.data_dir)
  skipped = dict(report['skipped'])
  assert set(skipped) == set(BAD)  # The hidden .DS_Store is ignored, not reported.
  for name, reason in BAD.items():
    assert skipped[name].startswith(reason), (name, skipped[name])
  assert report['duplicates'] == [DUPLICATE]
  summary = report['summary']
  assert summary['num_skipped'] == 4 and summary['num_duplicates'] == 1
  assert summary['layout'] == 'folder' and not summary['source_splits']


def test_split_is_stratified(folder_builder):
  counts = {split: collections.Counter(r[1] for r in read_split(folder_builder, split, False))
            for split in ('train', 'validation', 'test')}
  for anp_name in ANPS:
    assert (counts['train'][anp_name], counts['validation'][anp_name],
            counts['test'][anp_name]) == (10, 1, 1)
  summary = prepared.read_report(folder_builder.data_dir)['summary']
  assert summary['class_counts']['train'] == dict(sorted(counts['train'].items()))
  assert selection.allocate(12, (0.8, 0.1, 0.1)) == [10, 1, 1]
  assert selection.allocate(3, (0.8, 0.1, 0.1)) == [1, 1, 1]
  assert selection.allocate(1000, (0.8, 0.1, 0.1)) == [800, 100, 100]


def test_preparation_is_deterministic(folder_builder, manual_dir, tmp_path):
  again = anp.prepare(manual_dir, str(tmp_path), layout='folder', min_images_per_anp=MIN,
                      resize=RESIZE, num_workers=1)
  assert again.builder_config.name == folder_builder.builder_config.name
  for split in ('train', 'validation', 'test'):
    assert read_split(again, split, False) == read_split(folder_builder, split, False)


def test_reuse_and_read_only_loading(folder_builder, manual_dir):
  data_dir = folder_builder.data_dir_root
  same = anp.prepare(manual_dir, data_dir, layout='folder', min_images_per_anp=MIN,
                     resize=RESIZE)  # Already prepared: reused, not regenerated.
  assert same.info.splits['train'].num_examples == 60
  info = prepared.load_info(data_dir)
  assert info.features['label_anp'].names == sorted(ANPS)
  loaded = prepared.load_builder(data_dir, folder_builder.builder_config.name)
  assert read_split(loaded, 'test', False) == read_split(folder_builder, 'test', False)
  elsewhere = os.path.join(os.path.dirname(manual_dir), 'other_manual')
  shutil.copytree(manual_dir, elsewhere, dirs_exist_ok=True)
  with pytest.raises(ValueError, match='was prepared from'):
    anp.prepare(elsewhere, data_dir, layout='folder', min_images_per_anp=MIN, resize=RESIZE)
  # The same folder through a symlink is the same source (it was refused as another one).
  link = os.path.join(os.path.dirname(manual_dir), 'linked_manual')
  os.symlink(manual_dir, link)
  linked = anp.prepare(link, data_dir, layout='folder', min_images_per_anp=MIN, resize=RESIZE)
  assert linked.info.splits['train'].num_examples == 60


def test_csv_layout(manual_dir, tmp_path):
  builder = anp.prepare(manual_dir, str(tmp_path), resize=0, min_images_per_anp=MIN)
  assert builder.builder_config.layout == 'auto'
  report = prepared.read_report(builder.data_dir)
  assert report['summary']['layout'] == 'csv'
  assert report['anps'] == sorted(ANPS)
  assert {s: builder.info.splits[s].num_examples for s in builder.info.splits} == {
      'train': 60, 'validation': 6, 'test': 6}
  skipped = dict(report['skipped'])
  assert set(skipped) == set(BAD) | {'happy_dog/missing.jpg'}
  assert skipped['happy_dog/missing.jpg'].startswith('missing file (images.csv line ')
  assert report['duplicates'] == [DUPLICATE]
  # resize=0 keeps sizes; an RGB JPEG is stored byte for byte.
  stored = {r[0]: r[4] for r in read_split(builder, 'train', False)}
  stored.update({r[0]: r[4] for s in ('validation', 'test') for r in read_split(builder, s, False)})
  with open(os.path.join(manual_dir, 'dark_forest/img_00.jpg'), 'rb') as f:
    assert stored['dark_forest/img_00.jpg'] == f.read()
  assert Image.open(io.BytesIO(stored['dark_forest/img_03.jpg'])).size == (96, 72)


def test_source_splits_folder_and_csv(tmp_path):
  root = str(tmp_path / 'split_manual')
  expected = {}
  for s, (split, n) in enumerate((('train', 4), ('val', 2), ('test', 3))):
    for k, name in enumerate(('red_car', 'blue_car')):
      for f in write_class(os.path.join(root, split), name, n, 10 * s + k):
        expected[f'{split}/{f}'] = {'val': 'validation'}.get(split, split)
  builder = anp.prepare(root, str(tmp_path / 'd1'), resize=RESIZE)
  got = {r[0]: split for split in builder.info.splits for r in read_split(builder, split, False)}
  assert got == expected
  summary = prepared.read_report(builder.data_dir)['summary']
  assert summary['source_splits']
  assert summary['split_origin'] == {s: 'source' for s in ('train', 'validation', 'test')}

  write_csv(os.path.join(root, 'list.csv'), [(f, f.split('/')[1], sp.upper())
                                             for f, sp in sorted(expected.items())],
            header=('path', 'label', 'subset'))
  builder = anp.prepare(root, str(tmp_path / 'd2'), layout='csv', csv_file='list.csv',
                        csv_image_column='path', csv_anp_column='label',
                        csv_split_column='subset', resize=RESIZE)
  got = {r[0]: split for split in builder.info.splits for r in read_split(builder, split, False)}
  assert got == expected


def test_a_split_the_source_lacks_is_carved_from_its_train_split(tmp_path, capsys):
  """A source with train and test only (as MUSA2): validation is carved from each ANP's train
  images, 0.1 / 0.9 of them (split_fractions 0.8 / 0.1 / 0.1), seeded; the test split stays the
  source's; summary.json and the report say where each split comes from. A validation fraction
  of 0 carves nothing. (Before: such a source gave no validation split.)"""
  root = str(tmp_path / 'train_test')
  source = {}
  for s, (split, n) in enumerate((('train', 18), ('test', 3))):
    for k, name in enumerate(('red_car', 'blue_car')):
      for f in write_class(os.path.join(root, split), name, n, 10 * s + k):
        source[f'{split}/{f}'] = split
  builder = anp.prepare(root, str(tmp_path / 'd'), resize=RESIZE)
  got = {split: {r[0]: r[1] for r in read_split(builder, split, False)}
         for split in builder.info.splits}
  assert set(got['test']) == {f for f, sp in source.items() if sp == 'test'}
  assert set(got['train']) | set(got['validation']) == {f for f, sp in source.items()
                                                        if sp == 'train'}
  assert collections.Counter(got['validation'].values()) == {'red_car': 2, 'blue_car': 2}
  origin = prepared.read_report(builder.data_dir)['summary']['split_origin']
  assert origin['test'] == 'source'
  assert origin['validation'].startswith('carved from the source train split: 0.1111 of each')
  assert origin['train'] == 'source, less the images carved into validation'
  prepare_cli._print_report(builder)
  assert 'validation: carved from the source train split' in capsys.readouterr().out
  other_seed = anp.prepare(root, str(tmp_path / 'd2'), resize=RESIZE, split_seed=1)
  assert {r[0] for r in read_split(other_seed, 'validation', False)} != set(got['validation'])
  uncarved = anp.prepare(root, str(tmp_path / 'd3'), resize=RESIZE,
                         split_fractions=(0.9, 0.0, 0.1))
  assert set(uncarved.info.splits) == {'train', 'test'}
  assert prepared.read_report(uncarved.data_dir)['summary']['split_origin'] == {
      'train': 'source', 'test': 'source'}


def test_max_images_per_anp_and_config_names(manual_dir, tmp_path):
  builder = anp.prepare(manual_dir, str(tmp_path), layout='folder', min_images_per_anp=MIN,
                        max_images_per_anp=8, resize=RESIZE)
  summary = prepared.read_report(builder.data_dir)['summary']
  assert all(n == 4 for n in summary['capped_classes'].values())
  assert sum(builder.info.splits[s].num_examples for s in builder.info.splits) == 6 * 8
  names = {options.make_config().name, options.make_config(resize=128).name,
           options.make_config(split_fractions=(0.7, 0.2, 0.1)).name,
           options.make_config(separator='-').name, options.make_config(source_tag='mvso_en').name}
  assert len(names) == 5
  assert options.make_config(resize=128).name == options.make_config(resize=128).name
  assert options.make_config(split_fractions='0.7,0.2,0.1').name == options.make_config(
      split_fractions=(0.7, 0.2, 0.1)).name


def test_bad_inputs_raise_naming_the_file_or_row(manual_dir, tmp_path):
  data_dir = str(tmp_path / 'data')
  missing = str(tmp_path / 'nowhere')
  with pytest.raises(FileNotFoundError, match='nowhere'):
    anp.prepare(missing, data_dir)
  with pytest.raises(FileNotFoundError, match='absent.csv'):
    anp.prepare(manual_dir, data_dir, layout='csv', csv_file='absent.csv')

  write_csv(os.path.join(manual_dir, 'cols.csv'), [('happy_dog/img_00.jpg', 'happy_dog')],
            header=('image', 'label'))
  with pytest.raises(ValueError, match=r"cols\.csv.*lacks the column\(s\) \['anp'\]"):
    anp.prepare(manual_dir, data_dir, csv_file='cols.csv')

  write_csv(os.path.join(manual_dir, 'bad_rows.csv'),
            [('happy_dog/img_00.jpg', 'happy_dog'), ('happy_dog/img_01.png', ''),
             ('happy_dog/img_02.gif', 'happy_dog')])
  with pytest.raises(ValueError, match=r'bad_rows\.csv: line 3 has an empty or missing ANP'):
    anp.prepare(manual_dir, data_dir, csv_file='bad_rows.csv')

  write_csv(os.path.join(manual_dir, 'nosep.csv'),
            [('happy_dog/img_00.jpg', 'happy_dog'), ('happy_dog/img_01.png', 'happydog')])
  with pytest.raises(ValueError, match=r"'happydog' \(nosep\.csv line 3\)"):
    anp.prepare(manual_dir, data_dir, csv_file='nosep.csv')

  write_csv(os.path.join(manual_dir, 'badsplit.csv'),
            [('happy_dog/img_00.jpg', 'happy_dog', 'holdout')], header=('image', 'anp', 'split'))
  with pytest.raises(ValueError, match=r"badsplit\.csv line 2: unknown split 'holdout'"):
    anp.prepare(manual_dir, data_dir, csv_file='badsplit.csv')

  folder = str(tmp_path / 'nosep_folder')
  write_class(folder, 'happy_dog', 2, 0)
  write_class(folder, 'sunset', 2, 1)
  with pytest.raises(ValueError, match=r"'sunset' \(folder .*sunset\)"):
    anp.prepare(folder, data_dir)

  with pytest.raises(ValueError, match='fewer than min_images_per_anp=500'):
    anp.prepare(manual_dir, data_dir, layout='folder', min_images_per_anp=500)

  junk = str(tmp_path / 'junk')
  os.makedirs(os.path.join(junk, 'sad_cat'))
  for name, data in (('a.jpg', b''), ('b.txt', b'text'), ('c.jpg', b'\xff\xd8\xff\xe0oops')):
    with open(os.path.join(junk, 'sad_cat', name), 'wb') as f:
      f.write(data)
  with pytest.raises(ValueError, match=r'No usable images .*sad_cat/a\.jpg: empty file'):
    anp.prepare(junk, data_dir)

  empty = str(tmp_path / 'empty_manual')
  os.makedirs(os.path.join(empty, 'sad_cat'))
  with pytest.raises(ValueError, match='No images found'):
    anp.prepare(empty, data_dir)

  with pytest.raises(ValueError, match='split_fractions'):
    options.make_config(split_fractions=(0.8, 0.1, 0.2))
  with pytest.raises(ValueError, match='Unknown anp option'):
    options.make_config(min_images=3)
  # Failed preparations leave nothing behind: not even an empty config folder or the lock file.
  assert not os.path.exists(data_dir), sorted(os.listdir(data_dir))


def test_cli_prints_report_and_writes_contact_sheet(folder_builder, manual_dir, tmp_path, capsys):
  sheet = str(tmp_path / 'sheet.png')
  data_dir = str(folder_builder.data_dir_root)
  rc = prepare_cli.main(['--manual_dir', manual_dir, '--data_dir', data_dir, '--layout', 'folder',
                         '--min_images_per_anp', str(MIN), '--resize', str(RESIZE),
                         '--contact_sheet', sheet, '--contact_rows', '2', '--contact_cols', '4'])
  out = capsys.readouterr().out
  assert rc == 0
  assert '6 ANPs, 3 adjectives, 4 nouns' in out
  assert 'old_school_bus' in out
  assert 'skipped files: 4' in out and 'duplicates (same bytes, first kept): 1' in out
  assert f'dropped classes (< min_images_per_anp): 1: {SMALL_ANP} (3)' in out
  train_line = next(line for line in out.splitlines() if line.strip().startswith('train '))
  assert train_line.split()[1:5] == ['60', '6', '10', '10']
  assert f'--config.anp.config_name={folder_builder.builder_config.name}' in out
  with Image.open(sheet) as img:
    assert img.format == 'PNG' and img.size[0] > img.size[1] > 100


def test_every_cli_flag_sets_its_preparation_option(manual_dir, tmp_path, capsys):
  """The absl command line (underscore flags) hands every option to the builder under its own
  name: the prepared config is the one `make_config` names for the same options; a flag left out
  keeps the builder's default; --resize is --resize_short_side."""
  flags = dict(layout='csv', csv_file='images.csv', csv_image_column='image',
               csv_anp_column='anp', csv_split_column='', csv_delimiter=',', separator='_',
               min_images_per_anp=MIN, max_images_per_anp=12, split_fractions='0.7,0.2,0.1',
               split_seed=3, resize_short_side=24, jpeg_quality=80, source_tag='t')
  argv = ['--manual_dir', manual_dir, '--data_dir', str(tmp_path / 'd'), '--num_workers=2']
  argv += [f'--{k}={v}' for k, v in flags.items()]
  assert prepare_cli.main(argv) == 0
  expected = {('resize' if k == 'resize_short_side' else k): v for k, v in flags.items()}
  name = options.make_config(**expected).name
  assert f'--config.anp.config_name={name}' in capsys.readouterr().out
  summary = prepared.read_report(prepared.dataset_dir(str(tmp_path / 'd'), name))['summary']
  assert summary['options']['resize'] == 24 and summary['options']['split_seed'] == 3
  # Left out: the builder's defaults, the same config as anp.prepare without them.
  argv = ['--manual_dir', manual_dir, '--data_dir', str(tmp_path / 'e'), '--layout=folder',
          f'--min_images_per_anp={MIN}', '--resize=24']
  assert prepare_cli.main(argv) == 0
  default_name = options.make_config(layout='folder', min_images_per_anp=MIN,
                                            resize=24).name
  assert f'--config.anp.config_name={default_name}' in capsys.readouterr().out


@pytest.mark.parametrize('side', [32, 0])
def test_photos_stored_with_a_shorter_side_of_at_most_n(manual_dir, tmp_path, capsys, side):
  """--resize_short_side N stores every photo with its shorter side min(N, source), re-encoded at
  --jpeg_quality; summary.json records N for the pipeline (dataset_meta.stored_short_side); 0
  keeps the source sizes (and records None)."""
  from anp_jax.data import pipeline
  from conftest import tiny_config
  data_dir = str(tmp_path / 'data')
  rc = prepare_cli.main(['--manual_dir', manual_dir, '--data_dir', data_dir, '--layout',
                         'folder', '--min_images_per_anp', str(MIN), '--resize_short_side',
                         str(side), '--jpeg_quality', '75'])
  out = capsys.readouterr().out
  assert rc == 0
  assert (f'shorter side <= {side} px' if side else 'shorter side as in the source') in out
  builder = prepared.load_builder(data_dir)
  sources = {}
  for name in os.listdir(manual_dir):
    for f in (os.listdir(os.path.join(manual_dir, name))
              if os.path.isdir(os.path.join(manual_dir, name)) else []):
      try:
        with Image.open(os.path.join(manual_dir, name, f)) as img:
          sources[f'{name}/{f}'] = min(img.size)
      except Exception:  # pylint: disable=broad-except  # The bad files: skipped anyway.
        pass
  for split in builder.info.splits:
    for file_name, *_, data in read_split(builder, split, False):
      with Image.open(io.BytesIO(data)) as img:
        expected = min(side, sources[file_name]) if side else sources[file_name]
        assert min(img.size) == expected, (file_name, img.size)
  assert prepared.read_report(data_dir)['summary']['stored_short_side_max'] == (side or None)
  config = tiny_config(data_dir, dataset='anp')
  assert pipeline.dataset_meta(builder, config).stored_short_side == (side or None)


def test_paper_config_trains_on_a_prepared_folder(folder_builder, tmp_path):
  """The MUSA2 recipe (ResNet v1.5, inception crops, per-device BN, SGD) shrunk to a tiny run."""
  from anp_jax import trainer
  from anp_jax.configs import musa2_resnet50
  config = musa2_resnet50.get_config()
  root = os.path.dirname(os.path.dirname(os.path.dirname(folder_builder.data_dir)))
  config.data_dir = root
  config.anp.config_name = folder_builder.builder_config.name
  config.model.name, config.model.width, config.model.dtype = 'resnet18', 0.125, 'float32'
  config.image_size = 32
  config.batch_size, config.eval_batch_size = 16, 16
  config.num_train_steps, config.log_every_steps = 3, 1
  config.progress_bar = False
  config.checkpoint_every_steps = 0
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.setup.devices == 8
  losses = [h['train/loss'] for h in result.records if 'train/loss' in h]
  assert len(losses) == 3 and all(np.isfinite(losses))
  n_eval = folder_builder.info.splits['validation'].num_examples
  top1 = result.final_eval['eval/anp_top1'] * n_eval
  assert abs(top1 - round(top1)) < 1e-4  # A mean over exactly the validation examples.
  run = trainer.build(config)  # The held-out split, as config.evals will name it.
  assert run.meta.split_sizes == {'train': 60, 'validation': 6, 'test': 6}
  assert run.meta.stored_short_side == RESIZE
  test = run.evaluate(result.state, split='test')
  assert abs(test['test/anp_top1'] * 6 - round(test['test/anp_top1'] * 6)) < 1e-4


def _write_files(root: str, files) -> None:
  for name, data in files.items():
    os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
    with open(os.path.join(root, name), 'wb') as f:
      f.write(data)


def _scan(root: str, **config_options):
  """(ScanResult, {file_name: bytes} of every stored file) for `root` scanned with
  `config_options`."""
  result = selection.scan(root, options.make_config(layout='folder', **config_options))
  stored = {}
  for items in result.splits.values():
    for c in items:
      with open(c.path, 'rb') as f:
        stored[c.file_name] = f.read()
  return result, stored


def _assert_truthful(result, stored):
  """Every duplicates row names a kept file that is in the dataset, with the same bytes, and no
  bytes are stored twice."""
  for dropped, kept in result.duplicates:
    assert kept in stored, (dropped, kept)
    assert dropped not in stored
  assert len(set(stored.values())) == len(stored)


def test_a_duplicate_is_kept_in_an_anp_that_stays(tmp_path):
  """Bytes listed in two ANPs are kept in one that is in the dataset: de-duplication runs among
  the ANPs that min_images_per_anp keeps (before: the first copy was kept, its ANP then dropped,
  and the image was lost from the surviving ANP too, while duplicates.txt named the dropped
  copy as kept; the survivor's shrunken count could drop it as well)."""
  png = lambda seed: encode(photo(seed, 20, 20), 'RGB', 'PNG')  # noqa: E731
  root = str(tmp_path / 'manual')
  _write_files(root, {'aaa_x/shared.png': png(0), 'bbb_y/1.png': png(1), 'bbb_y/2.png': png(2),
                      'bbb_y/shared_copy.png': png(0)})
  # bbb_y has 3 distinct images: it stays (before: "Every ANP ... has fewer than ...").
  result, stored = _scan(root, min_images_per_anp=3, split_fractions=(1.0, 0.0, 0.0))
  assert result.anps == ['bbb_y'] and result.dropped == [('aaa_x', 1)]
  assert sorted(stored) == ['bbb_y/1.png', 'bbb_y/2.png', 'bbb_y/shared_copy.png']
  assert result.duplicates == [('aaa_x/shared.png', 'bbb_y/shared_copy.png')]
  _assert_truthful(result, stored)

  # bbb_y and ccc_z share an image: the first copy in listing order (bbb_y's) stays, which takes
  # ccc_z below the minimum; ccc_z is dropped with the count that decided it.
  _write_files(root, {'bbb_y/3.png': png(3), 'ccc_z/1.png': png(4), 'ccc_z/2.png': png(5),
                      'ccc_z/copy_of_3.png': png(3)})
  result, stored = _scan(root, min_images_per_anp=3, split_fractions=(1.0, 0.0, 0.0))
  assert result.anps == ['bbb_y'] and result.dropped == [('aaa_x', 1), ('ccc_z', 2)]
  assert 'bbb_y/shared_copy.png' in stored and 'bbb_y/3.png' in stored
  assert result.duplicates == [('aaa_x/shared.png', 'bbb_y/shared_copy.png'),
                               ('ccc_z/copy_of_3.png', 'bbb_y/3.png')]
  _assert_truthful(result, stored)


def test_a_duplicate_left_out_by_max_images_per_anp_is_kept_elsewhere(tmp_path):
  """max_images_per_anp samples each ANP before de-duplication, so a kept copy is never one the
  sample left out (before: aaa_x's copies were kept, then sampled away, bbb_y's copies were
  reported as duplicates of files not in the dataset, and bbb_y kept only its 3 own images)."""
  png = lambda seed: encode(photo(seed, 20, 20), 'RGB', 'PNG')  # noqa: E731
  root = str(tmp_path / 'manual')
  files = {}
  for i in range(6):
    files[f'aaa_x/s{i}.png'] = files[f'bbb_y/copy_s{i}.png'] = png(i)
  for i in range(3):
    files[f'bbb_y/own{i}.png'] = png(10 + i)
  _write_files(root, files)
  result, stored = _scan(root, max_images_per_anp=4, split_fractions=(1.0, 0.0, 0.0))
  _assert_truthful(result, stored)
  # bbb_y's sampled copies that aaa_x keeps are made up from the rest of bbb_y: both ANPs are
  # full, and 8 of the 9 byte strings are stored; the one left out is counted as capped.
  assert collections.Counter(name.split('/')[0] for name in stored) == {'aaa_x': 4, 'bbb_y': 4}
  assert len(set(files.values()) - set(stored.values())) == 1
  assert 'bbb_y' in result.capped and set(result.capped.values()) == {1}
  # Every byte string of the source that is not stored was left out by both samples.
  assert len(result.duplicates) == sum(1 for name, data in files.items()
                                       if name not in stored and data in stored.values())


@pytest.mark.parametrize('bad', ['happy_dog ', ' happy_dog', 'happy\tdog', 'happy_dog\u00a0'])
def test_anp_names_that_label_files_would_change_are_refused(tmp_path, bad):
  """TFDS reads label files back with every name stripped, one per line, and the reports are
  tab separated: a folder 'happy_dog ' beside 'happy_dog' prepared as two ANPs and loaded as one
  name twice. Such names are refused, naming the folder (or CSV line)."""
  root = str(tmp_path / 'manual')
  write_class(root, 'happy_dog', 2, 0)
  write_class(root, bad, 2, 1)
  with pytest.raises(ValueError, match=r'whitespace at either end or a control character'):
    selection.scan(root, options.make_config(layout='folder'))
  with pytest.raises(ValueError, match=f'{re.escape(repr(bad))} \\(folder .*\\)'):
    selection.scan(root, options.make_config(layout='folder'))
  write_csv(os.path.join(root, 'images.csv'), [('happy_dog/img_00.jpg', 'happy_dog'),
                                               ('happy_dog/img_01.png', 'sad\ncat')])
  with pytest.raises(ValueError, match=r"'sad\\ncat' \(images\.csv line \d+\) has whitespace"):
    selection.scan(root, options.make_config(layout='csv'))


@pytest.mark.parametrize('mode,key', [('RGB', (10, 200, 30)), ('L', 77)])
def test_a_png_colour_key_is_composited_on_white(tmp_path, mode, key):
  """A PNG tRNS chunk on an RGB or greyscale image marks one colour transparent, like alpha: it
  becomes white, as RGBA and palette transparency do (it kept its key colour before)."""
  img = Image.new(mode, (4, 4), key)
  img.putpixel((0, 0), (1, 2, 3) if mode == 'RGB' else 5)
  path = tmp_path / 'keyed.png'
  img.save(path, transparency=key)
  with Image.open(path) as loaded:
    assert 'transparency' in loaded.info
    rgb = np.asarray(images.to_rgb(loaded))
  assert rgb.shape == (4, 4, 3)
  assert (rgb[1:, 1:] == 255).all()  # The keyed colour.
  assert tuple(rgb[0, 0]) == ((1, 2, 3) if mode == 'RGB' else (5, 5, 5))


# ----------------------------------------------------------------------------------------------
# The same command again on a changed folder, progress, TFDS's noise, ANP_DATA_DIR, plain classes.


def _small_manual(root: str, classes=('happy_dog', 'sad_cat'), per_class: int = 10) -> str:
  for k, name in enumerate(classes):
    write_class(root, name, per_class, 50 + k)
  return root


def test_a_changed_folder_is_refused_not_reused_silently(tmp_path, capsys):
  """Adding photos and rerunning the same prepare command printed the old split sizes: the
  preparation records its files (names, sizes, mtimes) and refuses a changed folder."""
  root = _small_manual(str(tmp_path / 'manual'))
  argv = ['--manual_dir', root, '--data_dir', str(tmp_path / 'd'), '--resize', '32']
  assert prepare_cli.main(argv) == 0
  first = capsys.readouterr().out
  assert re.search(r'^  train +16 ', first, re.M), first
  assert prepare_cli.main(argv) == 0  # Unchanged: reused, and said so.
  assert 'anp_jax | reusing ' in capsys.readouterr().out
  write_class(root, 'happy_dog', 15, 53, prefix='more')  # 15 photos more.
  with pytest.raises(ValueError, match=r'prepared from 20 files of .*; the folder now has 35: '
                                       r'pass --overwrite'):
    prepare_cli.main(argv)
  shutil.rmtree(os.path.join(root, 'happy_dog'))
  write_class(root, 'happy_dog', 10, 52)  # As many files as prepared, other bytes.
  os.utime(os.path.join(root, 'happy_dog', 'img_00.jpg'), (1, 1))
  with pytest.raises(ValueError, match='has as many, but names, sizes or modification times'):
    prepare_cli.main(argv)
  write_class(root, 'happy_dog', 15, 53, prefix='more')
  assert prepare_cli.main(argv + ['--overwrite']) == 0
  out = capsys.readouterr().out
  assert re.search(r'^  train +28 ', out, re.M), out  # 25 + 10 photos: 20 + 8 to train.
  assert prepare_cli.main(argv) == 0 and 'reusing' in capsys.readouterr().out


def test_progress_is_shown_and_tfds_is_quiet(tmp_path, capfd, monkeypatch):
  monkeypatch.setattr(selection, 'PROGRESS_EVERY_S', 0.0)  # A line per file and image.
  root = _small_manual(str(tmp_path / 'manual'))
  # Options other than the defaults: TFDS logged its 400-character "custom data configuration".
  argv = ['--manual_dir', root, '--data_dir', str(tmp_path / 'd'), '--resize', '32',
          '--min_images_per_anp', '2', '--num_workers', '1']
  assert prepare_cli.main(argv) == 0
  out, err = capfd.readouterr()
  text = out + err
  for noise in ('Downloading and preparing', 'Using custom data configuration', 'Generating',
                'Shuffling', 'downloaded and prepared', '\r', '\x1b['):
    assert noise not in text, (noise, text[:3000])
  assert 'anp_jax | scanning 20 files' in out and 'anp_jax | scanned 19 / 20 files' in out
  assert 'anp_jax | writing train: 15 / 16 images' in out and 'anp_jax | prepared in ' in out
  assert not err.strip(), err


def test_the_data_dir_defaults_to_where_training_looks(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv('ANP_DATA_DIR', str(tmp_path / 'data'))
  root = _small_manual(str(tmp_path / 'manual'))
  assert prepare_cli.main(['--manual_dir', root, '--resize', '32']) == 0
  assert f"--config.data_dir={tmp_path / 'data'} " in capsys.readouterr().out
  assert len(prepared.prepared_dirs(str(tmp_path / 'data'))) == 1


def test_plain_class_folders_prepare_and_train(tmp_path, capsys):
  """cat/ and dog/ were refused ("not of the form adjective_noun"), and the failed attempt left
  an empty config folder behind; --labels class prepares them: one label per class, trained
  with the ANP head only."""
  from anp_jax import trainer
  from conftest import tiny_config
  root = _small_manual(str(tmp_path / 'pets'), classes=('cat', 'dog', 'golden_retriever'),
                       per_class=12)
  data_dir = str(tmp_path / 'd')
  with pytest.raises(ValueError, match=r"'cat' .*prepare with --labels=class"):
    prepare_cli.main(['--manual_dir', root, '--data_dir', data_dir])
  assert not os.path.exists(data_dir)
  assert prepare_cli.main(['--manual_dir', root, '--data_dir', data_dir, '--labels', 'class',
                           '--resize', '32']) == 0
  out = capsys.readouterr().out
  assert '--config.model.adjective_head=False --config.model.noun_head=False' in out
  assert 'classes: 3 (--labels class' in out and 'cat, dog, golden_retriever' in out
  builder = prepared.load_builder(data_dir)
  assert builder.info.features['label_anp'].names == ['cat', 'dog', 'golden_retriever']
  assert builder.info.features['label_adjective'].names == [options.NO_LABEL]
  # The name of an ANP preparation of the same options is unchanged by the new option.
  assert builder.builder_config.name.startswith('auto_classes_')
  assert options.make_config(resize=32).name == 'auto_min0_max0_r32_q90_' + options.make_config(
      resize=32).name.rsplit('_', 1)[1]

  config = tiny_config(data_dir, dataset='anp', eval_every_epochs=1.0,
                       **{'anp.config_name': builder.builder_config.name})
  with pytest.raises(ValueError, match='add --config.model.adjective_head=False '
                                       '--config.model.noun_head=False'):
    trainer.build(config)
  config.model.adjective_head = config.model.noun_head = False
  config.batch_size, config.eval_batch_size, config.bn_group_size = 16, 16, 2
  config.num_train_steps = 3
  result = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert sorted(k for k in result.final_eval if k.endswith('_top1')) == ['eval/anp_top1']
  n_eval = builder.info.splits['validation'].num_examples
  assert n_eval == 3 and result.final_eval['eval/anp_top1'] * 3 == pytest.approx(
      round(result.final_eval['eval/anp_top1'] * 3))
