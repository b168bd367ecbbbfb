"""Process set-up before JAX starts its backend and TensorFlow runs anything: `configure()`.

Every entry point calls it first (``.venv/bin/python -m anp_jax.main`` and the library's other
command
lines, the experiment scripts, the tests' conftest and their subprocess workers); in IPython or a
notebook, call it before the first JAX computation::

    import anp_jax.runtime; anp_jax.runtime.configure()

Importing anp_jax only quiets TensorFlow's start-up notices (see `anp_jax/__init__.py`: that
has to precede every TensorFlow import); `configure` does the rest, explicitly:

* The XLA:CPU defaults of `anp_jax.xla_flags` (convolutions through Eigen, not YNNPACK) in
  ``XLA_FLAGS``: XLA reads them when JAX starts its first backend, so later calls have no
  effect; ``ANP_XLA_CPU_DEFAULTS=0`` turns them off. Subprocesses inherit the environment.
* JAX's persistent compilation cache, on (`anp_jax.compile_cache`: in
  ``~/.cache/anp_jax/xla`` unless ``JAX_COMPILATION_CACHE_DIR`` or ``ANP_COMPILATION_CACHE_DIR``
  says otherwise; ``ANP_COMPILATION_CACHE=0`` turns it off): a study compiles each program once.
* TensorFlow sees no GPU (``tensorflow=True``): it would otherwise reserve accelerator memory
  that JAX needs. This imports TensorFlow (`anp_jax.tf_import`: without the Keras it would
  import), after the variables above are set.
"""

from anp_jax import compile_cache, xla_flags


def configure(tensorflow: bool = True) -> None:
  """Sets up this process for anp_jax (see the module docstring); safe to call again."""
  xla_flags.apply_cpu_defaults()
  compile_cache.configure()
  if tensorflow:
    hide_gpus_from_tensorflow()


def hide_gpus_from_tensorflow() -> None:
  """TensorFlow, used for the input pipeline only, never takes a GPU from JAX."""
  from anp_jax.tf_import import tf  # Heavy: only for the entry points that read data.
  tf.config.set_visible_devices([], 'GPU')
