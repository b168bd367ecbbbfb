"""Every command README.md and docs/*.md print runs as written, from the repository root, in a
clean environment's terms (the venv's Python; HOME and ANP_DATA_DIR in a temporary folder).

Each fenced ``bash`` command runs in the tiny form the rules below state, so that the file stays
minutes, not hours: a study script with ``--dry_run`` (its whole plan, datasets included, no
training; a confirmation of a placeholder study with ``--help``); a command that reads data or weights nobody has here (``~/mvso_en``, ``DIR``, a pilot
run), or writes into the committed results, with ``--help`` after its flags (absl parses every
flag before it reaches ``--help``: a misspelt flag or ``--config.x`` field fails; for the tools
whose help comes first, every flag the command uses must be in the help); ``./run.sh`` and
``./test.sh`` on a stand-in environment whose ``pip`` only records what it is asked (the GPU
set-up is checked for the CUDA requirements it installs, offline); ``sbatch`` and the GPU scripts
(no SLURM controller, no GPU here) for their files and, through ``anp_jax.main --help``, their
flags; a loop's body (a template: ``for t in a b ...; do CMD $t; done``) for its flags; everything else (the performance model, the planner on committed results, Python
snippets) as it is. ``.venv/bin/python`` is this interpreter; output paths under ``workdirs/``,
``/tmp/`` or ``DIR`` go to a temporary folder.

Each ``python`` snippet runs in a subprocess. A snippet that continues a session declares what
comes before and after it in HTML comments just above it (invisible on the page)::

    <!-- snippet-setup: from anp_jax.configs import default; c = default.get_config() -->
    <!-- snippet-after: from anp_jax.setup import validate_config; validate_config(c) -->

README's ``<!-- ipython-snippet -->`` is tests/test_readme.py's. A ``yaml`` block is a cluster
file, read by the performance model's and the planner's loader.
"""

import glob
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Dict, List, NamedTuple

import pytest

from conftest import ROOT, TEST_XLA_FLAGS

DOCS = ['README.md'] + sorted(os.path.relpath(p, ROOT)
                              for p in glob.glob(os.path.join(ROOT, 'docs', '*.md')))
VENV_PYTHON = '.venv/bin/python'
# Study scripts: --dry_run lists their runs and estimate without training.
DRY_RUN = ('study.py', 'batch_size_sweep.py', 'sync_async_mixed.py', 'finetune.py',
           'plan_time_validation.py')
# Scripts that only a GPU node runs: their files are checked (`bash -n`), not run.
GPU_SCRIPTS = ('experiments/bench_gpu.sh', 'experiments/bench_gpu_input.sh')
# Arguments that name data, weights or runs this machine does not have.
PLACEHOLDER = re.compile(r'(^|[=,])(DIR\b|RUN\b|~/|/shared/|/scratch/|/d/|runs/|workdirs/pilot|'
                         r'PLACEHOLDER|\$H/)')
OUTPUT_ROOTS = ('workdirs/', '/tmp/')


class Block(NamedTuple):
  path: str
  line: int
  lang: str
  text: str
  comments: Dict[str, str]  # snippet-setup / snippet-after / ipython-snippet, just above it.


def _blocks() -> List[Block]:
  out = []
  for path in DOCS:
    text = open(os.path.join(ROOT, path)).read()
    for m in re.finditer(r'^( *)```(\w*)\n(.*?)^\1```', text, re.S | re.M):
      indent = len(m.group(1))
      body = '\n'.join(l[indent:] for l in m.group(3).splitlines())
      before = text[:m.start()].rstrip('\n').splitlines()
      comments = {}
      while before and before[-1].strip().startswith('<!--'):
        c = re.match(r'<!--\s*([\w-]+):?\s*(.*?)\s*-->', before.pop().strip())
        if c:
          comments[c.group(1)] = c.group(2)
      out.append(Block(path, text[:m.start()].count('\n') + 1, m.group(2), body, comments))
  return out


BLOCKS = _blocks()


