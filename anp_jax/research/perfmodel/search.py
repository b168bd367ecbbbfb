"""Configuration search, SPRINT's criterion: the fastest nodes x devices x per-device batch (by
epoch time) for a target global batch."""

from typing import Iterable, List, Optional, Sequence, Union

from anp_jax.research.perfmodel.hardware import Cluster, Workload
from anp_jax.research.perfmodel.prediction import Prediction, predict
from anp_jax.staleness import require_positive


def rank_configurations(cluster_options: Union[Cluster, Iterable[Cluster]], workload: Workload,
                        target_global_batch: int, *, match: str = 'at_least',
                        per_device_batches: Optional[Sequence[int]] = None,
                        node_counts: Optional[Sequence[int]] = None,
                        device_counts: Optional[Sequence[int]] = None,
                        **predict_kwargs) -> List[Prediction]:
  """All feasible configurations for a target global batch, fastest epoch first.

  For every cluster option (its ``nodes`` and ``max_devices_per_node`` — or ``devices_per_node``
  when unconstrained — are the upper bounds), every node count ``node_counts`` (default
  1..nodes) and devices per node ``device_counts`` (default 1..max) is tried with the per-device
  batch that meets the target: with ``match='exact'`` the global batch must equal the target;
  with ``'at_least'`` the smallest per-device batch whose global batch reaches the target. Given
  ``per_device_batches``, only those candidates are tried (with 'at_least', every one that
  reaches the target). Configurations whose batch does not fit in device memory are skipped.
  ``predict_kwargs`` (method, overlap, ...) go to `predict`.
  """
  require_positive('best_configuration', 'target_global_batch', target_global_batch,
                    integer=True)
  if match not in ('exact', 'at_least'):
    raise ValueError(f"best_configuration.match={match!r}; choose 'exact' or 'at_least'.")
  options = [cluster_options] if isinstance(cluster_options, Cluster) else list(cluster_options)
  if not options:
    raise ValueError('best_configuration.cluster_options is empty.')
  results, rejected = [], []
  for option in options:
    max_d = option.max_devices_per_node or option.devices_per_node
    for n in (node_counts or range(1, option.nodes + 1)):
      if n > option.nodes:
        continue
      for d in (device_counts or range(1, max_d + 1)):
        if d > max_d:
          continue
        devices = n * d
        if per_device_batches is None:
          if match == 'exact':
            batches = [target_global_batch // devices] if (
                target_global_batch % devices == 0) else []
          else:
            batches = [-(-target_global_batch // devices)]
        else:
          batches = [b for b in per_device_batches
                     if (devices * b == target_global_batch if match == 'exact'
                         else devices * b >= target_global_batch)]
        for b in batches:
          try:
            results.append(predict(option.resized(n, d), workload, b, **predict_kwargs))
          except ValueError as e:
            rejected.append(f'{option.name} {n}x{d} batch {b}: {e}')
  if not results:
    why = '; '.join(rejected[:3]) if rejected else 'no node/device/batch combination matches'
    raise ValueError(f'No configuration reaches global batch {target_global_batch} '
                     f'({match}): {why}.')
  return sorted(results, key=lambda p: (p.epoch_time, p.num_devices))


def best_configuration(cluster_options: Union[Cluster, Iterable[Cluster]], workload: Workload,
                       target_global_batch: int, **kwargs) -> Prediction:
  """The fastest configuration (by epoch time) for the target global batch, SPRINT-style.

  See `rank_configurations` for the search space and options; ties go to fewer devices.
  """
  return rank_configurations(cluster_options, workload, target_global_batch, **kwargs)[0]
