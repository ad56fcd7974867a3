#!/bin/bash
# Run an hpccomm program with mpirun/mpiexec: on a workstation, or inside any batch job
# whose scheduler mpirun understands (it reads the node list of Slurm, PBS, LSF...).
#
#   NP=4 bash jobscripts/mpirun.sh                        # runs jobscripts/hello.py
#   NP=8 HPCCOMM_PROGRAM=train.py bash jobscripts/mpirun.sh --epochs 3
#   NP=8 HOSTFILE=hosts.txt bash jobscripts/mpirun.sh     # several machines, no scheduler
#
# Use the mpirun of the MPI library that mpi4py was built with: with pip's mpich wheel
# it is the mpiexec next to the venv's python (the default below).
set -euo pipefail

PYTHON=${HPCCOMM_PYTHON:-python3}
PROGRAM=${HPCCOMM_PROGRAM:-jobscripts/hello.py}
NP=${NP:-4}
MPIEXEC=${HPCCOMM_MPIEXEC:-$(dirname "$(command -v "$PYTHON")")/mpiexec}
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec || command -v mpirun)

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

ARGS=(-n "$NP")
# Hydra (MPICH, Intel MPI): -f HOSTFILE, -ppn ranks per node, -bind-to core.
# Open MPI:                 --hostfile HOSTFILE, --map-by ppr:4:node, --bind-to core.
# Binding keeps hpccomm's shared-memory path (it counts a node's CPUs together); the same
# ranks per node lets large all_reduce over several nodes run hierarchically. Try a
# two-node job on one machine with MPICH: MPIR_CVAR_NUM_CLIQUES=2 MPIR_CVAR_CLIQUES_BY_BLOCK=1
# (any MPI: HPCCOMM_NODES=2, for hpccomm's own decisions); `python -m hpccomm info`
# under the same launcher shows the placement (docs/cluster.md).
if [ -n "${HOSTFILE:-}" ]; then
    ARGS+=("$(HPCCOMM_MPIEXEC="$MPIEXEC" "$PYTHON" -m hpccomm.cli.launch hostfile-option)" "$HOSTFILE")
fi

# hpccomm.cli.rank_env sets RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE on each rank and
# aborts the whole job if one rank raises (HPCCOMM_NO_ABORT_ON_EXCEPTION=1 to opt out).
# Equivalent: "$PYTHON" -m hpccomm run -n "$NP" "$PROGRAM" "$@"
exec "$MPIEXEC" "${ARGS[@]}" "$PYTHON" -m hpccomm.cli.rank_env "$PROGRAM" "$@"
