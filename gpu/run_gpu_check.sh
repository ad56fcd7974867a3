#!/usr/bin/env bash
# The whole GPU check of hpccomm, repeatable on any Linux machine with NVIDIA GPUs.
#
#   gpu/run_gpu_check.sh              # fresh venv, wheels for CUDA 12 (hpccomm[gpu])
#   GPU_CHECK_CUDA=13 gpu/run_gpu_check.sh   # wheels for CUDA 13 (hpccomm[gpu-cuda13])
#   gpu/run_gpu_check.sh --offline    # no venv, no pip: the interpreter and packages here
#
# 1. makes a fresh venv and installs from wheels: cupy-cuda12x (+ CUDA libraries) and
#    nvidia-nccl-cu12 (cupy-cuda13x and nvidia-nccl-cu13 with GPU_CHECK_CUDA=13), mpi4py,
#    mpich, pytest, pytest-mpi, ml_dtypes, and this checkout. --offline skips this step:
#    it uses $PYTHON (default python3) with what it has, and this checkout on PYTHONPATH;
# 2. says what it found (gpu/preflight.py: mpi4py, pytest, pytest-mpi, CuPy, NCCL, the
#    GPUs; torch and ml_dtypes optional) and stops with exit status 2 and the list of
#    what is missing if something required is;
# 3. runs the GPU tests (tests/test_gpu_collectives.py and tests/test_gpu_lifecycle.py,
#    cupy-* cases and the rest) at world size 1, then 2 and 4 ranks where the machine has
#    that many GPUs (one rank per GPU), and, with nccl4py, at 1 rank with nonblocking
#    communicators (and tests/test_gpu_nccl4py.py);
# 4. runs benchmarks/studies/gpu_allreduce.py (hpccomm vs raw cupy.cuda.nccl, same buffers) at
#    world size 1 and at the number of GPUs;
# 5. runs gpu/capture_check.py (collectives captured in a CUDA graph, replayed, checked) at
#    world size 1 and at the number of GPUs, and benchmarks/studies/gpu_call_cost.py (CPU
#    time per synchronous call, hpccomm vs raw NCCL) and benchmarks/studies/nccl_bindings.py
#    (one ncclAllReduce through CuPy, nccl4py and ctypes; informative) at world size 1;
# 6. writes everything to gpu/results/<host>-<UTC time>/ and a summary.md there.
#
# NCCL is found as users get it: hpccomm loads the NCCL wheel's library itself, so
# LD_LIBRARY_PATH is not set here (hpccomm info says where it came from).
# Environment: PYTHON (default python3), VENV (default .gpu-venv in the checkout),
# GPU_CHECK_CUDA (12 or 13, default 12), GPU_CHECK_RANKS (default "1 2 4", capped at the
# GPU count), SKIP_INSTALL=1 to reuse VENV, GPU_CHECK_OUT (the results folder),
# GPU_BENCH_ARGS (extra benchmark arguments, e.g. "--max-bytes 1048576").
# Exit status: 0 only if every test run passed, no cupy-* test was skipped, every
# benchmark's correctness check held and every graph replay gave the expected results;
# 2 if the check could not start.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OFFLINE=0
for arg in "$@"; do
    case "$arg" in
        --offline) OFFLINE=1 ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run_gpu_check.sh: unknown argument $arg (--offline, --help)" >&2; exit 2 ;;
    esac
done
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-$ROOT/.gpu-venv}"
CUDA_MAJOR="${GPU_CHECK_CUDA:-12}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="${GPU_CHECK_OUT:-$ROOT/gpu/results/$(hostname -s)-$STAMP}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
STATUS=0
log() { echo "[gpu-check] $*" | tee -a "$OUT/check.log"; }
case "$CUDA_MAJOR" in
    12) EXTRA=gpu ;;
    13) EXTRA=gpu-cuda13 ;;
    *) log "GPU_CHECK_CUDA=$CUDA_MAJOR: 12 or 13"; exit 2 ;;
esac

# -- 1. install ---------------------------------------------------------------------------------
if (( OFFLINE )); then
    log "offline: $PYTHON and the packages it has; no venv, no pip"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    PY="$(command -v "$PYTHON")" || { log "no interpreter $PYTHON"; exit 2; }
