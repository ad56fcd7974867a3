"""The NCCL communicators of a group, from creation to abort: what
:class:`~.nccl.NCCLCommunicator` inherits from :class:`Communicators`.

A group's communicator is made on its first GPU collective (or at once,
``init_process_group(device_id=...)``), after the meeting of its ranks over MPI
(:mod:`.shared_gpu`), from one unique id or, through nccl4py, from one per block of
ranks; a pair's for a first send between two ranks; a child's by ``ncclCommSplit`` of
its parent's. Blocking creations run under :func:`.deadline.bounded` (past the timeout
the job ends: they cannot be interrupted); nonblocking ones (nccl4py) are polled under
the timeout and aborted past it, with a DistTimeoutError on that rank. A failure aborts
them all (``ncclCommAbort``, which waits for no other rank); a normal end destroys them
in creation order.
"""
from __future__ import annotations

import time
from typing import Any, List, Optional

from ...errors import DistBackendError, DistError, DistTimeoutError
from ...work import Work
from . import deadline, device as _cuda, nccl4py_binding, shared_gpu

#: The first NCCL release with ``ncclCommSplit`` (as ``major * 10000 + minor * 100``).
SPLIT_SINCE = 21800


def can_split(nccl: Any) -> bool:
    """Whether ``nccl`` (CuPy's module, or :mod:`.nccl4py_binding`) splits
    communicators: CuPy 14 or later (``NcclCommunicator.commSplit``; nccl4py always),
    built with and running on NCCL 2.18 or later."""
    built = getattr(nccl, "get_build_version", None)
    return (hasattr(getattr(nccl, "NcclCommunicator", None), "commSplit")
            and built is not None and built() >= SPLIT_SINCE
            and nccl.get_version() >= SPLIT_SINCE)


