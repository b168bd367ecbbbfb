#!/usr/bin/env python3
"""Moved: the performance model's command line is
``.venv/bin/python -m anp_jax.research.perfmodel``.

Its flags are spelt with underscores now (``--per_device_batch``, not ``--per-device-batch``).
This file only says so, with exit code 2, so that an old command line fails with the fix.
"""

import os  # noqa: I001  (first: the environment, before anything else is imported)
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # This folder: its helpers.
import _venv  # noqa: E402,F401  (started by another Python, e.g. the shebang's: rerun in .venv)

if __name__ == '__main__':
  print('ERROR: experiments/perfmodel.py moved: run .venv/bin/python -m '
        'anp_jax.research.perfmodel, with '
        'the same flags spelt with underscores (--per_device_batch, --sweep_nodes, ...).',
        file=sys.stderr)
  sys.exit(2)
