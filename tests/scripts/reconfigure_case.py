"""torch's reconfigure contract on backend "hpccomm", for tests/test_torch_reconfigure.py:
``mpiexec -n N python this.py CASE [DIR]``.

* ``subset_and_back``: the program that re-forms a gloo group over a subset of its
  handles and back, on "hpccomm": the even ranks re-form the default group over their
  handles (sum = their count), then every rank over all handles in reverse order (each
  rank's new rank is the mirror of its old one), then over the set of them (the job's
  order again). Handles go through the default store (over MPI), no TCP.
* ``join DIR``: the ranks of this job and those of a second job started apart (same
  case, ``CASE_PART=second``) write their handles into ``DIR``, wait for all,
  and re-form one group over all of them (MPICH, Intel MPI: MPI connects the jobs).
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import hpccomm.torch  # noqa: F401 (registers backend "hpccomm")

CASE = sys.argv[1]


def say(rank, *parts):
    sys.stdout.flush()
    os.write(1, (" ".join(["RESULT", f"rank={rank}", *parts]) + "\n").encode())


def total(value=1.0):
    t = torch.tensor([value])
    dist.all_reduce(t)
    return int(t.item())


def subset_and_back():
    dist.init_process_group("hpccomm", init_method="mpi://", enable_reconfigure=True,
                            timeout=datetime.timedelta(seconds=60))
    rank, n = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"handle{rank}", dist._get_reconfigure_handle())
    handles = [store.get(f"handle{r}").decode() for r in range(n)]
    assert dist._supports_reconfigure()
    even = [r for r in range(n) if r % 2 == 0]
    if rank in even:
        dist._reconfigure(1, [handles[r] for r in even]).wait()
        say(rank, f"sub_rank={dist.get_rank()}", f"sub_size={dist.get_world_size()}",
            f"sub_sum={total()}")
    dist._reconfigure(2, list(reversed(handles))).wait()
    say(rank, f"mirror_rank={dist.get_rank()}", f"mirror_size={dist.get_world_size()}",
        f"mirror_sum={total(rank)}")
    dist._reconfigure(3, set(handles)).wait()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
    model(torch.full((2, 3), float(rank))).sum().backward()
    grads = [torch.empty_like(model.module.weight.grad) for _ in range(n)]
    dist.all_gather(grads, model.module.weight.grad)
    say(rank, f"set_rank={dist.get_rank()}", f"set_sum={total()}",
        f"ddp_same={all(torch.equal(g, grads[0]) for g in grads)}")
    try:
        dist._reconfigure(4, [handles[r] for r in range(n) if r != rank]).wait()
        say(rank, "outside=none")
    except Exception as exc:  # noqa: BLE001
        say(rank, f"outside={type(exc).__name__}: {exc}")
    dist.destroy_process_group()


def join():
    directory = sys.argv[2]
    part = os.environ.get("CASE_PART", "first")
    dist.init_process_group("hpccomm", init_method="mpi://", enable_reconfigure=True,
                            timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    name = os.path.join(directory, f"{part}-{rank:04d}")
    with open(name + ".tmp", "w") as out:
        out.write(dist._get_reconfigure_handle())
    os.replace(name + ".tmp", name)
    expected = int(os.environ["CASE_TOTAL"])
    deadline = time.monotonic() + 60
    while len([f for f in os.listdir(directory) if not f.endswith(".tmp")]) < expected:
        assert time.monotonic() < deadline, "the other job's handles never came"
        time.sleep(0.05)
    names = sorted(f for f in os.listdir(directory) if not f.endswith(".tmp"))
    handles = [open(os.path.join(directory, f)).read() for f in names]
    start = time.monotonic()
    dist._reconfigure(7, handles).wait()
    say(rank if part == "first" else 100 + rank, f"joined_rank={dist.get_rank()}",
        f"joined_size={dist.get_world_size()}", f"joined_sum={total()}",
        f"seconds={time.monotonic() - start:.2f}")
    dist.destroy_process_group()


{"subset_and_back": subset_and_back, "join": join}[CASE]()
