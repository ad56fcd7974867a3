"""What torch's flight recorder costs an hpccomm group's small operation, paired in one job.

    mpiexec -n 1 python benchmarks/studies/torch_recorder_cost.py [--cpu] [--rounds R]
    mpiexec -n 2 python benchmarks/studies/torch_recorder_cost.py

Times a blocking 8 B ``dist.all_reduce`` through torch on ``"hpccomm"`` in batches, the
group's flight recorder on and off (its trace set and cleared between batches), in
rounds of a random order drawn afresh each round, and prints on rank 0 the minimum and
median batch of each and the median of the paired differences, in µs per call.
``--cpu`` times each batch in this thread's CPU time instead of wall time: at one rank,
where the call is all local work, that stays true on a machine whose other processes
take the cores (wall time then measures the scheduler).
"""
from __future__ import annotations

import argparse
import json
import random
import time

import torch
import torch.distributed as dist

import hpccomm.torch  # noqa: F401  (registers "hpccomm" and mpi://)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--cpu", action="store_true", help="thread CPU time, not wall time")
    args = parser.parse_args()
    dist.init_process_group("hpccomm", init_method="mpi://")
    torch.set_num_threads(1)
    clock = time.thread_time if args.cpu else time.perf_counter
    pg = dist.distributed_c10d._get_default_group()
    trace = pg._state.trace
    if trace is None:
        raise SystemExit("the flight recorder is off (TORCH_FR_BUFFER_SIZE=0): unset it")
    x = torch.zeros(1, dtype=torch.float64)

    def batch(n: int) -> float:
        dist.barrier()
        start = clock()
        for _ in range(n):
            dist.all_reduce(x)
        mine = torch.tensor([(clock() - start) / n * 1e6], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        return float(mine)

    found = {"on": [], "off": []}
    rng = random.Random(7)
    for state in found:  # warm both up
        pg._state.trace = trace if state == "on" else None
        batch(args.calls // 10)
    for _ in range(args.rounds):
        order = list(found)
        rng.shuffle(order)
        for state in order:
            pg._state.trace = trace if state == "on" else None
            found[state].append(batch(args.calls))
    pg._state.trace = trace
    if dist.get_rank() == 0:
        def median(values):
            return sorted(values)[len(values) // 2]
        report = {state: {"min": round(min(v), 3), "median": round(median(v), 3)}
                  for state, v in found.items()}
        report["on - off, paired median"] = round(
            median([a - b for a, b in zip(found["on"], found["off"])]), 3)
        report.update(torch=torch.__version__, ranks=dist.get_world_size(),
                      clock=clock.__name__)
        print(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
