"""DeviceMesh cases that need a fresh process state, each its own MPI job.

Usage: mpiexec -n N python device_mesh_case.py init|nonmember|gpu_sim|gpu_sim_absent
Prints one ``RESULT ...`` line per rank.

init       DeviceMesh initializes the default group when nothing did (torch's rule).
nonmember  A mesh over half the world: ranks outside it get NON_GROUP_MEMBER, -1 and
           None without communicating, members communicate on its groups, and the
           whole world then meets in a barrier (nothing hangs). Timeouts are short.
gpu_sim    On the simulated GPU (tests/gpu_sim), 2**k ranks: init_process_group with a
           device_id makes the default group's NCCL communicator at once; a 2 x ... x 2
           mesh then all-reduces rank + 1 on each dimension (``sums=``). Reports the
           NCCL communicators made by bootstrap and by split after init (``init=``) and
           after the mesh (``mesh=``); then every rank calls new_group for the lower
           half, which all-reduces rank + 1 on it (``half=``), and reports the counts
           after that collective (``group=``); then a 2 x n/2 mesh of the ranks in
           reverse order all-reduces rank + 1 on its dimension 1 (``row=``; counts
           after: ``backwards=``) and broadcasts it from the group's rank 0 (``first=``).
gpu_sim_absent  As gpu_sim, 3 ranks: rank 2 never calls new_group([0, 1]) (1.5 s), so
           the split it would join never happens; ranks 0 and 1 report the error
           (``error=``) and the counts (``made=``), then all meet in a CPU barrier.
           Then only ranks 0 and 1 call new_group([0, 1], use_local_synchronization=True)
           and all-reduce rank + 1 on it (``sum=``; counts after: ``local=``).
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


def simulated_nccl():
    """``(cupy, made)``: the simulated CuPy, and a function giving the NCCL communicators
    made so far as ``"bootstraps,splits"``; the default group is bound to device 0."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "gpu_sim"))
    import cupy
    from cupy.cuda import nccl

    def made() -> str:
        return f"{nccl.made['bootstrap']},{nccl.made['split']}"
    dist.init_process_group(backend="cpu:mpi,cuda:nccl", device_id=0, timeout=30)
    return cupy, made


def case_gpu_sim() -> None:
    cupy, made = simulated_nccl()
    after_init = made()
    dims = dist.get_world_size().bit_length() - 1
    names = tuple(f"d{i}" for i in range(dims))
    mesh = dist.init_device_mesh("cuda", (2,) * dims, mesh_dim_names=names)
    sums = []
    for name in names:
        x = cupy.asarray(np.full(2, dist.get_rank() + 1.0, np.float32))
        dist.all_reduce(x, group=mesh.get_group(name))
        sums.append(f"{float(x[0]):g}")
    after_mesh = made()
    rank, half = dist.get_rank(), list(range(dist.get_world_size() // 2))
    group = dist.new_group(half)
    total = "-"
    if rank in half:
        x = cupy.asarray(np.full(2, rank + 1.0, np.float32))
        dist.all_reduce(x, group=group)
        total = f"{float(x[0]):g}"
    after_group = made()
    # the whole world in reverse order: its Cartesian group splits from the default one
    n = dist.get_world_size()
    backwards = DeviceMesh("cuda", np.arange(n)[::-1].reshape(2, n // 2))
    row = backwards.get_group(1)
    y = cupy.asarray(np.full(2, rank + 1.0, np.float32))
    dist.all_reduce(y, group=row)
    z = cupy.asarray(np.full(2, rank + 1.0, np.float32))  # the NCCL ranks keep the mesh's
    dist.broadcast(z, src=dist.get_global_rank(row, 0), group=row)
    report(f"RESULT rank={rank} init={after_init} mesh={after_mesh} "
           f"sums={','.join(sums)} group={after_group} half={total} "
           f"backwards={made()} row={float(y[0]):g} first={float(z[0]):g}")
    dist.destroy_process_group()


def case_gpu_sim_absent() -> None:
    cupy, made = simulated_nccl()
    rank, error = dist.get_rank(), "-"
    dist.barrier()  # the ranks leave together: only rank 2's absence is tested
    if rank < 2:
        try:
            dist.new_group([0, 1], timeout=1.5)
        except dist.DistError as exc:
            error = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    dist.barrier()
    after, total = made(), "-"
    if rank < 2:  # only members call it: no split, a bootstrap on first use
        group = dist.new_group([0, 1], use_local_synchronization=True)
        x = cupy.asarray(np.full(2, rank + 1.0, np.float32))
        dist.all_reduce(x, group=group)
        total = f"{float(x[0]):g}"
    dist.barrier()
    report(f"RESULT rank={rank} made={after} local={made()} sum={total} error={error}")
    dist.destroy_process_group()


if __name__ == "__main__":
    {"init": case_init, "nonmember": case_nonmember, "gpu_sim": case_gpu_sim,
     "gpu_sim_absent": case_gpu_sim_absent}[sys.argv[1]]()
