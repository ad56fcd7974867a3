"""Where hpccomm's microseconds go: the all_reduce hot path, piece by piece.

Runs in ONE process (a world of one: ``python benchmarks/profile_hotpath.py``), where the
MPI call itself is nearly free, so what remains is the Python layer. Every piece is timed
with the thread's CPU clock (``time.thread_time_ns``: immune to other processes taking the
core on this shared 2-core machine), best of 7 loops of 20,000 calls, minus nothing (the
cost of calling an empty lambda is listed as its own row). Also counts the Python-level
function calls per operation (cProfile) and lists the functions that cost the most.
Writes ``docs/bench_hotpath.csv`` and prints a table.
"""
from __future__ import annotations

import cProfile
import csv
import io
import os
import pstats
import sys
import time

import numpy as np
from mpi4py import MPI

import hpccomm as dist

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.normpath(os.path.join(HERE, "..", "docs"))


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
    from hpccomm.types import ReduceOp, RedOpType, split_op
    from hpccomm.work import Work
    from hpccomm.backends import mpi as backend
    collectives = sys.modules["hpccomm.collectives"]
    pg = sys.modules["hpccomm.group"].registry.world
    cpu = pg.cpu
    comm = MPI.COMM_WORLD.Dup()
    a = np.zeros(2, np.float32)
    IN_PLACE, FLOAT = MPI.IN_PLACE, MPI.FLOAT
    SUM = RedOpType.SUM
    plans = backend._PLANS
    plans.get((a.dtype, SUM)) or backend._plan(a.dtype, SUM)

    def spin(req):
        while not req.Test():
            pass

    def launch_only():
        _call.launch(pg, "all_reduce", lambda *args: Work(), (), a, True)

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
        ("  collectives._group(None)", lambda: collectives._group(None, "all_reduce")),
        ("  _call.array(pg, op, a)", lambda: _call.array(pg, "all_reduce", a)),
        ("  _call.reduction(pg, op, SUM, dtype)",
         lambda: _call.reduction(pg, "all_reduce", ReduceOp.SUM, a.dtype)),
        ("    types.split_op(SUM)", lambda: split_op(SUM)),
        ("    hash(RedOpType.SUM) (Enum.__hash__ is Python code)", lambda: hash(SUM)),
        ("    RedOpType.SUM (class attribute load)", lambda: RedOpType.SUM),
        ("    (dtype, kind) in dict/set", lambda: (a.dtype, SUM) in plans),
        ("  backend MPICommunicator.all_reduce(a, SUM, None) + Work.wait()",
         lambda: cpu.all_reduce(a, SUM, None).wait()),
        ("    Work(test) construction", lambda: Work(bool)),
        ("    Work(lambda: True).wait() (construct + wait + _complete)",
         lambda: Work(_true).wait()),
        ("  _call.launch bookkeeping (with Work() construction)", launch_only),
        ("  time.monotonic()", time.monotonic),
    ]
    # a lean sketch of the same sync/async all_reduce (same checks, same MPI calls, same
    # deadline spin) to show what the Python layer can cost; NOT library code
    lean = _lean_all_reduce(pg, cpu.comm)
    pieces += [
        ("  numpy: a.flags (flags object)", lambda: a.flags),
        ("  numpy: a.flags.c_contiguous", lambda: a.flags.c_contiguous),
        ("  pg.seq += 1", lambda: _bump(pg)),
        ("LEAN SKETCH sync all_reduce (same checks, deadline spin)", lambda: lean(a)),
        ("LEAN SKETCH async all_reduce + wait", lambda: lean(a, async_op=True).wait()),
    ]
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
    with open(os.path.join(DOCS, "bench_hotpath.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["piece", "ns"])
        writer.writeheader()
        writer.writerows(rows)
    dist.destroy_process_group()


def _true():
    return True


def _bump(pg):
    pg.seq += 1


def _lean_all_reduce(pg, comm):
    """A minimal all_reduce with hpccomm's semantics for the common case (see main)."""
    import os
    from hpccomm.types import RedOpType
    from hpccomm.backends.mpi import _PLANS, _plan
    from hpccomm.errors import DistTimeoutError
    ndarray = np.ndarray
    IN_PLACE = MPI.IN_PLACE
    monotonic = time.monotonic
    sched_yield = os.sched_yield
    SUM = RedOpType.SUM
    cache = {}
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        mpitype, mpiop, _ = _plan(dtype, SUM)
        cache[(SUM, dtype)] = (mpitype, mpiop)

    class LeanWork:
        __slots__ = ("_test", "_done", "_info")

        def __init__(self, test, info):
            self._test, self._done, self._info = test, False, info

        def wait(self):
            if not self._done:
                _spin(self._test, self._info)
                self._done = True
            return True

    def _spin(test, info):
        if test():
            return
        deadline = monotonic() + info[0].timeout
        polls = 0
        while not test():
            polls += 1
            if polls == 64:
                polls = 0
                sched_yield()
                if monotonic() > deadline:
                    raise DistTimeoutError(f"all_reduce seq {info[2]} timed out")

    def all_reduce(tensor, op=SUM, group=None, async_op=False):
        if group is not None or type(tensor) is not ndarray:
            return dist.all_reduce(tensor, op, group, async_op)  # general path
        plan = cache.get((op, tensor.dtype))
        flags = tensor.flags
        if plan is None or not flags.c_contiguous or not flags.writeable:
            return dist.all_reduce(tensor, op, group, async_op)  # general path
        test = comm.Iallreduce(IN_PLACE, [tensor, plan[0]], plan[1]).Test
        pg.seq += 1
        info = (pg, "all_reduce", pg.seq, tensor)
        if async_op:
            return LeanWork(test, info)
        _spin(test, info)
        return None
    return all_reduce


if __name__ == "__main__":
    main()
