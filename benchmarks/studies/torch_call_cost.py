"""What one small operation through torch costs on backend "hpccomm", with and without
torch's profiler or a hook, in one job.

    mpiexec -n 2 python benchmarks/studies/torch_call_cost.py [--label L] [--json FILE]

Each rank makes torch's default group on ``"hpccomm"`` (``mpi://``), then times ``dist.all_reduce`` of one float64 (8 B), blocking and with
``async_op=True`` plus ``wait()``, ``dist.broadcast`` of 8 B, and the blocking
all_reduce again inside ``torch.profiler.profile()`` (hpccomm records one event per
operation there) and with a pre-hook registered (torch 2.14). (gloo is not measured
here: its worker threads keep running after each call and would slow what follows;
``benchmarks/torch_backend.py`` compares it in rounds of its own.) Each figure is the per-call
time of a batch after a barrier, the maximum over ranks, over rounds in a random order
drawn afresh each round; printed on rank 0 are the minimum and the median round, in µs.

To compare two checkouts of hpccomm, run this script under each (``PYTHONPATH`` set to
the other checkout) one after the other, several times alternated, on an idle machine:
a difference smaller than the spread of one checkout's runs is none.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
import torch.distributed as dist

import hpccomm.torch  # noqa: F401  (registers "hpccomm" and mpi://)


def batch(call, n):
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        call()
    mine = torch.tensor([(time.perf_counter() - start) / n * 1e6], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return float(mine)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="")
    parser.add_argument("--json", default=None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=4000)
    args = parser.parse_args()
    dist.init_process_group("hpccomm", init_method="mpi://")
    torch.set_num_threads(1)
    x = torch.zeros(1, dtype=torch.float64)
    pg = dist.distributed_c10d._get_default_group()

    def profiled():
        with torch.profiler.profile():
            for _ in range(200):
                dist.all_reduce(x)

    def hooked():
        pg.register_pre_hook(99, lambda args: None)
        try:
            for _ in range(200):
                dist.all_reduce(x)
        finally:
            pg.unregister_pre_hook(99)

    cases = {
        "all_reduce 8 B": (lambda: dist.all_reduce(x), args.calls),
        "all_reduce 8 B async+wait": (lambda: dist.all_reduce(x, async_op=True).wait(),
                                      args.calls),
        "broadcast 8 B": (lambda: dist.broadcast(x, src=0), args.calls),
        "all_reduce 8 B, 200 under torch.profiler (per call)": (profiled, 5),
    }
    if hasattr(pg, "register_pre_hook"):
        cases["all_reduce 8 B, a pre-hook registered (per call)"] = (hooked, 20)
    samples = {name: [] for name in cases}
    order = list(cases)
    for name in order:  # warm-up
        batch(cases[name][0], max(1, cases[name][1] // 10))
    rng = random.Random(1)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            call, n = cases[name]
            per = batch(call, n)
            if "(per call)" in name:
                per /= 200
            samples[name].append(per)
    if dist.get_rank() == 0:
        rows = {name: {"min": min(v), "median": statistics.median(v)}
                for name, v in samples.items()}
        print(f"torch {torch.__version__} {args.label}")
        for name, row in rows.items():
            print(f"  {name:55s} min {row['min']:8.2f}  median {row['median']:8.2f} us")
        if args.json:
            with open(args.json, "a") as handle:
                handle.write(json.dumps({"torch": torch.__version__, "label": args.label,
                                         "rows": rows}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
