"""Failure scenarios of the shared-memory path for tests/test_shm.py.

Run as ``mpiexec -n N python this.py CASE``; every message goes through shared memory
(``HPCCOMM_SHM_MIN_BYTES=1``, small ring slots). Lines starting with ``RESULT`` are what
the test checks. After a timeout the group is unusable: survivors destroy it and exit
normally, except where a peer was killed (it can stall ``MPI_Finalize``: ``os._exit``).
"""
import os
import signal
import sys
import time

os.environ.update(HPCCOMM_SHM="1", HPCCOMM_SHM_MIN_BYTES="1", HPCCOMM_SHM_CHUNK="4096")

import numpy as np  # noqa: E402

import hpccomm as dist  # noqa: E402

TIMEOUT = float(os.environ.get("CASE_TIMEOUT", "2"))


def say(*parts):
    """One ``RESULT`` line, written with one system call so ranks' lines never interleave."""
    sys.stdout.flush()
    os.write(1, (" ".join(["RESULT", f"rank={dist.get_rank()}", *parts]) + "\n").encode())


def backing_files():
    """The file behind the shared segment this rank maps (``/proc/self/maps``)."""
    cpu = dist.group.WORLD.cpu
    regions = [cpu.ring.regions[cpu.rank]]
    found = []
    with open("/proc/self/maps") as maps:
        lines = maps.read().splitlines()
    for region in regions:
        address = region.ctypes.data
        for line in lines:
            span, rest = line.split(" ", 1)
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                found.append(rest.split(None, 4)[-1].replace(" ", ""))
    return found


def killed():
    """Rank 1 stops in the middle of an all_reduce, holding the ring; the others must
    raise within the timeout. Then rank 0 kills it (``SIGKILL``) and everyone leaves.

    The rank is stopped first and killed afterwards because MPICH's mpiexec kills every
    rank as soon as one dies: the survivors could not report otherwise.
    """
    x = np.ones(1 << 22, np.float32)
    dist.all_reduce(x)  # every rank through once: the segment is in use
    segments = backing_files()
    pids = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    if dist.get_rank() == 1:
        work = dist.all_reduce(x, async_op=True)
        for _ in range(3):
            work.is_completed()  # stage what the ring holds, then stop holding it
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        # join only once rank 1 has stopped: while its peers keep pace, one call of
        # rank 1 goes on advancing and could finish the whole operation
        time.sleep(1.0)
    start = time.monotonic()
    try:
        dist.all_reduce(x)
        error = "none"
    except dist.DistError as exc:
        error = type(exc).__name__
    say(f"elapsed={time.monotonic() - start:.2f}", f"error={error}",
        f"segments={','.join(segments)}")
    if dist.get_rank() == 0:
        time.sleep(0.5)  # let the other survivors report
        os.kill(pids[1], signal.SIGKILL)
    time.sleep(5)  # mpiexec ends the job once it sees rank 1 killed
    os._exit(0)


def leave():
    """The documented way out after a timeout: destroy the groups, exit normally (so
    every MPI, Open MPI included, sees each rank finalize)."""
    dist.destroy_process_group()
    sys.exit(0)


def absent():
    """Rank 1 never comes: each shared-memory collective of rank 0 raises in time."""
    if dist.get_rank() == 1:
        time.sleep(TIMEOUT * 4 + 6)
        leave()
    n = 1 << 14
    ops = {
        "all_reduce": lambda: dist.all_reduce(np.ones(n)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(np.ones(n), np.ones(2 * n)),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(np.ones(2 * n),
                                                                      np.ones(n)),
        "broadcast": lambda: dist.broadcast(np.ones(n), src=1),
    }
    raised, slowest = [], 0.0
    for name, run in ops.items():
        start = time.monotonic()
        try:
            run()
        except dist.DistTimeoutError:
            raised.append(name)
        slowest = max(slowest, time.monotonic() - start)
    say(f"raised={','.join(raised)}", f"slowest={slowest:.2f}")
    leave()


if __name__ == "__main__":
    dist.init_process_group(timeout=TIMEOUT)
    {"killed": killed, "absent": absent}[sys.argv[1]]()
