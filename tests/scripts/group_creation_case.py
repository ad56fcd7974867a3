"""One rank skips a group-creation call; the others must raise a timeout, not hang.

Usage: mpiexec -n 3 python group_creation_case.py new_group|split|mesh
       mpiexec -n 4 python group_creation_case.py mesh_vs_barrier
(mesh_vs_barrier: the ranks with tp == 0 make the (2, 2) mesh's "dp" group and
all_reduce on it while the others call a barrier on the world: the group's hidden
meeting must not pair with the user's barrier.)
Prints one RESULT line per rank; ranks stay alive a few seconds so the launcher does
not end the job before every rank has reported.
"""
import os
import sys
import time

import hpccomm as dist


def report(line: str) -> None:
    """One write per line, so ranks sharing the launcher's pipe never interleave."""
    os.write(1, (line + "\n").encode())


case = sys.argv[1]
dist.init_process_group(timeout=2)
r = dist.get_rank()
t = time.monotonic()
try:
    if case == "new_group":
        if r != 1:               # rank 1 is a member but never calls new_group
            dist.new_group([0, 1, 2])
    elif case == "split":
        if r != 2:
            dist.split_group(split_ranks=[[0, 1], [2]])
    elif case == "mesh":
        from hpccomm.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (1, 3), mesh_dim_names=("dp", "tp"))
        if r != 0:               # "tp" would be the world group itself: "dp" needs a Cart_sub
            mesh.get_group("dp")
    elif case == "mesh_vs_barrier":
        import numpy as np
        from hpccomm.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        if mesh.get_local_rank("tp") == 0:
            dist.all_reduce(np.ones(4), group=mesh.get_group("dp"))
        else:
            dist.barrier()
    report(f"RESULT rank {r} no error")
    time.sleep(6)
except dist.DistTimeoutError as exc:
    report(f"RESULT rank {r} timeout after {time.monotonic()-t:.1f}s: {str(exc)[:400]}")
time.sleep(4)
os._exit(0)
