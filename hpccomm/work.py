"""Work: the handle of one started operation, and the Future it can hand out.

A host-side backend (MPI) starts a nonblocking operation and hands back the three
arguments of a Work, ``(test, finish, keep)``: ``test()`` says, without blocking, whether
the operation is complete (``MPI_Test``), ``finish()`` runs once after completion (copy
out of a staging buffer, divide for AVG) and may return a value (a receive's source), and
``keep`` holds temporaries alive until then. A synchronous call polls ``test`` with
:func:`poll` and builds no Work at all; ``async_op=True`` wraps the triple in a Work.

Waiting spins on ``test()`` and never sleeps: a kernel wake-up costs 50-65 us on these
machines, against ~2 us for a small all-reduce. Every few polls it checks the deadline
and yields the core (``sched_yield``, not a sleep): rarely when each rank has a core of
its own, often when ranks outnumber cores, so that the rank being waited for runs (see
:func:`set_oversubscribed`). A backend that can spin on its tests in native code, with
the GIL released, does so instead (:data:`spin_wait`), under the same deadline. When
the deadline passes, the error names the operation, its sequence number, the group, the
ranks, sizes and dtype, and how long it waited, with what the observers of timeouts add
(:mod:`.observe`: the roll call names absent ranks).
"""
from __future__ import annotations

import datetime
import os
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import observe as _observe
from .errors import (DistBackendError, DistError, DistTimeoutError, Undescribed, described,
                     process_failed)
from .types import timeout_seconds

_monotonic = time.monotonic
_yield = getattr(os, "sched_yield", lambda: None)
_INF = float("inf")

#: What a host-side backend returns: the arguments of :class:`Work`.
Started = Tuple[Callable[[], bool], Optional[Callable[[], Any]], Any]

_PENDING, _DONE, _FAILED = 0, 1, 2
_STATE_NAMES = ("pending", "completed", "failed")

#: Polls between two deadline checks, each followed by a ``sched_yield``. 64 when every
#: rank has a core (a yield there returns at once); 4 when ranks outnumber cores, where
#: measured 4-rank/2-core latency is best with frequent yields (and ~200x worse without).
POLLS_ALONE, POLLS_SHARED = 64, 4
_polls_per_check = POLLS_ALONE
_spin_yield = 0  # the same for a backend's native spin: never, or every POLLS_SHARED


def set_oversubscribed(shared: bool) -> None:
    """Tell the poll loop whether this rank shares its core with other ranks."""
    global _polls_per_check, _spin_yield
    _polls_per_check = POLLS_SHARED if shared else POLLS_ALONE
    _spin_yield = POLLS_SHARED if shared else 0


def spin_yield_every() -> int:
    """For a backend's own spin loop (in C): tests between two yields of the core, 0 for
    never. Only ranks sharing cores yield: elsewhere the test calls are MPI's progress
    (its shared-memory copies run inside them), and a syscall between them slows it."""
    return _spin_yield


#: Advances the backends' own pending work (shared-memory collectives of other groups)
#: while some operation is waited for, as MPI's progress engine advances every request;
#: set by a backend while it has such work, ``None`` otherwise. Called between the polls
#: of a wait, never before the first test: an operation complete at once pays nothing.
while_waiting: Optional[Callable[[], None]] = None
#: Non-zero while a status check that must not block runs (``Work.is_completed``): a
#: backend's test may then not wait in native code for its peers, as it may in a wait.
probing = 0


#: Set by a backend that can wait on some of its tests in native code, without the GIL:
#: ``spin_wait(test, seconds)`` spins up to ``seconds`` (capped by the backend) on
#: ``test``'s operation and says whether it completed, or returns ``None`` for a test it
#: cannot spin on. A Python loop of tests releases and takes the GIL at every test,
#: which a thread waiting for the GIL turns into a storm of wake-ups until the
#: interpreter forces a switch (5 ms); a native spin releases it once.
spin_wait: Optional[Callable[[Callable[[], bool], float], Optional[bool]]] = None


