"""The progress thread: completes asynchronous operations nobody is polling.

MPI advances a nonblocking operation only while some thread is inside an MPI call. A
Python caller that waits polls the request itself (no hand-off), but two kinds of caller
never poll: C++ code blocked on a Work's torch Future (DDP's reducer, comm hooks), and a
program computing while a large asynchronous operation should progress. For them one
daemon thread per process tests the outstanding requests, settles their futures and
enforces their deadlines.

It starts on the first asynchronous operation or future, never for a synchronous call,
and it is built to stay out of the way: on a busy node a helper that spins, or wakes for
every operation, competes with the ranks for the cores, the GIL and MPI's lock
(measured on 2 ranks sharing 2 cores: an 8-byte async all-reduce waited at once took
about 10x longer with a spinning thread beside the waiter, about 5x with a thread woken
per operation). So it polls in rounds separated by sleeps, not by spinning: every
:data:`POLL_S` while it drives operations, backing off to :data:`MAX_SLEEP_S` while
there is nothing for it to do, and blocking on a condition variable after
:data:`LINGER_S` of that. Between rounds the GIL is free and the program runs
undisturbed, while MPI still progresses every request as the caller computes.

* an asynchronous operation is picked up at the thread's next round (within
  :data:`MAX_SLEEP_S`); most are waited for before, and the thread never touches them;
* a future is wanted by code that will block in C++: it wakes the thread at once;
* while a Python thread waits on a Work it polls MPI itself (which progresses every
  request of the process), so the thread skips its rounds (:meth:`Progress.hold`);
* works their callers have finished leave the queue within a few operations
  (:data:`PRUNE_AT`) and never make the thread poll closely: a stream of async ops
  waited at once neither keeps hundreds of dead works alive between rounds (each
  garbage collection would promote them, and full collections take tens of ms with
  torch loaded) nor has the thread take the GIL every :data:`POLL_S`.

It needs MPI_THREAD_MULTIPLE (mpi4py's default); below that, :func:`available` is false
and futures are completed by waiting for them.
"""
from __future__ import annotations

import atexit
import collections
import threading
import time
from typing import Any, Deque, List, Optional

from ..mpi_level import helper_lock

_monotonic = time.monotonic
#: Pause between two rounds of tests while operations are driven (the kernel makes it
#: ~0.1 ms).
POLL_S = 50e-6
#: Longest pause while there is nothing to drive (or a waiter polls).
MAX_SLEEP_S = 2e-3
#: Idle time after which the thread blocks until an operation wakes it.
LINGER_S = 0.1
#: Queue length from which an add first drops the works already finished.
PRUNE_AT = 16
#: MPI_THREAD_MULTIPLE's value in every MPI library hpccomm supports (MPICH, Open MPI,
#: Intel MPI number the levels 0-3).
_THREAD_MULTIPLE = 3


_multiple: Optional[bool] = None


def available() -> bool:
    """Whether MPI allows a second thread to make MPI calls (MPI_THREAD_MULTIPLE)."""
    global _multiple
    if _multiple is None:
        from ..backends.mpi import plumbing as mpi  # initializes MPI if nothing has yet

        _multiple = mpi.thread_level() >= _THREAD_MULTIPLE
    return _multiple