elif [[ "${SKIP_INSTALL:-0}" != "1" ]]; then
    log "creating venv $VENV (CUDA $CUDA_MAJOR wheels: hpccomm[$EXTRA])"
    "$PYTHON" -m venv "$VENV" || { log "venv creation failed"; exit 2; }
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
    python -m pip install -q --upgrade pip setuptools wheel >>"$OUT/install.log" 2>&1
    # [ctk] pulls the CUDA runtime/NVRTC wheels so no system CUDA toolkit is needed;
    # fall back to the plain wheel where that extra is unknown.
    CUPY="cupy-cuda${CUDA_MAJOR}x"
    python -m pip install -q "$CUPY[ctk]" >>"$OUT/install.log" 2>&1 \
        || python -m pip install -q "$CUPY" >>"$OUT/install.log" 2>&1 \
        || { log "installing $CUPY failed (see install.log)"; exit 2; }
    python -m pip install -q mpich mpi4py pytest pytest-mpi ml_dtypes numpy \
        >>"$OUT/install.log" 2>&1 || { log "installing wheels failed (see install.log)"; exit 2; }
    python -m pip install -q -e "$ROOT[$EXTRA]" >>"$OUT/install.log" 2>&1 \
        || { log "installing hpccomm[$EXTRA] from $ROOT failed (see install.log)"; exit 2; }
    # NVIDIA's NCCL binding: nonblocking communicators (step 3) and the bindings study
    # (step 5); optional
    python -m pip install -q nccl4py >>"$OUT/install.log" 2>&1 \
        || log "nccl4py not installed: its checks are skipped, and the bindings study compares CuPy and ctypes only"
else
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
fi
(( OFFLINE )) || PY="$(command -v python)"
# the mpiexec beside the interpreter (the mpich wheel's), else the one on PATH
MPIEXEC="$(dirname "$PY")/mpiexec"
[[ -x "$MPIEXEC" ]] || MPIEXEC="$(command -v mpiexec || true)"

# -- 2. what is here ----------------------------------------------------------------------------
"$PY" "$ROOT/gpu/preflight.py" "$OUT/environment.json" 2>>"$OUT/check.log" \
    | tee -a "$OUT/check.log"
PREFLIGHT=${PIPESTATUS[0]}
if [[ -z "$MPIEXEC" ]]; then
    log "MISSING mpiexec: not on PATH"; PREFLIGHT=1
fi
if (( PREFLIGHT != 0 )) || [[ ! -s "$OUT/environment.json" ]]; then
    log "cannot run the GPU check here: required pieces are missing (listed above)"; exit 2
fi
NGPU="$("$PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["gpus"]))' "$OUT/environment.json")"
log "GPUs: $NGPU; mpiexec: $MPIEXEC"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true

# -- 3. tests -------------------------------------------------------------------------------------
cd "$ROOT" || exit 2
{
    echo "# hpccomm GPU check, $STAMP"
    echo
    echo '```json'; cat "$OUT/environment.json"; echo '```'
    echo
    echo "## Tests (tests/test_gpu_collectives.py, tests/test_gpu_lifecycle.py)"
    echo
    echo "| ranks | result |"
    echo "|---|---|"
} >"$SUMMARY"
for n in ${GPU_CHECK_RANKS:-1 2 4}; do
    if (( n > NGPU )); then log "skipping $n ranks: only $NGPU GPU(s)"; continue; fi
    log "tests at $n rank(s)"
    HPCCOMM_TEST_TIMEOUT=120 timeout 1200 "$MPIEXEC" -n "$n" "$PY" -m pytest -q -rs \
        -m mpi --with-mpi -p no:cacheprovider tests/test_gpu_collectives.py \
        tests/test_gpu_lifecycle.py >"$OUT/tests-n$n.log" 2>&1
    code=$?
    line="$(grep -E '[0-9]+ (passed|failed)' "$OUT/tests-n$n.log" | tail -1)"
    skipped_gpu="$(grep -c 'no CUDA device/CuPy/NCCL' "$OUT/tests-n$n.log")"
    if (( code != 0 )) || (( skipped_gpu > 0 )); then STATUS=1; fi
    echo "| $n | exit $code: $line (GPU-skip lines: $skipped_gpu) |" >>"$SUMMARY"
