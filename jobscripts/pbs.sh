#!/bin/bash
# PBS Pro / OpenPBS / Torque job: 2 nodes x 4 MPI ranks.
#
#   qsub jobscripts/pbs.sh
#   qsub -v HPCCOMM_PROGRAM=train.py jobscripts/pbs.sh
#
# select=2 chunks (nodes), each with 4 MPI processes and 4 cores; for GPUs add ngpus=4
# to the chunk (one rank per GPU, as in slurm_gpu.sbatch).
#PBS -N hpccomm
#PBS -l select=2:ncpus=4:mpiprocs=4
##PBS -l select=2:ncpus=32:mpiprocs=4:ngpus=4     # GPU nodes: one rank per GPU
#PBS -l walltime=00:10:00
#PBS -j oe
##PBS -q workq
##PBS -A myproject

set -euo pipefail
cd "${PBS_O_WORKDIR:-.}"            # PBS starts jobs in $HOME

# module load hpccomm              # or: source ~/venvs/hpccomm/bin/activate
PYTHON=${HPCCOMM_PYTHON:-python3}
PROGRAM=${HPCCOMM_PROGRAM:-jobscripts/hello.py}
MPIEXEC=${HPCCOMM_MPIEXEC:-$(dirname "$(command -v "$PYTHON")")/mpiexec}
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec)

# $PBS_NODEFILE lists each node once per MPI process (mpiprocs), so its length is the
# number of ranks. Hydra (MPICH, Intel MPI) reads it with -f, Open MPI's mpirun with
# --hostfile; each binds a rank to a core with its own spelling of --bind-to.
NP=$(wc -l < "${PBS_NODEFILE:?not inside a PBS job}")
export OMP_NUM_THREADS=1
case $(HPCCOMM_MPIEXEC="$MPIEXEC" "$PYTHON" -m hpccomm.cli.launch flavour) in
    openmpi) PLACE=(--hostfile "$PBS_NODEFILE" --bind-to core) ;;
    *)       PLACE=(-f "$PBS_NODEFILE" -bind-to core) ;;
esac

"$MPIEXEC" -n "$NP" "${PLACE[@]}" "$PYTHON" -m hpccomm.cli.rank_env "$PROGRAM" "$@"
