#!/usr/bin/env bash
# Runs the test suite (8 simulated CPU devices; multi-process tests on 127.0.0.1).
# Creates the environment from requirements.txt first if it is missing. Extra args go to pytest.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ANP_SETUP_ONLY=1 "$HERE/run.sh"
cd "$HERE"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
# Test files run in parallel worker processes (pytest-xdist, whole files per worker so that module
# fixtures are built once): min(cores, 4) workers; ANP_TEST_WORKERS=1 runs everything in one.
cores="$(nproc 2>/dev/null || echo 1)"
workers="${ANP_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}"
xdist=()
if [ "$workers" -gt 1 ]; then xdist=(-n "$workers" --dist loadfile); fi
exec "${ANP_VENV:-$HERE/.venv}/bin/python" -m pytest -q "${xdist[@]}" "$@"
