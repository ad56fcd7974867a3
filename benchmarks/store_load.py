"""Store load benchmark: N clients doing set/get/add against each store.

Compares hpccomm's TCPStore, torch's own TCPStore (libuv server) and hpccomm's
MPIStore (run under ``mpiexec -n N``) on the same machine in the same run, for
N = 1, 8, 32, 64 client processes. Each client cycles set / get / add; throughput
is all operations over the wall time from a common start to the last client's end,
latencies are per operation. Prints a markdown table and writes it to
``docs/store-load.md``.

    PYTHONPATH=. python benchmarks/store_load.py            # everything (~4 min on 2 cores)
    PYTHONPATH=. python benchmarks/store_load.py --quick    # a smoke run
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

CLIENTS = [1, 8, 32, 64]
PAYLOAD = b"x" * 32


def ops_per_client(n: int, quick: bool) -> int:
    """Fewer ops per client as clients grow, so every row takes a few seconds."""
    base = {1: 3000, 8: 600, 32: 200, 64: 100}[n]
    return max(base // 10, 10) if quick else base


def run_ops(store, tag: str, n_ops: int) -> List[float]:
    """The client loop: set, get, add in turn; per-op latencies in seconds."""
    lat = []
    clock = time.perf_counter
    for i in range(n_ops):
        key = f"{tag}/{i % 16}"
        t0 = clock()
        kind = i % 3
        if kind == 0:
            store.set(key, PAYLOAD)
        elif kind == 1:
            store.get(f"{tag}/0")
        else:
            store.add("counter", 1)
        lat.append(clock() - t0)
    return lat


def summarize(name: str, n: int, wall: float, lats: List[float]) -> Dict[str, object]:
    lats = sorted(lats)
    return {"store": name, "clients": n, "ops": len(lats), "ops_per_s": len(lats) / wall,
            "p50_us": lats[len(lats) // 2] * 1e6,
            "p99_us": lats[min(len(lats) - 1, int(len(lats) * 0.99))] * 1e6}


# -- TCP stores: forked client processes ------------------------------------------------
def _tcp_client(kind: str, port: int, n_ops: int, idx: int, start, out) -> None:
    if kind == "torch":
        import torch.distributed as tdist

        store = tdist.TCPStore("127.0.0.1", port, is_master=False,
                               timeout=datetime.timedelta(seconds=120))
    else:
        from hpccomm.stores import TCPStore

        store = TCPStore("127.0.0.1", port, timeout=120)
    store.set(f"ready/{idx}", "1")
    start.wait()
    t0 = time.perf_counter()
    lat = run_ops(store, f"c{idx}", n_ops)
    out.put((t0, time.perf_counter(), lat))


def _context(kind: str):
    """Fork for hpccomm; for torch a forkserver that preloaded torch (forking a process
    whose torch store threads run deadlocks the children)."""
    if kind != "torch":
        return multiprocessing.get_context("fork")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch.distributed"])
    return ctx


def bench_tcp(kind: str, n: int, n_ops: int) -> Dict[str, object]:
    ctx = _context(kind)
    if kind == "torch":
        import torch.distributed as tdist

        master = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                timeout=datetime.timedelta(seconds=120))
    else:
        from hpccomm.stores import TCPStore

        master = TCPStore("127.0.0.1", 0, is_master=True, timeout=120)
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_tcp_client, args=(kind, master.port, n_ops, i, start, out))
             for i in range(n)]
    for p in procs:
        p.start()
    master.wait([f"ready/{i}" for i in range(n)])
    start.set()
    results = [out.get(timeout=300) for _ in range(n)]
    for p in procs:
        p.join(60)
    wall = max(r[1] for r in results) - min(r[0] for r in results)
    name = "torch TCPStore (libuv)" if kind == "torch" else "hpccomm TCPStore"
    return summarize(name, n, wall, [x for r in results for x in r[2]])


# -- MPIStore: one mpiexec run per N ------------------------------------------------------
def mpi_worker(n_ops: int, out_path: str) -> None:
    """Body of each rank under mpiexec."""
    from mpi4py import MPI

    from hpccomm.stores import MPIStore

    comm = MPI.COMM_WORLD
    store = MPIStore(timeout=120)
    comm.Barrier()
    t0 = time.perf_counter()
    lat = run_ops(store, f"r{comm.Get_rank()}", n_ops)
    t1 = time.perf_counter()
    gathered = comm.gather((t0, t1, lat), root=0)
    store.close()
    if comm.Get_rank() == 0:
        # perf_counter is per-host monotonic: fine for one node
        wall = max(g[1] for g in gathered) - min(g[0] for g in gathered)
        row = summarize("hpccomm MPIStore", comm.Get_size(), wall,
                        [x for g in gathered for x in g[2]])
        with open(out_path, "w") as f:
            json.dump(row, f)


def bench_mpi(n: int, n_ops: int) -> Optional[Dict[str, object]]:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        cmd = [mpiexec, "-n", str(n), sys.executable, os.path.abspath(__file__),
               "--mpi-worker", "--ops", str(n_ops), "--out", out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or not os.path.exists(out):
            print(f"MPIStore run at {n} ranks failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            return None
        with open(out) as f:
            return json.load(f)


def table(rows: List[Dict[str, object]]) -> str:
    lines = ["| store | clients | ops/client | ops/s | p50 latency (µs) | p99 latency (µs) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['store']} | {r['clients']} | {r['ops'] // r['clients']} | "
                     f"{r['ops_per_s']:,.0f} | {r['p50_us']:,.0f} | {r['p99_us']:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few ops per client only")
    parser.add_argument("--clients", type=int, nargs="*", default=CLIENTS)
    parser.add_argument("--no-write", action="store_true", help="do not write docs/store-load.md")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ops", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mpi_worker:
        mpi_worker(args.ops, args.out)
        return
    try:
        import torch.distributed  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    rows: List[Dict[str, object]] = []
    t_start = time.time()
    if have_torch:
        _context("torch").Process(target=time.sleep, args=(0,)).start()  # start it early
    for n in args.clients:
        n_ops = ops_per_client(n, args.quick)
        kinds = ["hpccomm", "torch"] if have_torch else ["hpccomm"]
        for kind in kinds:
            rows.append(bench_tcp(kind, n, n_ops))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
        row = bench_mpi(n, n_ops)
        if row is not None:
            rows.append(row)
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print()
    print(text)
    if not args.no_write:
        cpus = os.cpu_count()
        doc = (
            "# Store load benchmark\n\n"
            f"Output of `benchmarks/store_load.py` on {platform.node() and 'one host'} with "
            f"{cpus} CPU cores, Python {platform.python_version()}, "
            f"{datetime.date.today().isoformat()}; total run {time.time() - t_start:.0f} s.\n"
            "Each client process cycles `set` (32-byte value) / `get` / `add`; clients and "
            "servers share the same cores, so at 8+ clients the machine is oversubscribed "
            "and the numbers measure scheduling as much as the stores. MPIStore rows run "
            "under `mpiexec -n N` (rank 0 is both a client and the server thread).\n\n"
            + text + "\n")
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                            "store-load.md")
        with open(path, "w") as f:
            f.write(doc)
        print(f"\nwritten to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
