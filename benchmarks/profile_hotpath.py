"""Where hpccomm's microseconds go: the all_reduce hot path, piece by piece.

Runs in ONE process (a world of one: ``python benchmarks/profile_hotpath.py``), where the
MPI call itself is nearly free, so what remains is the Python layer: each operation
against its raw nonblocking call + ``Test`` (what it wraps), and the all_reduce path
piece by piece. Every piece is timed
with the thread's CPU clock (``time.thread_time_ns``: immune to other processes taking the
core on this shared 2-core machine), best of 7 loops of 20,000 calls, minus nothing (the
cost of calling an empty lambda is listed as its own row). Also counts the Python-level
function calls per operation (cProfile) and lists the functions that cost the most.
Writes ``docs/results/bench_hotpath.csv`` and prints a table.
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time

import numpy as np
from mpi4py import MPI

import hpccomm as dist

from common import result, write_csv



class _NullStore:
    """Stand-in store, used only if this checkout's default store cannot be built."""


def cpu_ns(fn, n=20_000, loops=7):
    best = float("inf")
    for _ in range(loops):
        t0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time_ns() - t0) / n)
    return best


def main():
    try:
        dist.init_process_group()
    except (ImportError, AttributeError):
        dist.init_process_group(store=_NullStore())
    from hpccomm import _call
    from hpccomm.group import resolve
    from hpccomm.types import ReduceOp, RedOpType
    from hpccomm.work import Work, poll
    pg = sys.modules["hpccomm.group"].registry.world
    cpu = pg.cpu
    comm = MPI.COMM_WORLD.Dup()
    a, b = np.zeros(2, np.float32), np.zeros(2, np.float32)
    IN_PLACE, FLOAT, MPI_SUM = MPI.IN_PLACE, MPI.FLOAT, MPI.SUM
    SUM = RedOpType.SUM
    dist.all_reduce(a)  # validates (SUM, float32) once: later calls hit the cache

    def spin(req):
        while not req.Test():
            pass

    pieces = [
        ("empty lambda call (loop overhead, included in every row)", lambda: None),
        ("raw comm.Allreduce(IN_PLACE, a)", lambda: comm.Allreduce(IN_PLACE, a)),
        ("raw comm.Allreduce(IN_PLACE, [a, MPI.FLOAT])",
         lambda: comm.Allreduce(IN_PLACE, [a, FLOAT])),
        ("raw comm.Iallreduce(IN_PLACE, a).Wait()",
         lambda: comm.Iallreduce(IN_PLACE, a).Wait()),
        ("raw Iallreduce(IN_PLACE, [a, FLOAT]) + Test() spin",
         lambda: spin(comm.Iallreduce(IN_PLACE, [a, FLOAT]))),
        ("hpccomm all_reduce(a) (sync)", lambda: dist.all_reduce(a)),
        ("hpccomm all_reduce(a, async_op=True).wait()",
         lambda: dist.all_reduce(a, async_op=True).wait()),
        ("  group.resolve(None)", lambda: resolve(None, "all_reduce")),
        ("  _call.reduce_operand(pg, op, a, SUM) (array + op checks)",
         lambda: _call.reduce_operand(pg, "all_reduce", a, ReduceOp.SUM)),
        ("  backend all_reduce(a, SUM, None) -> (test, finish, keep); test()",
         lambda: cpu.all_reduce(a, SUM, None)[0]()),
        ("  _call.launch(...) sync: backend call + seq + test (+ poll)",
         lambda: _call.launch(pg, "all_reduce", cpu.all_reduce, (a, SUM, None), a, False,
                              result=(a,))),
        ("  _call.launch(...) async: + Work construction and stamps, then wait()",
         lambda: _call.launch(pg, "all_reduce", cpu.all_reduce, (a, SUM, None), a, True,
                              result=(a,)).wait()),
        ("    Work(test) construction", lambda: Work(_true)),
        ("    Work(test).wait() (construct + wait + complete)", lambda: Work(_true).wait()),
        ("    work.poll(test, limit) when test() is already true", lambda: poll(_true, 1.0)),
        ("    numpy: a.flags", lambda: a.flags),
        ("    pg.seq += 1", lambda: _bump(pg)),
        ("    time.monotonic()", time.monotonic),
        ("    os.sched_yield() (each deadline check when ranks share cores)", os.sched_yield),
    ]
    # every measured operation, sync, against its raw nonblocking call + Test (1 rank)
    ops = [
        ("broadcast", lambda: dist.broadcast(a, 0),
         lambda: spin(comm.Ibcast([a, FLOAT], 0))),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(b, a),
         lambda: spin(comm.Iallgather([a, FLOAT], [b, FLOAT]))),
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(b, a),
         lambda: spin(comm.Ireduce_scatter_block([a, FLOAT], [b, FLOAT], MPI_SUM))),
        ("all_to_all_single", lambda: dist.all_to_all_single(b, a),
         lambda: spin(comm.Ialltoall([a, FLOAT], [b, FLOAT]))),
        ("barrier", lambda: dist.barrier(), lambda: spin(comm.Ibarrier())),
    ]
    for name, hp, raw in ops:
        pieces += [(f"hpccomm {name} (sync)", hp), (f"raw nonblocking {name} + Test() spin", raw)]
    # a lean sketch of the same sync all_reduce (same checks, same MPI call, same deadline
    # spin, every helper inlined) to show the floor of a Python layer; NOT library code
    lean = _lean_all_reduce(pg, cpu.comm)
    pieces += [("LEAN SKETCH sync all_reduce (checks and poll inlined)", lambda: lean(a))]
    rows = []
    for name, fn in pieces:
        ns = cpu_ns(fn)
        rows.append(dict(piece=name, ns=round(ns)))
        print(f"{name:70s} {ns:8.0f} ns", flush=True)

    # Python-level calls per operation, and where the time goes (cProfile)
    n = 20_000
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        dist.all_reduce(a)
    prof.disable()
    stats = pstats.Stats(prof)
    calls = sum(v[1] for v in stats.stats.values()) / n
    rows.append(dict(piece="Python+C function calls per sync all_reduce (cProfile)",
                     ns=round(calls, 1)))
    print(f"function calls per sync all_reduce: {calls:.1f}")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    print(buf.getvalue())
    write_csv(result("bench_hotpath.csv"), rows, ["piece", "ns"])
    dist.destroy_process_group()


