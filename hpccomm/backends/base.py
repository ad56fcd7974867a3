"""The backend interface: buffers in, a started operation out.

A ``Communicator`` is one backend's handle on one group's processes. It knows ranks as
positions in that group (0..size-1), takes arrays that the public layer has already
resolved and validated (contiguous, supported dtype, matching sizes) and starts the
operation without blocking. It knows nothing of ``ProcessGroup``, default groups, global
ranks or the public API, so a backend is small and testable.

What an operation returns (:data:`Outcome`):

* a host-side backend (MPI) returns ``(test, finish, keep)``, the arguments of a
  :class:`~hpccomm.work.Work`. A synchronous call then polls ``test`` and never builds a
  Work (on an 8-byte all-reduce that object costs about as much as the MPI call);
* a backend whose completion is not a host-side test returns its own Work subclass
  (NCCL: the caller's CUDA stream waits on an event; the CPU does not).

Reductions arrive as ``(kind, factor)``: a :class:`~hpccomm.types.RedOpType` and the
``PREMUL_SUM`` factor (``None`` otherwise). Counts are in elements.
"""
from __future__ import annotations

import abc
from typing import Any, Callable, Dict, Optional, Sequence, Union

from ..types import RedOpType
from ..work import Started, Work

#: What every operation returns: a host-side triple, or a backend's own Work.
Outcome = Union[Started, Work]


#: Operation codes of :attr:`Communicator.small_run` (the shared-memory small channel's)
#: and of :attr:`Communicator.stream_run`, which also takes ``REDUCE``.
BARRIER, ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, REDUCE = range(7)


class Communicator(abc.ABC):
    """One backend's view of a group: ``rank``, ``size`` and the operations below."""

    #: Name under which the backend is registered (``Backend._plugins``).
    name = "undefined"
    rank: int
    size: int
    #: Bytes below which a synchronous in-place SUM all-reduce may take the backend's
    #: direct form, ``sum_in_place_at`` (the MPI backend's); 0: the backend has none.
    direct_below = 0
    #: dtype -> MPI datatype handle, the dtypes that direct form takes.
    direct_types: Dict[Any, int] = {}
    #: The direct form of a blocking send or receive, for a caller that waits at once and
    #: keeps the array alive: ``transfer_now(receive, array, peer, tag, slice)`` returns
    #: ``None`` once done, ``False`` with nothing started where the array's buffer does
    #: not fit (another dtype, not C-contiguous: the general path applies), else the running
    #: request, spun on for ``slice`` seconds, for :meth:`transfer_running`; a failure
    #: raises what :meth:`transfer_error` names. ``None``: the backend has none.
    transfer_now: Optional[Callable[..., Any]] = None
    #: Longest spin (seconds) of :attr:`transfer_now` before the general wait takes over.
    transfer_slice = 0.0

    #: ``transfer_running(request)``: the ``(test, finish, keep)`` of a transfer
    #: :attr:`transfer_now` left running; given with it.
    transfer_running: Optional[Callable[[Any], Any]] = None

    @staticmethod
    def transfer_error(exc: Exception) -> Exception:
        """The exception to report for one :attr:`transfer_now` raised."""
        return exc
    #: The whole synchronous small operation in native code, where the backend has it
    #: (the shared-memory backend's small channel): ``small_run(code, send, recv,
    #: redop, root)`` returns 0 once done, -1 where it does not apply (the general path
    #: then starts it), else the running operation's number (``small.started(number)``
    #: waits for it). ``None``: the backend has none.
    small_run: Optional[Callable[..., int]] = None
    small: Any = None
    #: A synchronous operation enqueued whole on the caller's current CUDA stream, where
    #: the backend's completion is stream-ordered (NCCL): ``stream_run(code, send, recv,
    #: redop, root)`` returns 0 once enqueued, -1 where it does not apply (nothing is
    #: done; the general path then starts it). ``None``: the backend has none.
    stream_run: Optional[Callable[..., int]] = None

    def set_timeout(self, seconds: Optional[float]) -> None:
        """The timeout of this backend's own waits from now on (``set_timeout``; a
        backend holding other communicators passes it on)."""
        self.timeout = seconds

    def capturing(self) -> bool:
        """Whether the caller's stream is capturing a CUDA graph (GPU backends; a CPU
        backend never sees one)."""
        return False

    # -- collectives ------------------------------------------------------------------
    @abc.abstractmethod
    def broadcast(self, buf: Any, root: int) -> Outcome:
        """Copy ``buf`` of ``root`` into ``buf`` of every rank."""

    @abc.abstractmethod
    def all_reduce(self, buf: Any, kind: RedOpType, factor: Any) -> Outcome:
        """Reduce ``buf`` over all ranks, result in ``buf`` everywhere."""

    @abc.abstractmethod
    def reduce(self, buf: Any, kind: RedOpType, factor: Any, root: int) -> Outcome:
        """Reduce ``buf`` over all ranks into ``buf`` of ``root``; others unchanged."""

    @abc.abstractmethod
    def all_gather(self, send: Any, recv: Any, counts: Optional[Sequence[int]]) -> Outcome:
        """Concatenate every rank's ``send`` into ``recv`` (``counts`` when uneven).

        ``send is None`` means in place: this rank's block already sits in ``recv``.
        """

    @abc.abstractmethod
    def gather(self, send: Any, recv: Any, root: int, counts: Optional[Sequence[int]]) -> Outcome:
        """Concatenate every rank's ``send`` into ``recv`` of ``root`` (``None`` elsewhere)."""

    @abc.abstractmethod
    def scatter(self, send: Any, recv: Any, root: int, counts: Optional[Sequence[int]]) -> Outcome:
        """Split ``send`` of ``root`` into consecutive blocks, block ``i`` to rank ``i``."""

    @abc.abstractmethod
    def reduce_scatter(self, send: Any, recv: Any, kind: RedOpType, factor: Any,
                       counts: Optional[Sequence[int]]) -> Outcome:
        """Reduce ``send`` over ranks, block ``i`` of the result into ``recv`` of rank ``i``."""

    @abc.abstractmethod
    def all_to_all(self, send: Any, recv: Any, send_counts: Optional[Sequence[int]],
                   recv_counts: Optional[Sequence[int]]) -> Outcome:
        """Block ``j`` of ``send`` on rank ``i`` goes to block ``i`` of ``recv`` on rank ``j``."""

    @abc.abstractmethod
    def barrier(self) -> Outcome:
        """Complete once every rank has entered the barrier."""

    # -- point to point -----------------------------------------------------------------
    @abc.abstractmethod
    def send(self, buf: Any, dst: int, tag: int) -> Outcome:
        """Send ``buf`` to group rank ``dst``."""

    @abc.abstractmethod
    def recv(self, buf: Any, src: Optional[int], tag: int) -> Outcome:
        """Receive into ``buf`` from ``src``; for ``src=None`` (any rank) the finishing step
        returns the sender's rank."""

    def start_batch(self) -> None:
        """Begin a batch of point-to-point operations (NCCL group call); default no-op."""

    def end_batch(self) -> None:
        """End a batch begun with :meth:`start_batch`."""

    # -- life cycle ---------------------------------------------------------------------
    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release the backend's resources; pending operations are abandoned."""

    def abort(self) -> None:
        """Tear down after a timeout or error so that nothing blocks (default: shutdown)."""
        self.shutdown()
