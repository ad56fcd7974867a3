"""hpccomm at the MPI thread level the job's HPCCOMM_MPI_THREAD_LEVEL names (case
``job``), the one the program gave mpi4py before importing hpccomm (case
``program_chose_serialized``), or with rank 0's host unreachable (case
``unreachable``); started by tests/test_thread_level.py. Each rank prints
``RESULT rank=R level=... store=... ok=1`` (or ``error=...``)."""
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import hpccomm as dist  # noqa: E402


def job() -> str:
    """Start-up over the default store, the store itself, collectives small and large,
    object collectives, a new group and teardown."""
    dist.init_process_group(timeout=5 if sys.argv[1:] == ["unreachable"] else 60)
    from mpi4py import MPI

    rank, size = dist.get_rank(), dist.get_world_size()
    store = dist.get_default_store()
    store.set(f"from/{rank}", str(rank * 10))
    seen = [int(store.get(f"from/{r}")) for r in range(size)]
    assert seen == [r * 10 for r in range(size)], seen
    assert store.add("count", 1) >= 1
    store.barrier("all here", size)
    for count in (1, 1 << 18):  # 8 bytes, 2 MiB: MPI's path and the shared-memory one
        x = np.full(count, rank + 1.0)
        dist.all_reduce(x)
        assert x[0] == x[-1] == size * (size + 1) / 2, x[0]
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank})
    assert [o["rank"] for o in objects] == list(range(size))
    pair = dist.new_group([0, 1])
    y = np.ones(4)
    if rank < 2:
        dist.all_reduce(y, group=pair)
        assert y[0] == 2
    dist.barrier()
    names = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
             MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    level, kind = names[MPI.Query_thread()], type(store).__name__
    dist.destroy_process_group()
    return f"level={level} store={kind}"


if __name__ == "__main__":
    if sys.argv[1:] == ["program_chose_serialized"]:  # the program sets mpi4py's level
        import mpi4py

        mpi4py.rc.thread_level = "serialized"
    elif sys.argv[1:] == ["unreachable"]:  # rank 0 names a host nobody can reach
        import socket

        socket.gethostname = lambda: "no-such-host.invalid"
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK", "?")
    try:
        print(f"RESULT rank={rank} {job()} ok=1", flush=True)
    except Exception as exc:  # one line for the test, the traceback for a person
        if sys.argv[1:] == ["unreachable"]:
            raise  # as in a user's program: the traceback, and the job ends
        traceback.print_exc()
        print(f"RESULT rank={rank} error={type(exc).__name__}: {exc}", flush=True)
