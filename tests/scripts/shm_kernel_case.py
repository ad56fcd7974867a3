"""Ranks that differ in having the C kernel of shared-memory sums, for
tests/test_shm_kernel.py: ``mpiexec -n 2 python this.py``. Rank 0 switches the kernel
off before importing hpccomm; both must then run the NumPy steps, and sum right.
"""
import os
import sys

from mpi4py import MPI

if MPI.COMM_WORLD.Get_rank() == 0:
    os.environ["HPCCOMM_SHM_KERNEL"] = "0"
os.environ.update(HPCCOMM_SHM="1", HPCCOMM_SHM_MIN_BYTES="1", HPCCOMM_SHM_CHUNK="4096")

import numpy as np  # noqa: E402

import hpccomm as dist  # noqa: E402
from hpccomm.backends.shm.communicator import SharedMemoryCommunicator  # noqa: E402


def say(*parts):
    sys.stdout.flush()
    os.write(1, (" ".join(["RESULT", f"rank={dist.get_rank()}", *parts]) + "\n").encode())


def main():
    dist.init_process_group("mpi", timeout=30)
    try:
        import hpccomm.backends.shm._pair  # noqa: F401
    except ImportError:
        say("no-kernel-built")
        return
    cpu = dist.group.WORLD.cpu
    assert isinstance(cpu, SharedMemoryCommunicator), type(cpu)
    arr = np.arange(100001, dtype=np.float32) * (dist.get_rank() + 1)
    dist.all_reduce(arr)
    ok = np.array_equal(arr, np.arange(100001, dtype=np.float32) * 3)
    say(f"kernel={cpu.pair_kernel is not None}", f"sum={'ok' if ok else 'wrong'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