def poll(test: Callable[[], bool], limit: Optional[float]) -> float:
    """Call ``test()`` until it is true: return 0.0, or the seconds waited once ``limit``
    seconds (``None``: no limit) have passed first. Spins; never sleeps."""
    start = _monotonic()
    deadline = _INF if limit is None else start + limit
    spin = spin_wait
    if spin is not None and while_waiting is None:
        done = spin(test, deadline - start)
        if done is not None:  # the backend spins on it; the deadline is checked between
            while not done:
                now = _monotonic()
                if now > deadline:
                    return max(now - start, 1e-9)
                if while_waiting is not None:  # other work to advance: the loop below
                    break
                done = spin(test, deadline - now)
            if done:
                return 0.0
    every = _polls_per_check
    polls = 0
    while not test():
        progress = while_waiting
        if progress is not None:
            progress()
        polls += 1
        if polls == every:
            polls = 0
            _yield()
            now = _monotonic()
            if now > deadline:
                return max(now - start, 1e-9)
    return 0.0


#: Operations given up before they completed (a timeout, a failure, a Work dropped while
#: pending, a group destroyed under it), as ``(test, keep, group)``: MPI may still read or
#: write their buffers and use their communicators, so ``keep`` stays alive until
#: ``test`` says the operation is over (see :func:`abandon`), and the communicators of
#: ``group`` are freed only then (:func:`running` and :func:`after`).
_abandoned: List[Tuple[Callable[[], bool], Any, Any]] = []
#: Actions waiting for operations to end, as ``(tests still running, action)``.
_deferred: List[Tuple[List[Callable[[], bool]], Callable[[], None]]] = []
#: Whether abandoned operations may be tested now; a backend whose tests become illegal
#: (MPI after ``MPI_Finalize``) replaces it.
can_test: Callable[[], bool] = lambda: True
_REAP_AT = 64


def abandon(test: Callable[[], bool], keep: Any, group: Any = None) -> None:
    """Keep ``keep`` alive until ``test()`` is true: an operation of ``group`` left
    unfinished must not free buffers that MPI may still use. Finished ones are dropped
    when the list grows."""
    global _REAP_AT
    if test is _no_test:
        return
    _abandoned.append((test, keep, group))
    if len(_abandoned) >= _REAP_AT and can_test():
        _reap()
        _REAP_AT = max(64, 2 * len(_abandoned))


def _reap() -> None:
    _abandoned[:] = [entry for entry in _abandoned if not _over(entry[0])]


def abandon_pending(works: Sequence["Work"]) -> None:
    """Count those of ``works`` still pending as abandoned (:func:`abandon`), keeping
    each Work and its buffers: their group is being destroyed, yet their requests stay
    in MPI and their caller may still wait on them."""
    for work in works:
        if work._state == _PENDING:
            abandon(work._test, work, work.group)


def running(group: Any) -> List[Callable[[], bool]]:
    """The tests of ``group``'s abandoned operations that are still running."""
    if not _abandoned or not can_test():
        return []
    _reap()
    return [test for test, _, owner in _abandoned if owner is group]


def after(tests: Sequence[Callable[[], bool]], action: Callable[[], None]) -> None:
    """Run ``action()`` once every one of ``tests`` is true (or raises): at once when
    they are, else in a later call of this function that finds them so.

    For freeing what running operations use. MPI may progress an abandoned request in
    any later call, and freeing its communicator first is not safe everywhere: Open MPI
    crashes in a later MPI call when a communicator is freed under a nonblocking
    collective that is still running.
    """
    for entry in tuple(_deferred):  # earlier actions whose operations have ended since
        waiting = entry[0]
        waiting[:] = [test for test in waiting if can_test() and not _over(test)]
        if not waiting:
            _deferred.remove(entry)
            entry[1]()
    waiting = [test for test in tests if can_test() and not _over(test)]
    if waiting:
        _deferred.append((waiting, action))
    else:
        action()


