"""hpccomm vs raw mpi4py vs torch.distributed (gloo), measured interleaved in ONE run.

Run under an MPI launcher (2 and 4 ranks)::

    mpiexec -n 2 python benchmarks/collectives.py --out docs/bench_collectives_n2.csv

Every process initializes both hpccomm (MPI) and torch.distributed with the gloo backend
(tcp rendezvous on 127.0.0.1, port chosen by rank 0 and broadcast over MPI). For each
operation and size, the variants run in rounds: in each round every variant runs one
batch of ``inner`` back-to-back operations, in a rotating order, after an MPI barrier.
One sample is the batch time / ``inner``, taken as the maximum over ranks (an operation
is finished when the slowest rank has it). Reported: the median sample (``*_us``), and the
best sample (``*_min_us``: the least disturbed by other processes on a shared machine).

Variants (all on the same NumPy buffer; torch tensors are ``torch.from_numpy`` views):

* ``hpccomm``       ``dist.all_reduce(a)`` (sync, group timeout on: the default 30 min)
* ``hpccomm_async`` ``dist.all_reduce(a, async_op=True).wait()``
* ``mpi4py``        uppercase blocking API, e.g. ``comm.Allreduce(MPI.IN_PLACE, a)`` (floor)
* ``mpi4py_nb``     uppercase nonblocking + ``Wait``, e.g. ``comm.Iallreduce(...).Wait()``
* ``gloo``          ``torch.distributed.all_reduce(t)`` on the gloo backend

Sizes follow nccl-tests: all_gather's size is the whole output, reduce_scatter's the whole
input, all_to_all's the whole per-rank buffer; element counts are rounded up to a multiple
of the group size (so at 4 ranks, 8 B becomes 16 B for those three). ``algbw = size /
time``; ``busbw = algbw * factor`` with factor 2(n-1)/n for all_reduce, (n-1)/n for
all_gather, reduce_scatter and all_to_all, 1 for broadcast and send/recv. send/recv is a
ping-pong between rank pairs (0,1), (2,3)...; its time is half the round trip.

Also measured here (same processes): object collectives (``all_gather_object``,
``broadcast_object_list``) vs mpi4py's lowercase pickle path (``comm.allgather``,
``comm.bcast``) and torch gloo's object collectives; and the NumPy copy bandwidth of all
ranks copying at once (the memory ceiling for large all_reduce).
"""
from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import socket
import statistics
import sys
import time
import warnings

import numpy as np
from mpi4py import MPI

import hpccomm as dist

warnings.filterwarnings("ignore", category=FutureWarning)

KiB, MiB = 1024, 1024 * 1024
DEFAULT_SIZES = [8, 64, 512, 4 * KiB, 32 * KiB, 256 * KiB, 2 * MiB, 16 * MiB, 64 * MiB]
OPS = ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
       "all_to_all_single", "send_recv"]
VARIANTS = ["hpccomm", "hpccomm_async", "mpi4py", "mpi4py_nb", "gloo"]
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "all_to_all_single": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
}


class _NullStore:
    """Stand-in store, used only if this checkout's default store cannot be built."""


def init_hpccomm() -> str:
    """``dist.init_process_group()``; falls back to a stand-in store if the default fails."""
    try:
        dist.init_process_group()
        return "default"
    except (ImportError, AttributeError) as exc:
        dist.init_process_group(store=_NullStore())
        return f"stand-in store ({type(exc).__name__}: {exc})"


def init_gloo(comm):
    import torch
    import torch.distributed as td

    torch.set_num_threads(1)
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                          rank=comm.rank, world_size=comm.size)
    return torch, td


