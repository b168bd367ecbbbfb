#!/usr/bin/env bash
# ResNet-50 at 224 px, bfloat16: training images/s and MFU on the GPUs of this node, for 128 and
# 256 images per device, on synthetic in-memory batches (bare step) and through the real input
# pipeline (the full training loop), next to a plain jax.jit + optax loop (one GPU only).
#
#   experiments/bench_gpu.sh                      # on a GPU node; one command, a few minutes
#   ANP_BENCH_TINY=1 experiments/bench_gpu.sh     # CPU dry run: ResNet-50 at 32 px, batches 4 and 8
#                                                 # (~5 min per batch on the loaded 2-core machine)
#
# Environment:
#   ANP_VENV        virtual environment (default ./.venv; created by run.sh from requirements.txt
#                   and, on a GPU node, requirements-cuda.txt: ANP_ACCELERATOR=cuda)
#   ANP_PYTHON      instead: a Python that already has JAX for this GPU and the requirements (a
#                   container's or a cluster module's); no venv is made and pip is not run
#   ANP_WHEELS      folder of wheels for an offline install of requirements-cuda.txt (and the
#                   requirements); without it pip uses its index (PyPI)
#   ANP_BENCH_OUT   where the JSON results go (default workdirs/bench_gpu)
#   ANP_DATA_DIR + ANP_CONFIG_NAME   a prepared `anp` dataset (JPEGs, Inception crops) for the
#                   real-pipeline part; default: the generated synthetic_anp set (64 px PNGs
#                   resized to 224 px in the tf.data graph)
#   ANP_BENCH_BATCHES  per-device batch sizes (default "128 256"; input mode: "256 512")
#   ANP_BENCH_INPUT    0: skip the input-pipeline benchmark (e.g. a second call for more batch
#                   sizes into the same ANP_BENCH_OUT; the summary reads the JSON already there)
#   ANP_BENCH_MODE     model (default: the above) or input: the 224 px JPEG pipeline (photo-like
#                   500 x 375 JPEGs prepared at shorter side 256, or ANP_DATA_DIR) through the
#                   training loop with each of ANP_BENCH_BACKENDS (default "tf tf_device dali":
#                   config.input_backend; dali only where it imports) against the bare step at
#                   each of ANP_BENCH_BATCHES; the bare step again with each XLA_FLAGS variant of
#                   ANP_BENCH_XLA (';'-separated, default: autotune level 4; no Triton GEMMs);
#                   the host's core-seconds per image of tf vs tf_device (input_benchmark.py);
#                   and DALI's GPU decode against libjpeg's. About 6 minutes on one H200:
#     ANP_PYTHON=python3 ANP_BENCH_MODE=input ANP_BENCH_OUT=/tmp/bench experiments/bench_gpu.sh
#   ANP_BENCH_PHOTOS   input mode: JPEGs to generate (default 1000; tiny: 40)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$HERE"
TINY="${ANP_BENCH_TINY:-0}"
MODE="${ANP_BENCH_MODE:-model}"
case "$MODE" in model|input) ;; *) echo "bench_gpu.sh: ANP_BENCH_MODE=$MODE: use model or input" >&2; exit 2;; esac
VENV="${ANP_VENV:-$HERE/.venv}"
OUT="${ANP_BENCH_OUT:-$HERE/workdirs/bench_gpu}"
mkdir -p "$OUT"
t_start=$(date +%s)

if [ -n "${ANP_WHEELS:-}" ]; then
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$ANP_WHEELS"
fi
if [ -n "${ANP_PYTHON:-}" ]; then
  PY="$ANP_PYTHON"
  TF_CPP_MIN_LOG_LEVEL=2 "$PY" -c "import jax, flax, optax, tensorflow, tensorflow_datasets" || {
    echo "bench_gpu.sh: ANP_PYTHON=$PY lacks a package of requirements.txt (above)" >&2; exit 2; }
else
  # The venv from requirements.txt, with requirements-cuda.txt on a GPU node (run.sh's
  # ANP_ACCELERATOR=cuda; first run only).
  accel="${ANP_ACCELERATOR:-}"
  [ "$TINY" != 1 ] && accel=cuda
  ANP_ACCELERATOR="$accel" ANP_SETUP_ONLY=1 "$HERE/run.sh"
  PY="$VENV/bin/python"
fi

if [ "$TINY" != 1 ]; then
  "$PY" -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')" || {
    echo "bench_gpu.sh: JAX sees no GPU (nvidia-smi? driver >= CUDA 12?); ANP_BENCH_TINY=1 for a CPU dry run" >&2
    exit 2; }
  export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
fi
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
# The timed training loop compiles the same step again: let it hit this run's cache.
export JAX_COMPILATION_CACHE_DIR="$OUT/jax_cache"
"$PY" -c "import jax; print('bench_gpu.sh:', jax.device_count(), 'x', jax.devices()[0].device_kind, 'jax', jax.__version__)"
NDEV=$("$PY" -c "import jax; print(jax.local_device_count())" 2>/dev/null | tail -1)

