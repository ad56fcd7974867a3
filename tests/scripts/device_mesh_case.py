"""DeviceMesh cases that need a fresh process state, each its own MPI job.

Usage: mpiexec -n N python device_mesh_case.py init|nonmember
Prints one ``RESULT ...`` line per rank.

init       DeviceMesh initializes the default group when nothing did (torch's rule).
nonmember  A mesh over half the world: ranks outside it get NON_GROUP_MEMBER, -1 and
           None without communicating, members communicate on its groups, and the
           whole world then meets in a barrier (nothing hangs). Timeouts are short.
gpu_sim    On the simulated GPU (tests/gpu_sim), 2**k ranks: init_process_group with a
           device_id makes the default group's NCCL communicator at once; a 2 x ... x 2
           mesh then all-reduces rank + 1 on each dimension (``sums=``). Reports the
           NCCL communicators made by bootstrap and by split after init (``init=``) and
           after the mesh (``mesh=``).
"""
import os
import sys

import numpy as np

import hpccomm as dist
from hpccomm.device_mesh import DeviceMesh


def report(line: str) -> None:
    """One write per line, so ranks sharing the launcher's pipe never interleave."""
    os.write(1, (line + "\n").encode())


def case_init() -> None:
    assert not dist.is_initialized()
    DeviceMesh("cpu", np.arange(2).reshape(2, 1))
    assert dist.is_initialized()
    report("RESULT init ok")


def case_nonmember() -> None:
    dist.init_process_group(timeout=10)
    rank, size = dist.get_rank(), dist.get_world_size()
    members = list(range(size // 2))[::-1]  # the first half, in reverse order
    mesh = DeviceMesh("cpu", np.array(members).reshape(-1, 1), mesh_dim_names=("a", "b"))
    if rank in members:
        a = mesh.get_group("a")
        x = np.ones(4) * rank
        dist.all_reduce(x, group=a)
        assert (x == sum(members)).all(), x
        assert mesh.get_local_rank("a") == members.index(rank)
    else:
        assert mesh.get_coordinate() is None
        assert mesh.get_group("a") is dist.GroupMember.NON_GROUP_MEMBER
        assert mesh.get_all_groups() == [dist.GroupMember.NON_GROUP_MEMBER] * 2
        assert mesh.get_local_rank("b") == -1
        assert mesh["a"].get_coordinate() is None and mesh._flatten().get_coordinate() is None
        assert dist.get_rank(mesh.get_group("a")) == -1
        # as in torch, a collective on a group this rank is not in is a no-op
        assert dist.all_reduce(np.ones(4), group=mesh.get_group("a")) is None
    dist.barrier()
    report(f"RESULT nonmember ok rank {rank}")
    dist.destroy_process_group()


def case_gpu_sim() -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "gpu_sim"))
    import cupy
    from cupy.cuda import nccl

    def made() -> str:
        return f"{nccl.made['bootstrap']},{nccl.made['split']}"
    dist.init_process_group(backend="cpu:mpi,cuda:nccl", device_id=0, timeout=30)
    after_init = made()
    dims = dist.get_world_size().bit_length() - 1
    names = tuple(f"d{i}" for i in range(dims))
    mesh = dist.init_device_mesh("cuda", (2,) * dims, mesh_dim_names=names)
    sums = []
    for name in names:
        x = cupy.asarray(np.full(2, dist.get_rank() + 1.0, np.float32))
        dist.all_reduce(x, group=mesh.get_group(name))
        sums.append(f"{float(x[0]):g}")
    report(f"RESULT rank={dist.get_rank()} init={after_init} mesh={made()} "
           f"sums={','.join(sums)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    {"init": case_init, "nonmember": case_nonmember, "gpu_sim": case_gpu_sim}[sys.argv[1]]()