# -- the operations ------------------------------------------------------------------------
def make_case(op, nbytes, comm, torch, td):
    """Buffers and one closure per variant doing ONE operation of ``op`` on ``nbytes``."""
    n, rank = comm.size, comm.rank
    IN_PLACE = MPI.IN_PLACE
    count = max(1, nbytes // 4)
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
        count = -(-count // n) * n
    actual = count * 4
    fns = {}
    if op == "all_reduce":
        a = np.zeros(count, np.float32)
        t = torch.from_numpy(a)
        fns["hpccomm"] = lambda: dist.all_reduce(a)
        fns["hpccomm_async"] = lambda: dist.all_reduce(a, async_op=True).wait()
        fns["mpi4py"] = lambda: comm.Allreduce(IN_PLACE, a)
        fns["mpi4py_nb"] = lambda: comm.Iallreduce(IN_PLACE, a).Wait()
        fns["gloo"] = lambda: td.all_reduce(t)
        keep = (a, t)
    elif op == "broadcast":
        a = np.zeros(count, np.float32)
        t = torch.from_numpy(a)
        fns["hpccomm"] = lambda: dist.broadcast(a, 0)
        fns["hpccomm_async"] = lambda: dist.broadcast(a, 0, async_op=True).wait()
        fns["mpi4py"] = lambda: comm.Bcast(a, 0)
        fns["mpi4py_nb"] = lambda: comm.Ibcast(a, 0).Wait()
        fns["gloo"] = lambda: td.broadcast(t, 0)
        keep = (a, t)
    elif op == "all_gather_into_tensor":
        out = np.zeros(count, np.float32)
        inp = np.zeros(count // n, np.float32)
        tout, tinp = torch.from_numpy(out), torch.from_numpy(inp)
        fns["hpccomm"] = lambda: dist.all_gather_into_tensor(out, inp)
        fns["hpccomm_async"] = lambda: dist.all_gather_into_tensor(out, inp, async_op=True).wait()
        fns["mpi4py"] = lambda: comm.Allgather(inp, out)
        fns["mpi4py_nb"] = lambda: comm.Iallgather(inp, out).Wait()
        fns["gloo"] = lambda: td.all_gather_into_tensor(tout, tinp)
        keep = (out, inp, tout, tinp)
    elif op == "reduce_scatter_tensor":
        inp = np.zeros(count, np.float32)
        out = np.zeros(count // n, np.float32)
        tout, tinp = torch.from_numpy(out), torch.from_numpy(inp)
        fns["hpccomm"] = lambda: dist.reduce_scatter_tensor(out, inp)
        fns["hpccomm_async"] = lambda: dist.reduce_scatter_tensor(out, inp, async_op=True).wait()
        fns["mpi4py"] = lambda: comm.Reduce_scatter_block(inp, out, MPI.SUM)
        fns["mpi4py_nb"] = lambda: comm.Ireduce_scatter_block(inp, out, MPI.SUM).Wait()
        fns["gloo"] = lambda: td.reduce_scatter_tensor(tout, tinp)
        keep = (out, inp, tout, tinp)
    elif op == "all_to_all_single":
        inp = np.zeros(count, np.float32)
        out = np.zeros(count, np.float32)
        tout, tinp = torch.from_numpy(out), torch.from_numpy(inp)
        fns["hpccomm"] = lambda: dist.all_to_all_single(out, inp)
        fns["hpccomm_async"] = lambda: dist.all_to_all_single(out, inp, async_op=True).wait()
        fns["mpi4py"] = lambda: comm.Alltoall(inp, out)
        fns["mpi4py_nb"] = lambda: comm.Ialltoall(inp, out).Wait()
        fns["gloo"] = lambda: td.all_to_all_single(tout, tinp)
        keep = (out, inp, tout, tinp)
    elif op == "send_recv":
        # ping-pong within pairs (0,1), (2,3), ...; an odd last rank idles
        a = np.zeros(count, np.float32)
        t = torch.from_numpy(a)
        peer = rank ^ 1
        if peer >= n:
            idle = lambda: None  # noqa: E731
            for v in VARIANTS:
                fns[v] = idle
        elif rank % 2 == 0:
            def hp():
                dist.send(a, peer); dist.recv(a, peer)

            def hpa():
                dist.isend(a, peer).wait(); dist.irecv(a, peer).wait()

            def raw():
                comm.Send(a, peer); comm.Recv(a, peer)

            def rawnb():
                comm.Isend(a, peer).Wait(); comm.Irecv(a, peer).Wait()

            def gl():
                td.send(t, peer); td.recv(t, peer)
            fns.update(hpccomm=hp, hpccomm_async=hpa, mpi4py=raw, mpi4py_nb=rawnb, gloo=gl)
        else:
            def hp():
                dist.recv(a, peer); dist.send(a, peer)

            def hpa():
                dist.irecv(a, peer).wait(); dist.isend(a, peer).wait()

            def raw():
                comm.Recv(a, peer); comm.Send(a, peer)

            def rawnb():
                comm.Irecv(a, peer).Wait(); comm.Isend(a, peer).Wait()

            def gl():
                td.recv(t, peer); td.send(t, peer)
            fns.update(hpccomm=hp, hpccomm_async=hpa, mpi4py=raw, mpi4py_nb=rawnb, gloo=gl)
        keep = (a, t)
    else:
        raise ValueError(op)
    return actual, fns, keep


def batch_time(comm, fn, inner):
    """Seconds per operation of ``inner`` back-to-back calls, after a barrier."""
    comm.Barrier()
    t0 = time.perf_counter_ns()
    for _ in range(inner):
        fn()
    return (time.perf_counter_ns() - t0) / inner * 1e-9


def measure(comm, op, nbytes, torch, td, budget, variants, min_rounds, max_rounds, batch):
    actual, fns, keep = make_case(op, nbytes, comm, torch, td)
    fns = {v: fns[v] for v in variants}
    # warm-up: a few operations of every variant (registration, first-touch, caches)
    for fn in fns.values():
        for _ in range(3):
            fn()
    # calibrate each variant: batches of >= `batch` seconds (amortizes barrier skew),
    # as many rounds as fit the budget
    # (the MPI variants share one batch length, set by the raw blocking call, so each
    # pays the same barrier skew; gloo gets its own)
    inner = {}
    for v in ("mpi4py", "gloo"):
        one = comm.allreduce(min(batch_time(comm, fns[v], 10) for _ in range(3)), op=MPI.MAX)
        inner[v] = max(1, min(5000, int(batch / max(one, 1e-9))))
        if nbytes <= MiB:  # a disturbed calibration must not leave barrier skew unamortized
            inner[v] = max(inner[v], 10 if v == "gloo" else 20)
    for v in fns:
        inner.setdefault(v, inner["mpi4py"])
    per_round = sum(comm.allreduce(batch_time(comm, fn, inner[v]), op=MPI.MAX) * inner[v]
                    for v, fn in fns.items())
    rounds = int(min(max_rounds, max(min_rounds, budget / max(per_round, 1e-9))))
    samples = {v: np.empty(rounds) for v in fns}
    names = list(fns)
    for r in range(rounds):
        k = r % len(names)
        for v in names[k:] + names[:k]:  # rotate the order every round
            samples[v][r] = batch_time(comm, fns[v], inner[v])
    result, best = {}, {}
    for v in names:
        worst = np.empty_like(samples[v])
        comm.Allreduce(samples[v], worst, op=MPI.MAX)
        result[v] = float(np.median(worst))
        best[v] = float(np.min(worst))
    del keep
    return actual, inner, rounds, result, best


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
            for r in range(rounds):
                k = r % len(names)
                for v in names[k:] + names[:k]:
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


def fmt_size(n):
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="CSV path (default docs/bench_collectives_n<N>.csv)")
    parser.add_argument("--sizes", default=None, help="comma-separated byte sizes")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--budget", type=float, default=0.5,
                        help="seconds of measuring per (op, size), all variants together")
    parser.add_argument("--batch", type=float, default=5e-4,
                        help="seconds per timed batch of back-to-back operations")
    parser.add_argument("--min-rounds", type=int, default=7)
    parser.add_argument("--max-rounds", type=int, default=100)
    parser.add_argument("--no-objects", action="store_true")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    n, rank = comm.size, comm.rank
    store_note = init_hpccomm()
    torch, td = init_gloo(comm)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    ops = args.ops.split(",")
    docs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs")
    out = args.out or os.path.join(docs, f"bench_collectives_n{n}.csv")
    t_start = time.time()
    rows = []
    if rank == 0:
        print(f"# {n} ranks; {MPI.Get_library_version().splitlines()[0].strip()}; "
              f"torch {torch.__version__}; hpccomm {dist.__version__}; store: {store_note}; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)
    for op in ops:
        for nbytes in sizes:
            gc.collect()
            actual, inner, rounds, med, best = measure(comm, op, nbytes, torch, td, args.budget,
                                                 VARIANTS, args.min_rounds, args.max_rounds,
                                                 args.batch)
            algbw = {v: actual / t / 1e9 for v, t in med.items()}
            bus = BUS_FACTOR[op](n)
            row = dict(op=op, ranks=n, bytes=actual, rounds=rounds,
                       loadavg=round(os.getloadavg()[0], 2),
                       inner="/".join(str(inner[v]) for v in VARIANTS))
            for v in VARIANTS:
                row[f"{v}_us"] = med[v] * 1e6
            for v in VARIANTS:
                row[f"{v}_min_us"] = best[v] * 1e6
            for v in VARIANTS:
                row[f"{v}_algbw_GBs"] = algbw[v]
                row[f"{v}_busbw_GBs"] = algbw[v] * bus
            row["hpccomm_over_mpi4py_bw"] = med["mpi4py"] / med["hpccomm"]
            row["hpccomm_async_over_mpi4py_bw"] = med["mpi4py"] / med["hpccomm_async"]
            row["gloo_over_hpccomm_time"] = med["gloo"] / med["hpccomm"]
            row["hpccomm_minus_mpi4py_us"] = (med["hpccomm"] - med["mpi4py"]) * 1e6
            row["hpccomm_async_minus_mpi4py_us"] = (med["hpccomm_async"] - med["mpi4py"]) * 1e6
            rows.append(row)
            if rank == 0:
                print(f"{op:24s} {fmt_size(actual):>8s} "
                      + " ".join(f"{v}={med[v] * 1e6:10.2f}us" for v in VARIANTS)
                      + f"  hp/mpi bw {row['hpccomm_over_mpi4py_bw']:.3f}"
                        f"  gloo/hp {row['gloo_over_hpccomm_time']:.1f}x"
                        f"  ({row['inner']} x {rounds})", flush=True)
    objects = [] if args.no_objects else object_case(comm, torch, td)
    membw = copy_bandwidth(comm)
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        meta = dict(ranks=n, mpi=MPI.Get_library_version().splitlines()[0].strip(),
                    torch=torch.__version__, hpccomm=dist.__version__, store=store_note,
                    copy_GBs_all_ranks=membw, seconds=time.time() - t_start,
                    loadavg=os.getloadavg(), date=time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime()))
        base = os.path.splitext(out)[0]
        with open(base + ".json", "w") as f:
            json.dump(meta, f, indent=1)
        if objects:
            with open(base.replace("collectives", "objects") + ".csv", "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(objects[0]))
                writer.writeheader()
                writer.writerows(objects)
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