if [ "$TINY" = 1 ]; then
  BATCHES="${ANP_BENCH_BATCHES:-4 8}"
  SIZE=(--config.image_size=32 --config.synthetic.image_size=32
        --config.synthetic.train_per_class=8 --config.synthetic.eval_per_class=2)
  TIMING=(--warmup=1 --windows=1 --steps_per_window=1 --loop_steps=2 --peak_n=256
          --config.log_every_steps=1)
  DATA=(--config.data_dir="$OUT/tfds")
else
  BATCHES="${ANP_BENCH_BATCHES:-128 256}"
  SIZE=(--config.image_size=224 --config.synthetic.image_size=64
        --config.synthetic.train_per_class=250 --config.synthetic.eval_per_class=4)
  # The loop logs every 50 steps (a metric fetch each time) and is timed over 100 steps.
  TIMING=(--warmup=5 --windows=5 --steps_per_window=10 --loop_steps=100
          --config.log_every_steps=50)
  DATA=(--config.data_dir="$OUT/tfds")
fi
if [ -n "${ANP_DATA_DIR:-}" ]; then
  DATA=(--config.dataset=anp --config.data_dir="$ANP_DATA_DIR"
        --config.anp.config_name="${ANP_CONFIG_NAME:?set ANP_CONFIG_NAME with ANP_DATA_DIR}"
        --config.augment=inception)
else
  DATA+=(--config.dataset=synthetic_anp --config.augment=cifar)
fi

if [ "$MODE" = input ]; then
  source "$HERE/experiments/bench_gpu_input.sh"
  echo "bench_gpu.sh: done in $(( $(date +%s) - t_start )) s"
  exit 0
fi

for per_device in $BATCHES; do
  B=$((per_device * NDEV))
  echo "bench_gpu.sh: ResNet-50 at $per_device images per device ($B per step)"
  "$PY" experiments/benchmark.py --config=anp_jax/configs/musa2_resnet50.py \
      --config.model.dtype=bfloat16 --config.bn_mode=per_device --config.batch_size="$B" \
      --config.eval_batch_size="$B" --config.checkpoint_every_steps=0 \
      --config.checkpoint_every_minutes=0 "${SIZE[@]}" "${DATA[@]}" "${TIMING[@]}" \
      --notorch --out="$OUT/resnet50_bf16_b${per_device}.json"
done

# Can this node's CPUs feed its GPUs? The 224 px training pipeline of the paper config (JPEG
# decode + Inception crop + flip + normalisation in tf.data) on this machine's cores.
if [ "${ANP_BENCH_INPUT:-1}" != 0 ]; then
  echo "bench_gpu.sh: the 224 px input pipeline on $("$PY" -c 'import os; print(len(os.sched_getaffinity(0)))') cores"
  if [ "$TINY" = 1 ]; then INPUT=(--images=40 --batch=8 --batches=3 --warmup=1)
  else INPUT=(--images=1000 --batch=128 --batches=20 --warmup=4); fi
  "$PY" experiments/input_benchmark.py --skip_model "${INPUT[@]}" --out="$OUT/input_pipeline.json"
fi

"$PY" - "$OUT" <<'EOF'
import glob, json, sys
best = 0.0
print(f"\n{'run':24s}{'bare img/s':>11s}{'MFU':>7s}{'loop img/s':>11s}{'loop MFU':>9s}"
      f"{'loop/bare':>10s}{'plain jax':>10s}{'peak GiB':>9s}{'compile s':>10s}")
for path in sorted(glob.glob(f'{sys.argv[1]}/resnet50_*.json')):
  r = json.load(open(path))
  loop = r['loop'] or {}
  ref = (r['reference'] or {}).get('images_per_s', float('nan'))
  peak = (r.get('memory') or {}).get('device_peak_bytes') or float('nan')
  best = max(best, r['bare']['images_per_s'])
  print(f"{path.split('/')[-1][:-5]:24s}{r['bare']['images_per_s']:11.1f}{100 * r['mfu']:6.1f}%"
        f"{loop.get('images_per_s', float('nan')):11.1f}{100 * loop.get('mfu', float('nan')):8.1f}%"
        f"{r['ratios'].get('loop/bare', float('nan')):10.3f}{ref:10.1f}{peak / 2**30:9.1f}"
        f"{r['compile_s']:10.1f}")
print(f"peak {r['peak']['flops_per_s'] / 1e12:.1f} TFLOP/s ({r['peak']['dtype']} "
      f"{r['peak']['n']}^3 matmul on {r['peak']['device']}); JSON in {sys.argv[1]}")
try:
  inp = json.load(open(f'{sys.argv[1]}/input_pipeline.json'))
except FileNotFoundError:
  sys.exit(0)
print(f"input pipeline (224 px JPEG, Inception crop): {inp['pipeline_images_per_s']:.0f} img/s on "
      f"{inp['cpu_cores']} cores = {inp['pipeline_images_per_s'] / best:.2f}x the fastest bare "
      f"model rate above")
EOF
echo "bench_gpu.sh: done in $(( $(date +%s) - t_start )) s"