def _over(test: Callable[[], bool]) -> bool:
    try:
        return bool(test())
    except Exception:  # a failed operation no longer uses its buffers
        return True


class Deferred:
    """A ``test`` whose operation starts on its first call.

    A backend returns one as the ``test`` of its triple when the operation has a faster
    form that is safe only for a caller who waits at once (the MPI backend's gated
    blocking calls, :mod:`hpccomm.backends.mpi.gate`): polling it starts that form.
    Making a :class:`Work` of the triple first (``async_op=True``, :func:`as_work`)
    calls :meth:`start_async` instead, which starts the operation in a form that may
    complete later, in any order with other operations.
    """

    __slots__ = ()

    def __call__(self) -> bool:
        raise NotImplementedError

    def start_async(self) -> None:
        """Start the operation in its nonblocking form (no-op once started)."""
        raise NotImplementedError


def chain(first: Optional[Callable[[], Any]], then: Optional[Callable[[], Any]]
          ) -> Optional[Callable[[], Any]]:
    """One finishing step: ``first``, then ``then``, returning ``first``'s value (a
    receive's source); either may be ``None``."""
    if then is None:
        return first
    if first is None:
        return then

    def both() -> Any:
        value = first()
        then()
        return value
    return both


def as_work(outcome: "Started | Work") -> "Work":
    """A backend operation's outcome as a Work (a host-side triple is wrapped)."""
    return outcome if isinstance(outcome, Work) else Work(*outcome)


def _no_test() -> bool:
    return True


# Defaults of the slots that are set only when needed (see Work.__getattr__).
_DEFAULTS = {"_error": None, "_result": (), "_value": None, "group": None, "op": "operation",
             "seq": -1, "arr": None, "peer": None, "timeout": None, "t_start": 0.0,
             "t_end": 0.0}