def _shell_commands(text: str) -> List[List[str]]:
  """The commands of a bash block, as argument lists: continuation lines joined, comments
  dropped, placeholders (``<name printed by prepare>``, ``...``) made plain words, and the shell
  forms the docs use (``for t in a b; do CMD; done``, ``H=x; CMD``) unrolled for one value."""
  joined = re.sub(r'\\\n\s*', ' ', text)
  joined = re.sub(r'<[^<>\n]+>', 'PLACEHOLDER', joined)
  commands = []
  values: Dict[str, str] = {}  # A loop's variable holds until its `done` (on a later line too).
  for line in joined.splitlines():
    if not line.strip() or line.strip().startswith('#'):
      continue
    lexer = shlex.shlex(line, posix=True, punctuation_chars=';')
    lexer.whitespace_split, lexer.commenters = True, '#'
    tokens = [tok for tok in lexer if tok != '...']
    if 'TEMPLATE' not in values:
      values = {}
    current: List[str] = []
    parts = []
    for tok in tokens + [';']:
      if tok == ';':
        if current:
          parts.append(current)
        current = []
      else:
        current.append(tok)
    for part in parts:
      if part[0] == 'for':  # for VAR in V1 V2 ...: a template, checked with the first value.
        values[part[1]] = part[3]
        values['TEMPLATE'] = '1'
        continue
      if part[0] == 'do':
        part = part[1:]
      if not part:  # `...; do` ending a line: the body follows.
        continue
      if part == ['done']:
        values = {}
        continue
      if len(part) == 1 and re.fullmatch(r'\w+=\S+', part[0]) and not part[0].isupper():
        key, value = part[0].split('=', 1)
        values[key] = value
        continue
      expand = lambda tok: re.sub(r'\$(\w+)', lambda m: values.get(m.group(1), m.group(0)), tok)
      # A template's commands (a loop body) are checked for their flags, not run.
      commands.append((['TEMPLATE=1'] if 'TEMPLATE' in values else []) +
                      [expand(tok) for tok in part])
  return commands


COMMANDS = [(b, c) for b in BLOCKS if b.lang == 'bash' for c in _shell_commands(b.text)]


def _fake_venv(tmp_path) -> str:
  """A stand-in for .venv: its python is this one, except that ``-m pip`` only records its
  arguments (run.sh and test.sh then run offline, and nothing is installed anywhere)."""
  venv = tmp_path / 'venv'
  (venv / 'bin').mkdir(parents=True)
  python = venv / 'bin' / 'python'
  python.write_text('#!/bin/sh\n'
                    'if [ "$1 $2" = "-m pip" ]; then\n'
                    f'  echo "$@" >> {tmp_path}/pip.log; exit 0\n'
                    'fi\n'
                    f'exec {sys.executable} "$@"\n')
  python.chmod(0o755)
  maker = tmp_path / 'python3'  # ANP_PYTHON: `-m venv` on the stand-in only records it too.
  maker.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/pip.log\n')
  maker.chmod(0o755)
  (venv / '.anp_requirements_ok').write_text(open(os.path.join(ROOT, 'requirements.txt')).read())
  (venv / '.anp_package_ok').write_text(ROOT + '\n')
  for name in ('requirements-bench.txt', 'requirements-dali.txt'):
    marker = '.anp_bench_requirements_ok' if 'bench' in name else '.anp_dali_requirements_ok'
    (venv / marker).write_text(open(os.path.join(ROOT, name)).read())
  return str(venv)


@pytest.fixture(scope='module')
def clean_home(tmp_path_factory):
  """HOME and ANP_DATA_DIR of every command (datasets generated once for the module)."""
  home = tmp_path_factory.mktemp('home')
  (home / 'data').mkdir()
  return home


def _env(home, **extra) -> dict:
  env = {k: v for k, v in os.environ.items() if not k.startswith(('ANP_', 'SLURM_', 'PYTEST'))}
  env.update(HOME=str(home), ANP_DATA_DIR=str(home / 'data'), PYTHONPATH=ROOT,
             TF_CPP_MIN_LOG_LEVEL='2', XLA_FLAGS=TEST_XLA_FLAGS, CUDA_VISIBLE_DEVICES='')
  env.update(extra)
  return env


def _outputs_to(tokens: List[str], out_dir) -> List[str]:
  """Output paths under workdirs/ or /tmp/ (and DIR) into `out_dir`; the program (the first
  token: an interpreter may itself live under /tmp) stays as it is."""
  def move(value):
    if value == 'DIR' or value.startswith(OUTPUT_ROOTS):
      return str(out_dir / value.strip('/').replace('/', '_'))
    return value
  fixed = tokens[:1]
  for token in tokens[1:]:
    if token.startswith('--') and '=' in token:
      flag, value = token.split('=', 1)
      fixed.append(f'{flag}={move(value)}')
    else:
      fixed.append(move(token))
  return fixed


def _help_lists(output: str) -> set:
  return set(re.findall(r'--\[?(?:no)?\]?([a-z_]+)', output))


def _used_flags(tokens: List[str]) -> set:
  return {t[2:].split('=')[0] for t in tokens if t.startswith('--') and not
          t.startswith('--config.') and ' ' not in t} - {'help'}  # ' ': a quoted flag value.


def _run(argv, env, timeout=600):
  return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout)


