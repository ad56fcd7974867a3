"""Call patterns per MPI library: the numbers behind hpccomm's gating table.

Run under the MPI library to measure, on 2 ranks (one per core)::

    mpiexec -n 2 python benchmarks/studies/mpi_patterns.py --ops all --sizes all \\
        --csv docs/results/bench_patterns_openmpi.csv

For each operation and size these variants run interleaved in ONE job, on the same
buffers, as :func:`hpccomm.cli.bench.measure` does (rounds in a fresh random order, maximum
over ranks, median over rounds):

* ``raw``       mpi4py's blocking call (``comm.Allreduce``): the floor
* ``raw_nb``    the nonblocking call polled with ``Test`` (what hpccomm waits on)
* ``hp_nb``     ``dist.all_reduce(a)`` on a group whose calls are never gated
* ``hp_gated``  the same on a group whose calls are all gated (signature all-gather
  under the deadline, then the blocking call; :mod:`hpccomm.backends.mpi.gate`)
* ``hpccomm``   the same on a group with this library's table: what users get

The printed ratios are ``raw / variant`` (1.0 = as fast as the blocking call). The
gating table in :mod:`hpccomm.backends.mpi.gate` gates an operation from the size where
``hp_gated`` beats ``hp_nb`` for good.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from typing import Any, Callable, Dict

import numpy as np
from mpi4py import MPI

import hpccomm as dist
from hpccomm.backends.mpi import communicator as mpi_backend
from hpccomm.backends.mpi import gate as mpi_gate
from hpccomm.cli.bench import DEFAULT_SIZES, measure, parse_size, size_text

OPS = ["all_reduce", "broadcast", "reduce", "all_gather_into_tensor",
       "reduce_scatter_tensor", "all_to_all_single"]
VARIANTS = ["raw", "raw_nb", "hp_nb", "hp_gated", "hpccomm"]


def _spin(request: Any) -> None:
    test, polls = request.Test, 0
    while not test():
        polls += 1
        if polls == 64:
            polls = 0
            os.sched_yield()


def _group(table: Dict[str, float]) -> Any:
    """A group of every rank whose backend uses gating ``table`` (call name -> bytes)."""
    saved = mpi_backend._GATED_FROM
    mpi_backend._GATED_FROM = table
    try:
        return dist.new_group()
    finally:
        mpi_backend._GATED_FROM = saved


def make_case(op: str, nbytes: int, comm: Any, groups: Dict[str, Any]
              ) -> Dict[str, Callable[[], Any]]:
    n = comm.size
    count = max(1, nbytes // 4)
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
        count = -(-count // n) * n
    big, small = np.zeros(count, np.float32), np.zeros(max(1, count // n), np.float32)
    in_place = MPI.IN_PLACE
    if op == "all_reduce":
        raw = lambda: comm.Allreduce(in_place, big)  # noqa: E731
        raw_nb = lambda: _spin(comm.Iallreduce(in_place, big))  # noqa: E731
        hp = lambda g: dist.all_reduce(big, group=g)  # noqa: E731
    elif op == "broadcast":
        raw = lambda: comm.Bcast(big, 0)  # noqa: E731
        raw_nb = lambda: _spin(comm.Ibcast(big, 0))  # noqa: E731
        hp = lambda g: dist.broadcast(big, 0, group=g)  # noqa: E731
    elif op == "reduce":
        raw = lambda: comm.Reduce(in_place if comm.rank == 0 else big,  # noqa: E731
                                  big if comm.rank == 0 else None, root=0)
        raw_nb = lambda: _spin(comm.Ireduce(in_place if comm.rank == 0 else big,  # noqa: E731
                                            big if comm.rank == 0 else None, root=0))
        hp = lambda g: dist.reduce(big, 0, group=g)  # noqa: E731
    elif op == "all_gather_into_tensor":
        raw = lambda: comm.Allgather(small, big)  # noqa: E731
        raw_nb = lambda: _spin(comm.Iallgather(small, big))  # noqa: E731
        hp = lambda g: dist.all_gather_into_tensor(big, small, group=g)  # noqa: E731
    elif op == "reduce_scatter_tensor":
        raw = lambda: comm.Reduce_scatter_block(big, small)  # noqa: E731
        raw_nb = lambda: _spin(comm.Ireduce_scatter_block(big, small))  # noqa: E731
        hp = lambda g: dist.reduce_scatter_tensor(small, big, group=g)  # noqa: E731
    elif op == "all_to_all_single":
        other = np.zeros(count, np.float32)
        raw = lambda: comm.Alltoall(big, other)  # noqa: E731
        raw_nb = lambda: _spin(comm.Ialltoall(big, other))  # noqa: E731
        hp = lambda g: dist.all_to_all_single(other, big, group=g)  # noqa: E731
    else:
        raise ValueError(f"unknown operation {op!r}; choose from {', '.join(OPS)}")
    fns = {"raw": raw, "raw_nb": raw_nb}
    for variant in ("hp_nb", "hp_gated", "hpccomm"):
        fns[variant] = (lambda g: lambda: hp(g))(groups[variant])
    return fns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", default="all_reduce", help=f"comma-separated or 'all' "
                                                             f"({', '.join(OPS)})")
    parser.add_argument("--sizes", default="all", help="comma-separated bytes or 'all'")
    parser.add_argument("--budget", type=float, default=0.5, help="seconds per cell")
    parser.add_argument("--csv", help="write the rows to this CSV file (rank 0)")
    args = parser.parse_args()
    ops = OPS if args.ops == "all" else args.ops.split(",")
    sizes = DEFAULT_SIZES if args.sizes == "all" else [parse_size(s) for s in
                                                       args.sizes.split(",")]
    dist.init_process_group()
    comm = MPI.COMM_WORLD.Dup()
    never = {name: mpi_gate.NEVER for name in mpi_gate.CALLS.values()}
    groups = {"hp_nb": _group(never), "hp_gated": _group({k: 1 for k in never}),
              "hpccomm": dist.new_group()}
    vendor, version = MPI.get_vendor()
    library = f"{vendor} {'.'.join(map(str, version))}"
    load = os.getloadavg()[0]
    rows = []
    if comm.rank == 0:
        print(f"# {comm.size} ranks; {library}; load {load:.2f}; ratios are raw/variant")
        print(f"{'operation':22s} {'size':>8s} " + " ".join(f"{v:>9s}" for v in VARIANTS) +
              "   " + " ".join(f"{v:>8s}" for v in VARIANTS[1:]))
    for op in ops:
        for nbytes in sizes:
            fns = make_case(op, nbytes, comm, groups)
            _, rounds, median, _ = measure(comm, fns, nbytes, args.budget)
            row = {"library": library, "ranks": comm.size, "op": op, "bytes": nbytes,
                   "rounds": rounds, "load": round(load, 2)}
            row.update({f"{v}_us": round(median[v] * 1e6, 3) for v in VARIANTS})
            rows.append(row)
            if comm.rank == 0:
                times = " ".join(f"{median[v] * 1e6:9.2f}" for v in VARIANTS)
                ratios = " ".join(f"{median['raw'] / median[v]:8.3f}" for v in VARIANTS[1:])
                print(f"{op:22s} {size_text(nbytes):>8s} {times}   {ratios}", flush=True)
    if comm.rank == 0 and args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    for group in groups.values():
        dist.destroy_process_group(group)
    comm.Free()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
