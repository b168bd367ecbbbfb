"""The docs' tables of what is registered are the registries' (issue 43, item 2): docs/optim.md's
optimizer and schedule tables, the optimizer and schedule names README.md and
docs/configuration.md list, and docs/evaluation.md's evaluator kinds. A new entry, option or
fact changes the rendered table, and this test shows the table to paste."""

import os
import re

from anp_jax import registry
from conftest import ROOT


def _read(name):
  return open(os.path.join(ROOT, name)).read()


def _builtin(reg):
  """The library's own entries (not those a test file registers), by name."""
  out = {}
  for name in reg.names():
    entry = reg.get(name)
    where = getattr(getattr(entry, 'factory', entry), '__module__', '')
    if where.startswith('anp_jax.'):
      out[name] = entry
  return out


def _option(field, option):
  allowed = option.range or (f'one of {", ".join(map(str, option.choices))}'
                             if option.choices else 'any')
  return f'`{field}` = `{option.default!r}` ({allowed})'


def _options(options):
  return '<br>'.join(_option(k, o) for k, o in sorted(options.items())) or '-'


def optimizer_table():
  rows = ['| `config.optimizer` | options (default, range) | explicit momentum | what |',
          '|---|---|---|---|']
  for name, spec in sorted(_builtin(registry.OPTIMIZERS).items()):
    rows.append(f'| `{name}` | {_options(spec.options)} | '
                f'{"yes" if spec.explicit_momentum else "no"} | {spec.description} |')
  return '\n'.join(rows)


def schedule_table():
  rows = ['| `config.schedule` | options (default, range) | decays | what |', '|---|---|---|---|']
  for name, spec in sorted(_builtin(registry.SCHEDULES).items()):
    rows.append(f'| `{name}` | {_options(spec.options)} | {"yes" if spec.decays else "no"} | '
                f'{spec.description} |')
  return '\n'.join(rows)


def test_docs_optim_has_the_registered_optimizers_and_schedules():
  text = _read('docs/optim.md')
  for table in (optimizer_table(), schedule_table()):
    assert table in text, f'docs/optim.md should have this table (paste it):\n\n{table}\n'


def _listed(text: str, pattern: str) -> set:
  match = re.search(pattern, text, re.S)
  assert match, pattern
  return set(re.findall(r'`([a-z0-9_]+)`', match.group(1)))


def test_readme_and_configuration_list_the_registered_names():
  optimizers, schedules = set(_builtin(registry.OPTIMIZERS)), set(_builtin(registry.SCHEDULES))
  assert {'sgd', 'nesterov', 'adamw', 'lars', 'lamb'} <= optimizers
  readme = _read('README.md')
  assert _listed(readme, r'\| `optimizer` \| `nesterov` \|([^\n]*)\|') == optimizers
  configuration = _read('docs/configuration.md')
  assert _listed(configuration, r'\* `optimizer`:(.*?)\.') == optimizers
  assert _listed(configuration, r'then `schedule` =(.*?)\.') == schedules


def test_docs_evaluation_lists_every_evaluator_kind_with_its_options():
  text = _read('docs/evaluation.md').split('| kind | options | metrics |', 1)[1].split('\n\n')[0]
  rows = dict(re.findall(r'^\| `([a-z_]+)` \| ([^|]*) \|', text, re.M))
  kinds = {k: c for k, c in _builtin(registry.EVALUATORS).items()}
  assert set(rows) == set(kinds) >= {'classification', 'calibration'}, (set(rows), set(kinds))
  for kind, cls in kinds.items():
    assert set(re.findall(r'`([a-z_]+)` \(', rows[kind])) == set(cls.OPTIONS), kind
