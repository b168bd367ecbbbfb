"""How a checkpoint is written: each replicated array once (`checkpointing.single_writer_arrays`),
with no program compiled for the save, and restored equal."""

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from anp_jax import checkpointing
from conftest import assert_leaves_close, tiny_config

BACKEND_COMPILE = '/jax/core/compile/backend_compile_duration'  # jax._src.dispatch's event name.


def _state(sharding):
  # Shapes no other test uses, so that no program for them is already in this process's caches;
  # the first dimensions divide by 8 (orbax's replica-parallel mode slices along such a one).
  rng = np.random.default_rng(0)
  host = {'kernel': rng.normal(size=(24, 7, 3)).astype(np.float32),
          'bias': rng.normal(size=(56,)).astype(np.float32),
          'count': np.arange(40, dtype=np.int32)}
  return host, {k: jax.device_put(v, sharding) for k, v in host.items()}


def test_a_save_on_8_devices_writes_each_array_once_compiling_nothing(tmp_path):
  """Before: orbax's replica-parallel default compiled a slicing program per array and device
  (3 arrays x 8 devices here; 208 programs, 11.6 s, for the tiny model's first save)."""
  assert jax.device_count() == 8
  replicated = NamedSharding(jax.make_mesh((8,), ('data',)), P())
  host, state = _state(replicated)
  compiled = []

  def listener(event, seconds, **kwargs):
    if event == BACKEND_COMPILE:
      compiled.append(kwargs.get('fun_name', '?'))
  ckpt = checkpointing.Checkpointer(str(tmp_path), tiny_config(tmp_path))
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    ckpt.save(3, state)
    ckpt.manager.wait_until_finished()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert compiled == [], compiled
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                        state)
  restored, step = ckpt.restore_latest(target)
  assert step == 3
  keys = sorted(host)
  assert_leaves_close([np.asarray(restored[k]) for k in keys], [host[k] for k in keys])
  assert all(restored[k].sharding == replicated for k in keys)


def test_a_handler_of_your_own_is_left_alone(monkeypatch):
  import orbax.checkpoint as ocp

  class Mine(ocp.type_handlers.ArrayHandler):
    pass
  from orbax.checkpoint._src.serialization import type_handler_registry
  registered = {}
  monkeypatch.setattr(ocp.type_handlers, 'get_type_handler', lambda ty: Mine())
  monkeypatch.setattr(type_handler_registry.GLOBAL_TYPE_HANDLER_REGISTRY, 'add',
                      lambda ty, handler, **kw: registered.setdefault(ty, handler))
  checkpointing.single_writer_arrays()
  assert registered == {}
  monkeypatch.setattr(ocp.type_handlers, 'get_type_handler',
                      lambda ty: ocp.type_handlers.ArrayHandler())
  monkeypatch.setattr(checkpointing, '_SINGLE_WRITER', None)
  checkpointing.single_writer_arrays()
  assert list(registered) == [jax.Array]
