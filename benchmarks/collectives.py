"""hpccomm vs raw mpi4py vs torch.distributed (gloo), measured interleaved in ONE run.

Run under an MPI launcher (2 and 4 ranks)::

    mpiexec -n 2 python benchmarks/collectives.py --out docs/results/bench_collectives_n2.csv

The measurement itself is :mod:`hpccomm.bench` (what ``hpccomm bench`` runs): every
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
import time
import warnings

import numpy as np
from mpi4py import MPI

import hpccomm as dist
from hpccomm.bench import DEFAULT_SIZES, OPS, VARIANTS, batch_time, init_gloo, run, size_text

from common import result, write_csv

warnings.filterwarnings("ignore", category=FutureWarning)

MiB = 1024 * 1024


def object_case(comm, torch, td, rounds=30):
    """Object collectives: hpccomm vs mpi4py lowercase (pickle) vs torch gloo."""
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="CSV path (default docs/results/bench_collectives_n<N>.csv)")
    parser.add_argument("--sizes", default=None, help="comma-separated byte sizes")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--budget", type=float, default=0.5,
                        help="seconds of measuring per (op, size), all variants together")
    parser.add_argument("--no-objects", action="store_true")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    n, rank = comm.size, comm.rank
    dist.init_process_group()
    import torch

    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    out = args.out or result(f"bench_collectives_n{n}.csv")
    t_start = time.time()
    if rank == 0:
        print(f"# {n} ranks; {MPI.Get_library_version().splitlines()[0].strip()}; "
              f"torch {torch.__version__}; hpccomm {dist.__version__}; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)

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
    rows = run(args.ops.split(","), sizes, td=td, budget=args.budget, report=show)
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
