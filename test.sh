#!/usr/bin/env bash
# Runs the test suite (8 simulated CPU devices; multi-process tests on 127.0.0.1).
# Creates the environment from requirements.txt first if it is missing, and adds
# requirements-bench.txt (PyTorch, CPU: the benchmark's reference tests need it) and
# requirements-dali.txt (NVIDIA DALI: the DALI input backend's tests), so that this runs the
# same tests as CI. Extra args go to pytest.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# requirements-dali.txt (NVIDIA DALI, ~490 MB, without its declared pins: see the file) through
# run.sh's ANP_DALI: the DALI input backend's tests run on its CPU decoder. ANP_NO_DALI=1 skips
# the install, and those tests skip (the only way they do: without it a missing DALI fails them).
# ANP_TEST_NO_SETUP=1: use the environment ANP_VENV as it is (the suite's own tests of this script).
dali=1
[ "${ANP_NO_DALI:-0}" = 1 ] && dali=0
[ "${ANP_TEST_NO_SETUP:-0}" = 1 ] || ANP_DALI=$dali ANP_SETUP_ONLY=1 "$HERE/run.sh"
cd "$HERE"
VENV_PY="${ANP_VENV:-$HERE/.venv}/bin/python"
BENCH_OK="${ANP_VENV:-$HERE/.venv}/.anp_bench_requirements_ok"
if [ "${ANP_TEST_NO_SETUP:-0}" = 1 ]; then
  :
elif ! cmp -s requirements-bench.txt "$BENCH_OK" 2>/dev/null; then
  echo "test.sh: installing requirements-bench.txt (PyTorch CPU, first run only)..." >&2
  "$VENV_PY" -m pip install -q -r requirements-bench.txt >&2
  cp requirements-bench.txt "$BENCH_OK"
fi
if [ "$dali" = 1 ] && [ "${ANP_TEST_NO_SETUP:-0}" != 1 ]; then
  "$VENV_PY" -c "import nvidia.dali" 2>/dev/null || {
    echo "test.sh: NVIDIA DALI does not import after installing requirements-dali.txt" >&2; exit 1; }
fi
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
# Tests run in parallel worker processes (pytest-xdist): min(cores + 1, 4, GiB of memory / 6)
# workers (a worker with its 8 simulated devices and the multi-process tests' children peaks at
# ~5 GiB). One more worker than cores: the multi-process and SLURM tests' workers spend much of
# their time waiting on their jobs (2-core VM: 3 workers 606 s, 2 workers 691 s);
# ANP_TEST_WORKERS=1: one process. A worker takes a whole file at a time (module fixtures are
# built once), heaviest first in the order tests/conftest.py sets, so that no heavy file is left
# for the end.
cores="$(nproc 2>/dev/null || echo 1)"
mem_gib="$(awk '/^MemTotal:/ {print int($2 / 1048576)}' /proc/meminfo 2>/dev/null || echo 6)"
auto=$(( cores + 1 < 4 ? cores + 1 : 4 ))
auto=$(( mem_gib / 6 < auto ? mem_gib / 6 : auto ))
workers="${ANP_TEST_WORKERS:-$(( auto < 1 ? 1 : auto ))}"
xdist=()
# --max-worker-restart=0: a worker that crashes (SIGABRT, SIGSEGV, out of memory) stops the session,
# its test reported as failed by name, instead of being replaced: a replaced worker was once seen
# leaving the session waiting forever with no test running.
if [ "$workers" -gt 1 ]; then
  xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder --max-worker-restart=0)
fi
# --durations: the slowest tests, to keep their @pytest.mark.slow(seconds) weights current.
cmd=("$VENV_PY" -m pytest -q --durations=25 "${xdist[@]}" "$@")
# ANP_TEST_TIME_LIMIT=SECONDS (.ci/run sets it): an overall bound; past it every process of the
# session writes its Python stacks (SIGABRT), is killed, and this exits 124 (tests/run_bounded.py).
if [ -n "${ANP_TEST_TIME_LIMIT:-}" ]; then
  exec "$VENV_PY" "$HERE/tests/run_bounded.py" "$ANP_TEST_TIME_LIMIT" "${cmd[@]}"
fi
exec "${cmd[@]}"
