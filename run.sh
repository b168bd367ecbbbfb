#!/usr/bin/env bash
# anp_jax launcher: one call per node (srun starts one task per node) or by hand.
#
#   ./run.sh                                   # CPU demo: default config, workdir workdirs/demo
#   ./run.sh --config=anp_jax/configs/musa2_resnet50.py --workdir=/scratch/run1 --config.batch_size=512
#   srun --ntasks-per-node=1 ./run.sh --workdir=/shared/run1 ...   # multi-node under SLURM
#
# Creates the virtual environment from requirements.txt on first use (ANP_VENV, default
# ./.venv; put it on a shared filesystem for multi-node jobs), passes every flag through to
# `.venv/bin/python -m anp_jax.main`, and turns exit code 75 (preempted, checkpoint written)
# into a SLURM requeue when running inside a batch job.
#
# GPUs (README "On a GPU cluster"): ANP_ACCELERATOR=cuda adds requirements-cuda.txt (JAX for
# NVIDIA GPUs, CUDA 12, pinned) to the environment; ANP_ACCELERATOR=cpu removes it again; unset,
# the environment keeps what it has (cpu when new). The choice is recorded in the venv's marker
# (.anp_requirements_ok), so a switch installs or removes just that. ANP_DALI=1 adds
# requirements-dali.txt (NVIDIA DALI, input_backend='dali', --no-deps: see the file).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${ANP_VENV:-$HERE/.venv}"
PY="${ANP_PYTHON:-python3}"
# This process's rank in its job (SLURM task, or ANP_PROCESS_ID in explicit multi-process mode):
# only process 0 builds the environment, so that the processes of a job sharing one checkout
# (several on one host, or a shared filesystem) never run pip into the same venv at once.
# The --process_id flag counts too (the README's flag-launched jobs): as "rank 0" every process
# ran pip into the shared venv at once.
flag_rank=
prev=
for a in "$@"; do
  case "$a" in --process_id=*|-process_id=*) flag_rank="${a#*=}";; esac  # absl: - or --.
  case "$prev" in --process_id|-process_id) flag_rank="$a";; esac
  prev="$a"
done
RANK="${SLURM_PROCID:-${flag_rank:-${ANP_PROCESS_ID:-0}}}"

# anp_jax itself, editable (pyproject.toml): `import anp_jax` then works from any directory,
# notebook or script of this environment. Offline: no build isolation, no dependencies (those
# are requirements.txt's, installed just before).
install_package() {
  local isolation=--no-build-isolation  # Python >= 3.12 venvs come without setuptools.
  "$VENV/bin/python" -c 'import setuptools' 2>/dev/null || isolation=
  # setuptools' editable-install warnings are noise on a first run's screen: shown only on failure.
  local log="$VENV/.anp_package_install.log"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps $isolation -e "$HERE" \
      >"$log" 2>&1 || { cat "$log" >&2; echo "run.sh: pip install -e $HERE failed" >&2; return 1; }
  echo "$HERE" > "$VENV/.anp_package_ok"
}

# The environment wanted: requirements.txt, plus requirements-cuda.txt for ANP_ACCELERATOR=cuda;
# the marker holds what was installed, the accelerator line included.
MARKER="$VENV/.anp_requirements_ok"
have_accel=cpu
grep -qx '# ANP_ACCELERATOR=cuda' "$MARKER" 2>/dev/null && have_accel=cuda
ACCEL="${ANP_ACCELERATOR:-$have_accel}"
case "$ACCEL" in
  cpu|cuda) ;;
  *) echo "run.sh: ANP_ACCELERATOR=$ACCEL: use cpu or cuda (README: On a GPU cluster)" >&2; exit 2;;
esac
REQS=(-r "$HERE/requirements.txt")
[ "$ACCEL" = cuda ] && REQS+=(-r "$HERE/requirements-cuda.txt")
wanted() {
  cat "$HERE/requirements.txt"
  if [ "$ACCEL" = cuda ]; then echo '# ANP_ACCELERATOR=cuda'; cat "$HERE/requirements-cuda.txt"; fi
}
DALI="${ANP_DALI:-0}"
DALI_MARKER="$VENV/.anp_dali_requirements_ok"  # test.sh's too.
env_current() {
  cmp -s <(wanted) "$MARKER" &&
    { [ "$DALI" != 1 ] || cmp -s "$HERE/requirements-dali.txt" "$DALI_MARKER"; }
}

if [ ! -x "$VENV/bin/python" ] || ! env_current; then
  if [ "$RANK" != "0" ]; then
    # Other processes wait for process 0 to build the shared environment.
    for _ in $(seq 1 900); do
      env_current && break
      sleep 2
    done
  else
    if [ ! -x "$VENV/bin/python" ] || ! cmp -s <(wanted) "$MARKER"; then
      echo "run.sh: building the Python environment in $VENV ($ACCEL; first run only, a few" \
           "minutes)..." >&2
      "$PY" -m venv "$VENV" || { echo "run.sh: could not create a venv with $PY" >&2; exit 2; }
      "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2 || true
      "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${REQS[@]}" >&2 || {
        echo "run.sh: pip install ${REQS[*]} failed" >&2; exit 2; }
      if [ "$ACCEL" = cpu ] && [ "$have_accel" = cuda ]; then
        # Back to the CPU: without its plugin JAX no longer looks for GPUs.
        "$VENV/bin/python" -m pip uninstall -q -y jax-cuda12-plugin jax-cuda12-pjrt >&2 || {
          echo "run.sh: pip uninstall of JAX's CUDA plugin failed" >&2; exit 2; }
      fi
      install_package || exit 2
      wanted > "$MARKER"
    fi
    if [ "$DALI" = 1 ] && ! cmp -s "$HERE/requirements-dali.txt" "$DALI_MARKER"; then
      echo "run.sh: installing requirements-dali.txt (NVIDIA DALI, ~490 MB, first time only)..." >&2
      "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
          -r "$HERE/requirements-dali.txt" >&2 || {
        echo "run.sh: pip install --no-deps -r requirements-dali.txt failed" >&2; exit 2; }
      cp "$HERE/requirements-dali.txt" "$DALI_MARKER"
    fi
  fi
