"""Shared memory between the ranks of one node: MPI-3 shared windows and their counters.

A :class:`Window` is one ``MPI_Win_allocate_shared`` over a communicator whose ranks all
share a node. Every rank owns one region of it; every rank can read and write every
region through plain NumPy views, so a copy into a peer's region is one ``memcpy``.

Why MPI windows rather than named POSIX segments: MPICH and Open MPI both create the
backing file (``/dev/shm/mpich_shar_tmp*``, ``/dev/shm/osc_sm.<host>.<job>.<cid>...``,
named per host, job and communicator), map it on every rank and unlink it before
``MPI_Win_allocate_shared`` returns. From then on nothing on the file system names the
memory, so a rank that dies, even by ``SIGKILL``, leaves no segment behind: the kernel
frees the memory with the last mapping. MPI also gives the memory barrier that
non-x86 processors need (``MPI_Win_sync``).

Synchronization uses single-writer sequence counters: 64-bit words in a control block,
each on a cache-line pair of its own (128 bytes, so the adjacent-line prefetcher does
not couple two writers), written only by the region's owner and read by everyone.
Counters only grow, so a reader compares against the value it needs and never misses
an update. Ordering: the owner writes data, then the counter; a reader reads the
counter, then the data. x86-64 keeps stores in order and loads in order (TSO), and each
NumPy call is a separate C function the compiler cannot reorder across, so there no
barrier is needed; elsewhere :meth:`Window.fence` calls ``MPI_Win_sync`` around every
publish and after every observe.
"""
from __future__ import annotations

import os
import platform
import time
from typing import Any, List, Optional

import numpy as np
from mpi4py import MPI

from ..work import poll

#: Positions (int64 words) of the control words at the start of each rank's region.
#: Each counter has two cache lines (128 bytes) of its own; an operation's descriptor
#: (which user window and offset its buffer lies at) shares ENTER's line, since the same
#: rank writes them together.
STAGED, REDUCED, CONSUMED, ENTER = 0, 16, 32, 48
WINDOW, OFFSET = ENTER + 1, ENTER + 2
#: Bytes of the control block (a page, so the data behind it is page-aligned).
CONTROL_BYTES = 4096

#: ``HPCCOMM_SHM_FENCE=1`` forces ``MPI_Win_sync`` barriers even on x86 (tests use it).
FENCE_ENV = "HPCCOMM_SHM_FENCE"
_TSO = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def needs_fence() -> bool:
    """Whether publishing and observing counters need a memory barrier here."""
    forced = os.environ.get(FENCE_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return not _TSO


class Window:
    """A shared window of ``nbytes`` per rank over ``node`` (every rank on one node).

    ``regions[p]`` is rank ``p``'s region as a uint8 array, ``words[p]`` its control
    words (when ``control``) as a ``memoryview`` of int64: ``words[p][STAGED]`` is a
    Python int, the cheapest read and write Python has. Collective over ``node``; the caller has made sure every
    rank arrives (the group creation or a rendezvous under a deadline).
    """

    def __init__(self, node: Any, nbytes: int, control: bool = True):
        self.node = node
        self.rank, self.size = node.Get_rank(), node.Get_size()
        total = nbytes + (CONTROL_BYTES if control else 0)
        self.win = MPI.Win.Allocate_shared(max(total, 1), 1, comm=node)
        self.fenced = needs_fence()
        if self.fenced:  # MPI_Win_sync is defined inside a passive-target epoch
            self.win.Lock_all(MPI.MODE_NOCHECK)
        self.regions: List[np.ndarray] = []
        for peer in range(self.size):
            memory, _ = self.win.Shared_query(peer)
            self.regions.append(np.frombuffer(memory, dtype=np.uint8)[:total])
        self.words: List[Any] = []
        if control:
            self.regions[self.rank][:CONTROL_BYTES] = 0
            node.Barrier()  # every control block is zero before anyone reads it
            self.words = [memoryview(region[:CONTROL_BYTES]).cast("q") for region in self.regions]
            self.regions = [region[CONTROL_BYTES:] for region in self.regions]
        self.nbytes = nbytes
        self.base = self.regions[self.rank].ctypes.data if nbytes else 0

    def fence(self) -> None:
        """A full memory barrier (``MPI_Win_sync``) where the processor needs one."""
        if self.fenced:
            self.win.Sync()

    def owns(self, arr: np.ndarray) -> Optional[int]:
        """Byte offset of ``arr`` in this rank's region, or ``None`` if it lies elsewhere."""
        start = arr.ctypes.data
        if self.nbytes and self.base <= start and start + arr.nbytes <= self.base + self.nbytes:
            return start - self.base
        return None

    def free(self) -> None:
        """Release the window. Collective and blocking: call it only once every rank is
        known to be freeing it too (:func:`arrived`)."""
        self.regions, self.words = [], []
        if self.win == MPI.WIN_NULL or MPI.Is_finalized():
            return
        if self.fenced:
            self.win.Unlock_all()
        self.win.Free()


def arrived(comm: Any, timeout: Optional[float]) -> bool:
    """Whether every rank of ``comm`` arrived at this point within ``timeout`` seconds
    (a barrier polled under a deadline: the meeting before a blocking collective)."""
    return not poll(comm.Ibarrier().Test, timeout)


def rendezvous(comm: Any, timeout: Optional[float], what: str) -> None:
    """Return once every rank of ``comm`` has arrived, or raise a timeout error naming
    ``what``."""
    from ..errors import DistTimeoutError

    start = time.monotonic()
    if not arrived(comm, timeout):
        raise DistTimeoutError(
            f"{what} on rank {comm.Get_rank()}/{comm.Get_size()} of the node's ranks timed "
            f"out after {time.monotonic() - start:.3f} s (timeout {timeout} s): some rank "
            f"of the group did not call it")


def shm_space_ok(nbytes: int) -> bool:
    """Whether ``/dev/shm`` (where MPI libraries put shared windows) has ``nbytes`` free;
    ``True`` when it cannot be told (no ``/dev/shm``)."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return True
    return stat.f_bavail * stat.f_frsize >= nbytes
