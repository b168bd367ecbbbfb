"""Moved: the performance model's command line is ``python -m anp_jax.research.perfmodel``.

Its flags are spelt with underscores now (``--per_device_batch``, not ``--per-device-batch``).
This file only says so, with exit code 2, so that an old command line fails with the fix.
"""

import sys

if __name__ == '__main__':
  print('ERROR: experiments/perfmodel.py moved: run python -m anp_jax.research.perfmodel, with '
        'the same flags spelt with underscores (--per_device_batch, --sweep_nodes, ...).',
        file=sys.stderr)
  sys.exit(2)