fi
# An environment built before pyproject.toml existed, or for another checkout: (re)install the
# package (process 0 only; the others import it through PYTHONPATH below).
if [ "$RANK" = 0 ] && ! cmp -s <(echo "$HERE") "$VENV/.anp_package_ok" 2>/dev/null; then
  install_package || exit 2
fi

[ "${ANP_SETUP_ONLY:-0}" = 1 ] && exit 0

export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
export PYTHONUNBUFFERED=1

args=("$@")
has_workdir=0
prev=
for a in "${args[@]}"; do
  case "$a" in --workdir=*|--workdir|-workdir=*|-workdir) has_workdir=1;; esac
  # A --workdir inside a --flagfile (absl lets a later flag win: the default must not follow it).
  flagfile=
  case "$a" in --flagfile=*|-flagfile=*) flagfile="${a#*=}";; esac
  case "$prev" in --flagfile|-flagfile) flagfile="$a";; esac
  if [ -n "$flagfile" ] && grep -qE '^[[:space:]]*--?workdir([=[:space:]]|$)' "$flagfile" 2>/dev/null; then
    has_workdir=1
  fi
  prev="$a"
done
[ "$has_workdir" = 1 ] || args+=("--workdir=$HERE/workdirs/demo")

echo "run.sh: host $(hostname) task ${SLURM_PROCID:-0}/${SLURM_NTASKS:-1} job ${SLURM_JOB_ID:-none}" >&2
# Forward SIGTERM/SIGUSR1 (SLURM preemption / time-limit warning) to the trainer, which
# checkpoints at the next step boundary and exits with 75. Ctrl-C (SIGINT) too, as a SIGTERM: a
# background child of a script ignores SIGINT, so the trainer went on training without its
# launcher; an interrupted run is not requeued. The traps are set before the trainer starts: a
# signal in between (Ctrl-C on a loaded machine, an early preemption) killed run.sh and left the
# trainer running without it. One that comes before the trainer's pid is known waits in
# `pending` and is sent as soon as it is.
child=
pending=
interrupted=0
forward() { if [ -n "$child" ]; then kill -"$1" "$child" 2>/dev/null; else pending=$1; fi; }
trap 'forward TERM' TERM
trap 'forward USR1' USR1
trap 'interrupted=1; forward TERM' INT
"$VENV/bin/python" -m anp_jax.main "${args[@]}" &
child=$!
[ -z "$pending" ] || kill -"$pending" "$child" 2>/dev/null
rc=0
while :; do
  wait "$child"; rc=$?
  # wait returns >128 when interrupted by a trapped signal while the child still runs.
  kill -0 "$child" 2>/dev/null && continue
  # The child ended while a trapped signal interrupted `wait`: rc is that signal's 128+n, not
  # the child's code (a 75 read as "killed by signal 15" lost the requeue). Reap it for its own.
  if [ "$rc" -gt 128 ]; then
    wait "$child" 2>/dev/null; own=$?
    [ "$own" = 127 ] || rc=$own
  fi
  break
done
task="${SLURM_PROCID:-0}"
if [ "$rc" -gt 128 ] && [ "$rc" -lt 160 ]; then
  # Killed (kill -9, the OOM killer, a crash): say which process of the job is gone. The other
  # processes then stop within ANP_HEARTBEAT_TIMEOUT (or at once, under srun --kill-on-bad-exit).
  echo "run.sh: task $task (host $(hostname)): the trainer (pid $child) was killed by signal" \
       "$((rc - 128)) (SIG$(kill -l $((rc - 128)) 2>/dev/null))." >&2
elif [ "$rc" = 75 ]; then
  echo "run.sh: task $task: preempted; checkpoint written (exit 75)." >&2
  # Every task requeues, not only task 0: under `srun --kill-on-bad-exit` (the example sbatch) the
  # first task to exit 75 ends the step, and a task 0 still shutting down would be killed before
  # its requeue. Nothing is lost by requeueing early: a process leaves only after every process
  # has reached jax.distributed's shutdown barrier, i.e. after the agreed checkpoint is committed.
  # The first call requeues the job; later ones find it already requeued.
  if [ "$interrupted" = 1 ]; then
    echo "run.sh: task $task: interrupted (Ctrl-C): not requeued; rerun the same command to resume." >&2
  elif [ -n "${SLURM_JOB_ID:-}" ] && command -v scontrol >/dev/null && [ "${ANP_REQUEUE:-1}" = 1 ]; then
    if out=$(scontrol requeue "$SLURM_JOB_ID" 2>&1); then
      echo "run.sh: task $task: requeued SLURM job $SLURM_JOB_ID" >&2
    else
      echo "run.sh: task $task: scontrol requeue $SLURM_JOB_ID: ${out:-failed} (already requeued by another task, or the job is not requeueable: submit with --requeue)" >&2
    fi
  fi
fi
exit "$rc"
