"""Shared memory between the ranks of one node: segments, their counters, their lifetime.

A :class:`Segment` is one file in ``/dev/shm`` mapped by every rank of a node
communicator; each rank owns one region of it and can read and write every region
through plain NumPy views, so a copy into a peer's region is one ``memcpy``.

**Lifetime.** The file is named per host, job and communicator
(``hpccomm-<host>-<job>-<creator pid>-<number>-<random>``); rank 0 creates it, every rank
maps it, and once all have mapped it (a barrier: creation happens inside a collective)
rank 0 unlinks it. From then on nothing on the file system names the memory, so a rank
that dies, even by ``SIGKILL``, leaves nothing behind: the kernel frees the memory with
the last mapping. Should a rank die in the few milliseconds between creation and unlink,
the next segment created on that host removes files whose creator is gone. Releasing a
segment is local (dropping the mapping), so destroying a group never waits for a peer.

Why not MPI-3 shared windows (``MPI_Win_allocate_shared``)? They would do (MPICH and
Open MPI also unlink their backing file early), but ``MPI_Win_free`` is collective and
blocking: a group destroyed by one rank and not by another would hang in teardown, and
no deadline can make that call safe. The copies are the same either way (both are
shared mappings of a tmpfs file).

**Synchronization** uses single-writer sequence counters: 64-bit words in a control
block at the start of each region, each on a cache-line pair of its own (128 bytes, so
the adjacent-line prefetcher does not couple two writers), written only by the region's
owner and read by everyone. Counters only grow, so a reader compares against the value
it needs and never misses an update. Ordering: the owner writes data, then the counter;
a reader reads the counter, then the data. x86-64 keeps stores in order and loads in
order (TSO), and each NumPy call is a separate C function the compiler cannot reorder
across, so there no barrier is needed; elsewhere :meth:`Segment.fence` is a full memory
barrier (``MPI_Win_sync`` on a window of this process alone) around every publish and
after every observe.
"""
from __future__ import annotations

import atexit
import mmap
import os
import platform
import re
import secrets
import socket
import time
from typing import Any, List, Optional

import numpy as np

from ... import launcher_env, settings
from ...work import poll

#: Positions (int64 words) of the control words at the start of each rank's region.
#: Each counter has two cache lines (128 bytes) of its own; an operation's descriptor
#: (which user segment and offset its buffer lies at) shares ENTER's line, since the
#: same rank writes them together.
STAGED, REDUCED, CONSUMED, ENTER = 0, 16, 32, 48
SEGMENT, OFFSET = ENTER + 1, ENTER + 2
#: Bytes of the control block (a page, so the data behind it is page-aligned).
CONTROL_BYTES = 4096
PAGE = 4096
DIRECTORY = "/dev/shm"

_TSO = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_made = 0  # segments this process has created (part of the name)
_barrier_window: Any = None


def needs_fence() -> bool:
    """Whether publishing and observing counters need a memory barrier here."""
    forced = settings.SHM_FENCE.get()  # tests force the barriers on x86 too
    return not _TSO if forced is None else forced


def available() -> bool:
    """Whether this system has the shared-memory directory the segments live in."""
    return os.path.isdir(DIRECTORY) and os.access(DIRECTORY, os.W_OK)


def space_ok(nbytes: int) -> bool:
    """Whether the shared-memory directory has ``nbytes`` free."""
    try:
        stat = os.statvfs(DIRECTORY)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize >= nbytes


def _memory_barrier() -> None:
    """``MPI_Win_sync`` on a one-process window: a full memory barrier, portable."""
    global _barrier_window
    if _barrier_window is None:
        from mpi4py import MPI

        _barrier_window = MPI.Win.Allocate(8, 1, comm=MPI.COMM_SELF)
        _barrier_window.Lock_all(MPI.MODE_NOCHECK)
        atexit.register(_free_barrier_window)  # runs before mpi4py's MPI_Finalize
    _barrier_window.Sync()


def _free_barrier_window() -> None:
    from mpi4py import MPI

    if _barrier_window is not None and not MPI.Is_finalized():
        _barrier_window.Unlock_all()
        _barrier_window.Free()


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:40] or "host"


def _job() -> str:
    value = launcher_env.job_id()
    return re.sub(r"[^A-Za-z0-9_.-]", "_", value)[:32] if value else "job"


def _new_name() -> str:
    global _made
    _made += 1
    return f"hpccomm-{_host()}-{_job()}-{os.getpid()}-{_made}-{secrets.token_hex(4)}"


