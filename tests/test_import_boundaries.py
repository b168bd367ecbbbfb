"""What importing a module pulls in, checked in a fresh interpreter: the log reader and the
planner need no JAX, and setup checks configs without the executors (imports go one way)."""

import ast
import os
import subprocess
import sys

from conftest import ROOT


def _loaded(modules: str, packages) -> list:
  """The modules of `packages` loaded after ``import <modules>`` in a fresh interpreter."""
  code = (f'import sys, {modules}; print(sorted(m for m in sys.modules '
          f'if any(m == p or m.startswith(p + ".") for p in {tuple(packages)!r})))')
  out = subprocess.run([sys.executable, '-c', code], env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_the_log_reader_the_planner_and_the_reports_import_without_jax():
  assert _loaded('anp_jax.metrics_io, anp_jax.research.plan, anp_jax.research.sweep_report',
                 ('jax', 'tensorflow', 'clu', 'flax')) == []


def test_setup_checks_configs_without_importing_the_executors():
  assert _loaded('anp_jax.methods', ('jax',)) == []
  assert _loaded('anp_jax.setup', ('anp_jax.executors',)) == []
