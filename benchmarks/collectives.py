"""hpccomm vs raw mpi4py vs torch.distributed (gloo), measured interleaved in ONE run.

Run it as a driver (what ``benchmarks/run_all.sh`` does; 2 and 4 ranks)::

    python benchmarks/collectives.py --driver -n 2 --out docs/results/bench_collectives_n2.csv

The driver never initializes MPI: it alternates ``--repeats`` pairs of jobs under
``--mpiexec`` (default: the one beside this Python), one after the other, and writes
the merged results (:func:`hpccomm.cli.bench.alternate`, :func:`hpccomm.cli.bench.merge`). The
first job of a pair is this script under the launcher, with every variant below, at
the MPI thread level hpccomm starts MPI at (:mod:`hpccomm.mpi_level`: multiple unless
``HPCCOMM_MPI_THREAD_LEVEL`` says otherwise); the second is ``python -m hpccomm.cli.bench --raw-only
--thread-level other``: mpi4py's blocking call alone at the other of MPI_THREAD_MULTIPLE
and MPI_THREAD_SERIALIZED. Raw mpi4py at MULTIPLE is the ``mpi4py`` column, below it the
``mpi4py_serialized`` one (and ``hpccomm_over_mpi4py_serialized_bw``), whichever job
measured it. Each job measures for ``--budget / --repeats`` per (op, size); the medians
and best rounds are over the rounds of all jobs. Run under a launcher by hand, the
script is one job of the first kind alone (no ``mpi4py_serialized`` column; so is the
driver with ``--no-serialized``)::

    mpiexec -n 2 python benchmarks/collectives.py --out /tmp/bench_collectives_n2.csv

The measurement itself is :mod:`hpccomm.cli.bench` (what ``hpccomm bench`` runs): every
process initializes both hpccomm (MPI) and torch.distributed with the gloo backend, and
for each operation and size the five variants (hpccomm sync and async+wait, mpi4py's
blocking call, its nonblocking call + Wait, gloo) run in rounds, in a random order drawn
afresh each round, on the same buffers; a sample is the batch time / batch length, maximum over ranks; reported are the
median (``*_us``) and the best round (``*_min_us``). See that module for the method.

This script adds what the report needs: a CSV and a JSON of the run's metadata, object
collectives (``all_gather_object``, ``broadcast_object_list``) vs mpi4py's lowercase
pickle path and gloo's, and the NumPy copy bandwidth of all ranks copying at once (the
memory ceiling for large all_reduce).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import warnings

import numpy as np

from hpccomm.cli import bench
from hpccomm.cli.bench import DEFAULT_SIZES, OPS, VARIANTS, batch_time, init_gloo, run, size_text

from common import result, write_csv

HERE = os.path.abspath(__file__)

warnings.filterwarnings("ignore", category=FutureWarning)

MiB = 1024 * 1024


def object_case(comm, torch, td, rounds=30):
    """Object collectives: hpccomm vs mpi4py lowercase (pickle) vs torch gloo."""
    from mpi4py import MPI

    import hpccomm as dist
    rows = []
    objects = {
        "small dict": {"step": 1, "loss": 0.25, "rank": comm.rank},
        "list of 10k ints": list(range(10_000)),
        "1 MiB ndarray": np.zeros(MiB // 8, np.float64),
    }
    for name, obj in objects.items():
        size = len(__import__("pickle").dumps(obj, protocol=5))
        out = [None] * comm.size

        def hp_ag():
            dist.all_gather_object(out, obj)

        def raw_ag():
            comm.allgather(obj)

        def gl_ag():
            td.all_gather_object(out, obj)

        def hp_bc():
            lst = [obj]
            dist.broadcast_object_list(lst, 0)

        def raw_bc():
            comm.bcast(obj, root=0)

        def gl_bc():
            lst = [obj]
            td.broadcast_object_list(lst, 0)
        for op, fns in (("all_gather_object", dict(hpccomm=hp_ag, mpi4py=raw_ag, gloo=gl_ag)),
                        ("broadcast_object_list", dict(hpccomm=hp_bc, mpi4py=raw_bc,
                                                       gloo=gl_bc))):
            for fn in fns.values():
                fn(); fn()
            slowest = comm.allreduce(max(batch_time(comm, fn, 2) for fn in fns.values()),
                                     op=MPI.MAX)
            inner = max(1, min(100, int(500e-6 / max(slowest, 1e-9))))
            samples = {v: np.empty(rounds) for v in fns}
            names = list(fns)
            order = np.random.default_rng(seed=8)  # same random order on every rank
            for r in range(rounds):
                for index in order.permutation(len(names)):
                    v = names[index]
                    samples[v][r] = batch_time(comm, fns[v], inner)
            med = {}
            for v in names:
                worst = np.empty_like(samples[v])
                comm.Allreduce(samples[v], worst, op=MPI.MAX)
                med[v] = float(np.median(worst))
            rows.append(dict(op=op, object=name, pickled_bytes=size,
                             **{f"{v}_us": med[v] * 1e6 for v in names}))
    return rows


def copy_bandwidth(comm, nbytes=64 * MiB, rounds=15):
    """GB/s of ``np.copyto`` of ``nbytes`` per rank, all ranks copying at once."""
    from mpi4py import MPI

    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    samples = np.empty(rounds)
    for r in range(rounds):
        comm.Barrier()
        t0 = time.perf_counter_ns()
        np.copyto(dst, src)
        samples[r] = (time.perf_counter_ns() - t0) * 1e-9
    worst = np.empty_like(samples)
    comm.Allreduce(samples, worst, op=MPI.MAX)
    return nbytes / float(np.median(worst)) / 1e9


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="CSV path (default docs/results/bench_collectives_n<N>.csv)")
    parser.add_argument("--sizes", default=None, help="comma-separated byte sizes")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--budget", type=float, default=0.5,
                        help="seconds of measuring per (op, size), all variants together")
    parser.add_argument("--no-objects", action="store_true")
    parser.add_argument("--driver", action="store_true",
                        help="alternate the jobs at two thread levels (no MPI here)")
    parser.add_argument("-n", type=int, default=2, help="--driver: ranks per job")
    parser.add_argument("--mpiexec", default=None,
                        help="--driver: the launcher (default: the mpiexec beside this Python)")
    parser.add_argument("--no-serialized", action="store_true",
                        help="--driver: jobs of every variant only, no mpi4py job at "
                             "MPI_THREAD_SERIALIZED (where ranks outnumber cores MPICH's "
                             "blocking calls there spin for milliseconds per operation)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="--driver: pairs of jobs; each job measures BUDGET/REPEATS")
    parser.add_argument("--samples-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--inner-from", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def driver(args):
    """Alternate the two kinds of job, then write the merged CSV, the last full job's
    metadata JSON (with the driver's duration) and its object table."""
    python = sys.executable
    mpiexec = args.mpiexec or os.path.join(os.path.dirname(python), "mpiexec")
    repeats = max(1, args.repeats)
    n = args.n
    out = args.out or result(f"bench_collectives_n{n}.csv")
    sizes = args.sizes or ",".join(str(s) for s in DEFAULT_SIZES)
    common = ["--ops", args.ops, "--sizes", sizes, "--budget", f"{args.budget / repeats:g}"]
    t_start = time.time()
    scratch = tempfile.mkdtemp(prefix="hpccomm-jobs-")  # no "collectives": see base.replace
    job_out = os.path.join(scratch, "bench_collectives_job.csv")
    try:
        def first(r):  # the object collectives and the metadata: in the last pair only
            last = r == repeats - 1 and not args.no_objects
            return [HERE, *common, "--out", job_out, *([] if last else ["--no-objects"])]
        second = ["-m", "hpccomm.cli.bench", "--raw-only", "--thread-level", "other",
                  *common]
        launch = lambda words: [mpiexec, "-n", str(n), python, *words]  # noqa: E731
        if args.no_serialized:
            jobs = [job for _, job in bench.run_jobs(
                [("a", first(r)) for r in range(repeats)], launch)]
            serialized = []
        else:
            jobs, serialized = bench.alternate(first, second, repeats, launch)
        rows = bench.merge(jobs, serialized)
        for row in rows:
            row["hpccomm_minus_mpi4py_us"] = row["hpccomm_us"] - row["mpi4py_us"]
            row["hpccomm_async_minus_mpi4py_us"] = row["hpccomm_async_us"] - row["mpi4py_us"]
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        write_csv(out, rows)
        base = os.path.splitext(out)[0]
        with open(os.path.splitext(job_out)[0] + ".json") as f:
            meta = json.load(f)
        meta.update(seconds=time.time() - t_start, jobs=len(jobs), serialized_jobs=len(
            serialized), thread_level=jobs[0]["thread_level"],
                    serialized_thread_level=(serialized[0]["thread_level"] if serialized
                                             else None))
        with open(base + ".json", "w") as f:
            json.dump(meta, f, indent=1)
        objects = os.path.join(scratch, "bench_objects_job.csv")
        if os.path.exists(objects):
            shutil.copyfile(objects, base.replace("collectives", "objects") + ".csv")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ser = bench.SERIALIZED
    print(f"# merged: {len(jobs)} jobs at {jobs[0]['thread_level']}, {len(serialized)} of "
          f"mpi4py alone" + (f" at {serialized[0]['thread_level']}" if serialized else ""))
    shown = VARIANTS + ([ser] if serialized else [])
    for row in rows:
        print(f"{row['op']:24s} {size_text(row['bytes']):>8s} "
              + " ".join(f"{v}={row[f'{v}_us']:10.2f}us" for v in shown)
              + f"  hp/mpi bw {row['hpccomm_over_mpi4py_bw']:.3f}"
              + (f"  hp/ser bw {row[f'hpccomm_over_{ser}_bw']:.3f}" if serialized else ""),
              flush=True)
    print(f"wrote {os.path.normpath(out)}; the run took {meta['seconds']:.0f} s", flush=True)


def main():
    args = parse()
    if args.driver:
        driver(args)
        return
    from hpccomm import mpi_level

    mpi_level.prepare()  # MPI at the level hpccomm starts it at, as users get it
    from mpi4py import MPI

    import hpccomm as dist

    comm = MPI.COMM_WORLD.Dup()
    n, rank = comm.size, comm.rank
    dist.init_process_group()
    import torch

    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    out = args.out or result(f"bench_collectives_n{n}.csv")
    t_start = time.time()
    if rank == 0:
        print(f"# {n} ranks; {MPI.Get_library_version().splitlines()[0].strip()}; "
              f"torch {torch.__version__}; hpccomm {dist.__version__}; thread level "
              f"{bench.thread_level_name()}; load average {os.getloadavg()[0]:.2f}",
              flush=True)

    def show(row):
        gc.collect()
        row["loadavg"] = round(os.getloadavg()[0], 2)
        if rank == 0:
            print(f"{row['op']:24s} {size_text(row['bytes']):>8s} "
                  + " ".join(f"{v}={row[f'{v}_us']:10.2f}us" for v in VARIANTS)
                  + f"  hp/mpi bw {row['hpccomm_over_mpi4py_bw']:.3f}"
                    f"  gloo/hp {row['gloo_over_hpccomm_time']:.1f}x"
                    f"  ({row['inner']} x {row['rounds']})", flush=True)
    td = init_gloo(comm)
    preset = bench.batch_lengths(bench.read_job(args.inner_from)) if args.inner_from else None
    cells = []
    rows = run(args.ops.split(","), sizes, td=td, budget=args.budget, report=show,
               preset=preset, cells_out=cells)
    if args.samples_out:
        bench.write_job(args.samples_out, comm, cells, raw_only=False)
    for row in rows:
        row["hpccomm_minus_mpi4py_us"] = row["hpccomm_us"] - row["mpi4py_us"]
        row["hpccomm_async_minus_mpi4py_us"] = row["hpccomm_async_us"] - row["mpi4py_us"]
    objects = [] if args.no_objects else object_case(comm, torch, td)
    membw = copy_bandwidth(comm)
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        write_csv(out, rows)  # not every op has every variant: those cells stay empty
        meta = dict(ranks=n, mpi=MPI.Get_library_version().splitlines()[0].strip(),
                    torch=torch.__version__, hpccomm=dist.__version__, store="default",
                    copy_GBs_all_ranks=membw, seconds=time.time() - t_start,
                    loadavg=os.getloadavg(), date=time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime()))
        base = os.path.splitext(out)[0]
        with open(base + ".json", "w") as f:
            json.dump(meta, f, indent=1)
        if objects:
            write_csv(base.replace("collectives", "objects") + ".csv", objects)
            for o in objects:
                print(f"{o['op']:22s} {o['object']:18s} {o['pickled_bytes']:>8d} B  "
                      f"hpccomm {o['hpccomm_us']:9.1f} us  mpi4py {o['mpi4py_us']:9.1f} us  "
                      f"gloo {o['gloo_us']:9.1f} us")
        print(f"# NumPy copy bandwidth, {n} ranks copying 64 MiB at once: {membw:.2f} GB/s "
              f"per rank; run took {meta['seconds']:.0f} s", flush=True)
    td.barrier()
    td.destroy_process_group()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
