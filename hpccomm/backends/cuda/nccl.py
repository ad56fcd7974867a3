"""The NCCL backend: CuPy arrays through ``cupy.cuda.nccl``, bootstrapped over MPI.

Rank 0 of the group creates the NCCL unique id and broadcasts it over the group's MPI
communicator: no store, no port. The group communicator is made on the first
collective (all ranks call it); a point-to-point call before any collective makes a
two-rank communicator for that pair (id sent over MPI by the lower rank), as torch does.
``batch_isend_irecv`` always uses the group communicator, in one NCCL group call.

A synchronous operation (``async_op=False``) is enqueued on the caller's current stream,
as torch does: nothing to order across streams. The common ones (a contiguous CuPy
array, a dtype and op NCCL reduces natively) take :meth:`NCCLCommunicator.stream_run`,
which builds no Work; the rest, and every asynchronous operation, go through the
methods below: on this backend's internal stream, after an event recorded on the
caller's current stream, returning a :class:`~.device.CudaWork`. Done events come from a
pool that the watchdog refills, so a warmed-up call creates no CUDA event.

Inside a CUDA graph capture (the caller's stream is capturing, see
:func:`~.device.caller_stream`) every operation is enqueued on the capturing stream and
nothing else happens: no event, no query, no host synchronization, no allocation, and
the Work is complete at once. What would need any of those (a first collective, which
makes the NCCL communicator; staged dtypes and ops) raises instead.
Movement (broadcast, gather, send...) is byte-exact (``ncclInt8``). Reductions map to
NCCL types and ops; what NCCL lacks is done around it: complex as pairs of reals, bool
as uint8 MIN/MAX, int16 in int32, ``AVG`` as ``ncclAvg`` (NCCL >= 2.10, else sum then
divide), ``PREMUL_SUM`` as a multiply then sum, and bitwise ops or complex PRODUCT by
all-gathering the inputs and reducing locally (correct, not fast).
"""
from __future__ import annotations

import importlib
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ... import settings
from ..._arrays import FAMILY
from ...errors import DistBackendError, DistError, DistValueError
from ...types import RedOpType
from ...work import Work
from . import device as _cuda, nccl4py_binding, nccl_lib
from .nccl_life import Communicators
from .nccl_plan import UFUNC, Plan, make_plan, offsets
from ..base import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BROADCAST, REDUCE, REDUCE_SCATTER,
                    Communicator)

_SUM, _AVG, _PREMUL = RedOpType.SUM, RedOpType.AVG, RedOpType.PREMUL_SUM

_MEMCPY_D2D = 3  # cudaMemcpyDeviceToDevice
_available: Optional[bool] = None
#: Operation code -> name, for the watchdog's message about a synchronous call.
_NAMES = {ALL_REDUCE: "all_reduce", BROADCAST: "broadcast", REDUCE: "reduce",
          ALL_GATHER: "all_gather_into_tensor", REDUCE_SCATTER: "reduce_scatter_tensor",
          ALL_TO_ALL: "all_to_all_single"}


def nccl_module() -> Any:
    """``cupy.cuda.nccl`` (imported on first use, after the NCCL wheel's library is loaded)."""
    nccl_lib.preload()
    return importlib.import_module("cupy.cuda.nccl")


def binding() -> Any:
    """The module that makes and calls the NCCL communicators: CuPy's
    ``cupy.cuda.nccl``, or :mod:`.nccl4py_binding` (in the same shape) when
    ``HPCCOMM_NCCL_BINDING=nccl4py`` or ``HPCCOMM_NCCL_NONBLOCKING`` asks for it."""
    if settings.NCCL_BINDING.get() == "nccl4py" or settings.NCCL_NONBLOCKING.get():
        nccl4py_binding.lib()  # raises, saying what to install, if nccl4py is missing
        return nccl4py_binding
    return nccl_module()


def available() -> bool:
    """True only when CuPy imports, a CUDA device is visible and NCCL loads (cached)."""
    global _available
    if _available is None:
        try:
            cp = _cuda.cupy()
            nccl = nccl_module()
            _available = bool(getattr(nccl, "available", True)
                              and cp.cuda.runtime.getDeviceCount() > 0
                              and nccl.get_version() > 0)
        except Exception:
            _available = False
    return _available


