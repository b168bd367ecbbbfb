"""One process of a multi-process test job (started by tests/test_multiprocess.py).

Environment: ANP_COORDINATOR_ADDRESS / ANP_NUM_PROCESSES / ANP_PROCESS_ID, XLA_FLAGS for the
local device count, MP_CONFIG (JSON overrides of the tiny test config), MP_OUT (result path).
"""

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from anp_jax import distributed  # noqa: E402

distributed.initialize()  # Before any other JAX call.

import jax  # noqa: E402
import numpy as np  # noqa: E402

from anp_jax import train  # noqa: E402
from conftest import tiny_config  # noqa: E402


def main():
  overrides = json.loads(os.environ['MP_CONFIG'])
  data_dir, workdir = overrides.pop('data_dir'), overrides.pop('workdir')
  config = tiny_config(data_dir, **overrides)
  result = train.train_and_evaluate(config, workdir)
  run = train.build(config)
  batch = next(run.train_batches())
  shards = sorted(batch['image'].addressable_shards, key=lambda s: s.index[0].start or 0)
  local = np.concatenate([np.asarray(s.data) for s in shards])
  digests = [hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest() for x in local]
  out = {'process_index': jax.process_index(), 'process_count': jax.process_count(),
         'devices': jax.device_count(), 'local_devices': jax.local_device_count(),
         'losses': [h['train/loss'] for h in result.history if 'train/loss' in h],
         'final_eval': result.final_eval, 'first_batch_digests': digests,
         'params_sum': float(sum(np.asarray(x.addressable_data(0)).sum()
                                 for x in jax.tree.leaves(result.state.params)))}
  with open(os.environ['MP_OUT'], 'w') as f:
    json.dump(out, f)


if __name__ == '__main__':
  main()
