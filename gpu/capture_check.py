"""Capture hpccomm collectives in a CUDA graph, replay the graph, check the results.

The check a GPU machine must make of what ``tests/test_gpu_streams.py`` can only
simulate: that synchronous and ``async_op`` collectives issued while a CuPy stream
captures (all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor) become
part of the graph, and that each launch of the graph redoes them on the current
contents of the buffers. One rank per GPU::

    mpiexec -n N python gpu/capture_check.py [--replays 3] [--count 1024]

With ``--sim`` it runs on ``tests/gpu_sim`` (no GPU): the capture is made, and the
simulation says whether any call CUDA refuses during a capture was made; replays do
nothing there, so their results are not checked. Exit status 0 when every check held.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true")
    parser.add_argument("--replays", type=int, default=3)
    parser.add_argument("--count", type=int, default=1024)
    args = parser.parse_args()
    if args.sim:
        sys.path.insert(0, os.path.join(HERE, "..", "tests", "gpu_sim"))

    import cupy as cp
    import numpy as np

    import hpccomm as dist

    dist.init_process_group(backend="cpu:mpi,cuda:nccl")
    rank, size = dist.get_rank(), dist.get_world_size()
    simulated = getattr(cp, "SIMULATED", False)
    n = args.count
    x = cp.zeros(n, dtype=cp.float32)           # all_reduce, then gathered
    b = cp.zeros(n, dtype=cp.float32)           # broadcast from rank 0
    z = cp.zeros(n, dtype=cp.float32)           # async all_reduce, waited in the graph
    full = cp.zeros(n * size, dtype=cp.float32)
    part = cp.zeros(n, dtype=cp.float32)        # reduce_scatter_tensor of full

    def collectives():
        dist.all_reduce(x)
        dist.broadcast(b, src=0)
        dist.all_gather_into_tensor(full, x)
        dist.reduce_scatter_tensor(part, full)
        dist.all_reduce(z, async_op=True).wait()

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        collectives()  # outside the capture first: the NCCL communicator, plans, pools
        stream.synchronize()
        stream.begin_capture()
        try:
            collectives()
        finally:
            graph = stream.end_capture()
    problems = []
    if simulated:
        problems += list(cp.cuda.violations)
    else:
        total = size * (size + 1) / 2  # the sum of rank + 1 over the ranks
        for replay in range(args.replays):
            scale = replay + 1.0
            with stream:
                x[...] = (rank + 1) * scale
                b[...] = rank + 10 * scale
                z[...] = scale
                graph.launch(stream)
                stream.synchronize()
            expected = {"all_reduce": (x, total * scale),
                        "broadcast": (b, 10 * scale),
                        "all_gather_into_tensor": (full, total * scale),
                        "reduce_scatter_tensor": (part, size * total * scale),
                        "all_reduce async_op": (z, size * scale)}
            for name, (arr, value) in expected.items():
                got = cp.asnumpy(arr)
                if not np.allclose(got, value):
                    problems.append(f"replay {replay}: {name} gave {got[:4]}..., "
                                    f"expected {value}")
    dist.destroy_process_group()
    where = "simulation (no replays)" if simulated else f"{args.replays} replays"
    print(f"rank {rank}/{size}: graph capture check, {where}: "
          f"{'ok' if not problems else 'FAILED'}", flush=True)
    for problem in problems:
        print(f"rank {rank}: {problem}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
