"""Moved: the planner's command line is ``.venv/bin/python -m anp_jax.research.planner`` (same
flags).

This module only says so, with exit code 2, so that an old command line fails with the fix (the
core does not import `anp_jax.research`, so it cannot forward the call).
"""

import sys

if __name__ == '__main__':
  print('ERROR: .venv/bin/python -m anp_jax.plan moved: run .venv/bin/python -m '
        'anp_jax.research.planner with the '
        'same flags.', file=sys.stderr)
  sys.exit(2)