def _check(out, what):
  assert out.returncode == 0, (what, out.returncode, (out.stdout + out.stderr)[-3000:])


def _python_command(tokens, env, out_dir, what):
  """`.venv/bin/python ...`: run, dry-run or --help, by the rules of the module docstring."""
  argv = [sys.executable] + tokens[1:]
  target = tokens[1] if tokens[1] != '-m' else tokens[2]
  script = os.path.basename(target)
  if tokens[1] == '-c':
    _check(_run(argv, env), what)
    return
  assert os.path.exists(os.path.join(ROOT, target)) or tokens[1] == '-m', (what, target)
  # A confirmation (--confirm_seeds) reads a finished study: on a placeholder DIR, --help.
  confirms_a_placeholder = (any(t.split('=')[0] == '--confirm_seeds' for t in tokens)
                            and any(PLACEHOLDER.search(t) for t in tokens[1:]))
  if script in DRY_RUN and env.get('TEMPLATE') != '1' and not confirms_a_placeholder:
    if '--dry_run' not in argv:
      argv.append('--dry_run')
    out = _run(_outputs_to(argv, out_dir), env)
    _check(out, what)
    assert 'estimated' in out.stdout, (what, out.stdout[-2000:])  # Runs and their cost.
    return
  outs = [t.split('=', 1)[1] if '=' in t else (tokens + [''])[i + 1]
          for i, t in enumerate(tokens) if t.split('=')[0] == '--out']
  # Committed results are never written by the test: --out there, or the folder report.py
  # rewrites (it regenerated experiments/results/sync_async_mixed_cpu/summary.md in the tree).
  writes_results = any(o.startswith('experiments/results') for o in outs) or (
      script == 'report.py' and any(t.startswith('experiments/results') for t in tokens[2:]))
  if any(PLACEHOLDER.search(t) for t in tokens[1:]) or writes_results or 'benchmark' in script \
     or env.get('TEMPLATE') == '1' \
     or 'prepare' in target or 'pretrained' in target:
    out = _run(argv + ['--help'], env)
    _check(out, what)
    listed = _help_lists(out.stdout + out.stderr)
    missing = {f for f in _used_flags(tokens) - listed
               if not (f.startswith('no') and f[2:] in listed)}  # absl: --noloop is --[no]loop.
    assert not missing, (what, sorted(missing))
    return
  _check(_run(_outputs_to(argv, out_dir), env), what)


def _check_command(n, block, command, home, tmp_path) -> str:
  """Runs one command by the rules of the module docstring; AssertionError if it fails."""
  what = f'{block.path}:{block.line}: {shlex.join(command)}'
  tokens = list(command)
  env_vars = {}
  while tokens and re.fullmatch(r'[A-Z_]+=\S*', tokens[0]):
    key, value = tokens.pop(0).split('=', 1)
    env_vars[key] = value
  program = tokens[0]
  run_dir = tmp_path / f'c{n}'
  run_dir.mkdir()
  start = time.time()
  env = _env(home, **env_vars)
  if program == VENV_PYTHON:
    _python_command(tokens, env, run_dir, what)
  elif program in ('./run.sh', './test.sh'):
    env['ANP_VENV'] = _fake_venv(run_dir)
    env['ANP_PYTHON'] = str(run_dir / 'python3')
    if program == './test.sh':
      out = _run(['./test.sh', '--collect-only', '-q', 'tests/test_readme.py'], env)
    elif env.get('ANP_SETUP_ONLY') == '1':
      out = _run(tokens, env)
      asked = (run_dir / 'pip.log').read_text() if (run_dir / 'pip.log').exists() else ''
      if env.get('ANP_ACCELERATOR') == 'cuda':  # The pip step, offline.
        assert (f'-r {ROOT}/requirements.txt -r {ROOT}/requirements-cuda.txt' in asked
                and 'ANP_ACCELERATOR=cuda' in open(f'{env["ANP_VENV"]}/.anp_requirements_ok')
                .read()), (what, asked)
    else:
      out = _run(tokens + ['--help'], env)
    _check(out, what)
    if any(t.startswith('--config.') for t in tokens) and program == './run.sh':
      # Another configuration than the demo's: in workdirs/demo it is refused.
      assert any(t.startswith('--workdir') for t in tokens), (what, 'needs its own --workdir')
  elif program == 'sbatch':  # No controller here: the script, and its flags for run.sh.
    script = os.path.join(ROOT, tokens[1])
    assert open(script).read().startswith('#!'), what
    _check(_run(['bash', '-n', script], env), what)
    _check(_run([sys.executable, '-m', 'anp_jax.main'] + tokens[2:] + ['--help'], env), what)
  elif program in GPU_SCRIPTS:
    script = os.path.join(ROOT, program)
    assert os.access(script, os.X_OK), what
    _check(_run(['bash', '-n', script], env), what)
  else:
    raise AssertionError(f'{what}: no rule for {program!r}; add one to '
                         'tests/test_docs_commands.py')
  return f'{time.time() - start:5.1f} s  {what}'


