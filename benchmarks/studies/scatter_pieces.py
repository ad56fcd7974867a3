"""reduce_scatter_tensor of a group on one node: the small channel in pieces against the
MPI path it replaced and raw mpi4py, interleaved in one job.

From 3 ranks on (MPICH, Open MPI) a reduce_scatter whose block is larger than the small
channel's goes through it in pieces of every rank's block, below the shared-memory ring.
This alternates, round by round, hpccomm with its pieces, hpccomm with the pieces off
(``scatter_pieces_to = 0``: the MPI path it took before) and raw
``Reduce_scatter_block`` on the same buffers, so load spikes hit all three alike.

    mpiexec -n 4 python benchmarks/studies/scatter_pieces.py [MiB ...]

Prints, on rank 0, per input size: median and minimum microseconds per call of each
(the slowest rank's mean of a round).
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import hpccomm as dist


def main():
    sizes = [float(arg) for arg in sys.argv[1:]] or [0.5, 1, 4]
    dist.init_process_group()
    n, comm = dist.get_world_size(), MPI.COMM_WORLD
    cpu = dist.group.WORLD.cpu
    pieces_to = getattr(cpu, "scatter_pieces_to", 0)
    if not pieces_to and dist.get_rank() == 0:
        print(f"no reduce_scatter in pieces here ({n} ranks, {MPI.get_vendor()[0]}): "
              f"the columns 'pieces' and 'MPI' are the same path")

    def hpccomm_with(limit):
        def call(out, x):
            cpu.scatter_pieces_to = limit
            dist.reduce_scatter_tensor(out, x)
        return call
    variants = {"pieces": hpccomm_with(pieces_to), "MPI": hpccomm_with(0),
                "mpi4py": lambda out, x: comm.Reduce_scatter_block(x, out)}
    for mib in sizes:
        total = int(mib * (1 << 20)) // (8 * n) * 8 * n
        x, out = np.ones(total // 8), np.empty(total // 8 // n)
        reps = max(5, (1 << 24) // total)
        times = {name: [] for name in variants}
        for _ in range(7):
            for name, call in variants.items():
                call(out, x)
                comm.Barrier()
                start = time.perf_counter()
                for _ in range(reps):
                    call(out, x)
                times[name].append(comm.allreduce((time.perf_counter() - start) / reps,
                                                  op=MPI.MAX))
        cpu.scatter_pieces_to = pieces_to
        if dist.get_rank() == 0:
            print(f"{n} ranks, reduce_scatter_tensor of {total / (1 << 20):.2f} MiB: " +
                  ", ".join(f"{name} {np.median(t) * 1e6:.0f} us (min {min(t) * 1e6:.0f})"
                            for name, t in times.items()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