def version() -> Tuple[int, int, int]:
    """The loaded NCCL library's version as ``(major, minor, patch)``."""
    code = nccl_module().get_version()
    if code < 10000:  # NCCL <= 2.8 encodes X*1000 + Y*100 + Z
        return code // 1000, code % 1000 // 100, code % 100
    return code // 10000, code % 10000 // 100, code % 100


class NCCLCommunicator(Communicators, Communicator):
    """One group's NCCL communicator(s), driven on an internal CUDA stream."""

    name = "nccl"
    #: :meth:`abort` waits for no other rank (``ncclCommAbort``).
    aborts_locally = True

    def __init__(self, comm: Any, timeout: Optional[float] = None):
        if not available():
            raise DistBackendError("the NCCL backend needs CuPy, a visible CUDA device and "
                                   "the NCCL library (pip install hpccomm[gpu] for CUDA 12, "
                                   "hpccomm[gpu-cuda13] for CUDA 13; hpccomm info says what "
                                   "was found); hpccomm.is_nccl_available() is False")
        self.mpi_comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.timeout = timeout
        self.cp = _cuda.cupy()
        self.nccl = binding()
        #: Nonblocking communicators (nccl4py): creation and split polled under the
        #: timeout, then aborted, raising DistTimeoutError (the process goes on).
        self.nonblocking = self.nccl is nccl4py_binding and settings.NCCL_NONBLOCKING.get()
        #: Creation from one unique id per this many ranks (nccl4py; 0: one id).
        self.ranks_per_root = (settings.NCCL_RANKS_PER_ROOT.get()
                               if self.nccl is nccl4py_binding else 0)
        self._array = self.cp.ndarray
        self.device = _cuda.bound_device()
        self._dev = self.cp.cuda.Device(self.device)
        with self._dev:
            self.stream = self.cp.cuda.Stream(non_blocking=True)
            self._ready = self.cp.cuda.Event(disable_timing=True)
        self.has_avg = self.nccl.get_version() >= 21000
        self.blocking = _cuda.blocking_wait()
        self.failure: Optional[BaseException] = None
        self._comm: Any = None                      # the group's NCCL communicator
        self._pairs: Dict[int, Any] = {}            # peer -> two-rank communicator
        self._splits = 0                            # splits made of self._comm
        self._created: List[Any] = []               # every NCCL communicator, in order
        self._plans: Dict[Tuple[Any, RedOpType], Plan] = {}
        #: (op, dtype) -> (NCCL type, NCCL op, bytes per counted element): the
        #: reductions :meth:`stream_run` takes, each added when the general path first
        #: plans it (:meth:`_plan`; the op was validated for the dtype by then) and NCCL
        #: does it whole.
        self._native: Dict[Tuple[RedOpType, Any], Tuple[int, int, int]] = {}
        self._batch: Optional[List[Work]] = None
        self._group_open = False
        self._lock = threading.RLock()
        self._closed = False
        self._capturing = False  # whether the operation being enqueued is captured
        #: The done event of the internal stream's latest operation, until a synchronous
        #: call on a caller's stream is ordered after it (so that this rank's operations
        #: reach the device in the order they were called, as when all ran on one stream).
        self._behind: Any = None
        self._pool: List[Any] = []  # done events free for reuse (refilled by the watchdog)
        self.watchdog = _cuda.Watchdog(self, self.device, timeout, self._pool)

    def set_timeout(self, seconds: Optional[float]) -> None:
        super().set_timeout(seconds)
        self.watchdog.timeout = seconds
        if self.nonblocking:
            for made in self._created:
                made.deadline = seconds

    def _p2p(self, peer: int) -> Tuple[Any, int]:
        """(communicator, peer's rank in it) for a send or receive outside a batch."""
        if self._batch is not None:
            comm = self._full()
            self._open_group()
            return comm, peer
        pair = self._pairs.get(peer)
        if pair is not None:
            return pair, 0 if peer < self.rank else 1
        if self._comm is not None or self.size <= 2:
            return self._full(), peer
        self._not_capturing("a first send or receive between two ranks makes their NCCL "
                            "communicator")
        low, high = sorted((self.rank, peer))
        pair = self._pairs[peer] = self._new_comm([low, high], f"pair {low}-{high}")
        return pair, 1 if self.rank == low else 0

    def _open_group(self) -> None:
        if not self._group_open:
            self.nccl.groupStart()
            self._group_open = True

    # -- ordering -------------------------------------------------------------------------
    def _not_capturing(self, why: str) -> None:
        """Raise if the caller's stream is capturing a CUDA graph: ``why`` cannot be."""
        if _cuda.caller_stream(self.cp)[1]:
            raise DistError(f"this operation cannot be captured in a CUDA graph: {why} "
                            f"(run it once before capturing, or outside the capture)")

    def capturing(self) -> bool:
        """Whether the caller's stream is capturing a CUDA graph now."""
        return _cuda.caller_stream(self.cp)[1]

    def _begin(self, *arrays: Any) -> Any:
        """Check state and devices; the stream to enqueue on: the internal one, ordered
        after the caller's stream, or the caller's own when it is capturing a graph."""
        if self.failure is not None:
            raise self.failure
        if self._closed:
            raise DistError("the NCCL communicator was shut down")
        for arr in arrays:
            if arr is not None and arr.device.id != self.device:
                raise DistValueError(f"array on cuda:{arr.device.id}, but this rank's NCCL "
                                     f"communicator is bound to cuda:{self.device} (pass "
                                     f"device_id= to init_process_group or move the array)")
        current, self._capturing = _cuda.caller_stream(self.cp)
        if self._capturing:
            return current
        stream = self.stream
        if current != stream:
            self._ready.record(current)
            stream.wait_event(self._ready)
        return stream

    def _done_event(self) -> Any:
        """A CUDA event to record: one from the pool, else a new one."""
        pool = self._pool
        if not pool:
            self.watchdog.reap()  # finished events go back to the pool
            if not pool:
                with self._dev:
                    return self.cp.cuda.Event(disable_timing=True)
        return pool.pop()

    def _end(self, keep: Any, finish: Any = None) -> Work:
        """The Work of what was just enqueued (its event comes at ``end_batch`` in a batch)."""
        work = _cuda.CudaWork(self, None, keep, finish)
        if self._batch is not None:
            self._batch.append(work)
            return work
        if self._capturing:
            work.event = _cuda.CAPTURED
            return work
        event = self._done_event()
        event.record(self.stream)
        work.event = self._behind = event
        self.watchdog.track(event, work)
        return work

    def _no_staging(self, why: str) -> None:
        """Raise inside a capture: the operation needs a temporary buffer (``why``)."""
        if self._capturing:
            raise DistError(f"this operation cannot be captured in a CUDA graph: {why} "
                            f"needs a temporary device buffer per call")

    # -- the synchronous fast path ------------------------------------------------------------
    def stream_run(self, code: int, send: Any, recv: Any, redop: Any, root: int) -> int:
        """A synchronous operation enqueued whole on the caller's current stream, with no
        Work, no cross-stream event and no allocation: 0 once enqueued, -1 (nothing done)
        where the general path applies: a first call (no NCCL communicator yet), blocking
        wait, an open batch, a failure, anything but contiguous CuPy arrays of this
        device, a reduction not yet planned or not NCCL's own (:meth:`_plan`), sizes the
        general path must check, overlapping buffers it must copy, empty ones.

        ``code`` is an operation code of :mod:`..base`; ``send``/``recv`` are the input
        and output (the same array for all_reduce, broadcast and reduce), ``redop`` the
        caller's op, ``root`` a group rank already resolved. Outside a capture a pooled
        event recorded after the call lets the watchdog time it and keeps the arrays
        alive until it is done.
        """
        array = self._array
        if type(send) is not array or type(recv) is not array:
            return -1
        dtype = send.dtype
        if (not send.flags.c_contiguous or send.device.id != self.device or
                (recv is not send and (recv.dtype != dtype or not recv.flags.c_contiguous
                                       or recv.device.id != self.device))):
            return -1
        with self._lock:
            comm = self._comm
            if (comm is None or self.failure is not None or self._closed or self.blocking
                    or self._batch is not None):
                return -1
            if code == ALL_REDUCE or code == REDUCE:
                native = (self._native.get((redop, dtype)) if type(redop) is RedOpType
                          else None)
                if native is None:
                    return -1
                ntype, nop, unit = native
                stream, capturing = self._caller_stream()
                ptr = send.data.ptr
                if code == ALL_REDUCE:
                    comm.allReduce(ptr, ptr, send.nbytes // unit, ntype, nop, stream.ptr)
                else:
                    comm.reduce(ptr, ptr, send.nbytes // unit, ntype, nop, root, stream.ptr)
            elif code == BROADCAST:
                if dtype not in FAMILY:
                    return -1
                stream, capturing = self._caller_stream()
                ptr = send.data.ptr
                comm.broadcast(ptr, ptr, send.nbytes, self.nccl.NCCL_INT8, root, stream.ptr)
            else:
                started = self._stream_pair(comm, code, send, recv, redop, dtype)
                if started is None:
                    return -1
                stream, capturing = started
            if not capturing:
                event = self._done_event()
                event.record(stream)
                self.watchdog.track(event, _NAMES[code], (send, recv))
        return 0

    def _caller_stream(self) -> Tuple[Any, bool]:
        """``(stream, capturing)`` for :meth:`stream_run`, the stream ordered after the
        internal stream's latest operation when it has not been yet (outside a capture,
        where that event cannot be waited for)."""
        stream, capturing = _cuda.caller_stream(self.cp)
        behind = self._behind
        if behind is not None and not capturing:
            stream.wait_event(behind)
            self._behind = None
        return stream, capturing

    def _stream_pair(self, comm: Any, code: int, send: Any, recv: Any, redop: Any,
                     dtype: Any) -> Optional[Tuple[Any, bool]]:
        """:meth:`stream_run` for an input and an output array (all_gather_into_tensor,
        reduce_scatter_tensor, all_to_all_single): ``(stream, capturing)`` once enqueued,
        ``None`` where the general path applies."""
        size, n_send, n_recv = self.size, send.nbytes, recv.nbytes
        s_ptr, r_ptr = send.data.ptr, recv.data.ptr
        apart = s_ptr >= r_ptr + n_recv or r_ptr >= s_ptr + n_send
        if not n_send or not n_recv:
            return None
        int8 = self.nccl.NCCL_INT8
        if code == ALL_GATHER:
            if (n_recv != n_send * size or dtype not in FAMILY or
                    not (apart or s_ptr == r_ptr + self.rank * n_send)):
                return None
            stream, capturing = self._caller_stream()
            comm.allGather(s_ptr, r_ptr, n_send, int8, stream.ptr)
        elif code == REDUCE_SCATTER:
            native = self._native.get((redop, dtype)) if type(redop) is RedOpType else None
            if native is None or n_send != n_recv * size or not apart:
                return None
            ntype, nop, unit = native
            stream, capturing = self._caller_stream()
            comm.reduceScatter(s_ptr, r_ptr, n_recv // unit, ntype, nop, stream.ptr)
        elif code == ALL_TO_ALL:
            block = n_send // size
            if (n_send != n_recv or send.size % size or dtype not in FAMILY or not apart):
                return None
            stream, capturing = self._caller_stream()
            handle, me = stream.ptr, self.rank
            self.nccl.groupStart()
            try:
                for peer in range(size):
                    if peer != me:
                        comm.send(s_ptr + peer * block, block, int8, peer, handle)
                        comm.recv(r_ptr + peer * block, block, int8, peer, handle)
            finally:
                self.nccl.groupEnd()
            self._copy(r_ptr + me * block, s_ptr + me * block, block, stream)
        else:
            return None
        return stream, capturing

    def _plan(self, dtype: Any, kind: RedOpType) -> Plan:
        """The plan of a reduction, made once; :meth:`stream_run` takes it from then on
        if NCCL does it whole (no staging, no division, no premultiplication)."""
        plan = self._plans.get((dtype, kind))
        if plan is None:
            plan = self._plans[(dtype, kind)] = make_plan(self.nccl, dtype, kind, self.has_avg)
            if plan.mode == "native" and not plan.divide and kind is not _PREMUL:
                self._native[(kind, dtype)] = (plan.nccl_type, plan.nccl_op,
                                               plan.unit.itemsize)
        return plan

    # -- local steps on the internal stream ---------------------------------------------------
    def _prepare(self, plan: Plan, kind: RedOpType, factor: Any, buf: Any,
                 may_modify: bool) -> Any:
        """The buffer NCCL reduces: ``buf`` itself, or a staged / premultiplied copy."""
        if plan.stage is not None:  # int16/uint16: never PREMUL_SUM (not a float)
            return buf.astype(plan.stage)
        if kind != _PREMUL:
            return buf
        work = buf if may_modify else self.cp.empty(buf.shape, buf.dtype)
        return _cuda.premultiply(self.cp, buf, factor, work)

    def _finish_reduce(self, plan: Plan, work: Any, out: Any) -> None:
        """After the NCCL call: divide for AVG, copy a staged result back."""
        if plan.divide:
            self.cp.true_divide(work, self.size, out=work)
        if work is not out:
            out[...] = work.astype(out.dtype)

    def _count(self, plan: Plan, arr: Any) -> int:
        return arr.nbytes // plan.unit.itemsize

    def _gathered(self, comm: Any, stream: Any, send: Any) -> Any:
        """Every rank's ``send`` as rows of a ``(size, n)`` array (fallback reductions)."""
        rows = self.cp.empty((self.size, send.size), send.dtype)
        comm.allGather(send.data.ptr, rows.data.ptr, send.nbytes, self.nccl.NCCL_INT8,
                       stream.ptr)
        return rows

    def _reduce_rows(self, rows: Any, kind: RedOpType, factor: Any) -> Any:
        """Reduce the rows of a gathered array in rank order (same result on every rank)."""
        ufunc = getattr(self.cp, UFUNC[kind])
        acc = rows[0].copy()
        if kind == _PREMUL:
            _cuda.premultiply(self.cp, acc, factor, acc)
        for index in range(1, self.size):
            row = rows[index]
            if kind == _PREMUL:
                row = _cuda.premultiply(self.cp, row, factor, row.copy())
            ufunc(acc, row, out=acc)
        if kind == _AVG:
            self.cp.true_divide(acc, self.size, out=acc)
        return acc

    # -- collectives ----------------------------------------------------------------------------
    def broadcast(self, buf: Any, root: int) -> Work:
        with self._lock:
            comm = self._full()
            stream = self._begin(buf)
            ptr = buf.data.ptr
            comm.broadcast(ptr, ptr, buf.nbytes, self.nccl.NCCL_INT8, root, stream.ptr)
            return self._end(buf)

    def _capturable(self, plan: Plan, kind: RedOpType, dtype: Any, in_place: bool) -> None:
        """Raise inside a capture where this reduction needs a temporary buffer."""
        if not self._capturing:
            return
        if plan.mode == "gather":
            why = f"{kind.name} on {dtype} (all-gathered, then reduced locally)"
        elif plan.stage is not None:
            why = f"{kind.name} on {dtype} (reduced in {plan.stage})"
        elif kind is _PREMUL and (not in_place or _cuda.is_bfloat16(dtype)):
            why = "PREMUL_SUM here (the input is multiplied into a copy)"
        else:
            return
        raise DistError(f"this operation cannot be captured in a CUDA graph: {why} needs "
                        f"a temporary device buffer per call")

    def all_reduce(self, buf: Any, kind: RedOpType, factor: Any) -> Work:
        plan = self._plans.get((buf.dtype, kind)) or self._plan(buf.dtype, kind)
        with self._lock:
            comm = self._full()
            stream = self._begin(buf)
            if plan.mode == "native" and kind is _SUM:  # the hot path
                ptr = buf.data.ptr
                comm.allReduce(ptr, ptr, buf.nbytes // plan.unit.itemsize, plan.nccl_type,
                               plan.nccl_op, stream.ptr)
                return self._end(buf)
            self._capturable(plan, kind, buf.dtype, True)
            with self._dev, stream:
                if plan.mode == "gather":
                    flat = buf.reshape(-1)
                    rows = self._gathered(comm, stream, flat)
                    flat[...] = self._reduce_rows(rows, kind, factor)
                    return self._end((buf, rows))
                work = self._prepare(plan, kind, factor, buf, True)
                ptr = work.data.ptr
                comm.allReduce(ptr, ptr, self._count(plan, work), plan.nccl_type,
                               plan.nccl_op, stream.ptr)
                self._finish_reduce(plan, work, buf)
            return self._end((buf, work))

    def reduce(self, buf: Any, kind: RedOpType, factor: Any, root: int) -> Work:
        plan = self._plan(buf.dtype, kind)
        at_root = self.rank == root
        with self._lock:
            comm = self._full()
            stream = self._begin(buf)
            self._capturable(plan, kind, buf.dtype, at_root)
            with self._dev, stream:
                if plan.mode == "gather":
                    flat = buf.reshape(-1)
                    rows = self._gathered(comm, stream, flat)
                    if at_root:
                        flat[...] = self._reduce_rows(rows, kind, factor)
                    return self._end((buf, rows))
                work = self._prepare(plan, kind, factor, buf, at_root)
                ptr = work.data.ptr
                comm.reduce(ptr, ptr, self._count(plan, work), plan.nccl_type, plan.nccl_op,
                            root, stream.ptr)
                if at_root:
                    self._finish_reduce(plan, work, buf)
            return self._end((buf, work))

    def all_gather(self, send: Optional[Any], recv: Any,
                   counts: Optional[Sequence[int]]) -> Work:
        int8 = self.nccl.NCCL_INT8
        item = recv.dtype.itemsize
        with self._lock:
            comm = self._full()
            stream = self._begin(send, recv)
            base = recv.data.ptr
            if counts is None:
                block = recv.nbytes // self.size
                src = base + self.rank * block if send is None else send.data.ptr
                comm.allGather(src, base, block, int8, stream.ptr)
            else:
                self.nccl.groupStart()
                try:
                    for peer, (start, count) in enumerate(zip(offsets(counts), counts)):
                        dst = base + start * item
                        src = send.data.ptr if send is not None and peer == self.rank else dst
                        comm.broadcast(src, dst, count * item, int8, peer, stream.ptr)
                finally:
                    self.nccl.groupEnd()
            return self._end((send, recv))

    def gather(self, send: Any, recv: Optional[Any], root: int,
               counts: Optional[Sequence[int]]) -> Work:
        return self._rooted(send, recv, root, counts, to_root=True)

    def scatter(self, send: Optional[Any], recv: Any, root: int,
                counts: Optional[Sequence[int]]) -> Work:
        return self._rooted(recv, send, root, counts, to_root=False)

    def _rooted(self, local: Any, full: Optional[Any], root: int,
                counts: Optional[Sequence[int]], to_root: bool) -> Work:
        """Gather (``to_root``) or scatter: block ``i`` of the root's ``full`` pairs with
        rank ``i``'s ``local``, moved in one NCCL group of sends/receives at the root."""
        int8 = self.nccl.NCCL_INT8
        send, recv = (local, full) if to_root else (full, local)
        with self._lock:
            comm = self._full()
            stream = self._begin(send, recv)
            if self.rank != root:
                if local.nbytes:
                    move = comm.send if to_root else comm.recv
                    move(local.data.ptr, local.nbytes, int8, root, stream.ptr)
                return self._end(local)
            counts = list(counts) if counts else [local.size] * self.size
            item = local.dtype.itemsize
            starts = offsets(counts)
            move = comm.recv if to_root else comm.send
            self.nccl.groupStart()
            try:
                for peer in range(self.size):
                    if peer != root and counts[peer]:
                        move(full.data.ptr + starts[peer] * item, counts[peer] * item,
                             int8, peer, stream.ptr)
            finally:
                self.nccl.groupEnd()
            mine = full.data.ptr + starts[root] * item
            if to_root:
                self._copy(mine, local.data.ptr, local.nbytes, stream)
            else:
                self._copy(local.data.ptr, mine, local.nbytes, stream)
            return self._end((send, recv))

    def _copy(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        if nbytes and dst != src:
            self.cp.cuda.runtime.memcpyAsync(dst, src, nbytes, _MEMCPY_D2D, stream.ptr)

    def reduce_scatter(self, send: Any, recv: Any, kind: RedOpType, factor: Any,
                       counts: Optional[Sequence[int]]) -> Work:
        plan = self._plan(send.dtype, kind)
        with self._lock:
            comm = self._full()
            stream = self._begin(send, recv)
            self._capturable(plan, kind, send.dtype, False)
            with self._dev, stream:
                flat_out = recv.reshape(-1)
                if plan.mode == "gather":
                    flat = send.reshape(-1)
                    rows = self._gathered(comm, stream, flat)
                    sizes = list(counts) if counts else [recv.size] * self.size
                    start = offsets(sizes)[self.rank]
                    flat_out[...] = self._reduce_rows(rows, kind, factor)[start:start + recv.size]
                    return self._end((send, recv, rows))
                work_send = self._prepare(plan, kind, factor, send, False)
                work_recv = recv if plan.stage is None else self.cp.empty(recv.shape, plan.stage)
                if counts is None:
                    comm.reduceScatter(work_send.data.ptr, work_recv.data.ptr,
                                       self._count(plan, work_recv), plan.nccl_type,
                                       plan.nccl_op, stream.ptr)
                else:
                    per = work_send.dtype.itemsize // plan.unit.itemsize
                    item = work_send.dtype.itemsize
                    self.nccl.groupStart()
                    try:
                        for peer, (start, count) in enumerate(zip(offsets(counts), counts)):
                            comm.reduce(work_send.data.ptr + start * item, work_recv.data.ptr,
                                        count * per, plan.nccl_type, plan.nccl_op, peer,
                                        stream.ptr)
                    finally:
                        self.nccl.groupEnd()
                self._finish_reduce(plan, work_recv, recv)
            return self._end((send, recv, work_send, work_recv))

    def all_to_all(self, send: Any, recv: Any, send_counts: Optional[Sequence[int]],
                   recv_counts: Optional[Sequence[int]]) -> Work:
        int8 = self.nccl.NCCL_INT8
        if send_counts is None:
            send_counts = [send.size // self.size] * self.size
            recv_counts = [recv.size // self.size] * self.size
        item = send.dtype.itemsize
        with self._lock:
            comm = self._full()
            stream = self._begin(send, recv)
            sends, recvs = offsets(send_counts), offsets(recv_counts)
            self.nccl.groupStart()
            try:
                for peer in range(self.size):
                    if peer == self.rank:
                        continue
                    if send_counts[peer]:
                        comm.send(send.data.ptr + sends[peer] * item, send_counts[peer] * item,
                                  int8, peer, stream.ptr)
                    if recv_counts[peer]:
                        comm.recv(recv.data.ptr + recvs[peer] * item, recv_counts[peer] * item,
                                  int8, peer, stream.ptr)
            finally:
                self.nccl.groupEnd()
            me = self.rank
            self._copy(recv.data.ptr + recvs[me] * item, send.data.ptr + sends[me] * item,
                       min(send_counts[me], recv_counts[me]) * item, stream)
            return self._end((send, recv))

    def barrier(self) -> Work:
        with self._lock:
            comm = self._full()
            stream = self._begin()
            self._no_staging("an NCCL barrier")
            with self._dev, stream:
                token = self.cp.zeros(1, self.cp.int32)
            comm.allReduce(token.data.ptr, token.data.ptr, 1, self.nccl.NCCL_INT32,
                           self.nccl.NCCL_SUM, stream.ptr)
            return self._end(token)

    # -- point to point ----------------------------------------------------------------------
    def send(self, buf: Any, dst: int, tag: int) -> Work:
        with self._lock:
            comm, peer = self._p2p(dst)
            stream = self._begin(buf)
            comm.send(buf.data.ptr, buf.nbytes, self.nccl.NCCL_INT8, peer, stream.ptr)
            return self._end(buf)

    def recv(self, buf: Any, src: Optional[int], tag: int) -> Work:
        if src is None:
            raise DistValueError("NCCL cannot receive from any source: pass src (or use "
                                 "backend='mpi' for CuPy arrays)")
        with self._lock:
            comm, peer = self._p2p(src)
            stream = self._begin(buf)
            comm.recv(buf.data.ptr, buf.nbytes, self.nccl.NCCL_INT8, peer, stream.ptr)
            return self._end(buf, lambda: src)

    def start_batch(self) -> None:
        """Collect the following sends/receives into one NCCL group call."""
        self._batch = []
        self._group_open = False

    def end_batch(self) -> None:
        """Close the NCCL group; every Work of the batch completes with one event."""
        batch, self._batch = self._batch, None
        if self._group_open:
            self._group_open = False
            self.nccl.groupEnd()
        if batch:
            if self._capturing:
                for work in batch:
                    work.event = _cuda.CAPTURED
                return
            with self._dev:
                event = self._behind = self.cp.cuda.Event(disable_timing=True)
            event.record(self.stream)
            for work in batch:  # one event for them all: not for the pool
                work.event = event
                self.watchdog.track(event, work, recycle=False)
