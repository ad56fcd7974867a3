#!/usr/bin/env bash
# The whole GPU check of hpccomm, repeatable on any Linux machine with NVIDIA GPUs.
#
#   gpu/run_gpu_check.sh            # from the repository root or anywhere
#
# 1. makes a fresh venv and installs from wheels: cupy-cuda12x (+ CUDA libraries),
#    nvidia-nccl-cu12, mpi4py, mpich, pytest, pytest-mpi, ml_dtypes, and this checkout;
# 2. records the GPU, driver, CUDA, NCCL and CuPy versions;
# 3. runs the GPU tests (tests/test_gpu_collectives.py, cupy-* cases and the rest) at world
#    size 1, then 2 and 4 ranks where the machine has that many GPUs (one rank per GPU);
# 4. runs benchmarks/studies/gpu_allreduce.py (hpccomm vs raw cupy.cuda.nccl, same buffers) at
#    world size 1 and at the number of GPUs;
# 5. runs gpu/capture_check.py (collectives captured in a CUDA graph, replayed, checked) at
#    world size 1 and at the number of GPUs, and benchmarks/studies/gpu_call_cost.py (CPU
#    time per synchronous call, hpccomm vs raw NCCL) at world size 1;
# 6. writes everything to gpu/results/<host>-<UTC time>/ and a summary.md there.
#
# Environment: PYTHON (default python3), VENV (default .gpu-venv in the checkout),
# GPU_CHECK_RANKS (default "1 2 4", capped at the GPU count), SKIP_INSTALL=1 to reuse VENV,
# GPU_BENCH_ARGS (extra benchmark arguments, e.g. "--max-bytes 1048576").
# Exit status: 0 only if every test run passed, no cupy-* test was skipped, every
# benchmark's correctness check held and every graph replay gave the expected results.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-$ROOT/.gpu-venv}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="${GPU_CHECK_OUT:-$ROOT/gpu/results/$(hostname -s)-$STAMP}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
STATUS=0
log() { echo "[gpu-check] $*" | tee -a "$OUT/check.log"; }

# -- 1. install ---------------------------------------------------------------------------------
if [[ "${SKIP_INSTALL:-0}" != "1" ]]; then
    log "creating venv $VENV"
    "$PYTHON" -m venv "$VENV" || { log "venv creation failed"; exit 2; }
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
    python -m pip install -q --upgrade pip setuptools wheel >>"$OUT/install.log" 2>&1
    # [ctk] pulls the CUDA runtime/NVRTC wheels so no system CUDA toolkit is needed;
    # fall back to the plain wheel where that extra is unknown.
    python -m pip install -q "cupy-cuda12x[ctk]" >>"$OUT/install.log" 2>&1 \
        || python -m pip install -q cupy-cuda12x >>"$OUT/install.log" 2>&1 \
        || { log "installing cupy-cuda12x failed (see install.log)"; exit 2; }
    python -m pip install -q nvidia-nccl-cu12 mpich mpi4py pytest pytest-mpi ml_dtypes numpy \
        >>"$OUT/install.log" 2>&1 || { log "installing wheels failed (see install.log)"; exit 2; }
    python -m pip install -q -e "$ROOT" >>"$OUT/install.log" 2>&1 \
        || { log "installing hpccomm from $ROOT failed (see install.log)"; exit 2; }
else
    # shellcheck disable=SC1091
    source "$VENV/bin/activate"
fi
# Let CuPy find the NCCL of the nvidia-nccl-cu12 wheel.
NCCL_LIB="$(python -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)"
[[ -n "$NCCL_LIB" ]] && export LD_LIBRARY_PATH="$NCCL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
MPIEXEC="$VENV/bin/mpiexec"
[[ -x "$MPIEXEC" ]] || MPIEXEC="$(command -v mpiexec)"

