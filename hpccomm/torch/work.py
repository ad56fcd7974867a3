"""torch ``Work`` objects for hpccomm operations.

torch's Python wrappers call ``wait()`` on the Work a group returns, and C++ callers
(functional collectives, DDP's reducer) reach ``wait()`` and ``get_future()`` through
torch's Work trampoline, so both are Python subclasses of ``torch.distributed.Work``:

* :class:`DoneWork` for a synchronous call, already complete when it is returned;
* :class:`PendingWork` for an asynchronous one, around hpccomm's own
  :class:`~hpccomm.work.Work` (its test, finishing step, deadline and error messages).
  ``wait()`` polls the MPI request on the caller's thread (no hand-off). Work that must
  progress without a poller (asynchronous operations, futures) is also driven by the
  :mod:`progress thread <hpccomm.torch.progress>`; a per-work lock makes sure only one
  thread tests a request at a time, as MPI requires.

A future's value is the list of output tensors, as torch's backends give it.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Optional

import torch.distributed as dist
from torch.futures import Future

from ..types import timeout_seconds
from ..work import Work as _HWork
from ..work import poll
from . import flight_recorder as _fr
from . import progress as _progress
from .errors import for_torch

_monotonic = time.monotonic
_INF = float("inf")


def _limit(timeout: Any) -> Optional[float]:
    """Seconds from a ``wait(timeout)`` argument; ``None``/0 means the operation's own."""
    if timeout is None:
        return None
    seconds = timeout_seconds(timeout)
    return seconds if seconds else None


