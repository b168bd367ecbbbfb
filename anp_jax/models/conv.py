"""Convolution lowerings offered as a model option (``config.model.conv_impl``).

All of them are drop-in replacements for ``flax.linen.Conv`` as the ResNet uses it (features,
kernel_size, strides, padding, use_bias, dtype; no dilation, no feature groups): the same
parameter names and shapes (``kernel`` of shape (kh, kw, in, out), optional ``bias``), the same
initialisers, so checkpoints and outputs are interchangeable (tested against ``nn.Conv``).

* ``'xla'``: ``nn.Conv`` itself, i.e. ``lax.conv_general_dilated``. The default; on GPU/TPU the
  backend's convolution kernels (cuDNN) are what one wants.
* ``'im2col'``: gather the kh*kw shifted (strided) windows of the padded input into one
  (N*Ho*Wo, kh*kw*C) matrix and multiply by the reshaped kernel: one matrix multiplication
  forward, two backward, plus pads/slices that XLA fuses. XLA:CPU runs matrix multiplications
  through its tuned GEMM path, while the gradients of a convolution are lowered as convolutions
  with unusual dimension numbers; which wins on a given CPU is measured by
  ``experiments/benchmark.py`` (docs/performance.md).
* ``'taps'``: the same sum written as kh*kw matrix multiplications of shifted windows by
  (C, F) kernel slices, accumulated; no kh*kw-times larger patch matrix in memory.

The input layout is NHWC throughout (flax's layout); a 1x1 convolution is a plain matmul in both
lowerings.
"""

from typing import Any, Callable, Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

PaddingLike = Union[str, int, Sequence[Union[int, Tuple[int, int]]]]

IMPLS = ('xla', 'im2col', 'taps')


def resolve_padding(padding: PaddingLike, in_size: Sequence[int], kernel: Sequence[int],
                    strides: Sequence[int]) -> Tuple[Tuple[int, int], ...]:
  """flax/lax padding spec → explicit (low, high) pairs per spatial dimension."""
  n = len(kernel)
  if isinstance(padding, str):
    if padding == 'VALID':
      return ((0, 0),) * n
    if padding == 'SAME':
      pads = []
      for size, k, s in zip(in_size, kernel, strides):
        out = -(-size // s)
        total = max((out - 1) * s + k - size, 0)
        pads.append((total // 2, total - total // 2))
      return tuple(pads)
    raise ValueError(f"padding={padding!r} is not supported by the matmul convolutions; use "
                     "'SAME', 'VALID', an int or (low, high) pairs, or conv_impl='xla'.")
  if isinstance(padding, int):
    return ((padding, padding),) * n
  pads = tuple((p, p) if isinstance(p, int) else tuple(p) for p in padding)
  if len(pads) != n or any(len(p) != 2 for p in pads):
    raise ValueError(f'padding={padding!r}: need one int or (low, high) pair per spatial '
                     f'dimension ({n}).')
  return pads


def _windows(xp, kernel, strides, out_size):
  """The kh*kw strided windows of the padded NHWC input, each (N, Ho, Wo, C), in (i, j) order."""
  (kh, kw), (sh, sw), (ho, wo) = kernel, strides, out_size
  n, _, _, c = xp.shape
  out = []
  for i in range(kh):
    for j in range(kw):
      out.append(lax.slice(xp, (0, i, j, 0), (n, i + (ho - 1) * sh + 1, j + (wo - 1) * sw + 1, c),
                           (1, sh, sw, 1)))
  return out


class _MatmulConv(nn.Module):
  """Shared fields and parameter handling of the matmul lowerings (2-D, NHWC)."""
  features: int
  kernel_size: Sequence[int]
  strides: Union[int, Sequence[int]] = 1
  padding: PaddingLike = 'SAME'
  use_bias: bool = True
  dtype: Optional[Any] = None
  param_dtype: Any = jnp.float32
  precision: Any = None
  kernel_init: Callable = nn.linear.default_kernel_init
  bias_init: Callable = nn.initializers.zeros_init()

  def _prepare(self, x):
    if x.ndim != 4:
      raise ValueError(f'{type(self).__name__} expects NHWC inputs, got shape {x.shape}.')
    kernel_size = tuple(self.kernel_size)
    if len(kernel_size) != 2:
      raise ValueError(f'kernel_size={self.kernel_size}: only 2-D convolutions are supported.')
    strides = ((self.strides,) * 2 if isinstance(self.strides, int) else tuple(self.strides))
    in_ch = x.shape[-1]
    kernel = self.param('kernel', self.kernel_init, kernel_size + (in_ch, self.features),
                        self.param_dtype)
    bias = (self.param('bias', self.bias_init, (self.features,), self.param_dtype)
            if self.use_bias else None)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
    pads = resolve_padding(self.padding, x.shape[1:3], kernel_size, strides)
    out_size = tuple((size + lo + hi - k) // s + 1
                     for size, (lo, hi), k, s in zip(x.shape[1:3], pads, kernel_size, strides))
    if min(out_size) <= 0:
      raise ValueError(f'Input {x.shape} is too small for kernel {kernel_size} with padding '
                       f'{pads} and strides {strides}.')
    if any(p != (0, 0) for p in pads):
      x = jnp.pad(x, ((0, 0),) + pads + ((0, 0),))
    return x, kernel, bias, kernel_size, strides, out_size

  def _finish(self, y, bias):
    return y if bias is None else y + bias


class Im2ColConv(_MatmulConv):
  """Convolution as patches (N·Ho·Wo, kh·kw·C) @ kernel (kh·kw·C, F)."""

  @nn.compact
  def __call__(self, x):
    xp, kernel, bias, ksize, strides, out_size = self._prepare(x)
    wins = _windows(xp, ksize, strides, out_size)
    cols = wins[0] if len(wins) == 1 else jnp.concatenate(wins, axis=-1)
    n, c = x.shape[0], x.shape[-1]
    k = ksize[0] * ksize[1] * c
    y = jnp.dot(cols.reshape(-1, k), kernel.reshape(k, self.features), precision=self.precision)
    return self._finish(y.reshape((n,) + out_size + (self.features,)), bias)


class TapsConv(_MatmulConv):
  """Convolution as the sum over kernel taps of window (N·Ho·Wo, C) @ kernel[i, j] (C, F)."""

  @nn.compact
  def __call__(self, x):
    xp, kernel, bias, ksize, strides, out_size = self._prepare(x)
    wins = _windows(xp, ksize, strides, out_size)
    n, c = x.shape[0], x.shape[-1]
    y = None
    for t, win in enumerate(wins):
      i, j = divmod(t, ksize[1])
      term = jnp.dot(win.reshape(-1, c), kernel[i, j], precision=self.precision)
      y = term if y is None else y + term
    return self._finish(y.reshape((n,) + out_size + (self.features,)), bias)


def _as_conv(cls):
  """A subclass called ``Conv``: flax names unnamed submodules after their class (``Conv_0``),
  so a model's parameter tree (and checkpoints) do not depend on the lowering."""
  return type('Conv', (cls,), {'__doc__': cls.__doc__, '__module__': __name__})


_IMPLS = {'im2col': _as_conv(Im2ColConv), 'taps': _as_conv(TapsConv)}


def get_conv_impl(name: str):
  """``config.model.conv_impl`` → a Conv module class with ``nn.Conv``'s signature."""
  if name == 'xla':
    return nn.Conv
  if name in _IMPLS:
    return _IMPLS[name]
  raise ValueError(f'config.model.conv_impl={name!r}; choose one of {IMPLS}.')
