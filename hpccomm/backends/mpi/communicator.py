"""The MPI backend: every operation is one nonblocking MPI call (``Iallreduce``...).

Each operation returns ``(test, finish, keep)`` (see :mod:`hpccomm.work`): the request's
``Test``, the step to run after completion (or ``None``) and the temporaries to keep.

The MPI library's own algorithms do the work; this module only maps arrays to buffer
specs, ops to ``MPI.Op``, and in-place semantics to ``MPI.IN_PLACE``. Datatype and op
lookups are cached per dtype, so the hot path is a dict lookup and one MPI call.

Dtypes without an MPI reduction type (bfloat16, and float16 on MPI libraries without
``MPIX_C_FLOAT16``) are reduced in float32 staging buffers, and so are float16 sums and
products everywhere: torch sums float16 with float32 accumulation, while MPI's own half
type rounds at every step of the reduction tree. Every dtype is *moved*
(broadcast, gather, send...) bit-exactly as its own type or as contiguous bytes.
Booleans reduce with logical ops (SUM/MAX/BOR -> LOR, PRODUCT/MIN/BAND -> LAND,
BXOR -> LXOR), as torch reduces bool tensors.

The communicators themselves (create, split, translate, free) are made by
:mod:`.plumbing`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ...types import RedOpType
from ... import work as _work
from ...work import Started, chain
from . import direct as mpi_direct, gate as mpi_gate
from .anysource import AnySourceQueue
from ..base import Communicator

IN_PLACE = MPI.IN_PLACE
ANY_SOURCE = MPI.ANY_SOURCE

_ARITH = {RedOpType.SUM: MPI.SUM, RedOpType.AVG: MPI.SUM, RedOpType.PREMUL_SUM: MPI.SUM,
          RedOpType.PRODUCT: MPI.PROD, RedOpType.MIN: MPI.MIN, RedOpType.MAX: MPI.MAX,
          RedOpType.BAND: MPI.BAND, RedOpType.BOR: MPI.BOR, RedOpType.BXOR: MPI.BXOR}
_LOGICAL = {RedOpType.SUM: MPI.LOR, RedOpType.MAX: MPI.LOR, RedOpType.BOR: MPI.LOR,
            RedOpType.PRODUCT: MPI.LAND, RedOpType.MIN: MPI.LAND, RedOpType.BAND: MPI.LAND,
            RedOpType.BXOR: MPI.LXOR}

# NumPy type code -> MPI's predefined type (float16 only where MPI has one, e.g. MPICH).
_PREDEFINED: Dict[Any, Any] = {np.dtype(char): MPI._typedict[char]
                               for char in "?bBhHiIlLqQefdFD" if char in MPI._typedict}
#: Whether this MPI reduces float16 natively (else it is staged in float32).
HALF_NATIVE = np.dtype("e") in _PREDEFINED
_SUM, _AVG, _PREMUL_SUM = RedOpType.SUM, RedOpType.AVG, RedOpType.PREMUL_SUM  # no enum
# attribute loads on the hot path (each is a descriptor lookup on Python 3.11)
_BYTES: Dict[int, Any] = {}  # itemsize -> committed contiguous byte type
_TRANSFER: Dict[Any, Any] = dict(_PREDEFINED)  # dtype -> its transfer type, once seen
_FLOAT32 = np.dtype(np.float32)
_NEVER = mpi_gate.NEVER
#: This MPI library's gating thresholds (nonblocking call name -> bytes), found once.
_GATED_FROM = mpi_gate.gated_from(MPI.get_vendor()[0])
_INT_MAX = 2 ** 31 - 1
_DIRECT_SUM = mpi_direct.handle(MPI.SUM)
_DIRECT_SLICE = mpi_direct.SLICE_S
_DIRECT_TYPES: Optional[Dict[Any, int]] = None
_TRANSFER_TYPES: Optional[Dict[Any, int]] = None
_Request = MPI.Request
_addressof = MPI._addressof
_spin_test = mpi_direct.spin_function()


def _spin_wait(test: Callable[[], bool], seconds: float) -> Optional[bool]:
    """:data:`hpccomm.work.spin_wait` for this backend: a test that is an mpi4py
    request's ``Test`` is spun on in C (up to :data:`~.mpi_direct.SLICE_S`), which
    updates the request in place as mpi4py's ``Test`` does; ``None`` for other tests."""
    request = getattr(test, "__self__", None)
    if type(request) is not _Request:
        return None
    try:
        return _spin_test(_addressof(request), _DIRECT_SLICE if seconds > _DIRECT_SLICE
                          else seconds, _work.spin_yield_every())
    except RuntimeError as exc:
        raise mpi_direct.error(exc) from None


