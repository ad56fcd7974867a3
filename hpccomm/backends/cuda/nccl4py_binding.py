"""NCCL through NVIDIA's ``nccl4py`` (its low-level ``nccl.bindings.nccl``), in the shape
of CuPy's ``cupy.cuda.nccl``, so that :mod:`.nccl` makes and calls communicators the same
way through either (``HPCCOMM_NCCL_BINDING``).

What it adds to CuPy's binding:

* **Nonblocking communicators** (``ncclConfig_t.blocking = 0``, ``HPCCOMM_NCCL_NONBLOCKING``):
  creation and split return at once, and the communicator is ready when
  ``ncclCommGetAsyncError`` stops saying ``ncclInProgress``. :meth:`NcclCommunicator.settle`
  polls for that under a deadline; the caller aborts it past the deadline
  (``ncclCommAbort``) and the process goes on. NCCL's rule for such a communicator is
  that any call may return ``ncclInProgress`` (a collective that must first connect its
  peers, say) and nothing else may be called on it until its state is ``ncclSuccess``;
  nccl4py does not hand back that code, so every call is followed by one state query
  (one C call when it is ``ncclSuccess``, the usual case), and by polling under
  :attr:`NcclCommunicator.deadline` when not.
* **Creation from several roots** (``ncclCommInitRankScalable``): a list of unique ids
  instead of one.
* **Shrink** (``ncclCommShrink``, NCCL 2.27): the communicator of the survivors, or of a
  planned subset, without a new bootstrap.

Unique ids cross this module as 128 ``bytes``, as with CuPy. Nothing is imported until the
binding is chosen: nccl4py is an optional package.
"""
from __future__ import annotations

import importlib
import os
import time
from typing import Any, Callable, List, Optional, Sequence, Union

import numpy as np

from ...errors import DistBackendError, DistTimeoutError

available = True
#: ``ncclResult_t`` values this module acts on.
SUCCESS, IN_PROGRESS = 0, 7
#: NCCL's enums (the same numbers as CuPy's constants of the same names).
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
(NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16,
 NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16) = range(10)
#: The color of a rank that joins no part of a split (``NCCL_SPLIT_NOCOLOR``).
NOCOLOR = -1
#: ``ncclCommShrink``'s flags: a planned shrink, and one after a failure (the parent's
#: operations in flight are aborted first).
SHRINK_DEFAULT, SHRINK_ABORT = 0, 1
#: The first NCCL release with ``ncclCommShrink`` (``major * 10000 + minor * 100``).
SHRINK_SINCE = 22700

_lib: Any = None
_depth = 0                      # ncclGroupStart nesting
_grouped: List["NcclCommunicator"] = []  # nonblocking communicators called in the group


def lib() -> Any:
    """``nccl.bindings.nccl``, imported on first use (after the NCCL wheel's library is
    loaded, so that nccl4py calls the same library as CuPy)."""
    global _lib
    if _lib is None:
        from . import nccl_lib

        nccl_lib.preload()
        try:
            _lib = importlib.import_module("nccl.bindings.nccl")
        except ImportError as exc:
            raise DistBackendError(
                f"HPCCOMM_NCCL_BINDING=nccl4py (or HPCCOMM_NCCL_NONBLOCKING=1) needs "
                f"NVIDIA's nccl4py: pip install nccl4py ({exc})") from None
    return _lib


def get_version() -> int:
    return int(lib().get_version())


get_build_version = get_version


def get_unique_id() -> bytes:
    """A new unique id (this rank hosts its bootstrap root), as 128 bytes."""
    return bytes(memoryview(lib().get_unique_id()))


def _config(blocking: bool) -> Any:
    config = lib().Config()
    config.blocking = 1 if blocking else 0
    return config


def groupStart() -> None:
    global _depth
    lib().group_start()
    _depth += 1


def groupEnd() -> None:
    """``ncclGroupEnd``; the nonblocking communicators called in the group are polled
    until their operations are enqueued, as after any call on them."""
    global _depth
    lib().group_end()
    _depth -= 1
    if _depth == 0 and _grouped:
        called, _grouped[:] = list(_grouped), []
        for comm in called:
            if comm.nonblocking:
                comm._progress("ncclGroupEnd")


