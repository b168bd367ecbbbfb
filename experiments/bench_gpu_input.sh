# ANP_BENCH_MODE=input of experiments/bench_gpu.sh (sourced by it, after its set-up: PY, OUT,
# TINY, NDEV, HERE): can the input keep the GPU busy? The 224 px JPEG training pipeline through
# the real training loop with each input backend, against the bare step; the bare step with
# other XLA flags and batch sizes; the host's cost per image of each backend; DALI's GPU decode
# against libjpeg's. Budget: about 6 minutes on one H200 (the compiled step is cached across
# calls in $OUT/jax_cache; each XLA flag variant compiles once).

if [ "$TINY" = 1 ]; then
  BATCHES="${ANP_BENCH_BATCHES:-4}"
  PHOTOS="${ANP_BENCH_PHOTOS:-40}"
  GEN=(48 64 32)  # height, width, stored shorter side
  # ResNet-8 at 32 px: the plumbing, in minutes on a CPU.
  MODEL=(--config.image_size=32 --config.model.name=resnet8)
  TIMING=(--warmup=1 --windows=1 --steps_per_window=1 --loop_steps=2 --peak_n=256
          --config.log_every_steps=1)
  XLA_VARIANTS="${ANP_BENCH_XLA---xla_gpu_autotune_level=4}"
else
  BATCHES="${ANP_BENCH_BATCHES:-256 512}"
  PHOTOS="${ANP_BENCH_PHOTOS:-1000}"
  GEN=(375 500 256)
  MODEL=(--config.image_size=224)
  # The loop: 60 timed steps after 20 (log every 20: a metric fetch each time).
  TIMING=(--warmup=5 --windows=3 --steps_per_window=10 --loop_steps=60
          --config.log_every_steps=20)
  XLA_VARIANTS="${ANP_BENCH_XLA---xla_gpu_autotune_level=4;--xla_gpu_enable_triton_gemm=false}"
fi
BACKENDS="${ANP_BENCH_BACKENDS:-tf tf_device dali}"

# 1. The dataset: ANP_DATA_DIR + ANP_CONFIG_NAME, or photo-like JPEGs prepared here.
if [ -n "${ANP_DATA_DIR:-}" ]; then
  DATA_DIR="$ANP_DATA_DIR"; CONFIG_NAME="${ANP_CONFIG_NAME:?set ANP_CONFIG_NAME with ANP_DATA_DIR}"
