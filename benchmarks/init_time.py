"""Start-up cost: ``init_process_group`` + the first ``barrier``, hpccomm vs torch gloo.

One launch measures one library at one size, in fresh processes (so MPI_Init / the TCP
rendezvous really happen)::

    mpiexec -n 4 python benchmarks/init_time.py hpccomm
    mpiexec -n 4 python benchmarks/init_time.py gloo --port 29517

Each rank times ``init_process_group`` and the first ``barrier`` after its imports are
done (imports are timed separately) and after every rank has finished importing (a
``ready.<rank>`` file per rank in ``--sync-dir``: otherwise the first rank's init would
include waiting for the slowest rank's ``import torch``, seconds on a loaded machine);
rank 0 prints one JSON line with the maxima over ranks. ``--driver`` runs the launches for several sizes and libraries (interleaved,
``--repeats`` times each) and writes ``docs/results/bench_init.csv`` with the medians.

hpccomm's init includes MPI_Init (hpccomm starts MPI in ``init_process_group``); gloo's
includes the TCPStore rendezvous (rank and size come from the launcher's PMI_RANK and
PMI_SIZE, the port from ``--port``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

from common import result, write_csv
from hpccomm.stores import free_port


class _NullStore:
    """Stand-in store, used only if this checkout's default store cannot be built."""


def _align(sync_dir, rank, size):
    """Wait until every rank finished its imports (files in ``sync_dir``), so that the
    timed part starts together on all ranks and excludes import-time skew."""
    if not sync_dir:
        return
    open(os.path.join(sync_dir, f"ready.{rank}"), "w").close()
    while len(os.listdir(sync_dir)) < size:
        time.sleep(0.0005)


def _launcher_rank():
    return int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])


def run_hpccomm(sync_dir=None):
    t0 = time.perf_counter()
    import numpy as np
    import hpccomm as dist
    _align(sync_dir, *_launcher_rank())
    t1 = time.perf_counter()
    from mpi4py import MPI  # noqa: F401  (MPI_Init, otherwise done inside init_process_group)
    t_mpi = time.perf_counter() - t1
    note = "default"
    try:
        dist.init_process_group()
    except (ImportError, AttributeError) as exc:
        note = f"stand-in store ({type(exc).__name__})"
        dist.init_process_group(store=_NullStore())
    t2 = time.perf_counter()
    dist.barrier()
    t3 = time.perf_counter()
    # import includes the alignment; init includes MPI_Init (t_mpi, reported apart too)
    times = np.array([t1 - t0, t2 - t1, t3 - t2, t3 - t1, t_mpi])
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    return rank, size, times.tolist(), note


def run_gloo(port, sync_dir=None):
    t0 = time.perf_counter()
    import torch
    import torch.distributed as td
    rank, size = _launcher_rank()
    _align(sync_dir, rank, size)
    t1 = time.perf_counter()
    td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                          world_size=size)
    t2 = time.perf_counter()
    td.barrier()
    t3 = time.perf_counter()
    times = torch.tensor([t1 - t0, t2 - t1, t3 - t2, t3 - t1, 0.0], dtype=torch.float64)
    td.all_reduce(times, op=td.ReduceOp.MAX)
    td.destroy_process_group()
    return rank, size, times.tolist(), "tcp rendezvous"


def driver(args):
    here = os.path.dirname(os.path.abspath(__file__))
    python = sys.executable
    mpiexec = args.mpiexec or os.path.join(os.path.dirname(python), "mpiexec")
    results = {}
    notes = {}
    for repeat in range(args.repeats):
        for n in [int(s) for s in args.sizes.split(",")]:
            for lib in ("hpccomm", "gloo"):
                sync_dir = tempfile.mkdtemp(prefix="hpccomm-init-")
                cmd = [mpiexec, "-n", str(n), python, os.path.join(here, "init_time.py"), lib,
                       "--port", str(free_port()), "--sync-dir", sync_dir]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                shutil.rmtree(sync_dir, ignore_errors=True)
                line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                if proc.returncode or not line:
                    print(f"init_time {lib} n={n} failed:\n{proc.stderr[-2000:]}", flush=True)
                    continue
                data = json.loads(line[-1])
                results.setdefault((n, lib), []).append(data["times"])
                notes[(n, lib)] = data["note"]
                print(f"n={n:2d} {lib:8s} import {data['times'][0] * 1e3:8.1f} ms  "
                      f"init {data['times'][1] * 1e3:8.1f} ms  first barrier "
                      f"{data['times'][2] * 1e3:7.1f} ms  init+barrier "
                      f"{data['times'][3] * 1e3:8.1f} ms  (MPI_Init {data['times'][4] * 1e3:.1f} ms)",
                      flush=True)
    rows = []
    for (n, lib), samples in sorted(results.items()):
        med = [statistics.median(s[i] for s in samples) for i in range(5)]
        rows.append(dict(ranks=n, library=lib, import_ms=med[0] * 1e3, init_ms=med[1] * 1e3,
                         first_barrier_ms=med[2] * 1e3, init_plus_barrier_ms=med[3] * 1e3,
                         min_init_plus_barrier_ms=min(s[3] for s in samples) * 1e3,
                         mpi_init_ms=med[4] * 1e3, launches=len(samples),
                         note=notes[(n, lib)]))
    out = args.out or result("bench_init.csv")
    write_csv(out, rows)
    print(f"wrote {os.path.normpath(out)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("library", nargs="?", choices=["hpccomm", "gloo"])
    parser.add_argument("--port", type=int, default=29517)
    parser.add_argument("--driver", action="store_true")
    parser.add_argument("--sync-dir", default=None,
                        help="directory used to start the timed part on all ranks together")
    parser.add_argument("--sizes", default="2,4,8,16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mpiexec", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.driver:
        driver(args)
        return
    if args.library == "hpccomm":
        rank, size, times, note = run_hpccomm(args.sync_dir)
    else:
        rank, size, times, note = run_gloo(args.port, args.sync_dir)
    if rank == 0:
        print(json.dumps(dict(library=args.library, ranks=size, times=times, note=note)),
              flush=True)


if __name__ == "__main__":
    main()
