"""One process of a multi-process test job (started by `conftest.run_workers`).

Environment: ANP_COORDINATOR_ADDRESS / ANP_NUM_PROCESSES / ANP_PROCESS_ID, XLA_FLAGS for the
local device count, MP_CONFIG (the whole config as JSON), MP_WORKDIR, MP_OUT (result path: a JSON
file, and MP_OUT + '.npz' with the final params and BN statistics leaves), MP_EVAL_BATCHES
(optional, comma-separated eval batch sizes to evaluate the final state with as well).
"""

import hashlib
import json
import os

from anp_jax import distributed, runtime

runtime.configure()
distributed.initialize()  # Before any other JAX call.

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from anp_jax import trainer  # noqa: E402


def main():
  config = ml_collections.ConfigDict(json.loads(os.environ['MP_CONFIG']))
  result = trainer.train_and_evaluate(config, os.environ['MP_WORKDIR'])
  run = trainer.build(config)
  batch = next(run.train_batches())
  shards = sorted(batch['image'].addressable_shards, key=lambda s: s.index[0].start or 0)
  local = np.concatenate([np.asarray(s.data) for s in shards])
  digests = [hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest() for x in local]
  evals = {}
  for size in filter(None, os.environ.get('MP_EVAL_BATCHES', '').split(',')):
    other = ml_collections.ConfigDict(config.to_dict())
    other.eval_batch_size = int(size)
    evals[size] = trainer.build(other).evaluate(result.state)
  out = {'process_index': jax.process_index(), 'process_count': jax.process_count(),
         'devices': jax.device_count(), 'local_devices': jax.local_device_count(),
         'losses': [h['train/loss'] for h in result.records if 'train/loss' in h],
         'final_eval': result.final_eval, 'evals': evals, 'first_batch_digests': digests,
         'cores': sorted(os.sched_getaffinity(0))}  # After anp_jax.distributed's core split.
  leaves = [np.asarray(x.addressable_data(0)) for x in
            jax.tree.leaves((result.state.params, result.state.batch_stats))]
  np.savez(os.environ['MP_OUT'] + '.npz', *leaves)
  with open(os.environ['MP_OUT'], 'w') as f:
    json.dump(out, f)


if __name__ == '__main__':
  main()
