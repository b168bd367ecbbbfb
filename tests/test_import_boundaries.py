"""Imports go one way: what importing a module pulls in, checked in a fresh interpreter (the log
reader and the planner need no JAX, setup checks configs without the executors), and what the
core's source imports (never `anp_jax.research`)."""

import ast
import os
import subprocess
import sys

from conftest import ROOT


def _printed(code: str):
  """The value `code`, run in a fresh interpreter, prints last (a Python literal)."""
  out = subprocess.run([sys.executable, '-c', code], env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def _loaded(modules: str, packages) -> list:
  """The modules of `packages` loaded after ``import <modules>`` in a fresh interpreter."""
  return _printed(f'import sys, {modules}; print(sorted(m for m in sys.modules '
                  f'if any(m == p or m.startswith(p + ".") for p in {tuple(packages)!r})))')


def test_the_log_reader_the_planner_and_the_reports_import_without_jax():
  assert _loaded('anp_jax.metrics_io, anp_jax.research.planner, anp_jax.research.sweep_report',
                 ('jax', 'tensorflow', 'clu', 'flax')) == []


def test_setup_checks_configs_without_importing_the_executors():
  assert _loaded('anp_jax.methods', ('jax',)) == []
  assert _loaded('anp_jax.setup', ('anp_jax.executors',)) == []


def test_validating_a_config_with_other_evaluators_imports_no_executor():
  """Issue 43, item 1: validation imports the modules of the evaluator kinds a config names
  (here the calibration kind and a classification on the test split), and those need no
  executor or trainer: an evaluator reaches the executor through the run it is given."""
  code = ('import sys\n'
          'from anp_jax import setup\n'
          'from anp_jax.configs import tiny\n'
          'c = tiny.get_config()\n'
          "c.evals.cal = dict(kind='calibration', bins=10)\n"
          "c.evals.test = dict(kind='classification', split='test')\n"
          "c.keep_best_metric = 'cal/ece'\n"
          'setup.validate_config(c)\n'
          "assert 'anp_jax.evaluators.calibration' in sys.modules\n"
          "print(sorted(m for m in sys.modules if m.startswith(('anp_jax.executors', "
          "'anp_jax.trainer'))))")
  assert _printed(code) == []


def test_the_planner_reads_which_schedules_decay_without_jax():
  """Issue 43, item 2: the planner's budget asks the schedule registry (every module of
  anp_jax/optim/schedules/ imported), and that imports no JAX."""
  code = ('import sys\n'
          'from anp_jax.research.planner import budget\n'
          "assert budget.decays('cosine') and budget.decays('step')\n"
          "assert not budget.decays('constant')\n"
          "print(sorted(m for m in ('jax', 'optax', 'flax', 'tensorflow') if m in sys.modules))")
  assert _printed(code) == []


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


def _core_modules() -> dict:
  """{dotted name: path} of every module of the core (`anp_jax` outside `anp_jax/research/`)."""
  out = {}
  for folder, dirs, files in os.walk(os.path.join(ROOT, 'anp_jax')):
    rel = os.path.relpath(folder, ROOT)
    if rel == os.path.join('anp_jax', 'research'):
      dirs[:] = []
      continue
    for name in files:
      if name.endswith('.py'):
        dotted = rel.replace(os.sep, '.') + ('' if name == '__init__.py' else f'.{name[:-3]}')
        out[dotted] = os.path.join(folder, name)
  return out


def _core_graph() -> dict:
  """{module: the core modules it imports}, at the top or inside a function. ``from package
  import submodule`` imports the submodule (not the package's other names)."""
  modules = _core_modules()
  graph = {}
  for name, path in modules.items():
    package = name if path.endswith('__init__.py') else name.rsplit('.', 1)[0]
    found = set()
    for imported in _imported_modules(path, package):
      if imported in modules and imported != name:
        found.add(imported)
    # `from pkg import sub`: _imported_modules lists pkg and pkg.sub; keep pkg only if it names
    # something else.
    graph[name] = {m for m in found if not any(o.startswith(m + '.') for o in found)
                   or _imports_names_of(path, package, m, modules)}
  return graph


def _imports_names_of(path: str, package: str, module: str, modules: dict) -> bool:
  """Whether the file at `path` imports `module` itself or a name of it that is not a submodule
  (``import module``, ``from module import function``)."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import) and any(a.name == module for a in node.names):
      return True
    if isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parts = package.split('.')
        base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
      if base == module and any(f'{base}.{a.name}' not in modules for a in node.names):
        return True
  return False


def _cycles(graph: dict) -> list:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_the_core_has_no_import_cycle():
  """Issue 43, item 4: imports go one way in the whole core, also inside functions. Before:
  data/pipeline.py -> windows.py -> dali_input.py -> windows.py -> pipeline.py (the shared
  geometry and label helpers now live in data/images.py, which the three import)."""
  graph = _core_graph()
  assert 'anp_jax.data.images' in graph['anp_jax.data.windows']  # The walk sees the imports.
  assert _cycles(graph) == []


def test_evaluators_sit_below_the_executors_and_the_trainer():
  """Issue 43, item 1: nothing in anp_jax/evaluators/ imports the executors or the trainer (at
  the top or inside a function): an evaluation gets predictions from `run.executor.map_eval`.
  Before, a new evaluator built its own compiled step from `executors.common.MeshHelper`, which
  put evaluators/ above executors/ and made config validation load them."""
  graph = _core_graph()
  evaluators = [m for m in graph if m == 'anp_jax.evaluators' or
                m.startswith('anp_jax.evaluators.')]
  assert 'anp_jax.evaluators.classification' in evaluators
  above = [f'{m} imports {i}' for m in evaluators for i in sorted(graph[m])
           if i == 'anp_jax.trainer' or i == 'anp_jax.executors' or
           i.startswith('anp_jax.executors.')]
  assert not above, above