if _spin_test is not None:
    _work.spin_wait = _spin_wait

#: Whether this MPI library's own sums of 8- and 16-bit integers saturate instead of
#: wrapping as torch's do: Open MPI 5's vectorized MPI_SUM gives 127 for 100 + 100 in
#: int8 from 64 elements on. Such sums are then done in 64-bit integers and copied back.
_SATURATING_SUMS = MPI.get_vendor()[0] == "Open MPI"

#: (MPI datatype, MPI op, staging dtype or None)
_Plan = Tuple[Any, Any, Optional[Any]]
#: ``_PLANS[kind][dtype]``: one dict per reduction kind, so the hot path looks a plan up
#: without building a (dtype, kind) key.
_PLANS: List[Dict[Any, _Plan]] = [{} for _ in RedOpType]


def transfer_type(dtype: Any) -> Any:
    """The MPI datatype that moves one element of ``dtype`` bit-exactly (cached in
    :data:`_TRANSFER`, which the hot path reads first)."""
    mpitype = _PREDEFINED.get(dtype)
    if mpitype is None:
        mpitype = _BYTES.get(dtype.itemsize)
        if mpitype is None:
            mpitype = _BYTES[dtype.itemsize] = MPI.BYTE.Create_contiguous(dtype.itemsize)
            mpitype.Commit()
    _TRANSFER[dtype] = mpitype
    return mpitype


#: (dtype, kind) -> the MPI op of a MIN or MAX of floats that propagates NaN.
_NAN_OPS: Dict[Any, Any] = {}


