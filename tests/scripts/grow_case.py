"""Jobs that grow, for tests/test_recovery.py: ``mpiexec -n N python this.py CASE [ARG]``.

* ``planned``: the last rank is excluded (``shrink_group([n-1])``, any MPI library),
  then the group grows back: a spawned process takes the vacant place; every rank checks
  its rank, the sizes, a sum, a sub-group, the store and a handed-over state.
* ``join DIR``: the same, the newcomer a job of its own that waits in ``DIR`` (started
  by the test with ``HPCCOMM_JOIN=DIR``; MPICH and Intel MPI).
* ``late``: the spawned newcomer starts MPI after the deadline; it is told so.
* ``never_comes``: the spawned command never starts MPI: grow_group names it within the
  timeout, and the group goes on at its size. ``never_joins DIR``: nobody waits in DIR.
"""
import os
import shutil
import sys
import tempfile
import time

import numpy as np

import hpccomm as dist
from hpccomm.checkpoint import Shard, hand_over, save

CASE = sys.argv[1]
ARG = sys.argv[2] if len(sys.argv) > 2 else None
TIMEOUT = float(os.environ.get("CASE_TIMEOUT", "60"))
#: The rank a newcomer reports as (its rank before: none).
NEWCOMER = 100


def say(rank, *parts):
    sys.stdout.flush()
    os.write(1, (" ".join(["RESULT", f"rank={rank}", *parts]) + "\n").encode())


def check_grown(n, before, checkpoint=None):
    """Every rank of the grown group (newcomer or not): numbers, a sum, a group, the
    store, the state, and a sharded state from the checkpoint (``checkpoint``: saved
    by the group before it shrank; the newcomer learns it from the state)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.array([rank + 1.0])
    dist.all_reduce(x)
    pair = dist.new_group([0, n - 1])
    y = np.ones(1)
    if pair is not dist.GroupMember.NON_GROUP_MEMBER:
        dist.all_reduce(y, group=pair)
    store = dist.get_default_store()
    store.set(f"k{rank}", str(rank))
    seen = sorted(int(store.get(f"k{r}")) for r in range(size))
    state = {"w": np.arange(4.0) * 7, "step": 12, "nested": [np.ones(2, np.int32), "x"],
             "checkpoint": checkpoint}
    got = hand_over(None if rank in dist.newcomers() else state)
    ok_state = (float(got["w"].sum()) == 42.0 and got["step"] == 12
                and got["nested"][0].tolist() == [1, 1] and got["nested"][1] == "x")
    shard = {"part": Shard(np.zeros(3), 0)}  # no survivor holds the newcomer's part
    hand_over(shard, fallback=got["checkpoint"])
    ok_shard = shard["part"].local.tolist() == [float(rank)] * 3
    say(before, f"rank_now={rank}", f"size={size}", f"sum={x[0]:.0f}", f"pair={y[0]:.0f}",
        f"store={seen == list(range(size))}", f"newcomers={dist.newcomers()}",
        f"state={ok_state}", f"shard={ok_shard}")
    dist.barrier()


def planned():
    dist.init_process_group(timeout=TIMEOUT)
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank in dist.newcomers():  # the spawned or joined replacement
        check_grown(dist.get_world_size(), NEWCOMER)
        dist.destroy_process_group()
        return
    folder = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(folder, src=0)
    checkpoint = os.path.join(folder[0], "parts.h5")
    save({"part": Shard(np.full(3, float(rank)), 0)}, checkpoint)  # every rank's part
    if rank == n - 1:  # excluded: leaves the group (and the job's work) to the others
        say(rank, "event=excluded")
        dist.destroy_process_group()
        return
    dist.shrink_group([n - 1])
    start = time.monotonic()
    if ARG is None:
        dist.grow_group(spawn=[sys.executable, os.path.abspath(__file__), "planned"])
    else:
        dist.grow_group(join=ARG)
    say(rank, f"grow_s={time.monotonic() - start:.2f}")
    check_grown(n, rank, checkpoint)
    if rank == 0:  # every rank has loaded it (check_grown ends in a barrier)
        shutil.rmtree(folder[0], ignore_errors=True)
    dist.destroy_process_group()


def never_comes():
    dist.init_process_group(timeout=TIMEOUT)
    rank, n = dist.get_rank(), dist.get_world_size()
    start = time.monotonic()
    try:
        if ARG is None:
            dist.grow_group(spawn=[sys.executable, "-c", "import time; time.sleep(8)"],
                            count=1, timeout=3)
        else:
            dist.grow_group(join=ARG, count=1, timeout=3)
        say(rank, "error=none")
    except dist.DistError as exc:
        say(rank, f"elapsed={time.monotonic() - start:.1f}", f"type={type(exc).__name__}",
            f"error={exc}")
    x = np.ones(1)
    dist.all_reduce(x)
    say(rank, f"after={x[0]:.0f}", f"size={dist.get_world_size()}")
    dist.destroy_process_group()


def late():
    """The spawned newcomer starts MPI only after the group gave up waiting (3 s): the
    group goes on, and the newcomer is told that nobody waits for it."""
    dist.init_process_group(timeout=TIMEOUT)
    rank = dist.get_rank()
    try:
        dist.grow_group(spawn=[sys.executable, os.path.abspath(__file__), "late_child"],
                        count=1, timeout=3)
    except dist.DistTimeoutError as exc:
        say(rank, f"gave_up={type(exc).__name__}")
    time.sleep(6)  # the newcomer comes meanwhile, and is let go
    x = np.ones(1)
    dist.all_reduce(x)
    say(rank, f"after={x[0]:.0f}")
    dist.destroy_process_group()


def late_child():
    time.sleep(5)
    try:
        dist.init_process_group(timeout=TIMEOUT)
        say(NEWCOMER, "told=nothing")
    except dist.DistTimeoutError as exc:
        say(NEWCOMER, f"told={exc}")


CASES = {"planned": planned, "late": late, "late_child": late_child, "join": planned, "never_comes": never_comes,
         "never_joins": never_comes}

if __name__ == "__main__":
    CASES[CASE]()
