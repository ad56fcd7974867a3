"""The physical ceiling of the shared-memory collectives on this machine.

Run under a launcher, once per rank count (``benchmarks/run_all.sh`` runs 2 and 4)::

    mpiexec -n 2 python benchmarks/membw.py

For each shared-memory operation and size, every rank at once runs the memory traffic
that a zero-copy algorithm cannot avoid (:func:`hpccomm.cli.bench_cases.ceiling`: for all_reduce at
two ranks, add the peer's half into mine, then copy the peer's other half in) with
NumPy on private arrays and no synchronization; the time is the slowest rank's, the
median of rounds. ``GB/s`` is the operation's size over that time, comparable with the
algorithm bandwidth of the collectives. The same ceiling is measured again inside
``benchmarks/collectives.py`` (the ``ceiling`` variant), interleaved with the
collectives, which is what the plot and the verdicts use; this script gives the curve
over sizes on its own, plus rank 0's single-process ``np.copyto`` rate for reference.
Appends its rows for this rank count to ``docs/results/bench_membw.csv`` (replacing older ones).
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np
from mpi4py import MPI

from hpccomm.cli.bench_cases import SHM_OPS, ceiling

from common import read_csv, result, write_csv

KiB, MiB = 1024, 1024 * 1024
SIZES = [256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
FIELDS = ["ranks", "what", "bytes", "us", "GBs"]


def timed(comm, fn, nbytes, rounds=15):
    """Median over rounds of the slowest rank's seconds per call."""
    inner = max(1, int(0.01 / max(nbytes / 5e9, 1e-7)))
    fn()
    samples = []
    for _ in range(rounds):
        comm.Barrier()
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        samples.append(comm.allreduce((time.perf_counter_ns() - t0) * 1e-9 / inner,
                                      op=MPI.MAX))
    return statistics.median(samples)


def main():
    comm = MPI.COMM_WORLD
    n, rank = comm.size, comm.rank
    rows = []
    for op in SHM_OPS:
        for nbytes in SIZES:
            count = -(-(nbytes // 4) // n) * n
            run, keep = ceiling(op, count, n, rank)
            seconds = timed(comm, run, nbytes)
            rows.append(dict(ranks=n, what=f"ceiling of {op}", bytes=count * 4,
                             us=round(seconds * 1e6, 2), GBs=round(count * 4 / seconds / 1e9, 3)))
            del keep
    if rank == 0:
        for nbytes in SIZES:
            src = np.ones(nbytes // 4, np.float32)
            dst = np.empty_like(src)
            seconds = timed(MPI.COMM_SELF, lambda: np.copyto(dst, src), nbytes)
            rows.append(dict(ranks=1, what="np.copyto, one process alone", bytes=nbytes,
                             us=round(seconds * 1e6, 2), GBs=round(nbytes / seconds / 1e9, 3)))
        path = result("bench_membw.csv")
        old = [r for r in (read_csv(path) if os.path.exists(path) else [])
               if set(r) == set(FIELDS) and int(r["ranks"]) not in (n, 1)]
        write_csv(path, old + rows, FIELDS)
        for r in rows:
            print(f"{r['ranks']} ranks  {r['what']:38s} {r['bytes'] // KiB:>8d} KiB "
                  f"{r['us']:>10.1f} us {r['GBs']:8.2f} GB/s")


if __name__ == "__main__":
    main()