class Work:
    """A started operation: ``wait()``, ``is_completed()``, ``get_future()``.

    The public layer fills in what the operation was (group, op name, sequence number,
    shape and dtype) for error messages and observers; backends never see it. Observers
    that time operations (the flight recorder) set ``t_start`` and ``t_end``.

    Beside torch's methods, the dispatch path, the backends and the diagnostics use a
    few of their own: :meth:`add_finish`, :meth:`hold` and :meth:`set_result` before
    completion, :attr:`value` and :attr:`state` after it, :meth:`fail` and
    :meth:`timed_out` to end it with an error.
    """

    __slots__ = ("_test", "_finish", "_keep", "_state", "_error", "_result", "_value",
                 "_future", "group", "op", "seq", "arr", "peer", "timeout",
                 "t_start", "t_end")

    def __init__(self, test: Optional[Callable[[], bool]] = None,
                 finish: Optional[Callable[[], Any]] = None, keep: Any = None,
                 result: Sequence[Any] = ()):
        # Only what every wait reads is set here; the public layer stamps group, op, seq,
        # arr and timeout, and any slot left unset reads its default (``__getattr__``).
        if isinstance(test, Deferred):
            test.start_async()
        self._test = test or _no_test
        self._finish = finish
        self._keep = keep
        self._state = _PENDING
        self._future: Optional[Future] = None
        if result:
            self._result = result

    def __del__(self) -> None:
        if self._state == _PENDING:  # dropped unfinished
            try:
                abandon(self._test, self._keep, self.group)
            except Exception:  # interpreter shutdown: nothing left to protect
                pass

    def __getattr__(self, name: str) -> Any:
        try:
            return _DEFAULTS[name]
        except KeyError:
            raise AttributeError(f"'Work' object has no attribute '{name}'") from None

    @property
    def shape(self) -> Any:
        """Shape of the operation's main array (``None`` for a barrier)."""
        arr = self.arr
        return None if arr is None else arr.shape

    @property
    def dtype(self) -> Any:
        """Dtype of the operation's main array (``None`` for a barrier)."""
        arr = self.arr
        return None if arr is None else arr.dtype

    # -- for the dispatch path, the backends and the diagnostics ----------------
    def add_finish(self, step: Callable[[], Any]) -> None:
        """Run ``step`` after the finishing step, once the operation completes
        (:attr:`value` stays the finishing step's, if there is one)."""
        self._finish = chain(self._finish, step)

    def hold(self, obj: Any) -> None:
        """Keep ``obj`` (staging buffers) alive until the operation ends, even if it
        times out or is dropped unfinished."""
        self._keep = (self._keep, obj)

    def set_result(self, result: Sequence[Any]) -> None:
        """The arrays :meth:`result` and the future return."""
        self._result = result

    @property
    def value(self) -> Any:
        """What the finishing step returned (a receive: the sender's group rank), or
        ``None``; set it where the finishing step returns nothing."""
        return self._value

    @value.setter
    def value(self, value: Any) -> None:
        self._value = value

    @property
    def state(self) -> str:
        """``"pending"``, ``"completed"`` or ``"failed"``, without polling."""
        return _STATE_NAMES[self._state]

    def fail(self, exc: BaseException) -> BaseException:
        """End the operation with ``exc`` (a non-hpccomm error is described as this
        operation's); returns the error to raise."""
        self._fail(exc)
        return self._error

    # -- completion -------------------------------------------------------------
    def _complete(self) -> None:
        """Run the finishing step once, settle the future."""
        self._state = _DONE
        finish, self._finish = self._finish, None
        try:
            if finish is not None:
                self._value = finish()
        except BaseException as exc:  # a failing copy-out fails the Work, not the poll
            self._fail(exc)
            raise self._error from _cause(exc)  # type: ignore[misc]
        self._keep = None
        if self._future is not None:
            self._future._settle(self._result, None)

    def _fail(self, exc: BaseException) -> None:
        self._state = _FAILED
        if not isinstance(exc, DistError) or isinstance(exc, Undescribed):
            exc = failure_error(self.describe(), self.group, exc)
        self._error = exc
        keep, self._keep = self._keep, None
        abandon(self._test, keep, self.group)
        _observe.failed(self, exc)
        if self._future is not None:
            self._future._settle(None, exc)

    def _poll(self) -> bool:
        try:
            return self._test()
        except BaseException as exc:
            self._fail(exc)
            raise self._error from _cause(exc)  # type: ignore[misc]

    def wait(self, timeout: "datetime.timedelta | float | None" = None) -> bool:
        """Block until the operation completes; raise its error or a timeout error.

        ``timeout`` (``timedelta`` or seconds; ``None`` or zero, torch's default
        ``timedelta(0)``, means the group's) bounds
        this wait. On expiry a :class:`DistTimeoutError` is raised and the operation is
        left unfinished: the group is unusable afterwards.
        """
        if self._state:
            if self._error is not None:
                raise self._error
            return True
        test = self._test
        try:
            if not test():
                limit = self.timeout if not timeout else timeout_seconds(timeout)
                waited = poll(test, limit)
                if waited:
                    self.timed_out(waited, limit)
        except DistTimeoutError:
            raise
        except BaseException as exc:
            self._fail(exc)
            raise self._error from _cause(exc)  # type: ignore[misc]
        self._complete()
        return True

    def timed_out(self, waited: float, limit: Optional[float]) -> None:
        """End the operation with a timeout error after ``waited`` seconds (``limit``:
        the timeout) and raise it; the observers add what they know (the roll call)."""
        self._state = _FAILED
        keep, self._keep = self._keep, None
        abandon(self._test, keep, self.group)
        notes = _observe.timed_out(self, waited)  # the roll call names absent ranks
        found = " ".join(notes) if notes else self._unanswered()
        error = DistTimeoutError(
            f"{self.describe()} timed out: waited {waited:.3f} s (timeout {limit} s). "
            f"{found} The group is now unusable: call destroy_process_group() or abort "
            f"the job.")
        self._error = error
        raise error

    def is_completed(self) -> bool:
        """Whether the operation finished (successfully or not), without blocking."""
        global probing
        if self._state:
            return True
        probing += 1
        try:
            done = self._poll()
        finally:
            probing -= 1
        if done:
            self._complete()
            return True
        progress = while_waiting  # a caller polling this way waits too
        if progress is not None:
            progress()
        return False

    def is_success(self) -> bool:
        """Whether the operation completed without error (polls, does not block)."""
        return self.is_completed() and self._error is None

    def exception(self) -> Optional[BaseException]:
        """The error this operation failed with, if any."""
        return self._error

    def source_rank(self) -> int:
        """For a completed receive: the sender's rank in the receive's group (as torch's
        ``Work.source_rank``; ``get_global_rank`` turns it into a global rank)."""
        source = self._value  # a receive's finishing step gives the sender's group rank
        if self._state != _DONE or not isinstance(source, int) or source < 0:
            raise DistError(f"{self.describe()}: source_rank() is known only for a "
                            f"completed receive")
        return source

    def result(self) -> List[Any]:
        """The output arrays of the operation (waits for it)."""
        self.wait()
        return list(self._result)

    def synchronize(self) -> None:
        """Same as ``wait()`` for CPU work; on GPU the stream waits (see the NCCL backend)."""
        self.wait()

    def block_current_stream(self) -> None:
        """Make later work wait for this one (CPU: wait now)."""
        self.wait()

    def get_future(self) -> "Future":
        """A :class:`Future` that completes with this operation's output arrays."""
        if self._future is None:
            self._future = Future(self)
            if self._state == _DONE:
                self._future._settle(self._result, None)
            elif self._state == _FAILED:
                self._future._settle(None, self._error)
        return self._future

    # -- description --------------------------------------------------------------
    def _unanswered(self) -> str:
        """What a timed-out operation waited for, where no observer said more: the
        other half of a point-to-point transfer, or a rank that never joined."""
        op, peer = self.op, self.peer
        if op in _RECEIVES:
            return ("No rank of the group sent a message with its tag." if peer is None
                    else f"Global rank {peer} never sent a message with its tag.")
        if op in _SENDS and peer is not None:
            return f"Global rank {peer} never posted a receive for it (with its tag)."
        return "Some rank of the group did not join it."

    def describe(self) -> str:
        """One line saying which operation this is, on which rank and group."""
        group = self.group
        if group is not None:
            where = (f"rank {group.rank()}/{group.size()} of group '{group.group_name}' "
                     f"(global ranks {_short(group.ranks)})")
        else:
            where = "a process"
        what = f"{self.op} (seq {self.seq})"
        if self.peer is not None:
            if self.op in _ROOTED:  # a collective's root, a group rank: said as global
                ranks = getattr(group, "ranks", None)
                root = ranks[self.peer] if ranks and 0 <= self.peer < len(ranks) else self.peer
                what += f" {_ROOTED[self.op]} root {root}"
            else:
                what += f" with peer {self.peer}"
        if self.shape is not None:
            what += f", shape {tuple(self.shape)} {self.dtype}"
        return f"{what} on {where}"

    def __repr__(self) -> str:
        return f"<Work {self.op} seq={self.seq} {self.state}>"


