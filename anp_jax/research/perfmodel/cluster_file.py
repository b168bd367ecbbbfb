"""Cluster files: a small JSON or YAML description of a cluster, read into a `Cluster`.

The one loader of ``--cluster`` for both command lines that take one: the performance model
(``.venv/bin/python -m anp_jax.research.perfmodel --cluster=FILE``) and the planner, which
imports it from here (the planner builds on the performance model, never the reverse). Unknown
fields are refused with the allowed list; the format is in docs/planner.md.
"""

import dataclasses
import json
import os
from typing import Dict, List, Optional, Tuple

from anp_jax.research.perfmodel.hardware import Cluster, Device, Interconnect
from anp_jax.research.perfmodel.presets import CLUSTERS, DEVICES


class ClusterFileError(ValueError):
  """A cluster file (or --cluster value) that cannot describe a cluster: what to change."""


_DEVICE_FIELDS = {f.name for f in dataclasses.fields(Device)}
_INTERCONNECT_FIELDS = {f.name for f in dataclasses.fields(Interconnect)}
_CLUSTER_FIELDS = {'name', 'nodes', 'devices_per_node', 'max_devices_per_node', 'device',
                   'interconnect', 'devices_per_compute_pool', 'node_counts',
                   'host_cores_per_node'}


def _check_fields(where: str, given: Dict, allowed):
  unknown = sorted(set(given) - set(allowed))
  if unknown:
    raise ClusterFileError(f'Unknown field(s) {unknown} in {where}; allowed: {sorted(allowed)}.')


def cluster_from_dict(spec: Dict) -> Tuple[Cluster, List[int]]:
  """A `perfmodel.Cluster` (at its maximum node count) and the node counts to plan for.

  Fields: ``nodes`` (the most nodes available), ``devices_per_node``, ``device`` (a preset name:
  k80, v100, h200, cpu, or a dict of `perfmodel.Device` fields, optionally with ``preset`` to
  start from), ``interconnect`` (a dict of `perfmodel.Interconnect` fields, or a cluster preset
  name whose links to use), optional ``name``, ``max_devices_per_node``,
  ``devices_per_compute_pool``, ``host_cores_per_node`` (the input stage's cores; unknown: no
  input check) and ``node_counts`` (default: 1, 2, 4, ... up to ``nodes``).
  """
  if not isinstance(spec, dict):
    raise ClusterFileError('A cluster file holds one mapping of fields, got '
                           f'{type(spec).__name__}.')
  _check_fields('the cluster file', spec, _CLUSTER_FIELDS)
  for req in ('nodes', 'devices_per_node', 'device', 'interconnect'):
    if req not in spec:
      raise ClusterFileError(f'The cluster file needs the field {req!r}.')
  device = spec['device']
  try:
    if isinstance(device, str):
      if device not in DEVICES:
        raise ClusterFileError(f'device {device!r} is not a preset; choose one of '
                               f'{sorted(DEVICES)} or give its fields.')
      device = DEVICES[device]()
    else:
      _check_fields('cluster.device', device, _DEVICE_FIELDS | {'preset'})
      device = dict(device)
      base = device.pop('preset', None)
      if base is not None:
        if base not in DEVICES:
          raise ClusterFileError(f'device.preset {base!r} is unknown; choose one of '
                                 f'{sorted(DEVICES)}.')
        device = dataclasses.replace(DEVICES[base](), **device)
      else:
        device.setdefault('name', 'device')
        device = Device(**device)
    links = spec['interconnect']
    if isinstance(links, str):
      if links not in CLUSTERS:
        raise ClusterFileError(f'interconnect {links!r} is not a cluster preset; choose one of '
                               f'{sorted(CLUSTERS)} or give its fields.')
      links = CLUSTERS[links]().interconnect
    else:
      _check_fields('cluster.interconnect', links, _INTERCONNECT_FIELDS)
      links = Interconnect(**links)
    cluster = Cluster(nodes=spec['nodes'], devices_per_node=spec['devices_per_node'],
                         device=device, interconnect=links,
                         max_devices_per_node=spec.get('max_devices_per_node'),
                         name=spec.get('name', 'cluster'),
                         devices_per_compute_pool=spec.get('devices_per_compute_pool', 1),
                         host_cores_per_node=spec.get('host_cores_per_node'))
  except (TypeError, ValueError) as e:
    if isinstance(e, ClusterFileError):
      raise
    raise ClusterFileError(f'Bad cluster description: {e}') from e
  counts = spec.get('node_counts')
  if counts is None:
    counts = powers_of_two(cluster.nodes)
  elif not isinstance(counts, (list, tuple)) or not counts:
    # A scalar (``node_counts: 4``) is a plausible slip for a one-element list; iterating it
    # would be a TypeError and a traceback instead of this message.
    raise ClusterFileError(f'node_counts must be a list of node counts, e.g. [1, 2, 4], got '
                           f'{counts!r}; leave it out for 1, 2, 4, ... up to nodes.')
  # bool is an int subclass, but `true` in YAML is no node count.
  if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 or n > cluster.nodes
         for n in counts):
    raise ClusterFileError(f'node_counts {counts} must be integers in 1..nodes={cluster.nodes}.')
  return cluster, sorted(set(counts))


def powers_of_two(top: int) -> List[int]:
  """1, 2, 4, ... up to `top` (and `top` itself): the default node counts."""
  counts, n = [], 1
  while n < top:
    counts.append(n)
    n *= 2
  return counts + [top]


def load_cluster(name_or_path: str, nodes: Optional[int] = None) -> Tuple[Cluster, List[int]]:
  """A cluster preset (``minotauro``, ``dgx_h200``) or a JSON/YAML cluster file."""
  if name_or_path in CLUSTERS:
    cluster = CLUSTERS[name_or_path]() if nodes is None else CLUSTERS[name_or_path](nodes)
    return cluster, powers_of_two(cluster.nodes)
  if not os.path.exists(name_or_path):
    raise ClusterFileError(f'--cluster {name_or_path!r} is neither a preset '
                           f'({sorted(CLUSTERS)}) nor an existing file.')
  with open(name_or_path) as f:
    text = f.read()
  if name_or_path.endswith(('.yaml', '.yml')):
    import yaml
    try:
      spec = yaml.safe_load(text)
    except yaml.YAMLError as e:
      raise ClusterFileError(f'{name_or_path}: not valid YAML ({e}).') from e
  else:
    try:
      spec = json.loads(text)
    except ValueError as e:
      raise ClusterFileError(f'{name_or_path}: not valid JSON ({e}); YAML files end in '
                             '.yaml.') from e
  return cluster_from_dict(spec)
