"""What a DeviceMesh costs to set up: making it, its first groups, later look-ups.

Driver (no MPI of its own): ``python benchmarks/studies/device_mesh_setup.py [--ranks 4,8]``
runs itself under ``mpiexec -n N`` for each rank count and prints a Markdown table.
Each worker makes ``--repeat`` fresh meshes of a 2-D (4 ranks) or 3-D (8 ranks) shape
and times, per mesh: ``init_device_mesh`` (communicates nothing), the first
``get_all_groups()`` (the Cartesian communicator plus one ``MPI_Cart_sub`` per
dimension), a second ``get_all_groups()`` (cached) and a slice plus its group.
Reported: the median over meshes of the slowest rank. Take it under
``flock /tmp/hpccomm-bench.lock`` so that two benchmarks never overlap.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

SHAPES = {4: ((2, 2), ("dp", "tp")), 8: ((2, 2, 2), ("dp", "pp", "tp"))}


def worker(repeat: int) -> None:
    import hpccomm as dist
    from hpccomm.device_mesh import init_device_mesh

    dist.init_process_group(timeout=60)
    size = dist.get_world_size()
    shape, names = SHAPES[size]
    steps = ("make", "first_groups", "cached_groups", "slice_group")
    times = {step: [] for step in steps}
    for _ in range(repeat):
        dist.barrier()
        t0 = time.perf_counter()
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        t1 = time.perf_counter()
        mesh.get_all_groups()
        t2 = time.perf_counter()
        mesh.get_all_groups()
        t3 = time.perf_counter()
        mesh[names[-1]].get_group()
        t4 = time.perf_counter()
        for step, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            times[step].append(seconds)
    slowest = np.array([times[step] for step in steps])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        medians = {step: float(np.median(row)) * 1e6 for step, row in zip(steps, slowest)}
        print("RESULT " + json.dumps({"ranks": size, "shape": shape, **medians}), flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="4,8")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.repeat)
        return
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    print("| ranks | mesh | make the mesh | first get_all_groups() | again (cached) | "
          "slice + its group |")
    print("|---|---|---|---|---|---|")
    for n in [int(x) for x in args.ranks.split(",")]:
        out = subprocess.run([mpiexec, "-n", str(n), sys.executable, __file__, "--worker",
                              "--repeat", str(args.repeat)], capture_output=True, text=True,
                             timeout=600, check=True).stdout
        row = json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[7:])
        mesh = " x ".join(map(str, row["shape"]))
        print(f"| {n} | {mesh} | {row['make']:.0f} us | {row['first_groups']:.0f} us | "
              f"{row['cached_groups']:.1f} us | {row['slice_group']:.0f} us |")


if __name__ == "__main__":
    main()
