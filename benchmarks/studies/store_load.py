"""Store load benchmark: N clients doing set/get/add against each store, and idle cost.

Compares hpccomm's TCPStore, torch's own TCPStore (its C++ libuv server) and hpccomm's
MPIStore on one machine in one run:

* **load**: N client processes (N = 1 and 8 by default) each cycle ``set`` (32-byte
  value) / ``get`` / ``add``. Throughput is all operations over the wall time from a
  common start to the last client's end; latencies are per operation. MPIStore runs
  under ``mpiexec -n N`` with every rank a client (rank 0's own requests never leave
  its process), plus a row with one client on rank 1 of a 2-rank job, whose every
  request crosses MPI to rank 0's server thread. Each configuration runs ``--reps``
  times, all configurations interleaved round by round; the table shows the median
  ops/s and the p50/p99 latency of all repetitions together, so a burst of load from
  other jobs moves one repetition, not the result.
* **idle**: after a burst of requests, the CPU time the store costs while nobody uses
  it: the TCPStore master process (server thread idle) and every rank of a 4-rank
  MPIStore job, over ``--idle-s`` seconds.

Prints markdown tables and writes them, with the machine's load average, to
``docs/results/store-load.md``::

    PYTHONPATH=. python benchmarks/studies/store_load.py            # everything (~2 min on 2 cores)
    PYTHONPATH=. python benchmarks/studies/store_load.py --quick    # a smoke run
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

CLIENTS = [1, 8]
PAYLOAD = b"x" * 32
OPS_TOTAL = 24000  # per repetition, shared by the clients
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ops_per_client(n: int, quick: bool) -> int:
    """Every configuration runs about the same number of operations in total."""
    total = OPS_TOTAL // 8 if quick else OPS_TOTAL
    return max(total // n, 30)


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


def measure(name: str, n: int, wall: float, lats: List[float]) -> Dict[str, object]:
    return {"store": name, "clients": n, "ops": len(lats), "ops_per_s": len(lats) / wall,
            "lats": lats, "load": os.getloadavg()[0]}


# -- TCP stores: a fresh coordinator process per run, clients from a forkserver ----------
def _tcp_client(kind: str, port: int, n_ops: int, idx: int, start, out) -> None:
    store = _tcp_store(kind, port, master=False)
    store.set(f"ready/{idx}", "1")
    start.wait()
    t0 = time.perf_counter()
    lat = run_ops(store, f"c{idx}", n_ops)
    out.put((t0, time.perf_counter(), lat))


def _tcp_store(kind: str, port: int, master: bool):
    if kind == "torch":
        import torch.distributed as tdist

        return tdist.TCPStore("127.0.0.1", port, is_master=master, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=120))
    from hpccomm.stores import TCPStore

    return TCPStore("127.0.0.1", port, is_master=master, timeout=120)


def _context(kind: str):
    """A forkserver that preloaded the store's module: every client starts from a clean
    process (forking one whose store threads run, or that loaded torch, is unsafe)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch.distributed" if kind == "torch" else "hpccomm.stores"])
    ctx.Process(target=time.sleep, args=(0,)).start()  # start the server before any thread
    return ctx


def tcp_name(kind: str) -> str:
    return "torch TCPStore (libuv)" if kind == "torch" else "hpccomm TCPStore"


def tcp_worker(kind: str, n: int, n_ops: int, idle_s: float, out_path: str) -> None:
    """Body of the coordinator process: a load run, or a burst then an idle window."""
    ctx = _context(kind)
    master = _tcp_store(kind, 0, master=True)
    if idle_s:
        result = _idle_tcp(ctx, kind, master, idle_s)
    else:
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
        result = [wall, [x for r in results for x in r[2]]]
    with open(out_path, "w") as f:
        json.dump(result, f)


