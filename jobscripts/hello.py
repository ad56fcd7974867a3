"""A tiny hpccomm program for checking a job script: every rank says hello, then allreduce.

Each rank prints ``hello from rank R of world size N on HOST (local rank L of M)`` and
the sum of all ranks, which must be N*(N-1)/2. Run it with any launcher:
``srun python jobscripts/hello.py``, ``mpiexec -n 4 python jobscripts/hello.py`` or
``hpccomm run -n 4 jobscripts/hello.py``.
"""
import os
import socket
import sys

import numpy as np

import hpccomm as dist


def main() -> None:
    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    total = np.array([rank], dtype=np.int64)
    dist.all_reduce(total)  # SUM over all ranks
    local = os.environ.get("LOCAL_RANK", "?"), os.environ.get("LOCAL_WORLD_SIZE", "?")
    # One write per line, so that lines of different ranks never interleave.
    sys.stdout.write(f"hello from rank {rank} of world size {size} on {socket.gethostname()} "
                     f"(local rank {local[0]} of {local[1]}); allreduce sum {int(total[0])}\n")
    sys.stdout.flush()
    assert int(total[0]) == size * (size - 1) // 2, "allreduce gave a wrong sum"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
