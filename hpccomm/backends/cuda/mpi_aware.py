"""The MPI backend for CuPy arrays: CUDA-aware MPI when available, else pinned-host staging.

Used when a group maps ``cuda`` to ``mpi`` (``backend="mpi"`` or ``"cuda:mpi"``). It wraps
:class:`~.mpi.MPICommunicator`, so MPI semantics (AVG, PREMUL_SUM, bool, bfloat16) are
exactly the CPU backend's.

* **CUDA-aware MPI** (``HPCCOMM_MPI_CUDA_AWARE=1``, mpi4py's ``Query_cuda_support()``, or
  ``MPICH_GPU_SUPPORT_ENABLED=1`` on Cray MPICH): device pointers go straight to MPI
  after the caller's current stream is synchronized (MPI knows no streams). Reductions
  that need a device-side step before MPI reads the buffer (PREMUL_SUM, dtypes MPI
  reduces in float32) take the staging path instead.
* **Staging**: inputs are copied to pinned host buffers (synchronizing the current
  stream), MPI runs on them, and outputs are copied back when the operation completes.

Operations return the MPI backend's ``(test, finish, keep)``: CPU semantics (a wait
blocks the CPU), as MPI itself has.
"""
from __future__ import annotations

import sys
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ... import launcher_env, settings
from ...errors import DistError
from ...types import RedOpType
from ...work import Started, chain
from . import device as _cuda
from ..base import Communicator
from ..mpi.communicator import MPICommunicator, reduction_plan


def cuda_aware_mpi() -> bool:
    """Whether the MPI library takes device pointers (env override, then library query)."""
    forced = settings.MPI_CUDA_AWARE.get()
    if forced is not None:
        return forced
    mpi = sys.modules.get("mpi4py.MPI")  # loaded by backends.mpi
    query = getattr(mpi, "Query_cuda_support", None)
    if query is not None:
        try:
            return bool(query())
        except Exception:
            return False
    return launcher_env.mpich_gpu_support()


def _then(started: Started, step: Any, keep: Any) -> Started:
    """``started`` with ``step`` (or nothing) after its own finishing step; ``keep`` kept
    alive until then."""
    test, first, held = started
    return test, chain(first, step), (held, keep)


