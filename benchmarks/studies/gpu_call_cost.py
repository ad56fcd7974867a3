"""Per-call CPU cost of synchronous GPU collectives: hpccomm against raw ``cupy.cuda.nccl``.

What a call costs the CPU, not bandwidth: each call is timed alone (``perf_counter_ns``
around it), in blocks of ``--block`` calls per variant, the variants interleaved block
by block and the stream synchronized (untimed) between blocks; the table gives the
median over all calls. Variants, on the same CuPy buffers:

* ``raw``: the ``cupy.cuda.nccl`` call(s) the operation needs, on the current stream,
  with a communicator made as hpccomm makes one (unique id broadcast over MPI);
* ``hpccomm``: the public call (``dist.all_reduce(buf)``...), synchronous unless the
  row says ``async``;
* ``torch``: ``torch.distributed`` on ProcessGroupNCCL, on a real GPU with a CUDA torch.

``share`` = hpccomm - raw: what hpccomm itself adds to the call.

On a GPU machine, one rank per GPU::

    mpiexec -n N python benchmarks/studies/gpu_call_cost.py [--bytes 4096] [--json out]

Without a GPU, ``--sim`` runs the same on ``tests/gpu_sim`` (host arrays, each NCCL call
done with MPI): the raw call is then the simulation's, not NCCL's, so only ``share`` is
meaningful (hpccomm's own Python work; CuPy's stream and event calls are the
simulation's Python stand-ins)::

    python benchmarks/studies/gpu_call_cost.py --sim

Measured with ``--sim`` at 1 rank on a 2-core CI machine (no GPU), 4 KiB float32,
``--calls 4000``, median µs per call, hpccomm before and after synchronous calls moved
to the caller's stream with pooled events (both on the same simulation, interleaved
runs; the run-to-run spread is about 0.2 µs):

| operation | raw (sim) | hpccomm before | share before | hpccomm after | share after |
|---|---|---|---|---|---|
| all_reduce | 6.91 | 12.45 | 5.45 | 9.48 | 2.57 |
| all_reduce async+wait | 6.88 | 12.11 | 5.15 | 12.41 | 5.53 |
| broadcast | 2.70 | 7.55 | 4.86 | 5.27 | 2.56 |
| reduce | 7.01 | 13.67 | 6.56 | 9.67 | 2.66 |
| all_gather_into_tensor | 4.62 | 11.99 | 7.29 | 7.58 | 2.97 |
| reduce_scatter_tensor | 7.13 | 16.25 | 9.09 | 10.28 | 3.15 |
| all_to_all_single | 1.21 | 8.96 | 7.75 | 4.39 | 3.18 |

The simulation's streams and events are cheap Python objects, unlike CUDA's: it
cannot show what the pool saves (an event created and destroyed per call, which the
async path used to pay), and it shows the async path's bookkeeping as a 0.4 µs loss.
On an H100 the synchronous all_reduce cost 18-26 µs against 0.6-1.2 µs raw before this
change (measured earlier); the real-GPU numbers after it are still to be measured
(``gpu/run_gpu_check.sh`` runs this script).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SIM_PATH = os.path.join(HERE, "..", "..", "tests", "gpu_sim")
sys.path.insert(0, os.path.join(HERE, ".."))
from common import interleaved  # noqa: E402


def measure(variants, sync, calls, block, barrier):
    """``{name: median ns per call}`` over ``calls`` timed calls of each variant."""
    samples = interleaved(variants, sync, block, max(1, calls // block), barrier)
    return {name: statistics.median(times) for name, times in samples.items()}


def raw_calls(cupy, nccl, raw, rank, size, nbytes, stream):
    """The raw NCCL call(s) of each operation, and the hpccomm call, on shared buffers."""
    import hpccomm as dist

    count = nbytes // 4
    f32, i8, total = nccl.NCCL_FLOAT32, nccl.NCCL_INT8, nccl.NCCL_SUM
    buf = cupy.zeros(count, dtype=cupy.float32)  # zeros: sums repeated 10^4 times stay 0
    small = cupy.zeros(count, dtype=cupy.float32)
    full = cupy.zeros(count * size, dtype=cupy.float32)
    full2 = cupy.zeros(count * size, dtype=cupy.float32)
    p, ps, pf, pf2 = buf.data.ptr, small.data.ptr, full.data.ptr, full2.data.ptr
    block = count // size * 4  # all_to_all block in bytes

    def a2a_raw():
        nccl.groupStart()
        for peer in range(size):
            if peer != rank:
                raw.send(pf + peer * block, block, i8, peer, stream().ptr)
                raw.recv(pf2 + peer * block, block, i8, peer, stream().ptr)
        nccl.groupEnd()
        cupy.cuda.runtime.memcpyAsync(pf2 + rank * block, pf + rank * block, block, 3,
                                      stream().ptr)

    return {
        "all_reduce": (
            lambda: raw.allReduce(p, p, count, f32, total, stream().ptr),
            lambda: dist.all_reduce(buf)),
        "all_reduce async+wait": (
            lambda: raw.allReduce(p, p, count, f32, total, stream().ptr),
            lambda: dist.all_reduce(buf, async_op=True).wait()),
        "broadcast": (
            lambda: raw.broadcast(p, p, nbytes, i8, 0, stream().ptr),
            lambda: dist.broadcast(buf, src=0)),
        "reduce": (
            lambda: raw.reduce(p, p, count, f32, total, 0, stream().ptr),
            lambda: dist.reduce(buf, dst=0)),
        "all_gather_into_tensor": (
            lambda: raw.allGather(ps, pf, nbytes, i8, stream().ptr),
            lambda: dist.all_gather_into_tensor(full, small)),
        "reduce_scatter_tensor": (
            lambda: raw.reduceScatter(pf, ps, count, f32, total, stream().ptr),
            lambda: dist.reduce_scatter_tensor(small, full)),
        "all_to_all_single": (a2a_raw, lambda: dist.all_to_all_single(full2, full)),
    }


def torch_calls(rank, size, nbytes, comm, device):
    """``{op: call}`` on torch's ProcessGroupNCCL, or ``{}`` without a CUDA torch."""
    try:
        import torch
        import torch.distributed as tdist
    except ImportError:
        return {}, None
    if not torch.cuda.is_available():
        return {}, None
    path = comm.bcast(tempfile.mktemp(prefix="gpu-call-cost-") if rank == 0 else None)
    torch.cuda.set_device(device)  # the GPU hpccomm bound this rank to
    tdist.init_process_group("nccl", store=tdist.FileStore(path, size), rank=rank,
                             world_size=size)
    count = nbytes // 4
    dev = torch.device("cuda", device)
    buf = torch.zeros(count, device=dev)
    small = torch.zeros(count, device=dev)
    full = torch.zeros(count * size, device=dev)
    full2 = torch.zeros(count * size, device=dev)
    calls = {
        "all_reduce": lambda: tdist.all_reduce(buf),
        "all_reduce async+wait": lambda: tdist.all_reduce(buf, async_op=True).wait(),
        "broadcast": lambda: tdist.broadcast(buf, src=0),
        "reduce": lambda: tdist.reduce(buf, dst=0),
        "all_gather_into_tensor": lambda: tdist.all_gather_into_tensor(full, small),
        "reduce_scatter_tensor": lambda: tdist.reduce_scatter_tensor(small, full),
        "all_to_all_single": lambda: tdist.all_to_all_single(full2, full),
    }
    return calls, tdist


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true",
                        help="run on tests/gpu_sim (no GPU): only 'share' means anything")
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.sim:
        sys.path.insert(0, os.path.abspath(SIM_PATH))

    import cupy
    from mpi4py import MPI

    import hpccomm as dist
    from hpccomm.backends.cuda.nccl import nccl_module

    nccl = nccl_module()  # the wheel's NCCL, loaded as hpccomm loads it

    dist.init_process_group(backend="cpu:mpi,cuda:nccl")
    rank, size = dist.get_rank(), dist.get_world_size()
    comm = MPI.COMM_WORLD
    simulated = getattr(cupy, "SIMULATED", False)
    uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
    raw = nccl.NcclCommunicator(size, uid, rank)
    stream = cupy.cuda.get_current_stream
    sync = lambda: stream().synchronize()  # noqa: E731
    torch_ops, tdist = ({}, None) if (simulated or args.no_torch) else \
        torch_calls(rank, size, args.bytes, comm, cupy.cuda.Device().id)
    if torch_ops:
        import torch
        sync = lambda: (stream().synchronize(), torch.cuda.synchronize())  # noqa: E731

    rows = []
    for op, (run_raw, run_hpc) in raw_calls(cupy, nccl, raw, rank, size, args.bytes,
                                            stream).items():
        variants = {"raw": run_raw, "hpccomm": run_hpc}
        if op in torch_ops:
            variants["torch"] = torch_ops[op]
        medians = measure(variants, sync, args.calls, args.block, comm.Barrier)
        worst = {name: comm.allreduce(value, op=MPI.MAX) for name, value in medians.items()}
        row = {"op": op, **{f"{name}_us": ns / 1e3 for name, ns in worst.items()}}
        row["share_us"] = row["hpccomm_us"] - row["raw_us"]
        rows.append(row)
    raw.destroy()
    if tdist is not None:
        tdist.destroy_process_group()
    dist.destroy_process_group()
    if rank == 0:
        where = "simulation (tests/gpu_sim), not a GPU" if simulated else "GPU"
        print(f"# per-call CPU time, µs (median, max over {size} rank(s)), "
              f"{args.bytes} B float32, {where}")
        torch_col = bool(torch_ops)
        head = "| operation | raw | hpccomm | share |" + (" torch |" if torch_col else "")
        print(head)
        print("|---" * (5 if torch_col else 4) + "|")
        for row in rows:
            line = (f"| {row['op']} | {row['raw_us']:.2f} | {row['hpccomm_us']:.2f} | "
                    f"{row['share_us']:.2f} |")
            if torch_col:
                line += f" {row.get('torch_us', float('nan')):.2f} |"
            print(line)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"simulated": simulated, "ranks": size, "bytes": args.bytes,
                           "rows": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