class Communicators:
    """The life cycle of a group's NCCL communicators (a mixin of
    :class:`~.nccl.NCCLCommunicator`, which holds the state it uses)."""

    def _new_comm(self, members: List[int], key: str) -> Any:
        """The NCCL communicator ``key`` of ``members`` (group ranks, in its rank order;
        this rank among them), made after their meeting from a unique id (or one per
        block of ranks: :func:`.shared_gpu.root_ids`), its creation under the group's
        timeout: polled, then aborted, if nonblocking (:meth:`_settle`), else watched
        (:func:`.deadline.bounded`)."""
        whole = len(members) == self.size  # the group's own (else a pair's)
        roots = nccl4py_binding.roots_for(self.size, self.ranks_per_root) if whole else 1
        uid = shared_gpu.meet(self.mpi_comm, members, key, self.cp, self.device,
                              self.timeout, self.nccl.get_unique_id if roots == 1 else None)
        what = shared_gpu.creation(key, members)
        if roots > 1:
            uid = shared_gpu.root_ids(self.mpi_comm, roots, self.nccl.get_unique_id,
                                      self.timeout, what)
        me = members.index(self.rank)
        if self.nonblocking:
            with self._dev:
                made = self.nccl.NcclCommunicator(len(members), uid, me, blocking=False)
            self._created.append(made)
            self._settle(made, what, self.timeout)
            return made
        with self._dev, deadline.bounded(what, self.rank, self.size, self.timeout):
            made = self.nccl.NcclCommunicator(len(members), uid, me)
        self._created.append(made)
        return made

    def _settle(self, made: Any, what: str, timeout: Optional[float],
                parent: bool = False) -> None:
        """Wait for the nonblocking creation or split ``made`` under ``timeout``; past it,
        abort it (and, after a split, this group's communicators too: the parent is
        mid-split) and raise a DistTimeoutError on this rank: its process goes on."""
        made.deadline, made.on_stall = self.timeout, self._stalled
        if made.settle(timeout):
            return
        made.abort()
        if made in self._created:
            self._created.remove(made)
        outcome = "It was aborted (ncclCommAbort); the group stays usable for CPU arrays."
        if parent:
            self.fail(None, f"{what} did not finish within {timeout:g} s")
            outcome = ("It was aborted (ncclCommAbort), and so were the NCCL "
                       "communicators of the group it was split from, which were mid-split: "
                       "that group's GPU operations raise from now on, its CPU arrays still "
                       "work.")
        raise DistTimeoutError(deadline.message(what, self.rank, self.size, timeout,
                                                outcome))

    def _stalled(self, what: str, seconds: float) -> BaseException:
        """A call on a nonblocking communicator stayed in progress past the timeout: the
        group fails (its communicators aborted) with a DistTimeoutError."""
        self.fail(None, f"NCCL's {what} stayed in progress (ncclInProgress) for "
                        f"{seconds:g} s")
        return self.failure

    def _full(self) -> Any:
        """The group's NCCL communicator; made on first use (collective over the group,
        after the meeting that names absent ranks: :func:`.shared_gpu.meet`)."""
        if self._comm is None:
            self._not_capturing("its first collective makes the group's NCCL communicator")
            self._comm = self._new_comm(list(range(self.size)), "group")
        return self._comm

    def connect(self) -> None:
        """Make the group's NCCL communicator now (collective over the group), as
        ``init_process_group(device_id=...)`` does for the default group."""
        with self._lock:
            self._full()

    def splittable(self) -> bool:
        """Whether :meth:`split` makes children here: the group's NCCL communicator
        exists and works, and NCCL and CuPy can split it."""
        return (self._comm is not None and self.failure is None and not self._closed
                and can_split(self.nccl))

    def split(self, child: Optional[Any], timeout: Optional[float]) -> Optional[Any]:
        """The NCCL communicator of ``child`` (an MPI communicator made of some of this
        group's ranks, just split from the group's), made with ``ncclCommSplit`` from
        this group's: no unique id, no root, the parent's bootstrap network reused.

        Collective over this group: every rank calls it right after the MPI split (a
        rank in no part passes ``None`` and gets ``None``), when :meth:`splittable`.
        The ranks meet over MPI first, under ``timeout``, so a rank that does not come
        is named on every rank that did, instead of leaving them in NCCL's split. The
        child's ranks keep the MPI communicator's order."""
        self._not_capturing("splitting the group's NCCL communicator")
        self._splits += 1
        key = f"split {self._splits}"
        shared_gpu.meet(self.mpi_comm, list(range(self.size)), key, self.cp, self.device,
                        self.timeout if timeout is None else timeout, None)
        color, rank = nccl4py_binding.NOCOLOR, 0
        if child is not None:
            from ..mpi.plumbing import ranks_in

            color, rank = min(ranks_in(child, self.mpi_comm)), child.Get_rank()
        what = shared_gpu.creation(key, list(range(self.size)))
        within = self.timeout if timeout is None else timeout
        if self.nonblocking:
            with self._lock, self._dev:
                made = self._comm.commSplit(color, rank)
            # no part here: the parent says when the split is done
            self._settle(self._comm if made is None else made, what, within, parent=True)
        else:
            with self._lock, self._dev, deadline.bounded(what, self.rank, self.size,
                                                         within):
                made = self._comm.commSplit(color, rank)
        if child is None:
            return None
        adopted = type(self)(child, timeout)
        adopted._comm = made
        adopted._created.append(made)
        return adopted

    def shrinkable(self) -> bool:
        """Whether :meth:`shrink` makes the shrunk group's communicator here: the group's
        NCCL communicator exists and works, through nccl4py, on NCCL 2.27 or later."""
        return (self.nccl is nccl4py_binding and self._comm is not None
                and self.failure is None and not self._closed
                and self.nccl.get_version() >= nccl4py_binding.SHRINK_SINCE)

    def shrink(self, child: Any, exclude: List[int], after_failure: bool,
               timeout: Optional[float]) -> Any:
        """The NCCL communicator of ``child`` (the MPI communicator of this group's ranks
        but ``exclude``, in order: ``shrink_group``'s), made by ``ncclCommShrink`` of this
        group's: no unique id, no bootstrap. Called by ``child``'s ranks only, once they
        have met (ULFM's agreement, or ``shrink_group``'s meeting), when
        :meth:`shrinkable`; under ``timeout`` as any creation."""
        what = (f"NCCL communicator shrink (this group's without group rank(s) "
                f"{', '.join(map(str, exclude))}) (ncclCommShrink)")
        within = self.timeout if timeout is None else timeout
        if self.nonblocking:
            with self._lock, self._dev:
                made = self._comm.commShrink(exclude, after_failure)
            self._settle(made, what, within)
        else:
            with self._lock, self._dev, deadline.bounded(what, self.rank, self.size,
                                                         within):
                made = self._comm.commShrink(exclude, after_failure)
        adopted = type(self)(child, timeout)
        adopted._comm = made
        adopted._created.append(made)
        return adopted

    # -- failure and life cycle ---------------------------------------------------------------
    def async_error(self) -> Optional[str]:
        """NCCL's asynchronous error of any of our communicators, as text (or ``None``)."""
        for made in list(self._created):
            try:
                made.check_async_error()
            except Exception as exc:
                return str(exc)
        return None

    def fail(self, work: Optional[Work], message: str, abort: bool = True,
             waited: float = 0.0, timeout: bool = True) -> None:
        """Record the failure every later call and wait raises; abort the communicators."""
        if self.failure is None:
            kind = DistTimeoutError if timeout else DistBackendError
            self.failure = kind(f"hpccomm NCCL backend, rank {self.rank}/{self.size}: "
                                f"{message}; the NCCL communicator was aborted "
                                f"(ncclCommAbort) and this group is unusable: call "
                                f"destroy_process_group() or abort the job")
            _cuda.run_timeout_hooks(work, waited)
        if abort:
            self._abort_comms()

    def _abort_comms(self) -> None:
        got = self._lock.acquire(timeout=5)  # abort anyway if the main thread is stuck
        try:
            self._let_go("abort")
        finally:
            if got:
                self._lock.release()

    def _let_go(self, how: str) -> None:
        """``abort`` or ``destroy`` every communicator made, in creation order, then
        forget them (one that fails to does not keep the others)."""
        for made in self._created:
            try:
                getattr(made, how)()
            except Exception:
                pass
        self._created = []
        self._comm = None
        self._pairs.clear()

    def shutdown(self) -> None:
        """Finish outstanding work (bounded by the timeout), then destroy in creation order."""
        if self._closed:
            return
        self._closed = True
        if self.failure is None and self._created:
            # synchronous calls ran on the callers' streams: their events say when done
            until = time.monotonic() + (self.timeout if self.timeout is not None else 1e9)
            while not self.stream.done or self.watchdog.pending():
                if self.failure is not None:  # the watchdog aborted meanwhile
                    break
                if time.monotonic() > until:
                    self.watchdog.close()
                    self.fail(None, "work still pending at shutdown after the timeout",
                              abort=True)
                    return
                time.sleep(0.0005)
        self.watchdog.close()
        self._let_go("destroy")

    def abort(self) -> None:
        """``ncclCommAbort`` every communicator of this group (nothing blocks)."""
        self._closed = True
        self.watchdog.close()
        if self.failure is None:
            self.failure = DistError("the NCCL communicator was aborted")
        self._abort_comms()