def test_outputs_move_into_the_test_folder_but_the_program_stays(tmp_path):
  """Was: a checkout under /tmp (a clean clone there, run as CI runs) had its own interpreter,
  /tmp/.../.venv/bin/python, moved as if it were an output path: FileNotFoundError."""
  argv = ['/tmp/clone/.venv/bin/python', 'experiments/study.py', '--out', '/tmp/gbn',
          '--workdir=workdirs/x', 'DIR']
  assert _outputs_to(argv, tmp_path) == [
      '/tmp/clone/.venv/bin/python', 'experiments/study.py', '--out', str(tmp_path / 'tmp_gbn'),
      f'--workdir={tmp_path / "workdirs_x"}', str(tmp_path / 'DIR')]


@pytest.mark.slow(200)
def test_every_fenced_command_runs(clean_home, tmp_path):
  """Three at a time (most of their time is imports and waiting on a dataset lock). No
  command changes the committed results (each file's size and modification time)."""
  import concurrent.futures
  results = os.path.join(ROOT, 'experiments', 'results')

  def committed():
    stats = {os.path.join(d, f): os.stat(os.path.join(d, f))
             for d, _, files in os.walk(results) for f in files}
    return {path: (st.st_size, st.st_mtime_ns) for path, st in stats.items()}
  before = committed()
  failures = []
  with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
    jobs = {pool.submit(_check_command, n, block, command, clean_home, tmp_path):
            f'{block.path}:{block.line}' for n, (block, command) in enumerate(COMMANDS)}
    for job in concurrent.futures.as_completed(jobs):
      try:
        print(job.result())
      except AssertionError as e:
        failures.append(str(e)[:3000])
  assert not failures, '\n\n'.join(failures)
  after = committed()
  changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
  assert not changed, f'the docs commands changed committed results: {changed[:10]}'


PYTHON_SNIPPETS = [b for b in BLOCKS if b.lang == 'python' and 'ipython-snippet' not in
                   b.comments]
# Runs each snippet (with its setup and check) in a namespace of its own, in one process (one
# import of JAX and TensorFlow for all), and reports each failure with its place.
SNIPPET_DRIVER = """
import json, sys, traceback
failures = []
for where, code in json.load(open(sys.argv[1])):
  try:
    exec(compile(code, where, 'exec'), {'__name__': '__snippet__'})
  except BaseException:
    failures.append(where + ': ' + traceback.format_exc()[-2000:])
print(json.dumps(failures))
"""


@pytest.mark.slow(60)
def test_python_snippets_run(clean_home, tmp_path):
  """Each snippet with what its comments say comes before and after it; a config file's
  `get_config()` (and a study preset's `get_sweep()`) is called too."""
  import json
  snippets = []
  for block in PYTHON_SNIPPETS:
    snippets.append((f'{block.path}:{block.line}', '\n'.join([
        block.comments.get('snippet-setup', '').replace('; ', '\n'),
        block.text,
        block.comments.get('snippet-after', '').replace('; ', '\n'),
        "if 'get_config' in globals():\n  get_config()",
        "if 'get_sweep' in globals():\n  get_sweep()"])))
  assert len(snippets) >= 9, [w for w, _ in snippets]
  (tmp_path / 'snippets.json').write_text(json.dumps(snippets))
  out = _run([sys.executable, '-c', SNIPPET_DRIVER, str(tmp_path / 'snippets.json')],
             _env(clean_home))
  _check(out, 'the snippet driver')
  failures = json.loads(out.stdout.strip().splitlines()[-1])
  assert not failures, '\n\n'.join(failures)


def test_the_readme_snippet_is_test_readmes():
  readme = [b for b in BLOCKS if b.path == 'README.md' and b.lang == 'python']
  assert [b.comments.keys() for b in readme] == [{'ipython-snippet': ''}.keys()]
  assert 'test_readme_ipython_snippet_runs' in open(
      os.path.join(ROOT, 'tests', 'test_readme.py')).read()


def test_yaml_blocks_are_cluster_files_both_loaders_read(tmp_path):
  from anp_jax.research import perfmodel as pm
  from anp_jax.research import planner
  yaml_blocks = [b for b in BLOCKS if b.lang == 'yaml']
  assert yaml_blocks
  for i, block in enumerate(yaml_blocks):
    path = tmp_path / f'c{i}.yaml'
    path.write_text(block.text)
    assert pm.load_cluster(str(path)) == planner.load_cluster(str(path))