#: Operations whose ``peer`` is the root of a collective (a group rank; named by its
#: global rank, as a point-to-point peer is), with the word before it, and the
#: point-to-point ones (``peer``: the other side's global rank, ``None`` for any source).
_ROOTED = {"broadcast": "from", "reduce": "to", "gather": "to", "gather_single": "to",
           "scatter": "from"}
_RECEIVES = frozenset({"recv", "irecv", "recv_object_list"})
_SENDS = frozenset({"send", "isend", "send_object_list"})


def _cause(exc: BaseException) -> Optional[BaseException]:
    """What a failed operation's error is chained to: the library's error (an MPI error,
    an OSError), never a backend's own undescribed one, which the error already says in
    full (its traceback would show the user hpccomm's internals twice)."""
    return None if isinstance(exc, Undescribed) else exc


def failure_error(what: str, group: Any, exc: BaseException) -> DistError:
    """A library error of operation ``what`` on ``group`` as a :class:`DistError`: a
    ``ProcessFailedError`` naming the failed ranks if ``group`` says it reports a process
    failure (the group then is revoked), else a ``DistBackendError``."""
    if isinstance(exc, Undescribed):  # named by the backend: said as it is
        return described(what, exc)
    failed = None
    if group is not None:
        try:
            failed = group.failed_ranks(exc)
        except Exception:  # naming the failure must not hide it
            failed = None
    if failed is not None:
        return process_failed(what, failed, exc)
    wrapped = DistBackendError(f"{what} failed: {exc}")
    wrapped.__cause__ = exc
    return wrapped


