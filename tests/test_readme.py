"""The README: its IPython snippet runs exactly as printed, and its command lines have one form."""

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


def _snippet():
  text = open(os.path.join(ROOT, 'README.md')).read()
  match = re.search(r'<!-- ipython-snippet -->\s*```python\n(.*?)```', text, re.S)
  assert match, 'README.md lost its IPython snippet'
  return match.group(1)


@pytest.mark.slow(40)
def test_readme_ipython_snippet_runs(tmp_path):
  env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='2')
  env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'
  out = subprocess.run([sys.executable, '-c', _snippet()], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert '8 devices' in out.stdout
  assert "'image': ((64, 32, 32, 3)" in out.stdout
  assert 'train/anp_top1' in out.stdout and 'logits' in out.stdout


def test_readme_commands_have_one_form():
  """Every command line of the README's code blocks starts the same way (no bare `python`)."""
  text = open(os.path.join(ROOT, 'README.md')).read()
  blocks = re.findall(r'```bash\n(.*?)```', text, re.S)
  commands = [l.strip() for b in blocks for l in b.splitlines()
              if l.strip() and not l.startswith((' ', '\t', '#'))]
  bad = [c for c in commands if re.search(r'(^|\s)(PYTHONPATH=\S* )?python3? ', c)]
  assert not bad, bad
  assert not re.search(r'PYTHONPATH=\. ', text)
  assert all(c.split()[0] in ('.venv/bin/python', './run.sh', './test.sh', 'sbatch',
                              'experiments/bench_gpu.sh') or '=' in c.split()[0]
             for c in commands), commands


def test_where_to_change_what_names_one_file_per_row():
  """Issue 43, item 6: every row of the README's "Where to change what" table says which one file
  to edit (a module, or the one new module of an extension point, `<name>` standing for its
  name), and that file, or for a new module its folder, exists."""
  text = open(os.path.join(ROOT, 'README.md')).read()
  table = text.split('## Where to change what', 1)[1].split('\n\n', 2)[1]
  rows = [line.split('|')[1:-1] for line in table.splitlines()[2:]]
  assert len(rows) >= 10
  for what, edit, _ in rows:
    paths = re.findall(r'`(anp_jax/[^`]*)`', edit)
    assert len(paths) == 1, (what, edit)
    path = paths[0]
    if '<' in path or path.endswith('/'):  # A new module there.
      folder = path if path.endswith('/') else os.path.dirname(path)
      assert os.path.isdir(os.path.join(ROOT, folder)), (what, path)
    else:
      assert os.path.isfile(os.path.join(ROOT, path)), (what, path)