def _stalled(what: str, seconds: float) -> BaseException:
    return DistTimeoutError(f"NCCL's {what} was still in progress (ncclInProgress) after "
                            f"{seconds:g} s")


class NcclCommunicator:
    """One NCCL communicator through nccl4py, with CuPy's ``NcclCommunicator`` methods.

    ``NcclCommunicator(nranks, ids, rank, blocking=True)`` makes it from one unique id
    (``bytes``) or from several (a list: ``ncclCommInitRankScalable``). Nonblocking, it
    returns at once: :meth:`settle` says when it is ready."""

    def __init__(self, ndev: int, commId: Union[bytes, Sequence[bytes]], rank: int,
                 blocking: bool = True):
        nccl = lib()
        self.nonblocking = not blocking
        #: Whether :meth:`abort` was called.
        self.aborted = False
        #: Seconds a call may stay in progress before :attr:`on_stall` is raised.
        self.deadline: Optional[float] = None
        #: ``(what, seconds) -> exception`` raised when a call outlived :attr:`deadline`.
        self.on_stall: Callable[[str, float], BaseException] = _stalled
        config = _config(blocking)
        if isinstance(commId, (bytes, bytearray)):
            self.handle = nccl.comm_init_rank_config(
                ndev, nccl.UniqueId.from_buffer(bytearray(commId)), rank, config)
        else:
            ids = np.frombuffer(bytearray(b"".join(commId)), nccl.unique_id_dtype)
            self.handle = nccl.comm_init_rank_scalable(ndev, rank, len(ids), ids, config)

    @classmethod
    def _adopt(cls, handle: Any, nonblocking: bool, deadline: Optional[float]
               ) -> "NcclCommunicator":
        lib()  # loaded once: the calls below use it directly
        self = cls.__new__(cls)
        self.handle, self.nonblocking, self.deadline = handle, nonblocking, deadline
        self.on_stall, self.aborted = _stalled, False
        return self

    # -- state ---------------------------------------------------------------------------
    def state(self) -> int:
        """``ncclCommGetAsyncError``: ``SUCCESS``, ``IN_PROGRESS`` or an error code."""
        return int(lib().comm_get_async_error(self.handle))

    def _raise_if_failed(self, state: int) -> None:
        if state not in (SUCCESS, IN_PROGRESS):
            nccl = lib()
            try:
                detail = nccl.get_last_error(self.handle)
            except Exception:  # pragma: no cover - the text is a courtesy
                detail = ""
            raise DistBackendError(f"NCCL error {state}: {nccl.get_error_string(state)}"
                                   + (f" ({detail})" if detail else ""))

    def settle(self, seconds: Optional[float]) -> bool:
        """Poll until this communicator's pending work (its creation, a split, a call)
        is done: True; False if it is still in progress after ``seconds`` (``None``:
        no limit). Raises if NCCL reports an error."""
        deadline = None if seconds is None else time.monotonic() + seconds
        polls = 0
        while True:
            state = self.state()
            if state != IN_PROGRESS:
                self._raise_if_failed(state)
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            polls += 1
            if polls < 1000:  # a call that is about to finish: spin
                os.sched_yield()
            else:  # a creation: NCCL's bootstrap over TCP takes milliseconds at least
                time.sleep(0.0005)

    def _progress(self, what: str) -> None:
        """After a call on a nonblocking communicator: wait until it is enqueued (one
        state query when it is, the usual case)."""
        if _depth:
            if self not in _grouped:
                _grouped.append(self)
            return
        if _lib.comm_get_async_error(self.handle) == SUCCESS:
            return
        if not self.settle(self.deadline):
            raise self.on_stall(what, self.deadline or 0.0)

    # -- CuPy's methods ------------------------------------------------------------------
    def allReduce(self, send: int, recv: int, count: int, dtype: int, op: int,
                  stream: int) -> None:
        _lib.all_reduce(send, recv, count, dtype, op, self.handle, stream)
        if self.nonblocking:
            self._progress("ncclAllReduce")

    def reduce(self, send: int, recv: int, count: int, dtype: int, op: int, root: int,
               stream: int) -> None:
        _lib.reduce(send, recv, count, dtype, op, root, self.handle, stream)
        if self.nonblocking:
            self._progress("ncclReduce")

    def broadcast(self, send: int, recv: int, count: int, dtype: int, root: int,
                  stream: int) -> None:
        _lib.broadcast(send, recv, count, dtype, root, self.handle, stream)
        if self.nonblocking:
            self._progress("ncclBroadcast")

    def reduceScatter(self, send: int, recv: int, count: int, dtype: int, op: int,
                      stream: int) -> None:
        _lib.reduce_scatter(send, recv, count, dtype, op, self.handle, stream)
        if self.nonblocking:
            self._progress("ncclReduceScatter")

    def allGather(self, send: int, recv: int, count: int, dtype: int,
                  stream: int) -> None:
        _lib.all_gather(send, recv, count, dtype, self.handle, stream)
        if self.nonblocking:
            self._progress("ncclAllGather")

    def send(self, buf: int, count: int, dtype: int, peer: int, stream: int) -> None:
        _lib.send(buf, count, dtype, peer, self.handle, stream)
        if self.nonblocking:
            self._progress("ncclSend")

    def recv(self, buf: int, count: int, dtype: int, peer: int, stream: int) -> None:
        _lib.recv(buf, count, dtype, peer, self.handle, stream)
        if self.nonblocking:
            self._progress("ncclRecv")

    def commSplit(self, color: int, key: int) -> Optional["NcclCommunicator"]:
        """``ncclCommSplit`` (collective over this communicator), the child as blocking
        as this one; ``None`` for :data:`NOCOLOR`. Nonblocking, the split is done when
        :meth:`settle` of the child (of this communicator for :data:`NOCOLOR`) says so."""
        handle = lib().comm_split(self.handle, color, key, _config(not self.nonblocking))
        if color == NOCOLOR or not handle:
            return None
        return NcclCommunicator._adopt(handle, self.nonblocking, self.deadline)

    def commShrink(self, exclude: Sequence[int], after_failure: bool) -> "NcclCommunicator":
        """``ncclCommShrink`` (NCCL 2.27): the communicator of this one's ranks but
        ``exclude`` (their ranks here), called by those ranks only, as blocking as this
        one (nonblocking: done when its :meth:`settle` says so). ``after_failure``:
        :data:`SHRINK_ABORT`, which first aborts what this communicator had in flight."""
        handle = lib().comm_shrink(self.handle, [int(r) for r in exclude], len(exclude),
                                   _config(not self.nonblocking),
                                   SHRINK_ABORT if after_failure else SHRINK_DEFAULT)
        return NcclCommunicator._adopt(handle, self.nonblocking, self.deadline)

    def check_async_error(self) -> None:
        self._raise_if_failed(self.state())

    def abort(self) -> None:
        """``ncclCommAbort``: waits for no other rank."""
        self.aborted = True
        if self.handle is not None:
            handle, self.handle = self.handle, None
            lib().comm_abort(handle)

    def destroy(self) -> None:
        """Free the communicator: ``ncclCommFinalize`` (polled under :attr:`deadline` when
        nonblocking), then ``ncclCommDestroy``; aborted instead if that stalls."""
        if self.handle is None:
            return
        if self.nonblocking:
            lib().comm_finalize(self.handle)
            if not self.settle(self.deadline):
                self.abort()
                return
        handle, self.handle = self.handle, None
        lib().comm_destroy(handle)

    def rank_id(self) -> int:
        return int(lib().comm_user_rank(self.handle))

    def size(self) -> int:
        return int(lib().comm_count(self.handle))


def root_index(rank: int, size: int, roots: int) -> int:
    """Which unique id ``rank`` makes for a creation of ``size`` ranks from ``roots`` ids
    (``-1``: none). NCCL gives each id a block of consecutive ranks, the first
    ``size % roots`` blocks one rank longer; the first rank of each block makes its id."""
    longer, per = size % roots, size // roots
    edge = longer * (per + 1)
    if rank < edge:
        return -1 if rank % (per + 1) else rank // (per + 1)
    return -1 if (rank - edge) % per else longer + (rank - edge) // per


def roots_for(size: int, ranks_per_root: int) -> int:
    """How many unique ids a creation of ``size`` ranks uses: one per ``ranks_per_root``
    ranks (rounded up) above that size, else one (``ranks_per_root`` 0: always one)."""
    if ranks_per_root <= 0 or size <= ranks_per_root:
        return 1
    return -(-size // ranks_per_root)