class MPICudaCommunicator(Communicator):
    """MPI for arrays on the GPU: direct (CUDA-aware) or staged through pinned memory."""

    name = "mpi"

    def __init__(self, comm: Any, timeout: Optional[float] = None):
        self.inner = MPICommunicator(comm, timeout)
        self.rank, self.size = self.inner.rank, self.inner.size
        self.cp = _cuda.cupy()
        self.device = _cuda.bound_device()
        self.cuda_aware = cuda_aware_mpi()

    # -- staging helpers ------------------------------------------------------------------------
    def _sync(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    def _host(self, arr: Any, copy: bool = True) -> np.ndarray:
        """A pinned host array shaped like ``arr`` (holding its data if ``copy``)."""
        memory = self.cp.cuda.alloc_pinned_memory(max(arr.nbytes, 1))
        host = np.frombuffer(memory, arr.dtype, arr.size).reshape(arr.shape)
        if copy and arr.size:
            arr.get(out=host)
        return host

    def _back(self, started: Started, pairs: List[Tuple[Any, np.ndarray]]) -> Started:
        """Copy host results into the device arrays once ``started`` completes."""
        def copy_back() -> None:
            for dev, host in pairs:
                if dev.size:
                    dev.set(host)
            self._sync()  # the host buffers may be freed once this returns
        return _then(started, copy_back, pairs)

    def capturing(self) -> bool:
        return _cuda.caller_stream(self.cp)[1]

    def _direct(self, kind: Optional[RedOpType], dtype: Any) -> bool:
        """Whether this call may hand device pointers to MPI (every operation asks first,
        so a CUDA graph capture is refused here: MPI synchronizes the host)."""
        if _cuda.caller_stream(self.cp)[1]:
            raise DistError("MPI on CuPy arrays cannot be captured in a CUDA graph: MPI "
                            "knows no streams, so each call synchronizes the host (use "
                            "the NCCL backend, backend='cpu:mpi,cuda:nccl', to capture)")
        if not self.cuda_aware:
            return False
        if kind is None:
            return True
        if kind == RedOpType.PREMUL_SUM:
            return False
        _, op, stage = reduction_plan(dtype, kind)  # MPI's own op, on device memory
        return stage is None and op.is_predefined  # (not a NaN-propagating MIN in Python)

    # -- collectives ---------------------------------------------------------------------------
    def broadcast(self, buf: Any, root: int) -> Started:
        if self._direct(None, buf.dtype):
            self._sync()
            return self.inner.broadcast(buf, root)
        host = self._host(buf, copy=self.rank == root)
        return self._back(self.inner.broadcast(host, root), [(buf, host)])

    def all_reduce(self, buf: Any, kind: RedOpType, factor: Any) -> Started:
        if self._direct(kind, buf.dtype):
            self._sync()
            return self.inner.all_reduce(buf, kind, factor)
        host = self._host(buf)
        return self._back(self.inner.all_reduce(host, kind, factor), [(buf, host)])

    def reduce(self, buf: Any, kind: RedOpType, factor: Any, root: int) -> Started:
        if self._direct(kind, buf.dtype):
            self._sync()
            return self.inner.reduce(buf, kind, factor, root)
        host = self._host(buf)
        started = self.inner.reduce(host, kind, factor, root)
        return self._back(started, [(buf, host)] if self.rank == root else [])

    def all_gather(self, send: Optional[Any], recv: Any,
                   counts: Optional[Sequence[int]]) -> Started:
        if self._direct(None, recv.dtype):
            self._sync()
            return self.inner.all_gather(send, recv, counts)
        hsend = None if send is None else self._host(send)
        hrecv = self._host(recv, copy=send is None)
        return self._back(self.inner.all_gather(hsend, hrecv, counts), [(recv, hrecv)])

    def gather(self, send: Any, recv: Optional[Any], root: int,
               counts: Optional[Sequence[int]]) -> Started:
        if self._direct(None, send.dtype):
            self._sync()
            return self.inner.gather(send, recv, root, counts)
        hsend = self._host(send)
        hrecv = None if recv is None else self._host(recv, copy=False)
        started = self.inner.gather(hsend, hrecv, root, counts)
        return self._back(started, [] if recv is None else [(recv, hrecv)])

    def scatter(self, send: Optional[Any], recv: Any, root: int,
                counts: Optional[Sequence[int]]) -> Started:
        if self._direct(None, recv.dtype):
            self._sync()
            return self.inner.scatter(send, recv, root, counts)
        hsend = None if send is None else self._host(send)
        hrecv = self._host(recv, copy=False)
        return self._back(self.inner.scatter(hsend, hrecv, root, counts), [(recv, hrecv)])

    def reduce_scatter(self, send: Any, recv: Any, kind: RedOpType, factor: Any,
                       counts: Optional[Sequence[int]]) -> Started:
        if self._direct(kind, send.dtype):
            self._sync()
            return self.inner.reduce_scatter(send, recv, kind, factor, counts)
        hsend, hrecv = self._host(send), self._host(recv, copy=False)
        started = self.inner.reduce_scatter(hsend, hrecv, kind, factor, counts)
        return self._back(started, [(recv, hrecv)])

    def all_to_all(self, send: Any, recv: Any, send_counts: Optional[Sequence[int]],
                   recv_counts: Optional[Sequence[int]]) -> Started:
        if self._direct(None, send.dtype):
            self._sync()
            return self.inner.all_to_all(send, recv, send_counts, recv_counts)
        hsend, hrecv = self._host(send), self._host(recv, copy=False)
        started = self.inner.all_to_all(hsend, hrecv, send_counts, recv_counts)
        return self._back(started, [(recv, hrecv)])

    def barrier(self) -> Started:
        return self.inner.barrier()

    # -- point to point -----------------------------------------------------------------------
    def send(self, buf: Any, dst: int, tag: int) -> Started:
        if self._direct(None, buf.dtype):
            self._sync()
            return self.inner.send(buf, dst, tag)
        host = self._host(buf)
        return _then(self.inner.send(host, dst, tag), None, host)

    def recv(self, buf: Any, src: Optional[int], tag: int) -> Started:
        if self._direct(None, buf.dtype):
            self._sync()
            return self.inner.recv(buf, src, tag)
        host = self._host(buf, copy=False)
        return self._back(self.inner.recv(host, src, tag), [(buf, host)])

    # -- life cycle -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        self.inner.shutdown()

    def abort(self) -> None:
        self.inner.abort()