def _true():
    return True


def _bump(pg):
    pg.seq += 1


def _lean_all_reduce(pg, comm):
    """A minimal sync all_reduce with hpccomm's semantics for the common case (see main)."""
    from hpccomm.backends.mpi.communicator import reduction_plan as _plan
    from hpccomm.errors import DistTimeoutError
    from hpccomm.types import RedOpType
    ndarray = np.ndarray
    IN_PLACE = MPI.IN_PLACE
    monotonic = time.monotonic
    sched_yield = os.sched_yield
    SUM = RedOpType.SUM
    cache = {}
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        mpitype, mpiop, _ = _plan(dtype, SUM)
        cache[(SUM, dtype)] = (mpitype, mpiop)

    def all_reduce(tensor, op=SUM, group=None, async_op=False):
        if group is not None or async_op or type(tensor) is not ndarray:
            return dist.all_reduce(tensor, op, group, async_op)  # general path
        plan = cache.get((op, tensor.dtype))
        flags = tensor.flags
        if plan is None or not flags.c_contiguous or not flags.writeable:
            return dist.all_reduce(tensor, op, group, async_op)  # general path
        test = comm.Iallreduce(IN_PLACE, [tensor, plan[0]], plan[1]).Test
        pg.seq += 1
        if test():
            return None
        deadline = monotonic() + pg.timeout
        polls = 0
        while not test():
            polls += 1
            if polls == 64:
                polls = 0
                sched_yield()
                if monotonic() > deadline:
                    raise DistTimeoutError(f"all_reduce seq {pg.seq} timed out")
        return None
    return all_reduce


if __name__ == "__main__":
    main()
