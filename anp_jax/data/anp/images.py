"""Image checks, decoding and the stored JPEG: what `anp` preparation does to each file.

Every image is decoded with PIL and made upright RGB (EXIF orientation applied; greyscale, CMYK,
palette, RGBA composited on white, 16-bit, GIF first frame); `inspect_file` tells a usable file
from one to skip (with the reason), `encode_jpeg` makes the bytes that are stored.
"""

import collections
import concurrent.futures
import hashlib
import io
import itertools
import os
import re
from typing import Callable, Iterable, Iterator, Optional, Tuple

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError


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


def to_rgb(img: Image.Image) -> Image.Image:
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
  return to_rgb(img)


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


def ordered_map(fn: Callable, items: Iterable, workers: int) -> Iterator:
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
