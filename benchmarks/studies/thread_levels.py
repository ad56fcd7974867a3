"""Raw mpi4py at each MPI thread level: the numbers that pick a library's default level.

MPICH uses its fast shared-memory algorithms for small messages only when MPI is not
initialized with MPI_THREAD_MULTIPLE (mpi4py's default). A process has one thread level,
so each level needs jobs of its own. Run once per MPI library, from the environment
whose mpi4py uses it (the driver itself never initializes MPI)::

    flock /tmp/hpccomm-bench.lock python benchmarks/studies/thread_levels.py mpich
    flock /tmp/hpccomm-bench.lock .venv-openmpi/bin/python \\
        benchmarks/studies/thread_levels.py openmpi     # + Open MPI's root/oversubscribe env
    python benchmarks/studies/thread_levels.py --summary   # the table of every CSV

Each job is ``python -m hpccomm.cli.bench --raw-only --thread-level LEVEL`` under
``--mpiexec`` (default: the one beside this Python), ``-n 2``: mpi4py's blocking
``Allreduce``, ``Bcast``, ``Allgather``, ``Reduce_scatter_block``, ``Alltoall`` and a
``Send``/``Recv`` ping-pong (half the round trip) on float32 buffers, sizes as
nccl-tests count them (:mod:`hpccomm.cli.bench`). ``--repeats`` rounds of one job per level
(single, funneled, serialized, multiple), in a random order drawn afresh each round;
every job uses the first job's batch lengths and measures ``--budget`` seconds per
(operation, size). Per level the median and the best over the rounds of all its jobs
(a sample: batch time / batch length, the maximum over ranks).

Writes ``docs/results/thread_levels_<LIB>.csv`` (through :mod:`common`): one row per
operation, size and level, with the level MPI provided, the median and best µs, the
median over the fastest level's, and each job's own median, in round order (a slow
spell of the machine can slow a whole job, which the pooled median alone hides).
``--summary`` prints, from every ``thread_levels_*.csv`` found, a table comparing
serialized with multiple across libraries (best rounds, and paired by round) and one
table per library.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import RESULTS, read_csv, result, write_csv  # noqa: E402

from hpccomm.cli import bench  # noqa: E402  (light: no MPI in this process)

LEVELS = list(bench.THREAD_LEVELS)  # single, funneled, serialized, multiple
SIZES = "8,1K,16K,64K,256K,1M"
CALLS = {"all_reduce": "Allreduce", "broadcast": "Bcast", "all_gather_into_tensor":
         "Allgather", "reduce_scatter_tensor": "Reduce_scatter_block",
         "all_to_all_single": "Alltoall", "send_recv": "Send/Recv"}


def measure(lib: str, args: argparse.Namespace) -> list:
    python = sys.executable
    mpiexec = args.mpiexec or os.path.join(os.path.dirname(python), "mpiexec")
    order = np.random.default_rng(seed=8)

    def words(level: str) -> list:
        return ["-m", "hpccomm.cli.bench", "--raw-only", "--thread-level", level, "--ops",
                args.ops, "--sizes", args.sizes, "--budget", f"{args.budget:g}"]

    def launch(target: list) -> list:
        return [mpiexec, "-n", str(args.n), python, *target]
    plan = [[LEVELS[i] for i in order.permutation(len(LEVELS))] for _ in range(args.repeats)]
    jobs = bench.run_jobs([(level, words(level)) for levels in plan for level in levels],
                          launch)
    by_level = defaultdict(list)
    for level, job in jobs:
        by_level[level].append(job)
    rows = []
    first = jobs[0][1]
    for cell in first["cells"]:
        key = bench.cell_key(cell["op"], cell["requested"])
        stats = {}
        for level in LEVELS:
            samples, loads, provided, per_job = [], [], set(), []
            for job in by_level[level]:
                same = next(c for c in job["cells"]
                            if bench.cell_key(c["op"], c["requested"]) == key)
                samples += same["samples"]["mpi4py"]
                per_job.append(float(np.median(same["samples"]["mpi4py"])))
                loads.append(same["loadavg"])
                provided.add(job["thread_level"])
            stats[level] = (float(np.median(samples)), float(np.min(samples)), len(samples),
                            "/".join(sorted(provided)), sum(loads) / len(loads), per_job)
        fastest = min(s[0] for s in stats.values())
        for level, (median, best, rounds, provided, load, per_job) in stats.items():
            rows.append(dict(
                library=lib, mpi=f"{first['vendor']} {first['version']}", ranks=first["ranks"],
                op=cell["op"], call=CALLS[cell["op"]], bytes=cell["bytes"], level=level,
                provided=provided, median_us=round(median * 1e6, 3),
                best_us=round(best * 1e6, 3), over_fastest=round(median / fastest, 3),
                # a slow spell can shift all of a job's rounds: these show it (round order)
                job_medians_us="/".join(f"{m * 1e6:.2f}" for m in per_job),
                rounds=rounds, jobs=len(by_level[level]), inner=cell["inner"]["mpi4py"],
                loadavg=round(load, 2)))
    return rows


def paired(a: dict, b: dict) -> float:
    """The median over rounds of level ``a``'s job median over level ``b``'s in the same
    round (rows of the CSV): a slow spell of the machine reaches both alike."""
    ratios = [float(x) / float(y) for x, y in zip(a["job_medians_us"].split("/"),
                                                  b["job_medians_us"].split("/"))]
    return float(np.median(ratios))


def across(paths: list) -> str:
    """One markdown table over every library: per call and size, the best round at
    serialized and at multiple (µs) and multiple over serialized (best rounds; paired
    medians in brackets)."""
    libs, cells = [], defaultdict(dict)
    for path in paths:
        rows = read_csv(path)
        if not rows:
            continue
        libs.append(rows[0]["library"])
        by = defaultdict(dict)
        for r in rows:
            by[(r["op"], int(r["bytes"]))][r["level"]] = r
        for key, levels in by.items():
            ser, mul = levels["serialized"], levels["multiple"]
            cells[key][libs[-1]] = (f"{float(ser['best_us']):.2f} / {float(mul['best_us']):.2f}"
                                    f" = **{float(mul['best_us']) / float(ser['best_us']):.2f}**"
                                    f" ({paired(mul, ser):.2f})")
    out = ["| call | size | " + " | ".join(libs) + " |", "|---|---|" + "---|" * len(libs)]
    for (op, nbytes), per_lib in cells.items():
        out.append(f"| {CALLS[op]} | {bench.size_text(nbytes)} | " +
                   " | ".join(per_lib.get(lib, "") for lib in libs) + " |")
    return "\n".join(out) + "\n"


def summary(paths: list) -> str:
    """A markdown table per library: median µs per level (best round), the fastest level
    by median, multiple's median over the fastest's, and multiple over serialized paired
    by round (:func:`paired`) and in best rounds."""
    out = []
    for path in paths:
        rows = read_csv(path)
        if not rows:
            continue
        cells = defaultdict(dict)
        for r in rows:
            cells[(r["op"], int(r["bytes"]))][r["level"]] = r
        some = rows[0]
        provided = {r["level"]: r["provided"] for r in rows}
        out.append(f"**{some['library']}** ({some['mpi']}, {some['ranks']} ranks; "
                   f"provided: " + ", ".join(f"{k}->{v}" for k, v in provided.items()) +
                   "): median µs (best round)\n")
        out.append("| call | size | " + " | ".join(LEVELS) +
                   " | fastest | multiple / fastest | multiple / serialized, paired | "
                   "multiple / serialized, best rounds |")
        out.append("|---|---|" + "---|" * (len(LEVELS) + 4))
        for (op, nbytes), levels in cells.items():
            med = {lv: float(levels[lv]["median_us"]) for lv in LEVELS}
            best = {lv: float(levels[lv]["best_us"]) for lv in LEVELS}
            fastest = min(med, key=med.get)
            out.append(f"| {CALLS[op]} | {bench.size_text(nbytes)} | " + " | ".join(
                f"{med[lv]:.2f} ({best[lv]:.2f})" for lv in LEVELS) +
                f" | {fastest} | {med['multiple'] / med[fastest]:.2f} | "
                f"{paired(levels['multiple'], levels['serialized']):.2f} | "
                f"{best['multiple'] / best['serialized']:.2f} |")
        out.append("")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("lib", nargs="?", help="the library's name in the CSV's name "
                                               "(mpich, openmpi, impi)")
    parser.add_argument("-n", type=int, default=2, help="ranks per job (default 2)")
    parser.add_argument("--mpiexec", default=None)
    parser.add_argument("--ops", default="all")
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--budget", type=float, default=0.1,
                        help="seconds per (operation, size) in each job (default 0.1)")
    parser.add_argument("--repeats", type=int, default=8,
                        help="rounds of one job per level (default 8)")
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args()
    if args.summary:
        paths = sorted(glob.glob(os.path.join(RESULTS, "thread_levels_*.csv")))
        print("Best round at serialized / at multiple (µs) = multiple over serialized "
              "(paired medians in brackets)\n")
        print(across(paths))
        print(summary(paths))
        return 0
    if not args.lib:
        parser.error("name the library (mpich, openmpi, impi) or give --summary")
    rows = measure(args.lib, args)
    path = result(f"thread_levels_{args.lib}.csv")
    write_csv(path, rows)
    print(summary([path]))
    print(f"wrote {os.path.normpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
