#!/usr/bin/env bash
# The benchmark suite: regenerate every number under docs/results/, the plot and the
# tables of docs/performance.md. (One-off studies are in benchmarks/studies/.)
#   benchmarks/run_all.sh            (PYTHON=/path/to/python to choose the interpreter,
#                                     default the README's .venv; MPIEXEC defaults to the
#                                     mpiexec next to it)
# Needs torch==2.13.0 and matplotlib in that environment: pip install -e '.[test,bench]'.
# Takes about 10 minutes on the idle 2-core reference machine (much longer under load).
# Extra arguments (e.g. --budget 0.25) go to benchmarks/collectives.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
MPIEXEC=${MPIEXEC:-$(dirname "$PYTHON")/mpiexec}
mkdir -p docs/results
echo "== hot path profile (1 process)"; "$PYTHON" benchmarks/profile_hotpath.py
# collectives.py --driver alternates jobs at two MPI thread levels (see its docstring)
echo "== collectives, 2 ranks"; "$PYTHON" benchmarks/collectives.py --driver -n 2 --mpiexec "$MPIEXEC" "$@"
# 4 ranks on 2 cores: no raw mpi4py job at MPI_THREAD_SERIALIZED, whose blocking calls
# spin without yielding there (milliseconds per 8-byte all_reduce, tens of minutes a run)
echo "== collectives, 4 ranks"; "$PYTHON" benchmarks/collectives.py --driver -n 4 --no-serialized --mpiexec "$MPIEXEC" "$@"
if [ -z "${SKIP_INIT:-}" ]; then  # SKIP_INIT=1 keeps docs/results/bench_init.csv (slowest part)
  echo "== init time";          "$PYTHON" benchmarks/init_time.py --driver --sizes 2,4,8,16 --repeats 3 --mpiexec "$MPIEXEC"
fi
echo "== memory ceiling, 2 ranks"; "$MPIEXEC" -n 2 "$PYTHON" benchmarks/membw.py
echo "== memory ceiling, 4 ranks"; "$MPIEXEC" -n 4 "$PYTHON" benchmarks/membw.py
echo "== torch backend, 2 ranks"; "$MPIEXEC" -n 2 "$PYTHON" benchmarks/torch_backend.py
echo "== work between collectives, 2 ranks"; "$MPIEXEC" -n 2 "$PYTHON" benchmarks/footprint.py
echo "== beside a busy Python thread, 2 ranks"; "$MPIEXEC" -n 2 "$PYTHON" benchmarks/busy_thread.py
echo "== a group spanning 2 simulated nodes, 4 ranks"
MPIR_CVAR_NUM_CLIQUES=2 MPIR_CVAR_CLIQUES_BY_BLOCK=1 "$MPIEXEC" -n 4 "$PYTHON" benchmarks/multinode.py \
    --out docs/results/bench_multinode
echo "== report";               "$PYTHON" benchmarks/report.py
