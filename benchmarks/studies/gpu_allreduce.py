"""all_reduce bandwidth on the GPU: hpccomm (NCCL backend) against raw ``cupy.cuda.nccl``.

Both run on the same CuPy buffers, one rank per GPU, under ``mpiexec -n N``. The raw
baseline is an ``NcclCommunicator`` made the same way hpccomm makes one (unique id
broadcast over MPI) and called in place on the current stream. For each size the time
per call is the median over repeats of ``iters`` back-to-back calls followed by a device
synchronize. Reported: algorithm bandwidth (bytes / time), bus bandwidth
(``2 (n-1)/n`` x that, as nccl-tests), and the ratio hpccomm time / raw time.

Usage: mpiexec -n N python benchmarks/studies/gpu_allreduce.py [--out result.json]
       [--min-bytes 1024] [--max-bytes 268435456] [--iters 50] [--repeats 5]
"""
import argparse
import json
import socket
import statistics
import sys
import time


def timed(run, sync, iters, repeats, comm):
    """Median seconds per call of ``run`` over ``repeats`` bursts of ``iters`` calls."""
    for _ in range(3):
        run()
    sync()
    samples = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(iters):
            run()
        sync()
        elapsed = time.perf_counter() - start
        samples.append(comm.allreduce(elapsed, op=MPI.MAX) / iters)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--min-bytes", type=int, default=1 << 10)
    parser.add_argument("--max-bytes", type=int, default=1 << 28)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import cupy

    import hpccomm as dist
    from hpccomm.backends.cuda import device as _cuda, nccl as hpc_nccl

    nccl = hpc_nccl.nccl_module()  # cupy.cuda.nccl, after hpccomm found the wheel's NCCL

    dist.init_process_group(backend="cpu:mpi,cuda:nccl")
    rank, size = dist.get_rank(), dist.get_world_size()
    comm = MPI.COMM_WORLD
    device = _cuda.bound_device()  # the GPU hpccomm bound at init; now current
    uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
    raw = nccl.NcclCommunicator(size, uid, rank)
    stream = cupy.cuda.get_current_stream()
    sync = stream.synchronize

    rows = []
    nbytes = args.min_bytes
    while nbytes <= args.max_bytes:
        count = nbytes // 4
        buf = cupy.ones(count, dtype=cupy.float32)
        ptr = buf.data.ptr

        def run_raw():
            raw.allReduce(ptr, ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)

        def run_hpc():
            dist.all_reduce(buf)

        iters = max(5, min(args.iters, int(args.iters * (1 << 24) / max(nbytes, 1))))
        t_raw = timed(run_raw, sync, iters, args.repeats, comm)
        t_hpc = timed(run_hpc, sync, iters, args.repeats, comm)
        factor = 2 * (size - 1) / size if size > 1 else 1.0
        row = {"bytes": nbytes, "iters": iters,
               "raw_us": t_raw * 1e6, "hpccomm_us": t_hpc * 1e6,
               "raw_algbw_GBs": nbytes / t_raw / 1e9, "hpccomm_algbw_GBs": nbytes / t_hpc / 1e9,
               "raw_busbw_GBs": factor * nbytes / t_raw / 1e9,
               "hpccomm_busbw_GBs": factor * nbytes / t_hpc / 1e9,
               "ratio_time_hpccomm_over_raw": t_hpc / t_raw}
        rows.append(row)
        if rank == 0:
            print(f"{nbytes:>12d} B  raw {row['raw_us']:9.1f} us {row['raw_busbw_GBs']:8.2f} GB/s"
                  f"   hpccomm {row['hpccomm_us']:9.1f} us {row['hpccomm_busbw_GBs']:8.2f} GB/s"
                  f"   ratio {row['ratio_time_hpccomm_over_raw']:.3f}", flush=True)
        del buf
        nbytes *= 4

    # correctness check on the last size: every element equals the world size^k
    check = cupy.ones(1024, dtype=cupy.float32)
    dist.all_reduce(check)
    ok = bool((check == size).all())
    props = cupy.cuda.runtime.getDeviceProperties(device)
    info = {"host": socket.gethostname(), "world_size": size, "device": device,
            "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
            "nccl_version": ".".join(map(str, hpc_nccl.version())),
            "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
            "cupy": cupy.__version__, "python": sys.version.split()[0],
            "all_reduce_check": ok, "rows": rows}
    raw.destroy()
    dist.destroy_process_group()
    if rank == 0:
        large = [r["ratio_time_hpccomm_over_raw"] for r in rows if r["bytes"] >= 1 << 24]
        info["median_ratio_ge_16MiB"] = statistics.median(large) if large else None
        text = json.dumps(info, indent=2)
        if args.out:
            with open(args.out, "w") as handle:
                handle.write(text + "\n")
        print(f"check {'ok' if ok else 'FAILED'}; median time ratio (>= 16 MiB): "
              f"{info['median_ratio_ge_16MiB']}")
    return 0 if ok else 1


if __name__ == "__main__":
    from mpi4py import MPI

    sys.exit(main())