def _run_worker(args: List[str]) -> Optional[object]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        cmd = [sys.executable, os.path.abspath(__file__), *args, "--out", out]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode != 0 or not os.path.exists(out):
            print(f"{' '.join(args)} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            return None
        with open(out) as f:
            return json.load(f)


def bench_tcp(kind: str, n: int, n_ops: int) -> Optional[Dict[str, object]]:
    got = _run_worker(["--tcp-worker", kind, "--n", str(n), "--ops", str(n_ops)])
    if got is None:
        return None
    wall, lats = got
    return measure(tcp_name(kind), n, wall, lats)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _idle_client(kind: str, port: int, out) -> None:
    store = _tcp_store(kind, port, master=False)
    run_ops(store, "idle", 3000)
    out.put("burst done")
    out.put(store.get("stop"))  # blocks in the store until the master says stop


def _idle_tcp(ctx, kind: str, master, seconds: float) -> float:
    """CPU % of the master process while a connected client waits and nobody talks."""
    out = ctx.Queue()
    proc = ctx.Process(target=_idle_client, args=(kind, master.port, out))
    proc.start()
    out.get(timeout=120)
    time.sleep(0.05)
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    time.sleep(seconds)
    pct = 100.0 * (_cpu_seconds() - cpu0) / (time.perf_counter() - t0)
    master.set("stop", "1")
    out.get(timeout=60)
    proc.join(30)
    return pct


def idle_tcp(kind: str, seconds: float) -> Optional[Dict[str, object]]:
    pct = _run_worker(["--tcp-worker", kind, "--tcp-idle", str(seconds)])
    if pct is None:
        return None
    return {"store": tcp_name(kind), "where": "master process (server thread)",
            "cpu_pct": pct, "load": os.getloadavg()[0]}


# -- MPIStore: one mpiexec run per configuration ----------------------------------------
def mpi_worker(n_ops: int, out_path: str, clients: str, idle_s: float) -> None:
    """Body of each rank under mpiexec: a load run, or a burst then an idle window."""
    from mpi4py import MPI

    from hpccomm.stores import MPIStore

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    store = MPIStore(timeout=120)
    active = clients == "all" or rank != 0
    comm.Barrier()
    if idle_s:
        run_ops(store, f"r{rank}", n_ops)
        comm.Barrier()
        time.sleep(0.05)
        cpu0, t0 = _cpu_seconds(), time.perf_counter()
        time.sleep(idle_s)
        pct = 100.0 * (_cpu_seconds() - cpu0) / (time.perf_counter() - t0)
        gathered = comm.gather(pct, root=0)
        store.close()
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(gathered, f)
        return
    t0 = time.perf_counter()
    lat = run_ops(store, f"r{rank}", n_ops) if active else []
    t1 = time.perf_counter()
    gathered = comm.gather((t0, t1, lat, active), root=0)
    store.close()
    if rank == 0:
        # perf_counter is per-host monotonic: fine for one node
        spans = [g for g in gathered if g[3]]
        wall = max(g[1] for g in spans) - min(g[0] for g in spans)
        with open(out_path, "w") as f:
            json.dump([wall, [x for g in spans for x in g[2]]], f)


def _mpiexec(ranks: int, args: List[str]) -> Optional[object]:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        cmd = [mpiexec, "-n", str(ranks), sys.executable, os.path.abspath(__file__),
               "--mpi-worker", "--out", out, *args]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode != 0 or not os.path.exists(out):
            print(f"MPIStore run at {ranks} ranks failed:\n{proc.stderr[-2000:]}",
                  file=sys.stderr)
            return None
        with open(out) as f:
            return json.load(f)


def mpi_name(remote: bool) -> str:
    return "hpccomm MPIStore, client on rank 1" if remote else "hpccomm MPIStore"


def bench_mpi(n: int, n_ops: int, remote: bool = False) -> Optional[Dict[str, object]]:
    """``remote``: a 2-rank job where only rank 1 is a client (every request crosses MPI)."""
    ranks, clients = (2, "remote") if remote else (n, "all")
    got = _mpiexec(ranks, ["--ops", str(n_ops), "--mpi-clients", clients])
    if got is None:
        return None
    wall, lats = got
    return measure(mpi_name(remote), n, wall, lats)


def idle_mpi(ranks: int, seconds: float) -> Optional[Dict[str, object]]:
    got = _mpiexec(ranks, ["--ops", "3000", "--mpi-idle", str(seconds)])
    if got is None:
        return None
    others = max(got[1:]) if len(got) > 1 else 0.0
    return {"store": "hpccomm MPIStore",
            "where": f"rank 0 (server thread) / busiest other rank, {ranks} ranks",
            "cpu_pct": got[0], "cpu_pct_others": others, "load": os.getloadavg()[0]}


# -- tables -------------------------------------------------------------------------------
def combine(runs: List[Dict[str, object]]) -> Dict[str, object]:
    """One row from repetitions: median ops/s, p50/p99 of all latencies together."""
    lats = sorted(x for r in runs for x in r["lats"])
    return {"store": runs[0]["store"], "clients": runs[0]["clients"],
            "ops": runs[0]["ops"], "reps": len(runs),
            "ops_per_s": statistics.median(r["ops_per_s"] for r in runs),
            "ops_per_s_min": min(r["ops_per_s"] for r in runs),
            "ops_per_s_max": max(r["ops_per_s"] for r in runs),
            "p50_us": lats[len(lats) // 2] * 1e6,
            "p99_us": lats[min(len(lats) - 1, int(len(lats) * 0.99))] * 1e6,
            "load": statistics.median(r["load"] for r in runs)}


def load_table(rows: List[Dict[str, object]]) -> str:
    lines = ["| store | clients | ops/rep | ops/s (median) | ops/s (min-max) | p50 (µs) | "
             "p99 (µs) | load avg |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['store']} | {r['clients']} | {r['ops']} | "
                     f"{r['ops_per_s']:,.0f} | {r['ops_per_s_min']:,.0f}-"
                     f"{r['ops_per_s_max']:,.0f} | {r['p50_us']:,.0f} | {r['p99_us']:,.0f} | "
                     f"{r['load']:.1f} |")
    return "\n".join(lines)


def idle_table(rows: List[Dict[str, object]], seconds: float) -> str:
    lines = [f"| store | measured | CPU while idle ({seconds:.0f} s) | load avg |",
             "|---|---|---:|---:|"]
    for r in rows:
        cpu = f"{r['cpu_pct']:.2f}%"
        if "cpu_pct_others" in r:
            cpu += f" / {r['cpu_pct_others']:.2f}%"
        lines.append(f"| {r['store']} | {r['where']} | {cpu} | {r['load']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few ops, one repetition")
    parser.add_argument("--clients", type=int, nargs="*", default=CLIENTS)
    parser.add_argument("--reps", type=int, default=5, help="repetitions per configuration")
    parser.add_argument("--idle-s", type=float, default=5.0, help="idle window (0: skip)")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/results/store-load.md")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ops", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tcp-worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--tcp-idle", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--mpi-clients", default="all", help=argparse.SUPPRESS)
    parser.add_argument("--mpi-idle", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mpi_worker:
        mpi_worker(args.ops, args.out, args.mpi_clients, args.mpi_idle)
        return
    if args.tcp_worker:
        tcp_worker(args.tcp_worker, args.n, args.ops, args.tcp_idle, args.out)
        return
    import importlib.util

    have_torch = importlib.util.find_spec("torch") is not None  # imported in workers only
    if not have_torch:
        print("torch is not installed: no torch TCPStore rows", file=sys.stderr)
    reps = 1 if args.quick else args.reps
    t_start = time.time()
    load_start = os.getloadavg()
    configs = []
    for n in args.clients:
        configs += [("tcp", "hpccomm", n)] + ([("tcp", "torch", n)] if have_torch else [])
        configs.append(("mpi", "all", n))
        if n == 1:
            configs.append(("mpi", "remote", n))
    runs: Dict[tuple, List[Dict[str, object]]] = {c: [] for c in configs}
    for rep in range(reps):
        for config in configs:
            family, kind, n = config
            n_ops = ops_per_client(n, args.quick)
            if family == "tcp":
                row = bench_tcp(kind, n, n_ops)
            else:
                row = bench_mpi(n, n_ops, remote=kind == "remote")
            if row is not None:
                runs[config].append(row)
                print(f"rep {rep + 1}/{reps}: {row['store']}, {n} clients: "
                      f"{row['ops_per_s']:,.0f} ops/s (load {row['load']:.1f})", flush=True)
    rows = [combine(r) for r in runs.values() if r]
    idle_rows = []
    if args.idle_s:
        seconds = 1.0 if args.quick else args.idle_s
        for kind in ["hpccomm"] + (["torch"] if have_torch else []):
            row = idle_tcp(kind, seconds)
            if row is not None:
                idle_rows.append(row)
        row = idle_mpi(4, seconds)
        if row is not None:
            idle_rows.append(row)
    load_text = load_table(rows)
    idle_text = idle_table(idle_rows, 1.0 if args.quick else args.idle_s) if idle_rows else ""
    print()
    print(load_text)
    if idle_text:
        print()
        print(idle_text)
    if not args.no_write:
        write_doc(load_text, idle_text, reps, load_start, time.time() - t_start)


def write_doc(load_text: str, idle_text: str, reps: int, load_start, seconds: float) -> None:
    when = datetime.date.today().isoformat()
    doc = f"""# Store load benchmark

Regenerate with (on a quiet machine; takes about two minutes on 2 cores):

    flock /tmp/hpccomm-bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/studies/store_load.py

This run: one host with {os.cpu_count()} CPU cores, Python {platform.python_version()}, {when},
{seconds:.0f} s. Load average at the start: {load_start[0]:.1f} / {load_start[1]:.1f} /
{load_start[2]:.1f} (1/5/15 min); the "load avg" column is the 1-minute load average
during each row. On a machine shared with other jobs the numbers move from run to run:
compare rows of one run only.

## Throughput and latency

Each client process cycles `set` (32-byte value) / `get` / `add`. Every configuration
ran {reps} times, interleaved with the others; ops/s is the median (and the range) over
the repetitions, p50/p99 are over all their operations. Clients and servers share the
same cores, so with 8 clients on {os.cpu_count()} cores the machine is oversubscribed and
the numbers measure scheduling as much as the stores. MPIStore rows run under
`mpiexec -n N` with every rank a client; "client on rank 1" is a 2-rank job where only
rank 1 makes requests, each one a message to rank 0's server thread and back.

{load_text}

## Cost while idle

CPU time used while the store is idle after a burst of 3,000 requests (a client stays
connected, or every rank keeps the store open), as a percentage of one core.

{idle_text}

## How the stores serve, and where the time goes

See [stores.md](../stores.md#how-the-servers-wait) for the design: the TCPStore server
blocks in `epoll` and, after requests, polls without blocking for a short window, and a
client polls for its reply before it blocks; clients on the server's host move to a
Unix socket; the MPIStore server polls MPI during bursts and sleeps between polls, with
growing gaps, when idle; rank 0's own MPIStore requests never leave its process.

torch's TCPStore server and client are C++; hpccomm's are Python, a few microseconds of
interpreter work per request on each side. A blocking request/reply costs two kernel
wake-ups, which take a couple of microseconds when an idle core answers and tens of
microseconds on a busy machine. hpccomm avoids both wake-ups during bursts by polling,
and gives the polling up as soon as it loses its core; so it is ahead where wake-ups are
slow and can trail by a few microseconds per request where an idle core wakes at once.
The idle table shows what the polling costs once the requests stop: nothing for TCPStore,
a few tenths of a percent of one core on MPIStore's rank 0.
"""
    path = os.path.join(ROOT, "docs", "results", "store-load.md")
    with open(path, "w") as f:
        f.write(doc)
    print(f"\nwritten to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