def test_every_block_has_a_rule():
  """A new kind of fenced block (e.g. ``sh``) would otherwise go unchecked; blocks without a
  language are program output."""
  for b in BLOCKS:
    assert b.lang in ('bash', 'python', 'yaml', ''), (b.path, b.line, b.lang)
    if b.lang == '':
      assert not re.search(r'^\s*(\./|\.venv/|python)', b.text, re.M), (b.path, b.line)


# ----------------------------------------------------------------------------------------------
# One form for every printed command: `.venv/bin/python ...`, and the scripts executable.

BARE_PYTHON = re.compile(r'(?<![/\w.])python3? (-m |-c |experiments/|\S+\.py)')


def _printed_code() -> List[tuple]:
  """(where, text) of every code span and block of README and docs, and of every experiment
  script's docstring (what --help prints)."""
  out = []
  for path in DOCS:
    text = open(os.path.join(ROOT, path)).read()
    for m in re.finditer(r'```\w*\n(.*?)```|`([^`\n]+(?:\n[^`\n]+)?)`', text, re.S):
      out.append((f'{path}:{text[:m.start()].count(chr(10)) + 1}', m.group(1) or m.group(2)))
  for script in EXPERIMENT_SCRIPTS:
    import ast
    doc = ast.get_docstring(ast.parse(open(os.path.join(ROOT, script)).read())) or ''
    out.append((script, doc))
  return out


EXPERIMENT_SCRIPTS = sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'experiments', '*.py'))
    if "__name__ == '__main__'" in open(p).read())


def test_every_printed_command_uses_the_venv_python():
  """`python3 -m anp_jax.research.planner --help` was ModuleNotFoundError: ml_collections (the
  docs printed bare `python` and never said to use the venv); README printed experiments bare."""
  bad = [(where, m.group(0)) for where, text in _printed_code()
         for m in BARE_PYTHON.finditer(text)]
  assert not bad, bad
  bare_script = re.compile(r'(?<![\w/.-])(?<!python )experiments/\w+\.py --')
  bad = [(where, text) for where, text in _printed_code()
         if bare_script.search(' '.join(text.split()))]
  assert not bad, bad


def test_experiment_scripts_are_executable_and_run_with_the_environment(tmp_path):
  """`experiments/study.py --preset ghost_bn ...` was "Permission denied" (mode 644, no
  shebang). Each script now has one, is executable in git, and imports `_venv` first, which runs
  it with the environment's Python when another (the shebang's python3) started it."""
  ls = subprocess.run(['git', 'ls-files', '-s', 'experiments'], cwd=ROOT, capture_output=True,
                      text=True, timeout=60)
  modes = {line.split()[3]: line.split()[0] for line in ls.stdout.splitlines()}
  for script in EXPERIMENT_SCRIPTS:
    text = open(os.path.join(ROOT, script)).read()
    assert text.startswith('#!/usr/bin/env python3\n'), script
    assert modes.get(script) == '100755', (script, modes.get(script))
    assert os.access(os.path.join(ROOT, script), os.X_OK), script
    body = text.split('"""', 2)[2]
    first_imports = [l for l in body.splitlines() if l.startswith(('import ', 'from '))][:3]
    assert first_imports == ['import os  # noqa: I001  (first: the environment, before '
                             'anything else is imported)', 'import sys',
                             'import _venv  # noqa: E402,F401  (started by another Python, e.g. '
                             "the shebang's: rerun in .venv)"], (script, first_imports)
  # A python3 without the packages (an empty venv) first on PATH: the script reruns itself in
  # the environment (ANP_VENV: this interpreter's).
  empty = tmp_path / 'bare'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(empty)], check=True,
                 timeout=120)
  env = dict(os.environ, PATH=f'{empty / "bin"}:{os.environ["PATH"]}',
             ANP_VENV=os.path.dirname(os.path.dirname(sys.executable)))
  env.pop('PYTHONPATH', None)
  out = subprocess.run([os.path.join(ROOT, 'experiments', 'report.py'), '--help'], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0 and 'report' in out.stdout.lower(), out.stderr[-2000:]
  env['ANP_VENV'] = str(tmp_path / 'nowhere')  # No environment: one line saying how to get one.
  out = subprocess.run([os.path.join(ROOT, 'experiments', 'report.py'), '--help'], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2 and 'ANP_SETUP_ONLY=1 ./run.sh' in out.stderr, out.stderr