class Progress:
    """The thread and its queue of works (objects with ``advance(settle)`` and
    ``expire(now, settle)``, both true once the work has finished, ``settle()``, which
    closes a finished work out, and ``done``, true once it is known to have finished)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._incoming: Deque[Any] = collections.deque()  # appended without the lock
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self._held = 0           # Python waiters polling MPI themselves
        self._held_lock = threading.Lock()  # += is not atomic across threads
        self._parked = False     # the thread blocks on the condition variable
        self._wake = False       # an urgent work (or stop) came: skip the next pause
        self._prune_at = PRUNE_AT  # queue length at which add() drops finished works

    def add(self, work: Any, urgent: bool = False) -> None:
        """Have the thread drive ``work`` until it finishes (starts the thread once);
        ``urgent`` wakes it now instead of at its next round."""
        if self._stopping:
            raise RuntimeError("hpccomm.torch: the progress thread has stopped "
                               "(interpreter shutting down)")
        incoming = self._incoming
        incoming.append(work)
        if len(incoming) > self._prune_at:
            self._prune()
        if self._thread is None or self._parked or urgent:
            with self._cond:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name="hpccomm-progress")
                    self._thread.start()
                    atexit.register(self.stop)  # runs before mpi4py finalizes MPI
                self._wake = True
                self._cond.notify()

    def _prune(self) -> None:
        """Drop the finished works from the queue (in place: other threads may append
        meanwhile; the thread drains it under the same lock). Works waited for at once
        would otherwise live until the thread's next round, and hundreds of them
        outliving the garbage collector's young generations make its full collections
        (tens of ms with torch loaded) far more frequent."""
        incoming = self._incoming
        with self._cond:
            for _ in range(len(incoming)):
                work = incoming.popleft()
                if not work.done:
                    incoming.append(work)
            # many works still running: prune again only once the queue has doubled
            self._prune_at = max(PRUNE_AT, 2 * len(incoming))

    def hold(self) -> None:
        """A caller starts polling MPI itself: the thread skips its rounds meanwhile."""
        with self._held_lock:
            self._held += 1

    def release(self) -> None:
        """The caller stopped polling."""
        with self._held_lock:
            self._held -= 1

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop the thread (called at exit, before MPI_Finalize); idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        active: List[Any] = []
        idle_since = _monotonic()
        delay = POLL_S
        cond = self._cond
        incoming = self._incoming
        while True:
            with cond:
                if incoming:  # works streaming in keep the thread from parking
                    idle_since = _monotonic()
                    while incoming:
                        work = incoming.popleft()
                        if not work.done:
                            active.append(work)
                    self._prune_at = PRUNE_AT
                if self._stopping:
                    return
                if not active and _monotonic() - idle_since > LINGER_S:
                    # parked is set before the queue is checked: an add() that comes
                    # after the check sees it and notifies (under this lock, so the
                    # notification reaches the wait)
                    self._parked = True
                    while not (self._incoming or self._stopping):
                        cond.wait()
                    self._parked = False
                    idle_since, delay = _monotonic(), POLL_S
                    continue
            if active and not self._held:
                # every MPI call of the round (tests, the timeouts' roll calls) under the
                # lock, so never inside MPI while an agreement progresses; the user's code
                # that finished works run (future callbacks, abort hooks) after it
                with helper_lock:
                    ended = [work for work in active if _advance(work)]
                    now = _monotonic()
                    ended += [work for work in active if not work.done and _expire(work, now)]
                for work in ended:
                    _settle(work)
                gone = {id(work) for work in ended}
                active = [work for work in active if id(work) not in gone and not work.done]
                idle_since = now
                # close polling only for operations still running with nobody waiting;
                # works their callers already completed (async ops waited at once) are
                # no reason to wake again soon: each wake-up takes the GIL from them
                delay = POLL_S if active else min(delay * 2, MAX_SLEEP_S)
            else:  # a waiter polls MPI: only forget the works finished meanwhile
                active = [work for work in active if not work.done]
                delay = min(delay * 2, MAX_SLEEP_S)
            with cond:
                # a work added since is picked up after the pause, like any other: only
                # a wake-up (urgent work, stop) cuts it short. Skipping the pause for every
                # new work would keep the thread on the GIL while async ops stream in.
                if not (self._wake or self._stopping):
                    cond.wait(delay)
                self._wake = False


def _advance(work: Any) -> bool:
    """One test of ``work``, not yet settled; a failure inside it finishes the work,
    never the thread."""
    try:
        return work.advance(settle=False)
    except BaseException:  # the work recorded its error; its waiter will raise it
        return True


def _expire(work: Any, now: float) -> bool:
    """Time ``work`` out if its deadline passed (not yet settled); whether it ended."""
    try:
        return work.expire(now, settle=False)
    except BaseException:  # a timeout hook failed: the work has its error all the same
        return True


def _settle(work: Any) -> None:
    """Close ``work`` out (the user's callbacks run here, outside :data:`helper_lock`);
    an error there is the callback's, never the thread's end."""
    try:
        work.settle()
    except BaseException:
        pass


#: The process's progress thread (started on first use).
progress = Progress()
