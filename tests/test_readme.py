"""The README's IPython snippet runs exactly as printed."""

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