else
  DATA_DIR="$OUT/photos/tfds"
  echo "bench_gpu.sh: $PHOTOS photo-like ${GEN[1]} x ${GEN[0]} JPEGs, prepared at shorter side ${GEN[2]}"
  CONFIG_NAME=$("$PY" - "$OUT/photos" "$PHOTOS" "${GEN[@]}" <<'EOF' | tail -1
import os, sys
from anp_jax import runtime
runtime.hide_gpus_from_tensorflow()
from anp_jax.data import anp, input_stages
root, n, height, width, side = sys.argv[1], *map(int, sys.argv[2:])
if not os.path.isdir(os.path.join(root, 'manual')):  # 20 ANPs, >= 10 photos each: every split.
  input_stages.write_photo_folder(os.path.join(root, 'manual'), n, max(1, min(20, n // 10)),
                                  height, width, 90)
builder = anp.prepare(os.path.join(root, 'manual'), os.path.join(root, 'tfds'), layout='folder',
                      resize=side, jpeg_quality=90)
print(builder.builder_config.name)
EOF
)
fi
DATA=(--config.dataset=anp --config.data_dir="$DATA_DIR" --config.anp.config_name="$CONFIG_NAME"
      --config.augment=inception --config.cache=False)
COMMON=(--config=anp_jax/configs/musa2_resnet50.py --config.model.dtype=bfloat16
        --config.bn_mode=per_device --config.checkpoint_every_steps=0
        --config.checkpoint_every_minutes=0 --noreference --notorch "${MODEL[@]}" "${DATA[@]}"
        "${TIMING[@]}")

HAS_DALI=$("$PY" -c "import nvidia.dali" >/dev/null 2>&1 && echo 1 || echo 0)
ON_GPU=$("$PY" -c "import jax; print(int(jax.default_backend() == 'gpu'))" 2>/dev/null | tail -1)
echo "bench_gpu.sh: NVIDIA DALI $([ "$HAS_DALI" = 1 ] && echo importable || echo 'not installed (pip install --no-deps -r requirements-dali.txt)')"

# 2. The loop with each backend at the first batch size, and tf_device at every batch size,
# each against the bare step timed in the same call.
first=${BATCHES%% *}
runs=()
for backend in $BACKENDS; do runs+=("$backend:$first"); done
for per_device in $BATCHES; do [ "$per_device" != "$first" ] && runs+=("tf_device:$per_device"); done
for run in "${runs[@]}"; do
  backend=${run%%:*}; per_device=${run##*:}
  if [ "$backend" = dali ] || [ "$backend" = dali_cpu ]; then
    if [ "$HAS_DALI" != 1 ]; then echo "bench_gpu.sh: $backend skipped: DALI is not installed"; continue; fi
    [ "$ON_GPU" != 1 ] && backend=dali_cpu  # The CPU dry run: DALI's CPU decoder.
  fi
  B=$((per_device * NDEV))
  echo "bench_gpu.sh: the training loop with input_backend=$backend at $per_device images per device"
  "$PY" experiments/benchmark.py "${COMMON[@]}" --config.input_backend="$backend" \
      --config.batch_size="$B" --config.eval_batch_size="$B" \
      --out="$OUT/input_loop_${backend}_b${per_device}.json"
done

# 3. The bare step with other XLA flags (no loop).
i=0
IFS=';' read -r -a variants <<< "$XLA_VARIANTS"
for flags in "${variants[@]}"; do
  [ -z "$flags" ] && continue
  i=$((i + 1))
  echo "bench_gpu.sh: the bare step at $first images per device with XLA_FLAGS+=$flags"
  printf '%s\n' "$flags" > "$OUT/xla_variant_$i.flags"
  XLA_FLAGS="${XLA_FLAGS:-} $flags" JAX_COMPILATION_CACHE_DIR="$OUT/jax_cache_xla_$i" \
      "$PY" experiments/benchmark.py "${COMMON[@]}" --noloop --config.batch_size=$((first * NDEV)) \
      --config.eval_batch_size=$((first * NDEV)) --out="$OUT/xla_variant_$i.json"
done

# 4. The host's cost per image of each backend on this machine's cores (whole pipelines only).
echo "bench_gpu.sh: host core-seconds per image, tf vs tf_device, on $("$PY" -c 'import os; print(len(os.sched_getaffinity(0)))') cores"
if [ "$TINY" = 1 ]; then INPUT=(--batch=8 --batches=3 --warmup=1); else INPUT=(--batch=128 --batches=20 --warmup=4); fi
"$PY" experiments/input_benchmark.py --skip_model --nostages --data_dir="$DATA_DIR" \
    --config_name="$CONFIG_NAME" --backends=tf,tf_device "${INPUT[@]}" \
    --out="$OUT/input_host_cost.json"

# 5. DALI's decode against libjpeg's ('tf_device'): the same windows, pixels compared.
if [ "$HAS_DALI" = 1 ]; then
  echo "bench_gpu.sh: DALI's decode vs libjpeg's on the same windows"
  "$PY" - "$DATA_DIR" "$CONFIG_NAME" "$OUT/dali_decode.json" "$ON_GPU" <<'EOF'
import json, sys
import numpy as np
from anp_jax import runtime
runtime.configure()
from anp_jax.configs import musa2_resnet50
from anp_jax.data import pipeline
data_dir, name, out, on_gpu = sys.argv[1:]
boxes = {}
for backend in ('tf_device', 'dali' if on_gpu == '1' else 'dali_cpu'):
  c = musa2_resnet50.get_config()
  c.data_dir, c.anp.config_name, c.cache, c.input_backend = data_dir, name, False, backend
  builder = pipeline.get_builder(c)
  ds = pipeline.train_dataset(builder, c, per_device_batch=64, num_shards=1, shards=[0])
  boxes[backend] = np.asarray(next(pipeline.global_batches(ds, lambda b: b))['image'], np.int32)
a, b = boxes.values()
diff = np.abs(a - b)
result = {'backends': list(boxes), 'images': len(a), 'max_abs_diff': int(diff.max()),
          'mean_abs_diff': float(diff.mean()), 'fraction_different': float((diff > 0).mean())}
json.dump(result, open(out, 'w'), indent=2)
print('bench_gpu.sh:', result)
EOF
fi

# 6. Summary.
"$PY" - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
print(f"\n{'loop run':32s}{'bare img/s':>11s}{'loop img/s':>11s}{'loop/bare':>10s}{'MFU':>7s}")
for path in sorted(glob.glob(f'{out}/input_loop_*.json')):
  r = json.load(open(path))
  loop = r['loop'] or {}
  print(f"{os.path.basename(path)[11:-5]:32s}{r['bare']['images_per_s']:11.1f}"
        f"{loop.get('images_per_s', float('nan')):11.1f}"
        f"{r['ratios'].get('loop/bare', float('nan')):10.3f}{100 * r['mfu']:6.1f}%")
for path in sorted(glob.glob(f'{out}/xla_variant_*.json')):
  r = json.load(open(path))
  flags = open(path[:-5] + '.flags').read().strip()
  print(f"bare step with {flags}: {r['bare']['images_per_s']:.1f} img/s, MFU {100 * r['mfu']:.1f}%")
try:
  host = json.load(open(f'{out}/input_host_cost.json'))
  v = host['variants'][host['reference']]['pipelines']
  print(f"host cost per image: tf {v['tf']['cpu_us_per_image']:.0f} us, tf_device "
        f"{v['tf_device']['cpu_us_per_image']:.0f} us: "
        f"{host.get('host_cost_ratio_tf_over_tf_device', float('nan')):.2f}x fewer core-seconds; "
        f"{host['cpu_cores']} cores feed {v['tf']['images_per_s']:.0f} / "
        f"{v['tf_device']['images_per_s']:.0f} img/s")
except (FileNotFoundError, KeyError) as e:
  print(f'host cost: not measured ({e})')
if os.path.exists(f'{out}/dali_decode.json'):
  print('DALI decode vs libjpeg:', json.load(open(f'{out}/dali_decode.json')))
EOF
