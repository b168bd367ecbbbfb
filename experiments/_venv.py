"""Runs an experiment script in the repository's environment, whichever Python started it.

Every script in experiments/ is executable (``#!/usr/bin/env python3``) and imports this module
first, so that ``experiments/study.py ...`` works from a fresh clone as ``.venv/bin/python
experiments/study.py ...`` does (the form the docs print): started by another Python that lacks
the project's packages (the system's ``python3``), the script is run again, as it was called,
by the environment's (``$ANP_VENV``, default ``.venv`` beside experiments/, built by
``./run.sh``). A Python that has them (the environment's, an activated one, a container's)
goes on. Either way the checkout the script lives in comes first on ``sys.path``: a script runs
its own anp_jax, not another checkout's installed one.
"""

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a script needs beyond the standard library (the heaviest is not imported here).
NEEDED = ('ml_collections', 'absl', 'jax')


def ensure() -> None:
  """Continues in an interpreter that has the project's packages, or exits 2 saying how to get
  one (see the module docstring)."""
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  if all(importlib.util.find_spec(name) for name in NEEDED):
    return
  venv = os.environ.get('ANP_VENV') or os.path.join(ROOT, '.venv')
  python = os.path.join(venv, 'bin', 'python')
  if os.access(python, os.X_OK) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
    os.execv(python, [python, os.path.abspath(sys.argv[0]), *sys.argv[1:]])
  missing = [name for name in NEEDED if not importlib.util.find_spec(name)]
  print(f'ERROR: {sys.executable} lacks {", ".join(missing)} and there is no environment at '
        f'{venv}: build it with `ANP_SETUP_ONLY=1 ./run.sh` (README: Quick start), then run '
        f'.venv/bin/python {os.path.relpath(sys.argv[0], ROOT)} ...', file=sys.stderr)
  sys.exit(2)


ensure()
