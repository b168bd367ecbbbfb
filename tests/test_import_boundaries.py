"""Imports go one way: what importing a module pulls in, checked in a fresh interpreter (the log
reader and the planner need no JAX, setup checks configs without the executors), and what the
core's source imports (never `anp_jax.research`)."""

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
  assert _loaded('anp_jax.metrics_io, anp_jax.research.planner, anp_jax.research.sweep_report',
                 ('jax', 'tensorflow', 'clu', 'flax')) == []


def test_setup_checks_configs_without_importing_the_executors():
  assert _loaded('anp_jax.methods', ('jax',)) == []
  assert _loaded('anp_jax.setup', ('anp_jax.executors',)) == []


def _imported_modules(path: str, package: str) -> list:
  """Every module the file at `path` (a module of `package`) imports, as absolute dotted names,
  whether at the top or inside a function (``from . import x`` resolved against `package`)."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parts = package.split('.')
        base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
      names += [base] + [f'{base}.{alias.name}' for alias in node.names]
  return names


def test_nothing_outside_research_and_experiments_imports_research():
  """The core (every module of `anp_jax` outside `anp_jax/research/`, configs included) never
  imports `anp_jax.research`, at the top or inside a function: research tools and their command
  lines sit on top of the core, never under it (experiments and tests may import both)."""
  offenders = []
  core = os.path.join(ROOT, 'anp_jax')
  for folder, dirs, files in os.walk(core):
    rel = os.path.relpath(folder, ROOT)
    if rel == os.path.join('anp_jax', 'research'):
      dirs[:] = []
      continue
    package = rel.replace(os.sep, '.')
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(folder, name)
        for imported in _imported_modules(path, package):
          if imported == 'anp_jax.research' or imported.startswith('anp_jax.research.'):
            offenders.append(f'{os.path.relpath(path, ROOT)} imports {imported}')
  assert not offenders, '\n'.join(sorted(set(offenders)))


def _changes_sys_path(path: str) -> bool:
  """Whether the file at `path` calls ``sys.path.insert`` / ``sys.path.append``."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr in ('insert', 'append') and ast.unparse(n.func.value) == 'sys.path'
             for n in ast.walk(tree))


# The PyTorch reference implementation stays a script beside the experiments (the package does
# not depend on torch); the tests that compare against it import it as a module.
SCRIPT_IMPORTS_ALLOWED = ('experiments', 'experiments.torch_reference')


def test_no_test_imports_another_test_file_or_an_experiment_script():
  """Tests share helpers through modules named for them (`conftest`, `planner_helpers`, ...),
  never by importing another test file (which ties the two together and runs its module-level
  code twice), and read what they check of an experiment from the package, never by putting
  ``experiments/`` on the path (a script's module-level flags and side effects come with it)."""
  offenders = []
  tests = os.path.join(ROOT, 'tests')
  for name in sorted(os.listdir(tests)):
    if not name.endswith('.py'):
      continue
    path = os.path.join(tests, name)
    for imported in _imported_modules(path, 'tests'):
      top = imported.split('.')[0]
      if top.startswith('test_') or (top == 'experiments'
                                     and imported not in SCRIPT_IMPORTS_ALLOWED):
        offenders.append(f'tests/{name} imports {imported}')
    if _changes_sys_path(path):
      offenders.append(f'tests/{name} changes sys.path')
  assert not offenders, '\n'.join(sorted(set(offenders)))
