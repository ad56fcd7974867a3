#!/usr/bin/env bash
# The whole test suite on a fresh machine: make .venv if needed, install hpccomm with its
# test extra (mpi4py + the mpich wheel give MPI and mpiexec), then run serial tests and
# MPI tests at 1, 2 and 4 ranks. Extra arguments go to tests/run_suite.py.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch extra: the torch backend's tests (CPU-only CI: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,torch]'
exec .venv/bin/python tests/run_suite.py "$@"
