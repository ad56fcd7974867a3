"""Where the time of a small send/recv and of a small torch all_reduce goes at many ranks.

Run under a launcher, one rank per core, at 2 and at 16 ranks on one node::

    mpiexec -n 16 python benchmarks/studies/many_ranks_latency.py [--torch] [--profile]

Pairs ``rank ^ 1`` ping-pong at once (as ``hpccomm bench``'s send_recv does), and one job
times, interleaved on the same buffers (:func:`hpccomm.cli.bench.measure`):

* ``mpi4py``       blocking ``Send``/``Recv``
* ``mpi4py_wait``  ``Isend``/``Irecv`` and ``Wait``
* ``mpi4py_test``  ``Isend``/``Irecv`` and a Python loop of ``Test`` (what a deadline needs)
* ``hpccomm``      ``hpccomm.send``/``recv``
* ``hpccomm_async`` ``isend``/``irecv`` and ``wait()``

so a gap between ``mpi4py`` and ``hpccomm`` splits into MPI's own test-versus-wait cost and
hpccomm's. With ``--torch``: an 8 B all_reduce on hpccomm's NumPy path, on its ``Work``
path, and through ``torch.distributed`` on backend ``"hpccomm"``. With ``--profile``: rank
0 and rank 1 each print the cProfile of 3000 hpccomm round trips (and torch all_reduces).
Rank 0 also prints the threads each rank runs, and its CPU affinity.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

import numpy as np
from mpi4py import MPI

import hpccomm as dist
from hpccomm.cli.bench import measure


def ping_pong(comm, a, peer, even):
    """The variants' round trips with ``peer``."""
    def tested(req):
        while not req.Test():
            pass
    pairs = {
        "mpi4py": (lambda: comm.Send(a, peer), lambda: comm.Recv(a, peer)),
        "mpi4py_wait": (lambda: comm.Isend(a, peer).Wait(), lambda: comm.Irecv(a, peer).Wait()),
        "mpi4py_test": (lambda: tested(comm.Isend(a, peer)),
                        lambda: tested(comm.Irecv(a, peer))),
        "hpccomm": (lambda: dist.send(a, peer), lambda: dist.recv(a, peer)),
        "hpccomm_async": (lambda: dist.isend(a, peer).wait(),
                          lambda: dist.irecv(a, peer).wait()),
    }
    out = {}
    for name, (send, recv) in pairs.items():
        out[name] = (lambda s=send, r=recv: (s(), r())) if even else \
            (lambda s=send, r=recv: (r(), s()))
    return out


def profile(comm, label, fn, calls=3000):
    """cProfile ``calls`` calls of ``fn`` on ranks 0 and 1; print the top of each."""
    prof = cProfile.Profile()
    comm.Barrier()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    text = ""
    if comm.rank < 2:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
        text = f"--- profile of {label}, rank {comm.rank} ({calls} calls)\n" + \
            "\n".join(buf.getvalue().splitlines()[4:])
    for t in comm.gather(text, root=0) if comm.rank == 0 else [comm.gather(text, root=0)]:
        if t:
            print(t)


def threads():
    return len(os.listdir("/proc/self/task"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--torch", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--budget", type=float, default=0.4)
    args = parser.parse_args()
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    rank, n = comm.rank, comm.size
    td = None
    if args.torch:
        import torch
        import torch.distributed as td
        import hpccomm.torch  # noqa: F401  (registers the backend)
        td.init_process_group("hpccomm", init_method="mpi://")
    where = comm.gather((rank, os.sched_getaffinity(0).__len__(), threads()), root=0)
    if rank == 0:
        print(f"# {n} ranks, {MPI.Get_library_version().splitlines()[0].strip()}; "
              f"thread level {MPI.Query_thread()}; os.cpu_count() {os.cpu_count()}")
        print("# (rank, CPUs in affinity, threads):", where)
    peer = rank ^ 1
    rows = []
    if peer < n:
        for nbytes in (8, 1024, 16384):
            a = np.zeros(nbytes // 4, np.float32)
            fns = ping_pong(comm, a, peer, rank % 2 == 0)
            _, rounds, med, best = measure(comm, fns, nbytes, budget=args.budget)
            rows.append(("send_recv", nbytes, rounds, med))
        if args.profile:
            a = np.zeros(2, np.float32)
            profile(comm, "hpccomm send/recv 8 B", ping_pong(comm, a, peer, rank % 2 == 0)["hpccomm"])
    if td is not None:
        a = np.zeros(2, np.float32)
        t = torch.from_numpy(a)
        work_path = lambda: dist.all_reduce(a, async_op=True).wait()  # noqa: E731
        fns = {"mpi4py": lambda: comm.Allreduce(MPI.IN_PLACE, a),
               "hpccomm": lambda: dist.all_reduce(a),
               "hpccomm_async": work_path,
               "torch_hpccomm": lambda: td.all_reduce(t),
               "torch_hpccomm_async": lambda: td.all_reduce(t, async_op=True).wait()}
        _, rounds, med, best = measure(comm, fns, 8, budget=args.budget)
        rows.append(("all_reduce (torch)", 8, rounds, med))
        if args.profile:
            profile(comm, "torch all_reduce 8 B", lambda: td.all_reduce(t))
        counts = comm.gather((torch.get_num_threads(), threads()), root=0)
        if rank == 0:
            print("# torch intra-op threads and process threads per rank:", counts)
    if rank == 0:
        for op, nbytes, rounds, med in rows:
            cells = "  ".join(f"{v} {s * 1e6:7.2f}" for v, s in med.items())
            print(f"{op:20s} {nbytes:6d} B  ({rounds} rounds, µs, median of max over ranks)  {cells}")
    sys.stdout.flush()
    if td is not None:
        td.destroy_process_group()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