class _Failed:
    """The outcome of a failed operation, on its inner future (see :func:`_outcome`)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _outcome(inner: Future) -> List[Any]:
    """The value of the future ``get_future()`` hands out: the output tensors, or the
    operation's error raised. Raised in a ``then`` callback, the error marks that future
    failed in C++ too (``Future.set_exception`` would only be seen from Python: DDP's
    reducer, in C++, would take the exception object for its tensors)."""
    value = inner.value()
    if isinstance(value, _Failed):
        raise value.error
    return value


class DoneWork(dist.Work):
    """The Work of an operation that completed before it was returned."""

    def __init__(self, outputs: List[Any], source: Optional[int] = None):
        super().__init__()
        self._outputs = outputs
        self._source = source

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Optional[BaseException]:
        return None

    def result(self) -> List[Any]:
        return self._outputs

    def synchronize(self) -> None:
        pass

    def block_current_stream(self) -> None:
        pass

    def get_future(self) -> Future:
        future: Future = Future()
        future.set_result(self._outputs)
        return future

    def _source_rank(self) -> int:
        if self._source is None:
            raise dist.DistError("source_rank() is known only for a completed receive")
        return self._source

    source_rank = _source_rank


#: What a synchronous call returns: torch's wrappers call ``wait()`` on it and drop it
#: (an asynchronous call, ``opts.asyncOp`` true, gets a Work of its own). Sharing one
#: saves building a torch Work, a quarter of the overhead budget of a small all-reduce.
DONE = DoneWork([])


class PendingWork(dist.Work):
    """An asynchronous operation in flight: hpccomm's Work behind torch's interface."""

    def __init__(self, work: _HWork, outputs: List[Any],
                 on_error: Optional[Callable[[BaseException], None]] = None):
        super().__init__()
        self._work = work
        self._outputs = outputs
        #: Told the operation's error once, when it failed (the group's error state).
        self._on_error = on_error
        #: The operation's profiler event, ended when it finishes (:meth:`end_with`).
        self._record: Any = None
        #: Its flight recorder entry, stamped when it completes (:meth:`trace`).
        self._entry: Any = None
        self._lock = threading.Lock()  # held by the thread testing the MPI request
        self.done = False              # finished (completed or failed)
        self._shared = False           # the progress thread drives it too
        self._polled = False           # a waiter polls it: the thread leaves it alone
        self._future: Optional[Future] = None
        self._returned: Optional[Future] = None  # what get_future() hands out
        self._settled = False          # the future, if any, has its outcome
        self._closing = 0              # the thread closing it out (event, error), once one is
        self._closed = False           # ... and has finished: waiters may return
        self._start = _monotonic()
        limit = work.timeout
        self._deadline = _INF if limit is None else self._start + limit

    # -- driving ------------------------------------------------------------------------
    def advance(self, settle: bool = True) -> bool:
        """Test once without blocking; true once the operation has finished. Then it is
        closed out (:meth:`settle`) unless ``settle`` is false: the progress thread
        tests under :data:`~hpccomm.mpi_level.helper_lock` and settles after it, since
        settling runs the user's code (future callbacks, abort hooks)."""
        if self.done:
            return True
        if not self._lock.acquire(False):  # the other thread is testing it right now
            return False
        try:
            if self.done:
                return True
            if self._polled:  # a waiter tests it and settles it
                return False
            try:
                finished = self._work.is_completed()  # runs the finishing step
            except BaseException:  # failed: hpccomm's Work holds the error
                finished = True
            self.done = finished
        finally:
            self._lock.release()
        if finished and settle:
            self._settle()
        return finished

    def _finished(self) -> bool:
        return self.done

    def expire(self, now: float, settle: bool = True) -> bool:
        """Fail with a timeout if the deadline has passed (progress thread); true if so.
        The timeout's hooks (the roll call, with its MPI calls) run here; closing it out
        (:meth:`settle`) too unless ``settle`` is false, as for :meth:`advance`."""
        if self.done or now <= self._deadline:
            return self.done
        self._time_out(now - self._start, self._work.timeout, settle)
        return True

    def settle(self) -> None:
        """Close out a finished work: its profiler event, the group's failure report
        (abort hooks) and its future (callbacks). Once; any thread may call it."""
        if self.done:
            self._settle()

    def _time_out(self, waited: float, limit: Optional[float], settle: bool = True) -> None:
        with self._lock:
            if self.done or self._polled:  # a waiter enforces its own limit
                return
            try:
                self._work.timed_out(waited, limit)  # always raises, after the hooks
            except Exception:
                pass
            self.done = True
        if settle:
            self._settle()

    def end_with(self, record: Any) -> None:
        """End ``record`` (a profiler event, :mod:`.profiling`) when the operation
        finishes, on the thread that finishes it; at once if it has."""
        with self._lock:
            if not self.done:
                self._record = record
                return
        record.end()

    def trace(self, entry: Any) -> None:
        """Stamp ``entry`` (:mod:`.flight_recorder`) when the operation completes, on the
        thread that completes it; at once if it has. A failed operation's stays as it
        was: issued, never seen to finish."""
        with self._lock:
            if not self.done:
                self._entry = entry
                return
        if self._work.exception() is None:
            _fr.completed(entry)

    def _settle(self) -> None:
        """Once finished: end the profiler event and report a failure to the group,
        exactly once, then complete the future, if one was handed out. Every thread that
        saw the operation finish calls this, and none returns before the event has ended
        and the failure was reported: a waiter whose operation another thread completed
        must not leave its profiler (or see the error) before the event is recorded (or
        the group's abort hooks ran). (get_future() makes the future before it checks
        ``done``, and the completing thread sets ``done`` before it calls this, so one
        of the two always sees both.)"""
        if not self._closed:
            with self._lock:
                mine = not self._closing
                if mine:
                    self._closing = threading.get_ident()
            if mine:
                try:
                    record = self._record
                    if record is not None:
                        self._record = None
                        record.end()
                    entry = self._entry
                    if entry is not None and self._work.exception() is None:
                        _fr.completed(entry)
                    if self._on_error is not None:
                        error = self._work.exception()
                        if error is not None:
                            report, self._on_error = self._on_error, None
                            report(error)
                finally:
                    self._closed = True
            elif self._closing != threading.get_ident():  # another thread closes it out
                poll(self._closed_out, None)  # (a few µs; a hook of this thread's own
                #                                that waits on the work returns at once)
        if self._future is None:
            return
        with self._lock:
            future = self._future
            if future is None or self._settled:
                return
            self._settled = True
        error = self._work.exception()
        future.set_result(self._outputs if error is None else _Failed(for_torch(error)))

    def _closed_out(self) -> bool:
        return self._closed

    def share(self, urgent: bool = False) -> "PendingWork":
        """Have the progress thread drive the work too (if MPI allows a second thread);
        ``urgent``: from now on, not from its next round."""
        if not self.done and _progress.available() and (urgent or not self._shared):
            self._shared = True
            _progress.progress.add(self, urgent)
        return self

    # -- torch's Work interface ------------------------------------------------------------
    def wait(self, timeout: Any = None) -> bool:
        """Block until complete; raise its error, or a timeout error naming the operation."""
        if not self.done:
            limit = _limit(timeout)
            if not self._shared:
                try:
                    self._work.wait(limit)
                except Exception:  # recorded as the work's error, raised below
                    pass
                self.done = True
                self._settle()
            else:
                runner = _progress.progress
                runner.hold()  # this thread polls; the progress thread steps aside
                try:
                    with self._lock:  # the thread may be testing it: let that test end
                        mine = not (self.done or self._polled)
                        self._polled = True
                    if mine:  # from here on only this thread tests the request
                        try:
                            self._work.wait(limit)
                        except Exception:  # recorded as the work's error, raised below
                            pass
                        except BaseException:  # interrupted: the thread takes it back
                            self._polled = False
                            raise
                        self.done = True
                    else:  # another thread waits on it already: wait for that one
                        poll(self._finished, None)
                finally:
                    runner.release()
                self._settle()
        elif not self._closed:  # finished by the progress thread, maybe still closing
            self._settle()
        error = self._work.exception()
        if error is not None:
            raise for_torch(error)
        return True

    def is_completed(self) -> bool:
        if not self.advance():
            return False
        if not self._closed:  # as in wait(): the event ended before the caller goes on
            self._settle()
        return True

    def is_success(self) -> bool:
        return self.is_completed() and self._work.exception() is None

    def exception(self) -> Optional[BaseException]:
        error = self._work.exception()
        return None if error is None else for_torch(error)

    def result(self) -> List[Any]:
        self.wait()
        return self._outputs

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()

    def get_future(self) -> Future:
        """A torch Future completed with the output tensors when the operation finishes.

        The progress thread completes it, so C++ code may block on it. Without
        MPI_THREAD_MULTIPLE the operation is waited for here instead."""
        with self._lock:
            future = self._future
            if future is None:
                future = self._future = Future()
                self._returned = future.then(_outcome)
        if self.done:
            self._settle()
        elif _progress.available():
            self.share(urgent=True)  # C++ may block on it: no one else would poll
        else:
            try:
                self.wait()
            except Exception:  # the future carries it
                pass
            self._settle()
        return self._returned

    def _source_rank(self) -> int:
        self.wait()
        try:
            return self._work.source_rank()
        except BaseException as exc:
            raise for_torch(exc) from None

    source_rank = _source_rank

    def __repr__(self) -> str:
        return f"<hpccomm.torch.PendingWork {self._work!r}>"

