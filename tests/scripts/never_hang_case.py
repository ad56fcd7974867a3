"""Failure scenarios for tests/test_never_hang.py, run as ``mpiexec -n N python this.py CASE``.

Each case breaks the group on purpose (a skipped collective, absent ranks, an uncaught
exception), so it runs in its own job. Lines starting with ``RESULT`` are what the test
checks; a rank that catches the expected error calls ``destroy_process_group`` and exits
normally, the documented way out of a group left unusable by a timeout.
"""
import os
import sys
import time

import numpy as np

import hpccomm as dist

TIMEOUT = float(os.environ.get("CASE_TIMEOUT", "2"))


def say(*parts):
    """One ``RESULT`` line, written with one system call so ranks' lines never interleave."""
    sys.stdout.flush()
    line = " ".join(["RESULT", f"rank={dist.get_rank()}", *parts]) + "\n"
    os.write(1, line.encode())


def leave(code=0):
    """The documented way out after a timeout: destroy the groups, exit normally."""
    dist.destroy_process_group()
    sys.exit(code)


def skip_collective():
    """Rank 1 skips an all_reduce; the others must raise within timeout + 2 s, naming it."""
    x = np.ones(4)
    dist.all_reduce(x)  # seq 1: everyone
    if dist.get_rank() == 1:
        time.sleep(TIMEOUT + 4)
        leave()
    start = time.monotonic()
    try:
        dist.all_reduce(x)
    except dist.DistTimeoutError as exc:
        say(f"elapsed={time.monotonic() - start:.2f}", "error=" + str(exc).replace("\n", " "))
        leave()
    say("no error")
    leave(3)


def every_op_times_out():
    """Rank 0 runs every kind of operation alone: each must raise a timeout error."""
    if dist.get_rank() != 0:
        time.sleep(float(os.environ.get("CASE_SLEEP", "30")))
        leave()
    small, big = np.ones(4), np.ones(1 << 18)
    ops = {
        "all_reduce": lambda: dist.all_reduce(small),
        "broadcast": lambda: dist.broadcast(small, src=1),
        "reduce": lambda: dist.reduce(small, dst=0),
        "all_gather": lambda: dist.all_gather([np.ones(4), np.ones(4)], small),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(np.ones(8), small),
        "gather": lambda: dist.gather(small, [np.ones(4), np.ones(4)], dst=0),
        "scatter": lambda: dist.scatter(small, None, src=1),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(small, np.ones(8)),
        "all_to_all_single": lambda: dist.all_to_all_single(np.ones(4), np.ones(4)),
        "barrier": lambda: dist.barrier(),
        "barrier(timeout=)": lambda: dist.barrier(timeout=0.3),
        "send": lambda: dist.send(big, dst=1),
        "recv": lambda: dist.recv(small, src=1),
        "irecv.wait(timeout)": lambda: dist.irecv(small, src=1).wait(timeout=0.3),
        "all_reduce async wait": lambda: dist.all_reduce(small, async_op=True).wait(),
        "broadcast_object_list": lambda: dist.broadcast_object_list([None], src=1),
        "recv_object_list": lambda: dist.recv_object_list([None], src=1),
    }
    for name, run in ops.items():
        start = time.monotonic()
        try:
            run()
        except dist.DistTimeoutError as exc:
            first = str(exc).split(" timed out")[0]
            cause = str(exc).split(" s). ", 1)[1].split(" The group is now unusable")[0]
            say(f"op={name}", f"elapsed={time.monotonic() - start:.2f}", f"cause={cause}",
                f"what={first}")
        else:
            say(f"op={name}", "no error")
    leave()


def monitored_absent():
    """Ranks in ABSENT skip the monitored barrier; the others must raise naming them."""
    absent = [int(r) for r in os.environ["CASE_ABSENT"].split(",")]
    wait_all = os.environ.get("CASE_WAIT_ALL") == "1"
    dist.monitored_barrier(timeout=TIMEOUT)  # everyone: passes
    if dist.get_rank() in absent:
        time.sleep(TIMEOUT + 4)
        leave()
    start = time.monotonic()
    try:
        dist.monitored_barrier(timeout=TIMEOUT, wait_all_ranks=wait_all)
    except dist.DistTimeoutError as exc:
        say(f"elapsed={time.monotonic() - start:.2f}", "error=" + str(exc))
        leave()
    say("no error")
    leave(3)


def uncaught_exception():
    """Rank 1 raises; rank 0 waits in a collective with a long timeout. The job must end."""
    x = np.ones(4)
    dist.all_reduce(x)
    if dist.get_rank() == 1:
        raise ValueError("boom on purpose in rank 1")
    say("waiting")
    dist.all_reduce(x)
    say("not reached")


def breakpoint_case():
    """Rank 0 enters pdb (commands come on stdin); rank 1 waits for it."""
    value = 6 * 7  # noqa: F841 (inspected from pdb)
    dist.breakpoint(rank=0, timeout_s=30)
    say("after breakpoint")
    dist.destroy_process_group()


def sizes_differ_in_pieces():
    """Rank 0 all_reduces 1 MiB of float64, the others 1.5 MiB: at 4 ranks both go through
    the small channel in pieces. Every rank must raise at once, naming both calls."""
    count = 131072 if dist.get_rank() == 0 else 196608
    start = time.monotonic()
    try:
        dist.all_reduce(np.ones(count))
        say(f"elapsed={time.monotonic() - start:.2f}", "returned")
    except dist.DistError as exc:
        say(f"elapsed={time.monotonic() - start:.2f}", f"type={type(exc).__name__}",
            f"error={' '.join(str(exc).split())}")
    leave()


CASES = {f.__name__: f for f in (skip_collective, every_op_times_out, monitored_absent,
                                 uncaught_exception, breakpoint_case, sizes_differ_in_pieces)}

if __name__ == "__main__":
    dist.init_process_group(timeout=TIMEOUT)
    CASES[sys.argv[1]]()
