"""The hardware side's input: a cluster preset of the performance model, or a small JSON/YAML
cluster file. The loader is the performance model's (`perfmodel.cluster_file`, so that
``.venv/bin/python -m anp_jax.research.perfmodel --cluster=FILE`` reads the same files); here
its errors become the planner's `PlanError`."""

import functools
from typing import Dict, List, Optional, Tuple

from anp_jax.research import perfmodel as pm
from anp_jax.research.perfmodel import cluster_file
from anp_jax.research.planner.errors import PlanError


def _as_plan_error(function):
  @functools.wraps(function)
  def wrapped(*args, **kwargs):
    try:
      return function(*args, **kwargs)
    except cluster_file.ClusterFileError as e:
      raise PlanError(str(e)) from e
  return wrapped


@_as_plan_error
def cluster_from_dict(spec: Dict) -> Tuple[pm.Cluster, List[int]]:
  """`perfmodel.cluster_file.cluster_from_dict`, raising PlanError."""
  return cluster_file.cluster_from_dict(spec)


@_as_plan_error
def load_cluster(name_or_path: str, nodes: Optional[int] = None) -> Tuple[pm.Cluster, List[int]]:
  """A cluster preset (``minotauro``, ``dgx_h200``) or a JSON/YAML cluster file (PlanError)."""
  return cluster_file.load_cluster(name_or_path, nodes)
