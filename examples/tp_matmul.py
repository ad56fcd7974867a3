"""2-D (dp x tp) tensor-parallel two-layer matmul on a DeviceMesh, checked against NumPy.

    mpiexec -n 4 python examples/tp_matmul.py          # a 2 x 2 mesh
    mpiexec -n 8 python examples/tp_matmul.py --dp 2   # a 2 x 4 mesh

Y = (X @ A) @ B. The batch X is split by rows over ``dp``; A is split by columns and B
by rows over ``tp`` (Megatron style), so each rank computes a partial Y that an
all_reduce over its ``tp`` group completes. An all_gather over ``dp`` reassembles the
batch, and every rank compares the result with the plain NumPy product.
"""
import argparse

import numpy as np

import hpccomm as dist
from hpccomm.device_mesh import init_device_mesh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=2, help="data-parallel size")
    parser.add_argument("--batch", type=int, default=8, help="rows of X per dp rank")
    parser.add_argument("--hidden", type=int, default=64, help="inner width (split over tp)")
    args = parser.parse_args()

    dist.init_process_group()
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (args.dp, world // args.dp), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh.size(0), mesh.size(1)
    dp_rank, tp_rank = mesh.get_coordinate()

    # The same full matrices on every rank (same seed); each rank keeps only its shards.
    rng = np.random.default_rng(0)
    n_in, n_out = 32, 16
    x = rng.standard_normal((dp * args.batch, n_in))
    a = rng.standard_normal((n_in, args.hidden))
    b = rng.standard_normal((args.hidden, n_out))
    if args.hidden % tp:
        raise SystemExit(f"--hidden {args.hidden} must be divisible by tp={tp}")
    cols = slice(tp_rank * args.hidden // tp, (tp_rank + 1) * args.hidden // tp)
    x_local = x[dp_rank * args.batch:(dp_rank + 1) * args.batch]
    a_local, b_local = a[:, cols], b[cols, :]

    y_partial = (x_local @ a_local) @ b_local          # this rank's share of its rows of Y
    dist.all_reduce(y_partial, group=mesh.get_group("tp"))  # sum the tp shares
    y = np.empty((dp * args.batch, n_out))
    dist.all_gather_single(y, y_partial, group=mesh["dp"])  # stack the dp batches

    error = float(np.abs(y - (x @ a) @ b).max())
    errors = np.array([error])
    dist.all_reduce(errors, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(f"mesh {mesh.mesh.tolist()} (dp={dp}, tp={tp}): Y of shape {y.shape}; "
              f"max |Y - X@A@B| over ranks = {errors[0]:.2e}")
        if errors[0] < 1e-9:
            print("the tensor-parallel result equals the NumPy product")
    dist.destroy_process_group()
    if errors[0] >= 1e-9:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