done
# the same at 1 rank with nonblocking communicators through nccl4py (HPCCOMM_NCCL_NONBLOCKING),
# each group made from one unique id per rank (ncclCommInitRankScalable), and nccl4py's own
# checks (tests/test_gpu_nccl4py.py: creation, split and abort on a deadline)
if "$PY" -c "import nccl.bindings.nccl" 2>/dev/null; then
    log "tests at 1 rank, nonblocking nccl4py communicators"
    HPCCOMM_NCCL_NONBLOCKING=1 HPCCOMM_NCCL_RANKS_PER_ROOT=1 HPCCOMM_TEST_TIMEOUT=120 \
        timeout 1200 "$MPIEXEC" -n 1 "$PY" -m pytest -q -rs -m mpi --with-mpi \
        -p no:cacheprovider tests/test_gpu_collectives.py tests/test_gpu_lifecycle.py \
        tests/test_gpu_nccl4py.py >"$OUT/tests-nccl4py-n1.log" 2>&1
    code=$?
    line="$(grep -E '[0-9]+ (passed|failed)' "$OUT/tests-nccl4py-n1.log" | tail -1)"
    (( code != 0 )) && STATUS=1
    echo "| 1, nonblocking nccl4py | exit $code: $line |" >>"$SUMMARY"
else
    echo "| 1, nonblocking nccl4py | not run: nccl4py is not installed |" >>"$SUMMARY"
fi

# -- 4. benchmarks --------------------------------------------------------------------------------
echo -e "\n## all_reduce bandwidth: hpccomm vs raw cupy.cuda.nccl\n" >>"$SUMMARY"
for n in 1 "$NGPU"; do
    [[ -f "$OUT/bench-n$n.log" ]] && continue
    log "benchmark at $n rank(s)"
    # shellcheck disable=SC2086
    timeout 1200 "$MPIEXEC" -n "$n" "$PY" benchmarks/studies/gpu_allreduce.py \
        --out "$OUT/bench-n$n.json" ${GPU_BENCH_ARGS:-} >"$OUT/bench-n$n.log" 2>&1 || STATUS=1
    {
        echo "### $n rank(s)"; echo
        echo '```'; grep -E ' B  raw|check' "$OUT/bench-n$n.log"; echo '```'; echo
    } >>"$SUMMARY"
done
# -- 5. graph capture and per-call cost --------------------------------------------------------
echo -e "\n## CUDA graph capture (gpu/capture_check.py)\n" >>"$SUMMARY"
for n in 1 "$NGPU"; do
    [[ -f "$OUT/capture-n$n.log" ]] && continue
    log "graph capture check at $n rank(s)"
    timeout 600 "$MPIEXEC" -n "$n" "$PY" gpu/capture_check.py >"$OUT/capture-n$n.log" 2>&1 \
        || STATUS=1
    { echo '```'; grep -E 'capture check|replay' "$OUT/capture-n$n.log"; echo '```'; echo; } \
        >>"$SUMMARY"
done
echo -e "\n## CPU time per synchronous call (gpu_call_cost.py, 1 rank)\n" >>"$SUMMARY"
log "call-cost benchmark at 1 rank"
# It may import cupy.cuda.nccl before hpccomm loads the wheel's NCCL: name the wheel's
# folder to the loader for this run only.
NCCL_DIR="$("$PY" -c 'import os; from hpccomm.backends.cuda import nccl_lib
p = nccl_lib.find_wheel_library(); print(os.path.dirname(p) if p else "")' 2>/dev/null)"
LDP="${LD_LIBRARY_PATH:-}"
[[ -n "$NCCL_DIR" ]] && LDP="$NCCL_DIR${LDP:+:$LDP}"
LD_LIBRARY_PATH="$LDP" timeout 600 "$MPIEXEC" -n 1 "$PY" benchmarks/studies/gpu_call_cost.py \
    --json "$OUT/call-cost-n1.json" >"$OUT/call-cost-n1.log" 2>&1 || STATUS=1
grep -E '^\||^#' "$OUT/call-cost-n1.log" >>"$SUMMARY"
echo -e "\n## One ncclAllReduce through each NCCL binding (nccl_bindings.py, 1 rank)\n" >>"$SUMMARY"
log "NCCL bindings study at 1 rank (informative: not part of the status)"
LD_LIBRARY_PATH="$LDP" BENCH_RESULTS="$OUT" timeout 300 "$PY" \
    benchmarks/studies/nccl_bindings.py >"$OUT/nccl-bindings.log" 2>&1 \
    || log "the bindings study failed (see nccl-bindings.log)"
grep -E '^\||^#' "$OUT/nccl-bindings.log" >>"$SUMMARY"

log "done: status $STATUS; results in $OUT"
echo -e "\nOverall status: $STATUS (0 = all GPU tests passed, none skipped, benchmark checks held)" >>"$SUMMARY"
cat "$SUMMARY"
exit "$STATUS"
