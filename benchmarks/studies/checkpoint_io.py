"""Checkpoint save/load throughput (GB/s) next to the machine's raw file-write speed.

Driver (no MPI of its own): ``python benchmarks/studies/checkpoint_io.py [--mib 256] [--ranks 2,4]``
measures raw writes (``numpy.tofile`` + ``fsync``, and ``dd conv=fsync``) and a cold raw
read, then runs itself under ``mpiexec -n N`` for each rank count and prints a Markdown
table. Under mpiexec (``--worker``) it saves a state of ``--mib`` MiB (7/8 sharded along
axis 0, 1/8 replicated) ``--repeat`` times and loads it back, cold (pages evicted with
``posix_fadvise``) and warm, reporting the best time of each.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

MIB = 2**20


def evict(path: str) -> None:
    """Drop the file's clean pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw(folder: str, mib: int, repeat: int) -> dict:
    data = np.random.default_rng(0).random(mib * MIB // 8)
    path = os.path.join(folder, "raw.bin")
    writes, reads, dds = [], [], []
    for _ in range(repeat):
        start = time.perf_counter()
        with open(path, "wb") as out:
            data.tofile(out)
            out.flush()
            os.fsync(out.fileno())
        writes.append(time.perf_counter() - start)
        evict(path)
        start = time.perf_counter()
        np.fromfile(path, dtype=np.float64)
        reads.append(time.perf_counter() - start)
        os.unlink(path)
        start = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}",
                        "conv=fsync"], check=True, capture_output=True)
        dds.append(time.perf_counter() - start)
        os.unlink(path)
    gb = mib * MIB / 1e9
    return {"tofile_fsync_GBps": gb / min(writes), "dd_fsync_GBps": gb / min(dds),
            "cold_read_GBps": gb / min(reads)}


def worker(folder: str, mib: int, repeat: int) -> None:
    import hpccomm as dist
    from hpccomm import checkpoint

    dist.init_process_group(timeout=600)
    rank, size = dist.get_rank(), dist.get_world_size()
    sharded_rows = (mib * MIB * 7 // 8) // 8 // 1024  # float64 rows of 1024 columns
    rows = [sharded_rows // size + (1 if r < sharded_rows % size else 0) for r in range(size)]
    rng = np.random.default_rng(rank)
    state = {"model": {"w": checkpoint.Shard(rng.random((rows[rank], 1024)))},
             "opt": {"replicated": np.full(mib * MIB // 8 // 8, 1.5)}}
    nbytes = sharded_rows * 1024 * 8 + state["opt"]["replicated"].nbytes
    path = os.path.join(folder, "bench.h5")

    def timed(step) -> float:
        dist.barrier()
        start = time.perf_counter()
        step()
        dist.barrier()
        return time.perf_counter() - start

    saves, cold, warm = [], [], []
    target = {"model": {"w": checkpoint.Shard(np.empty((rows[rank], 1024)))},
              "opt": {"replicated": np.empty_like(state["opt"]["replicated"])}}
    for _ in range(repeat):
        saves.append(timed(lambda: checkpoint.save(state, path)))
        if rank == 0:
            evict(path)
        cold.append(timed(lambda: checkpoint.load(target, path)))
        warm.append(timed(lambda: checkpoint.load(target, path)))
    assert np.array_equal(target["model"]["w"].local, state["model"]["w"].local)
    if rank == 0:
        gb = nbytes / 1e9
        print(json.dumps({"ranks": size, "MiB": nbytes / MIB, "save_GBps": gb / min(saves),
                          "load_cold_GBps": gb / min(cold), "load_warm_GBps": gb / min(warm),
                          "save_s": min(saves)}))
        os.unlink(path)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.dir, args.mib, args.repeat)
        return
    folder = args.dir or tempfile.mkdtemp(prefix="hpccomm-ckpt-bench-")
    base = raw(folder, args.mib, args.repeat)
    launcher = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    print(f"raw, 1 process, {args.mib} MiB: numpy.tofile+fsync "
          f"{base['tofile_fsync_GBps']:.2f} GB/s, dd conv=fsync {base['dd_fsync_GBps']:.2f} "
          f"GB/s, cold read {base['cold_read_GBps']:.2f} GB/s")
    print("\n| ranks | state (MiB) | save GB/s | load GB/s (cold) | load GB/s (warm) | "
          "save / raw write |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in [int(r) for r in args.ranks.split(",")]:
        done = subprocess.run([launcher, "-n", str(n), sys.executable, os.path.abspath(__file__),
                               "--worker", "--dir", folder, "--mib", str(args.mib),
                               "--repeat", str(args.repeat)],
                              capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {n} | {row['MiB']:.0f} | {row['save_GBps']:.2f} | {row['load_cold_GBps']:.2f} "
              f"| {row['load_warm_GBps']:.2f} | "
              f"{row['save_GBps'] / base['tofile_fsync_GBps']:.0%} |")


if __name__ == "__main__":
    main()
