"""torch DDP on "hpccomm" that replaces a dead rank and finishes at full size (ULFM).

Four ranks train a small MLP with DDP and SGD with momentum, each on its own slice of a
fixed data set, for ``STEPS`` steps. At step ``--kill-step`` rank ``--kill-rank`` dies
(SIGKILL). The survivors' DDP all_reduce raises ``ProcessFailedError``; they shrink
torch's default group to themselves, agree on the earliest step any of them was at,
restore the model and the optimizer as they were at its start, and grow the group back
to four (``hpccomm.torch.grow_group`` spawns this script once more; the newcomer's
``init_process_group("hpccomm", init_method="mpi://")`` joins in the dead rank's place).
Rank 0 hands its model and optimizer state to the newcomer in memory, every rank wraps
the model in DDP again, and training goes on at four ranks. Run with ``--kill-rank -1``
to see the weights of a run without failure: the ``weights sha256`` lines are equal.

    mpirun --with-ft ulfm -n 4 python examples/torch_elastic_grow.py
"""
import argparse
import copy
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import hpccomm
import hpccomm.torch as ht

STEPS, BATCH = 30, 16


def batch(rank, step):
    """Rank ``rank``'s batch at ``step``: the same on every run, whoever computes it."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, 8, generator=generator, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True).sin()


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1)).double()
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-rank", type=int, default=2, help="-1: nobody dies")
    parser.add_argument("--kill-step", type=int, default=STEPS // 3)
    args = parser.parse_args()

    dist.init_process_group("hpccomm", init_method="mpi://")
    rank = dist.get_rank()
    model, optimizer = build()
    step = 0
    if rank in ht.newcomers():  # a replacement: the state comes from rank 0's memory
        state = ht.hand_over(None)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"rank {rank}: joined, going on from step {step}", flush=True)
    victim = -1 if ht.newcomers() else args.kill_rank
    if not hpccomm.is_fault_tolerant():  # without ULFM a dead rank ends the job
        victim = -1
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    saved = {}  # step -> (model, optimizer) state at its start, the last two steps
    while step < STEPS:
        if rank == victim and step == args.kill_step:
            print(f"rank {rank}: dying at step {step} (clock {time.time():.3f})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        saved[step] = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
        saved.pop(step - 2, None)
        x, y = batch(rank, step)
        optimizer.zero_grad()
        try:
            torch.nn.functional.mse_loss(ddp(x), y).backward()
        except RuntimeError as failure:  # DDP's autograd engine hands it on as this
            if not ht.failed_ranks():
                raise
            if rank == 0:
                print(f"step {step}: ranks {ht.failed_ranks()} failed", flush=True)
            ht.shrink_group()
            earliest = torch.tensor([step])
            dist.all_reduce(earliest, op=dist.ReduceOp.MIN)
            step, victim = int(earliest), -1
            model_state, optimizer_state = saved[step]
            model.load_state_dict(model_state)
            optimizer.load_state_dict(optimizer_state)
            ht.grow_group(spawn=[sys.executable] + sys.argv)
            ht.hand_over({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "step": step})
            rank = dist.get_rank()
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            if rank == 0:
                print(f"step {step}: back to {dist.get_world_size()} ranks (clock "
                      f"{time.time():.3f})", flush=True)
            continue
        optimizer.step()
        step += 1
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if rank == 0:
        digest = hashlib.sha256(weights.numpy().tobytes()).hexdigest()
        print(f"trained {STEPS} steps on {dist.get_world_size()} ranks; weights sha256 "
              f"{digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
