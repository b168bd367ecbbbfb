"""One process of a multi-process job that only reads training data (started by
tests/test_pipeline.py through `conftest.launch`).

It builds the run as the trainer does (`trainer.build`: dataset, mesh, executor) and reads the
global training batches of each ``[start_step, steps]`` in MP_READS (JSON) with
`Run.train_batches`, the call a resumed run makes. For every step it writes the rows of the
global batch that this process holds (their offset in the global batch and a SHA-1 of each image)
to MP_OUT (JSON).

Environment: ANP_COORDINATOR_ADDRESS / ANP_NUM_PROCESSES / ANP_PROCESS_ID, XLA_FLAGS for the
local device count, MP_CONFIG (the whole config as JSON), MP_READS, MP_OUT.
"""

import hashlib
import itertools
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
  run = trainer.build(config)
  reads = []
  for start_step, steps in json.loads(os.environ['MP_READS']):
    batches = []
    for batch in itertools.islice(run.train_batches(start_step), steps):
      rows = {}
      for shard in batch['image'].addressable_shards:
        start = shard.index[0].start or 0
        for i, image in enumerate(np.asarray(shard.data)):
          rows[start + i] = hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest()
      batches.append(sorted(rows.items()))
    reads.append(batches)
  with open(os.environ['MP_OUT'], 'w') as f:
    json.dump({'process_index': jax.process_index(), 'devices': jax.device_count(),
               'reads': reads}, f)


if __name__ == '__main__':
  main()