# -- 2. environment ------------------------------------------------------------------------------
python - >"$OUT/environment.json" 2>>"$OUT/check.log" <<'EOF'
import json, platform, cupy, hpccomm
from cupy.cuda import nccl
from hpccomm.backends import nccl as hnccl
rt = cupy.cuda.runtime
gpus = [rt.getDeviceProperties(i)["name"] for i in range(rt.getDeviceCount())]
print(json.dumps({
    "host": platform.node(), "python": platform.python_version(), "cupy": cupy.__version__,
    "cuda_runtime": rt.runtimeGetVersion(), "cuda_driver": rt.driverGetVersion(),
    "nccl": ".".join(map(str, hnccl.version())),
    "gpus": [g.decode() if isinstance(g, bytes) else g for g in gpus],
    "is_nccl_available": hpccomm.is_nccl_available()}, indent=2))
EOF
if [[ ! -s "$OUT/environment.json" ]]; then
    log "CuPy/NCCL cannot start here (see check.log); no GPU check possible"; exit 2
fi
NGPU="$(python -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["gpus"]))' "$OUT/environment.json")"
log "GPUs: $NGPU; $(tr -d '\n ' <"$OUT/environment.json")"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true

# -- 3. tests -------------------------------------------------------------------------------------
cd "$ROOT" || exit 2
{
    echo "# hpccomm GPU check, $STAMP"
    echo
    echo '```json'; cat "$OUT/environment.json"; echo '```'
    echo
    echo "## Tests (tests/test_gpu_collectives.py)"
    echo
    echo "| ranks | result |"
    echo "|---|---|"
} >"$SUMMARY"
for n in ${GPU_CHECK_RANKS:-1 2 4}; do
    if (( n > NGPU )); then log "skipping $n ranks: only $NGPU GPU(s)"; continue; fi
    log "tests at $n rank(s)"
    HPCCOMM_TEST_TIMEOUT=120 timeout 1200 "$MPIEXEC" -n "$n" python -m pytest -q -rs \
        -m mpi --with-mpi -p no:cacheprovider tests/test_gpu_collectives.py \
        >"$OUT/tests-n$n.log" 2>&1
    code=$?
    line="$(grep -E '[0-9]+ (passed|failed)' "$OUT/tests-n$n.log" | tail -1)"
    skipped_gpu="$(grep -c 'no CUDA device/CuPy/NCCL' "$OUT/tests-n$n.log")"
    if (( code != 0 )) || (( skipped_gpu > 0 )); then STATUS=1; fi
    echo "| $n | exit $code: $line (GPU-skip lines: $skipped_gpu) |" >>"$SUMMARY"
done

# -- 4. benchmark ---------------------------------------------------------------------------------
echo -e "\n## all_reduce bandwidth: hpccomm vs raw cupy.cuda.nccl\n" >>"$SUMMARY"
for n in 1 "$NGPU"; do
    [[ -f "$OUT/bench-n$n.json" ]] && continue
    log "benchmark at $n rank(s)"
    timeout 1200 "$MPIEXEC" -n "$n" python benchmarks/studies/gpu_allreduce.py --out "$OUT/bench-n$n.json" ${GPU_BENCH_ARGS:-} \
        >"$OUT/bench-n$n.log" 2>&1 || STATUS=1
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
    timeout 600 "$MPIEXEC" -n "$n" python gpu/capture_check.py >"$OUT/capture-n$n.log" 2>&1 \
        || STATUS=1
    { echo '```'; grep -E 'capture check|replay' "$OUT/capture-n$n.log"; echo '```'; echo; } \
        >>"$SUMMARY"
done
echo -e "\n## CPU time per synchronous call (gpu_call_cost.py, 1 rank)\n" >>"$SUMMARY"
timeout 600 "$MPIEXEC" -n 1 python benchmarks/studies/gpu_call_cost.py \
    --json "$OUT/call-cost-n1.json" >"$OUT/call-cost-n1.log" 2>&1 || STATUS=1
grep -E '^\||^#' "$OUT/call-cost-n1.log" >>"$SUMMARY"

log "done: status $STATUS; results in $OUT"
echo -e "\nOverall status: $STATUS (0 = all GPU tests passed, none skipped, benchmark checks held)" >>"$SUMMARY"
cat "$SUMMARY"
exit "$STATUS"