def nan_propagating(dtype: Any, kind: RedOpType) -> Any:
    """An MPI op computing ``kind`` (MIN or MAX) of ``dtype`` elements as NumPy and torch
    do: a NaN in any rank's element makes the result NaN. MPI's own MIN and MAX compare
    with ``<``, so a NaN wins or loses by its place in the reduction order, and the ranks
    of one all-reduce could even get different results."""
    key = (dtype, kind)
    found = _NAN_OPS.get(key)
    if found is None:
        ufunc = np.minimum if kind is RedOpType.MIN else np.maximum

        def combine(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
            into = np.frombuffer(inoutbuf, dtype)
            ufunc(np.frombuffer(inbuf, dtype), into, out=into)
        found = _NAN_OPS[key] = MPI.Op.Create(combine, commute=True)
    return found


def reduction_plan(dtype: Any, kind: RedOpType) -> _Plan:
    """How to reduce ``dtype`` with ``kind``: ``(MPI type, MPI op, staging dtype or
    None)`` (cached in :data:`_PLANS`, which the hot path reads first)."""
    plan = _PLANS[kind].get(dtype)
    if plan is None:
        mpitype, op, stage = plan = _plan(dtype, kind)
        reduced = dtype if stage is None else stage
        if kind in (RedOpType.MIN, RedOpType.MAX) and reduced.kind == "f":
            plan = (mpitype, nan_propagating(reduced, kind), stage)
        _PLANS[kind][dtype] = plan
    return plan


def _plan(dtype: Any, kind: RedOpType) -> _Plan:
    """:func:`reduction_plan` with MPI's own operations."""
    if dtype.kind == "b":
        return (_PREDEFINED[dtype], _LOGICAL[kind], None)
    if _SATURATING_SUMS and dtype.kind in "iu" and dtype.itemsize <= 2 and kind in (
            RedOpType.SUM, RedOpType.PREMUL_SUM):
        wide = np.dtype(np.int64 if dtype.kind == "i" else np.uint64)
        return (_PREDEFINED[wide], _ARITH[kind], wide)  # copied back, wrapping
    if dtype in _PREDEFINED and dtype.name != "bfloat16" and not (
            dtype.name == "float16" and kind not in (RedOpType.MIN, RedOpType.MAX)):
        return (_PREDEFINED[dtype], _ARITH[kind], None)
    # bfloat16; float16 sums/products, or any float16 without an MPI half type
    return (MPI.FLOAT, _ARITH[kind], _FLOAT32)


def direct_sum_types() -> Dict[Any, int]:
    """dtype -> MPI datatype handle for :meth:`MPICommunicator.sum_in_place_at`: the
    dtypes whose SUM plan is one predefined type summed by ``MPI_SUM``, unstaged (an
    empty dict where the direct form is unavailable)."""
    global _DIRECT_TYPES
    if _DIRECT_TYPES is None:
        _DIRECT_TYPES = (mpi_direct.sum_types({dtype: reduction_plan(dtype, _SUM)
                                                for dtype in _PREDEFINED})
                         if mpi_direct.available() else {})
    return _DIRECT_TYPES


def direct_transfer_types() -> Dict[Any, int]:
    """dtype -> MPI datatype handle for :attr:`MPICommunicator.transfer_now`: the
    predefined dtypes, each as the general path sends it (an empty dict where the
    direct form is unavailable)."""
    global _TRANSFER_TYPES
    if _TRANSFER_TYPES is None:
        _TRANSFER_TYPES = (mpi_direct.transfer_types(dict(_PREDEFINED))
                           if mpi_direct.available() else {})
    return _TRANSFER_TYPES


def _start(finish: Optional[Callable[[], Any]], call: Callable[..., Any], *args: Any
           ) -> Started:
    """Start the nonblocking MPI call ``call(*args)``: ``(its request's Test, finish, args)``.

    Every operation of this module starts MPI through here. The arguments are what the
    operation keeps alive until it completes, so every buffer handed to MPI (send,
    receive, staging and premultiplied arrays, all named by the buffer specs in
    ``args``) outlives the request by construction: MPI may read a send buffer or write
    a receive buffer at any time until then, and mpi4py keeps no reference for some
    nonblocking calls.
    """
    return call(*args).Test, finish, args


def _plain_collective(nbytes: int, finish: Optional[Callable[[], Any]],
                      call: Callable[..., Any], *args: Any) -> Started:
    """:meth:`MPICommunicator._collective` where nothing is gated: always nonblocking."""
    return call(*args).Test, finish, args


def _displacements(counts: Sequence[int]) -> List[int]:
    displs, total = [], 0
    for count in counts:
        displs.append(total)
        total += count
    return displs


def _premultiply(buf: np.ndarray, factor: Any, out: Optional[np.ndarray] = None) -> np.ndarray:
    factor = np.asarray(factor).reshape(())
    return np.multiply(buf, factor, out=out, casting="unsafe") if out is not None else (
        (buf * factor).astype(buf.dtype, copy=False))


class MPICommunicator(Communicator):
    """A group's MPI communicator driven through nonblocking MPI calls."""

    name = "mpi"

    def __init__(self, comm: Any, timeout: Optional[float] = None):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.timeout = timeout
        #: Nonblocking call name -> bytes from which a synchronous call is gated.
        self.gated_from = {name: limit for name, limit in _GATED_FROM.items()
                           if limit != mpi_gate.NEVER} if self.size > 1 else {}
        self.gate = mpi_gate.Gate(comm, timeout) if self.gated_from else None
        if self.gate is None:
            self._collective = _plain_collective
        #: Bytes from which a synchronous in-place SUM all-reduce leaves the direct form
        #: (:meth:`sum_in_place_at`) for the general path: where a gate starts, the
        #: shared-memory path starts, or MPI's int count ends; 0: no direct form.
        self.direct_types = direct_sum_types()
        self.direct_below = (min(self.gated_from.get("Iallreduce", _NEVER), _INT_MAX)
                             if self.direct_types else 0)
        self._handle = mpi_direct.handle(comm)
        self._direct_sum = mpi_direct.function()
        transfer = mpi_direct.transfer_function()
        self.transfer_now = (functools.partial(transfer, self._handle,
                                               _work.spin_yield_every())
                             if transfer is not None and direct_transfer_types() else None)
        self.transfer_slice = _DIRECT_SLICE
        self._any_source = AnySourceQueue(comm)

    def _collective(self, nbytes: int, finish: Optional[Callable[[], Any]],
                    call: Callable[..., Any], *args: Any) -> Started:
        """Start collective ``call(*args)`` on ``nbytes`` bytes: nonblocking, or gated
        from this library's threshold (:mod:`.mpi_gate`). Without any threshold, the
        instance uses :func:`_plain_collective` instead."""
        if nbytes < self.gated_from.get(call.__name__, _NEVER):
            return call(*args).Test, finish, args
        return self.gate.start(nbytes, finish, call, args)

    # -- helpers --------------------------------------------------------------------
    def _post(self, buf: np.ndarray, kind: RedOpType):
        """The in-place step after a sum for AVG (divide by the group size)."""
        if kind is _AVG:
            size = self.size

            def average() -> None:
                np.true_divide(buf, size, out=buf, casting="unsafe")
            return average
        return None

    # -- collectives ----------------------------------------------------------------
    def sum_in_place_at(self, address: int, count: int, datatype: int,
                        limit: Optional[float]) -> Optional[Started]:
        """The direct form of an in-place SUM all-reduce (:mod:`.mpi_direct`) of
        ``count`` elements of ``datatype`` (a handle from :func:`direct_sum_types`) at
        ``address``, for a caller that waits at once and keeps the memory alive:
        ``None`` once done, else the ``(test, finish, keep)`` of the operation still
        running after spinning :data:`~.mpi_direct.SLICE_S` (or the caller's time
        ``limit`` in seconds, if shorter)."""
        slice_s = _DIRECT_SLICE if limit is None else min(_DIRECT_SLICE, limit)
        try:
            running = self._direct_sum(address, count, datatype, _DIRECT_SUM, self._handle,
                                       slice_s, _work.spin_yield_every())
        except RuntimeError as exc:
            raise mpi_direct.error(exc) from None
        if running is None:
            return None
        return MPI.Request.fromhandle(running).Test, None, None

    @staticmethod
    def transfer_running(request: int) -> Started:
        """``(test, finish, keep)`` of a transfer :attr:`transfer_now` left running."""
        return MPI.Request.fromhandle(request).Test, None, None

    @staticmethod
    def transfer_error(exc: Exception) -> Exception:
        """The MPI exception behind :attr:`transfer_now`'s ``RuntimeError(code)``."""
        return mpi_direct.error(exc) if isinstance(exc, RuntimeError) else exc

    def broadcast(self, buf: np.ndarray, root: int) -> Started:
        mpitype = _TRANSFER.get(buf.dtype) or transfer_type(buf.dtype)
        return self._collective(buf.nbytes, None, self.comm.Ibcast, [buf, mpitype], root)

    def all_reduce(self, buf: np.ndarray, kind: RedOpType, factor: Any) -> Started:
        plan = _PLANS[kind].get(buf.dtype) or reduction_plan(buf.dtype, kind)
        mpitype, op, stage = plan
        if stage is None:
            if kind is _SUM:
                spec = [buf, mpitype]
                if self.gate is None:  # the hottest path, inline: what it keeps is spec
                    return self.comm.Iallreduce(IN_PLACE, spec, op).Test, None, spec
                return self._collective(buf.nbytes, None, self.comm.Iallreduce, IN_PLACE,
                                        spec, op)
            if kind is _PREMUL_SUM:
                _premultiply(buf, factor, out=buf)
            return self._collective(buf.nbytes, self._post(buf, kind), self.comm.Iallreduce,
                                    IN_PLACE, [buf, mpitype], op)
        tmp = buf.astype(stage)
        if kind is _PREMUL_SUM:
            _premultiply(tmp, factor, out=tmp)
        return self._collective(tmp.nbytes, chain(self._post(tmp, kind), _copy_back(tmp, buf)),
                                self.comm.Iallreduce, IN_PLACE, [tmp, mpitype], op)

    def reduce(self, buf: np.ndarray, kind: RedOpType, factor: Any, root: int) -> Started:
        mpitype, op, stage = _PLANS[kind].get(buf.dtype) or reduction_plan(buf.dtype, kind)
        at_root = self.rank == root
        work_buf = buf if stage is None else buf.astype(stage)
        if kind is _PREMUL_SUM:
            if at_root or work_buf is not buf:
                _premultiply(work_buf, factor, out=work_buf)
            else:  # the caller's buffer stays untouched on non-roots
                work_buf = _premultiply(buf, factor)
        if at_root:
            finish = chain(self._post(work_buf, kind),
                           None if work_buf is buf else _copy_back(work_buf, buf))
            return self._collective(work_buf.nbytes, finish, self.comm.Ireduce, IN_PLACE,
                                    [work_buf, mpitype], op, root)
        return self._collective(work_buf.nbytes, None, self.comm.Ireduce, [work_buf, mpitype],
                                None, op, root)

    def all_gather(self, send: Optional[np.ndarray], recv: np.ndarray,
                   counts: Optional[Sequence[int]]) -> Started:
        mpitype = _TRANSFER.get(recv.dtype) or transfer_type(recv.dtype)
        sendspec = IN_PLACE if send is None else [send, mpitype]
        if counts is None:
            return self._collective(recv.nbytes, None, self.comm.Iallgather, sendspec,
                                    [recv, mpitype])
        return _start(None, self.comm.Iallgatherv, sendspec,
                      [recv, (counts, _displacements(counts)), mpitype])

    def gather(self, send: np.ndarray, recv: Optional[np.ndarray], root: int,
               counts: Optional[Sequence[int]]) -> Started:
        mpitype = _TRANSFER.get(send.dtype) or transfer_type(send.dtype)
        if counts is None:
            recvspec = [recv, mpitype] if recv is not None else None
            return _start(None, self.comm.Igather, [send, mpitype], recvspec, root)
        recvspec = ([recv, (counts, _displacements(counts)), mpitype]
                    if recv is not None else None)
        return _start(None, self.comm.Igatherv, [send, mpitype], recvspec, root)

    def scatter(self, send: Optional[np.ndarray], recv: np.ndarray, root: int,
                counts: Optional[Sequence[int]]) -> Started:
        mpitype = _TRANSFER.get(recv.dtype) or transfer_type(recv.dtype)
        if counts is None:
            sendspec = [send, mpitype] if send is not None else None
            return _start(None, self.comm.Iscatter, sendspec, [recv, mpitype], root)
        sendspec = ([send, (counts, _displacements(counts)), mpitype]
                    if send is not None else None)
        return _start(None, self.comm.Iscatterv, sendspec, [recv, mpitype], root)

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, kind: RedOpType,
                       factor: Any, counts: Optional[Sequence[int]]) -> Started:
        mpitype, op, stage = _PLANS[kind].get(send.dtype) or reduction_plan(send.dtype, kind)
        if kind is _SUM and stage is None and counts is None:  # the common case
            return self._collective(send.nbytes, None, self.comm.Ireduce_scatter_block,
                                    [send, mpitype], [recv, mpitype], op)
        work_send, work_recv = send, recv
        if stage is not None:
            work_send, work_recv = send.astype(stage), np.empty(recv.shape, stage)
        if kind is _PREMUL_SUM:
            work_send = (_premultiply(work_send, factor, out=work_send)
                         if work_send is not send else _premultiply(send, factor))
        finish = chain(self._post(work_recv, kind),
                       None if work_recv is recv else _copy_back(work_recv, recv))
        if counts is None:
            return self._collective(work_send.nbytes, finish, self.comm.Ireduce_scatter_block,
                                    [work_send, mpitype], [work_recv, mpitype], op)
        return _start(finish, self.comm.Ireduce_scatter, [work_send, mpitype],
                      [work_recv, mpitype], list(counts), op)

    def all_to_all(self, send: np.ndarray, recv: np.ndarray,
                   send_counts: Optional[Sequence[int]],
                   recv_counts: Optional[Sequence[int]]) -> Started:
        mpitype = _TRANSFER.get(recv.dtype) or transfer_type(recv.dtype)
        if send_counts is None and recv_counts is None:
            return self._collective(send.nbytes, None, self.comm.Ialltoall,
                                    [send, mpitype], [recv, mpitype])
        return _start(None, self.comm.Ialltoallv,
                      [send, (send_counts, _displacements(send_counts)), mpitype],
                      [recv, (recv_counts, _displacements(recv_counts)), mpitype])

    def barrier(self) -> Started:
        return _start(None, self.comm.Ibarrier)

    # -- point to point ---------------------------------------------------------------
    def send(self, buf: np.ndarray, dst: int, tag: int) -> Started:
        mpitype = _TRANSFER.get(buf.dtype) or transfer_type(buf.dtype)
        return _start(None, self.comm.Isend, [buf, mpitype], dst, tag)

    def recv(self, buf: np.ndarray, src: Optional[int], tag: int) -> Started:
        mpitype = _TRANSFER.get(buf.dtype) or transfer_type(buf.dtype)
        if src is not None:
            return _start(None, self.comm.Irecv, [buf, mpitype], src, tag)
        receive = self._any_source.post([buf, mpitype], tag)  # see .anysource
        return receive, receive.get_source, buf

    # -- life cycle -------------------------------------------------------------------
    def shutdown(self) -> None:
        """Free the gates' communicator; the group layer owns and frees ``comm``."""
        gate, self.gate = self.gate, None
        if gate is not None:
            gate.free()

    def abort(self) -> None:
        """Abort every process of the communicator (MPI offers no local abort)."""
        self.comm.Abort(1)


def _copy_back(src: np.ndarray, dst: np.ndarray):
    def copy() -> None:
        np.copyto(dst, src, casting="unsafe")
    return copy