def sweep() -> int:
    """Remove this host's segments whose creating process is gone (a rank killed between
    creating and unlinking one); returns how many were removed."""
    removed = 0
    prefix = f"hpccomm-{_host()}-"
    try:
        names = os.listdir(DIRECTORY)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix):].split("-")
        if len(parts) < 4 or not parts[-3].isdigit():
            continue
        pid = int(parts[-3])
        try:
            os.kill(pid, 0)
            continue  # alive (or another user's): leave it
        except ProcessLookupError:
            pass
        except OSError:
            continue
        try:
            os.unlink(os.path.join(DIRECTORY, name))
            removed += 1
        except OSError:
            pass
    return removed


class Segment:
    """``nbytes`` of shared memory per rank of ``node`` (every rank on one node).

    ``regions[p]`` is rank ``p``'s data as a uint8 array, ``words[p]`` its control words
    (when ``control``) as a ``memoryview`` of int64: ``words[p][STAGED]`` is a Python
    int, the cheapest read and write Python has. Collective over ``node`` (blocking: the
    caller makes sure every rank is there, at group creation or after a rendezvous).
    Raises ``OSError`` on every rank if any rank could not map it.
    """

    def __init__(self, node: Any, nbytes: int, control: bool = True):
        self.rank, self.size = node.Get_rank(), node.Get_size()
        head = CONTROL_BYTES if control else 0
        per = -(-(nbytes + head) // PAGE) * PAGE or PAGE
        name = None
        if self.rank == 0:
            sweep()
            name = _new_name()
        name = node.bcast(name, root=0)
        path = os.path.join(DIRECTORY, name)
        total = per * self.size
        fd, problem = None, ""
        if self.rank == 0:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                os.ftruncate(fd, total)
            except OSError as exc:
                problem = f"rank 0 cannot create {path}: {exc}"
        root_problem = node.bcast(problem, root=0)
        if not root_problem and self.rank != 0:
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError as exc:
                problem = f"rank {self.rank} cannot open {path}: {exc}"
        memory = None
        if fd is not None:
            try:
                if not problem:
                    memory = mmap.mmap(fd, total)
            except OSError as exc:
                problem = f"rank {self.rank} cannot map {path}: {exc}"
            finally:
                os.close(fd)
        problems = [p for p in node.allgather(problem) if p]  # also: everyone has mapped
        if self.rank == 0 and fd is not None:
            try:
                os.unlink(path)  # nothing names the memory from now on
            except OSError:
                pass
        if problems:
            if memory is not None:
                memory.close()
            raise OSError(problems[0])
        self.memory = memory
        self.fenced = needs_fence()
        whole = np.frombuffer(memory, dtype=np.uint8)
        self.regions: List[np.ndarray] = [whole[p * per:(p + 1) * per] for p in range(self.size)]
        self.words: List[Any] = []
        if control:
            self.words = [memoryview(r[:CONTROL_BYTES]).cast("q") for r in self.regions]
            self.regions = [r[CONTROL_BYTES:] for r in self.regions]
        self.nbytes = nbytes
        self.base = self.regions[self.rank].ctypes.data

    def fence(self) -> None:
        """A full memory barrier where the processor needs one (not on x86-64)."""
        if self.fenced:
            _memory_barrier()

    def owns(self, arr: np.ndarray) -> Optional[int]:
        """Byte offset of ``arr`` in this rank's region, or ``None`` if it lies elsewhere."""
        start = arr.ctypes.data
        if self.nbytes and self.base <= start and start + arr.nbytes <= self.base + self.nbytes:
            return start - self.base
        return None

    def release(self) -> None:
        """Drop this process's references; the mapping goes once no array views it."""
        self.regions, self.words, self.memory = [], [], None


def rendezvous(comm: Any, timeout: Optional[float], what: str) -> None:
    """Return once every rank of ``comm`` has arrived, or raise a timeout error naming
    ``what``: the meeting point before a blocking collective."""
    from ...errors import DistTimeoutError

    start = time.monotonic()
    if poll(comm.Ibarrier().Test, timeout):
        raise DistTimeoutError(
            f"{what} on rank {comm.Get_rank()}/{comm.Get_size()} of the node's ranks timed "
            f"out after {time.monotonic() - start:.3f} s (timeout {timeout} s): some rank "
            f"of the group did not call it")
