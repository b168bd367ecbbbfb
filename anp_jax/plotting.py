"""Headless matplotlib for the reports: one backend setup and one way to write a figure.

Imports neither JAX nor TensorFlow, so report scripts that only read JSON stay light.
"""


def pyplot():
  """`matplotlib.pyplot` on the non-interactive Agg backend (no display needed)."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  return plt


def save_figure(fig, path: str, dpi: int = 110) -> str:
  """Tight layout, writes `fig` to `path` (format from the suffix), frees it; returns `path`."""
  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  pyplot().close(fig)
  return path
