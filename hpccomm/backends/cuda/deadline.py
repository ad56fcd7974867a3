"""The deadline on NCCL's own creation of a communicator, once its ranks have met.

After the meeting (:mod:`.shared_gpu`) every rank holds what it needs, and NCCL's
creation (``ncclCommInitRank``, ``ncclCommSplit``) has only NCCL left to wait for: its
bootstrap, which connects the ranks over TCP. That can still block for good: a network
NCCL cannot use (the wrong interface, see ``NCCL_SOCKET_IFNAME``; a firewall between
the nodes), or a rank that stopped in the meantime. CuPy's creation blocks and cannot
be interrupted (there is no communicator to abort until it returns), so :func:`bounded`
watches it from a timer thread: past the group's timeout it writes which communicator,
on which rank, for how long and what to check to stderr, waits until the launcher has
read it, then ends the job (``MPI_Abort`` on the world: :func:`hpccomm.ending.end_job`),
as torch ends a process whose NCCL work outlived its timeout. It runs only while a
communicator is being made: no call's path pays for it.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional

from ...ending import end_job


def global_rank() -> str:
    """This process's rank in the world, as text for a message (``?`` without MPI)."""
    try:
        from mpi4py import MPI

        return str(MPI.COMM_WORLD.Get_rank())
    except Exception:  # pragma: no cover - MPI is up whenever a group exists
        return "?"


def message(what: str, rank: int, size: int, timeout: float, outcome: str) -> str:
    """What a rank says when NCCL's creation of ``what`` outlived ``timeout``, and then
    what became of it (``outcome``)."""
    return (f"hpccomm NCCL backend, rank {rank}/{size} of its group (global rank "
            f"{global_rank()}): {what} did not finish within {timeout:g} s, although "
            f"every rank of it had come to make it. {outcome} Check that NCCL's "
            f"bootstrap can connect the ranks (NCCL_SOCKET_IFNAME names the network "
            f"interface it uses; NCCL_DEBUG=INFO shows where it stops) and that no rank "
            f"stopped meanwhile (its own output says why)")


@contextlib.contextmanager
def bounded(what: str, rank: int, size: int, timeout: Optional[float]) -> Iterator[None]:
    """Run the blocking NCCL creation inside under a deadline of ``timeout`` seconds
    (none when ``None``): past it, :func:`message` goes to stderr and the job ends."""
    if timeout is None:
        yield
        return
    finished = threading.Event()

    def expire() -> None:
        if finished.is_set():
            return
        end_job(1, message(what, rank, size, timeout, "NCCL's own creation cannot be "
                           "interrupted, so this rank ends the job."))

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.name = "hpccomm-nccl-creation-deadline"
    timer.start()
    try:
        yield
    finally:
        finished.set()
        timer.cancel()