def _short(ranks: Sequence[int], limit: int = 16) -> str:
    ranks = list(ranks)
    if len(ranks) <= limit:
        return str(ranks)
    return f"[{', '.join(map(str, ranks[:limit]))}, ... ({len(ranks)} ranks)]"


def completed_work(result: Sequence[Any] = ()) -> Work:
    """A Work that is already complete (operations with nothing to communicate)."""
    work = Work()
    work._result = result
    work._complete()
    return work


class Future:
    """The value of a :class:`Work`: ``wait()``, ``value()``, ``done()``, ``then()``.

    There is no background thread: callbacks added with :meth:`then` run on the thread
    that observes completion (``wait``, ``value``, ``done``) or at once if complete.
    """

    __slots__ = ("_work", "_value", "_error", "_settled", "_callbacks")

    def __init__(self, work: Optional[Work] = None):
        self._work = work
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._settled = False
        self._callbacks: List[Callable[["Future"], None]] = []

    def _settle(self, value: Any, error: Optional[BaseException]) -> None:
        if self._settled:
            return
        self._value, self._error, self._settled = (list(value) if value is not None
                                                   else None), error, True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def set_result(self, value: Any) -> None:
        """Complete a stand-alone future with ``value``."""
        if self._settled:
            raise DistError("Future already completed")
        self._settled = True
        self._value = value
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def set_exception(self, error: BaseException) -> None:
        """Complete a stand-alone future with an error."""
        if self._settled:
            raise DistError("Future already completed")
        self._settled, self._error = True, error
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def done(self) -> bool:
        """Whether the value is ready (polls the underlying work)."""
        if not self._settled and self._work is not None:
            self._work.is_completed()
        return self._settled

    def wait(self) -> Any:
        """Block until complete, then return the value (or raise its error)."""
        if not self._settled:
            if self._work is None:
                raise DistError("wait() on a Future that nothing will complete")
            try:
                self._work.wait()
            except BaseException:
                if not self._settled:
                    raise
        if self._error is not None:
            raise self._error
        return self._value

    def value(self) -> Any:
        """The value; the future must be complete (as torch's ``Future.value``)."""
        if not self.done():
            raise DistError("Future.value() called before the future completed; "
                            "call wait() first")
        if self._error is not None:
            raise self._error
        return self._value

    def then(self, callback: Callable[["Future"], Any]) -> "Future":
        """A new future holding ``callback(self)``, run once this one completes."""
        chained = Future()

        def run(done: "Future") -> None:
            try:
                chained.set_result(callback(done))
            except BaseException as exc:
                chained.set_exception(exc)

        if self._settled:
            run(self)
        else:
            self._callbacks.append(run)
            chained._work = self._work
        return chained
