"""Executors' host-side transfers: the programs they need."""

import logging

import jax
import numpy as np

from anp_jax.executors import pmap as pmap_executor


def _pmap_transfers(monkeypatch):
  """The pmap executor's (unreplicate, to_checkpoint, fetch), around stub per-device steps."""
  monkeypatch.setattr(pmap_executor, 'per_device_functions',
                      lambda *a, **k: (lambda s, b: (s, b), lambda s, b: b, dict))
  ex = pmap_executor.make(None, None, None, None, None)
  return ex.unreplicate, ex.to_checkpoint, ex.fetch


def test_pmap_reads_device_0s_copy_without_a_program_across_the_devices(monkeypatch, caplog):
  """`unreplicate`, `to_checkpoint` and `fetch` take device 0's copy of each leaf. Indexing the
  pmap output (``a[0]``) compiled an SPMD gather over all 8 devices per leaf, with an all-reduce;
  XLA:CPU runs one collective at a time on a pool of as many threads as devices, and under load
  one such all-reduce waited 300 s for its last participant and aborted the test worker."""
  n = jax.local_device_count()
  # Shapes no other test compiles, so that every program these need is compiled (logged) here.
  tree = {'w': (np.arange(n * 7 * 3, dtype=np.float32) % 11).reshape(n, 7, 3),
          'b': np.arange(n * 5, dtype=np.int32).reshape(n, 5)}
  replicated = jax.pmap(lambda t: t)(tree)
  unreplicate, to_checkpoint, fetch = _pmap_transfers(monkeypatch)
  with jax.log_compiles(True), caplog.at_level(logging.DEBUG):
    got = jax.block_until_ready(unreplicate(replicated))
    host, fetched = to_checkpoint(replicated), fetch(replicated)
  for out in (got, host, fetched):
    np.testing.assert_array_equal(np.asarray(out['w']), tree['w'][0])
    np.testing.assert_array_equal(np.asarray(out['b']), tree['b'][0])
  compiled = [r.getMessage() for r in caplog.records if 'Compiling' in r.getMessage()]
  across = [m for m in compiled if f"': {n}, axis_types" in m]  # Mesh('<axis>': 8, ...)
  assert not across, across
  assert all(len(x.devices()) == 1 for x in jax.tree.leaves(got))
