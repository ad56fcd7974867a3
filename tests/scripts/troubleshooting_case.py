"""The errors of docs/troubleshooting.md, made on purpose for tests/test_troubleshooting.py:
``python this.py CASE`` (under ``mpiexec -n 2`` for the cases that need two ranks).

Each case prints every error it provokes as ``ClassName: message`` (one write, so two
ranks' lines never interleave) or lets hpccomm print its own (a warning, an uncaught
exception, the store's report at exit); the test checks that the page shows what was
printed.
"""
import os
import sys
import time

import numpy as np


def tell(exc):
    os.write(1, f"{type(exc).__name__}: {exc}\n".encode())


def first_steps():
    """A world of one, no launcher: use before init, then a launcher's variables that
    MPI's world contradicts (torchrun's; another MPI's launcher)."""
    import hpccomm as dist

    try:
        dist.all_reduce(np.ones(1))
    except dist.DistValueError as exc:
        tell(exc)
    os.environ.update(WORLD_SIZE="4", RANK="0")  # as torchrun would set them
    try:
        dist.init_process_group()
    except dist.DistValueError as exc:
        tell(exc)
    del os.environ["WORLD_SIZE"], os.environ["RANK"]
    os.environ.update(PMI_RANK="1", PMI_SIZE="2")  # another MPI's mpiexec started this
    dist.init_process_group()
    dist.destroy_process_group()


def torch_without_import():
    """torch's own errors where ``import hpccomm.torch`` is missing (one process, no
    launcher: torch stops before it needs one), then the torch benchmark without
    matplotlib."""
    import torch.distributed as dist

    for args, options in ((("hpccomm",), {"init_method": "mpi://"}),
                          (("hpccomm",), {"init_method": "tcp://127.0.0.1:1", "rank": 0,
                                          "world_size": 1}),
                          (("mpi",), {}),
                          (("hpccomm",), {})):  # no init_method: torch's env://
        try:
            dist.init_process_group(*args, **options)
        except (RuntimeError, ValueError, AssertionError) as exc:
            tell(exc)
    import runpy

    sys.modules["matplotlib"] = None  # as where it is not installed
    sys.argv = ["benchmarks/torch_backend.py", "--render", "2", "--out", sys.argv[2]]
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    runpy.run_path(sys.path[0] + "/torch_backend.py", run_name="__main__")


def mistakes():
    """Two ranks: a collective rank 1 never joins, a receive it never sends to, calls
    that differ on the shared-memory path, the group used again after that, then an
    uncaught exception on rank 1."""
    import hpccomm as dist

    dist.init_process_group(timeout=30)
    rank = dist.get_rank()
    x = np.ones(4)
    for kind in ("collective", "receive"):
        group = dist.new_group([0, 1], timeout=1)
        if rank == 0:
            try:
                if kind == "collective":
                    dist.all_reduce(x, group=group)
                else:
                    dist.recv(x, src=1, group=group)
            except dist.DistTimeoutError as exc:
                tell(exc)
            dist.destroy_process_group(group)
        else:
            time.sleep(2.5)  # past rank 0's timeout and roll call
        dist.barrier()
    group = dist.new_group([0, 1], timeout=10)
    y = np.ones(131072 if rank == 0 else 196608)  # 1 MiB against 1.5 MiB
    for _ in range(2):
        try:
            dist.all_reduce(y, group=group)
        except dist.DistDesyncError as exc:
            tell(exc)
    dist.destroy_process_group(group)
    dist.barrier()
    if rank == 1:
        raise ValueError("boom on purpose in rank 1")
    dist.all_reduce(x)  # rank 0 waits here until the launcher ends the job


def store_never_closed():
    """Rank 0 destroys its group and exits; rank 1 goes on past twice the timeout before
    it closes the store (at its exit)."""
    import hpccomm as dist

    dist.init_process_group(timeout=1)
    if dist.get_rank() == 1:
        time.sleep(4)
    else:
        dist.destroy_process_group()


if __name__ == "__main__":
    {f.__name__: f for f in (first_steps, torch_without_import, mistakes,
                             store_never_closed)}[sys.argv[1]]()
