"""all_reduce on a group that spans nodes: hierarchical (shared memory within each node,
MPI between) against flat MPI, on the same buffers, interleaved round by round.

Run it as a job of several nodes, or simulate two nodes on one machine with MPICH:

    MPIR_CVAR_NUM_CLIQUES=2 MPIR_CVAR_CLIQUES_BY_BLOCK=1 \\
        mpiexec -n 4 python benchmarks/multinode.py [--out docs/results/bench_multinode]

Three variants per size: ``hpccomm`` (a group made with ``HPCCOMM_SHM_MIN_BYTES=1``:
the three steps of hpccomm/backends/shm/hier.py at every size), ``hpccomm flat`` (a
group made with ``HPCCOMM_SHM=0``: one nonblocking MPI all-reduce), and raw mpi4py
``Allreduce`` in place on a duplicate of ``COMM_WORLD`` at mpi4py's default thread
level. Each round times every
variant once per size, in a rotating order; every result is checked against the exact
sum. Rank 0 prints a table (best and median milliseconds, and hpccomm's speed relative
to raw mpi4py) and, with ``--out PREFIX``, writes PREFIX.csv and PREFIX.md.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

from common import median_and_best, write_csv

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = [256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def label(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", help="write PREFIX.csv and PREFIX.md (rank 0)")
    args = parser.parse_args()
    import hpccomm as dist
    from mpi4py import MPI

    from hpccomm.backends.mpi import placement

    dist.init_process_group(timeout=300)
    rank, size = dist.get_rank(), dist.get_world_size()
    where = placement.world
    os.environ["HPCCOMM_SHM_MIN_BYTES"] = "1"  # the three steps at every size measured
    hier = dist.new_group(list(range(size)))
    os.environ["HPCCOMM_SHM"] = "0"
    flat = dist.new_group(list(range(size)))
    for name in ("HPCCOMM_SHM", "HPCCOMM_SHM_MIN_BYTES"):
        del os.environ[name]
    raw = MPI.COMM_WORLD.Dup()
    kind = type(hier.cpu).__name__
    from hpccomm.backends.shm.communicator import NEVER

    threshold = getattr(dist.group.WORLD.cpu, "min_hier", NEVER)
    default = ("the flat MPI path" if threshold >= NEVER else
               f"the three steps from {threshold} bytes")
    variants = {
        "hpccomm": lambda x: dist.all_reduce(x, group=hier),
        "hpccomm flat": lambda x: dist.all_reduce(x, group=flat),
        "mpi4py": lambda x: raw.Allreduce(MPI.IN_PLACE, x),
    }
    times = {(name, n): [] for name in variants for n in SIZES}
    buffers = {n: np.empty(n // 8) for n in SIZES}
    expected = float(sum(range(1, size + 1)))
    names = list(variants)
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for n in SIZES:
            x = buffers[n]
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                x[:] = rank + 1
                raw.Barrier()
                start = time.perf_counter()
                variants[name](x)
                elapsed = time.perf_counter() - start
                if not (x == expected).all():
                    raise SystemExit(f"{name} at {label(n)} gave a wrong sum on rank {rank}")
                if round_:
                    times[name, n].append(elapsed)
    # the slowest rank's time is the operation's
    for key, values in times.items():
        times[key] = list(np.max(raw.allgather(values), axis=0))
    if rank == 0:
        report(times, size, where, kind, default, args.out)
    raw.Free()
    dist.destroy_process_group()


def report(times, size, where, kind, default, out):
    header = ("| size | hierarchical best / median ms | hpccomm flat MPI best / median ms | "
              "raw mpi4py best / median ms | hierarchical vs raw mpi4py (median) | "
              "hierarchical vs hpccomm flat (median) |")
    rows = [f"{size} ranks, {where.nodes} nodes of {where.local_size} ranks "
            f"({where.describe()}); the measured group is a {kind}; the default group takes "
            f"{default}.", "", header, "|---|---|---|---|---|---|"]
    table = []
    for n in SIZES:
        cells = []
        for name in ("hpccomm", "hpccomm flat", "mpi4py"):
            median, best = (seconds * 1e3 for seconds in median_and_best(times[name, n]))
            cells.append(f"{best:.2f} / {median:.2f}")
            table.append({"bytes": n, "variant": name, "best_ms": round(best, 4),
                          "median_ms": round(median, 4)})
        mine = statistics.median(times["hpccomm", n])
        ratio = statistics.median(times["mpi4py", n]) / mine
        flat_ratio = statistics.median(times["hpccomm flat", n]) / mine
        rows.append(f"| {label(n)} | {' | '.join(cells)} | {ratio:.2f}x | {flat_ratio:.2f}x |")
    text = "\n".join(rows)
    print(text, flush=True)
    if out:
        with open(out + ".md", "w") as handle:
            handle.write(text + "\n")
        write_csv(out + ".csv", table)


if __name__ == "__main__":
    main()
