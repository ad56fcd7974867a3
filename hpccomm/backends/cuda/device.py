"""CUDA plumbing shared by the GPU backends: device binding, stream-ordered Work, watchdog.

CuPy is imported lazily (:func:`cupy`), never when ``hpccomm`` is imported.

* **Device binding.** ``init_process_group`` calls :func:`bind_at_init` once: it records
  ``device_id=`` if given, else this rank's node-local index (``LOCAL_RANK`` or
  ``MPI_Comm_split_type(SHARED)`` on the world). The device is
  ``device_id`` or ``local_rank % device_count``, fixed then, never re-guessed later.
* **Streams.** A synchronous operation is enqueued on the caller's current stream; an
  asynchronous one on its backend's internal stream after an event recorded on the
  caller's current stream, and its :class:`CudaWork` holds a "done" event.
  ``wait()`` makes the caller's current stream wait for that event and returns without
  blocking the CPU (torch's CUDA semantics); ``is_completed()`` queries the event.
  ``HPCCOMM_NCCL_BLOCKING_WAIT=1`` makes ``wait()`` block the CPU under the timeout.
  Done events come from a pool (:class:`Watchdog` gives them back once done), so a
  warmed-up call creates none.
* **Graph capture.** :func:`caller_stream` says whether the caller's stream (CuPy's
  current one, or torch's while torch captures) is capturing a CUDA graph. A captured
  operation is enqueued on that stream and nothing else: no event, no query, no host
  synchronization, no allocation; its Work is complete at once (:data:`CAPTURED`).
* **Timeouts.** A :class:`Watchdog` thread per backend communicator checks outstanding
  events against their deadlines; on expiry it records a ``DistTimeoutError`` and aborts
  the communicator (``ncclCommAbort``), so the stuck kernels exit and the error surfaces
  at the next call or wait.
"""
from __future__ import annotations

import collections
import importlib.util
import sys
import threading
import time
from typing import Any, Callable, Deque, List, Optional, Tuple

import numpy as np

from ... import launcher_env, observe, settings
from ...mpi_level import helper_lock
from ...errors import DistError
from ...work import Work

_monotonic = time.monotonic

_cupy: Any = None


def cupy() -> Any:
    """The ``cupy`` module (imported on first use)."""
    global _cupy
    if _cupy is None:
        import cupy as module

        _cupy = module
    return _cupy


def cupy_installed() -> bool:
    """Whether CuPy could be imported (no import is done)."""
    return _cupy is not None or importlib.util.find_spec("cupy") is not None


def blocking_wait() -> bool:
    """Whether ``Work.wait`` on GPU work blocks the CPU (``HPCCOMM_NCCL_BLOCKING_WAIT=1``)."""
    return settings.NCCL_BLOCKING_WAIT.get()


# -- device binding -------------------------------------------------------------------------
class _Binding:
    device_id: Optional[int] = None     # device_id= of init_process_group
    local_rank: Optional[int] = None
    local_size: Optional[int] = None
    device: Optional[int] = None        # resolved index, fixed once resolved


binding = _Binding()


def bind_at_init(world_comm: Any, device_id: Any) -> None:
    """Record what decides this rank's GPU (called once by ``init_process_group``).

    Does nothing (and no communication) when CuPy is not installed and no
    ``device_id`` was given, so CPU-only jobs are unaffected. Otherwise the device is
    resolved and made CuPy's current device here (importing CuPy), so arrays created
    after ``init_process_group`` are on the bound GPU.
    """
    if device_id is not None:
        index = getattr(device_id, "index", device_id)
        if index is None or not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise DistError(f"init_process_group: device_id {device_id!r} must be a "
                            f"non-negative device index")
        binding.device_id = index
    elif not cupy_installed():
        return
    else:
        local_rank, local_size = local_rank_from_env()
        if local_rank is None:
            from ..mpi.plumbing import node_local

            local_rank, local_size = node_local(world_comm)
        binding.device_id = None
        binding.local_rank, binding.local_size = local_rank, local_size
    binding.device = None
    try:  # make the device current now, so arrays made after init live on it
        bound_device()
    except Exception:  # no CuPy or no visible GPU: the NCCL backend reports it when used
        binding.device = None


def local_rank_from_env() -> Tuple[Optional[int], Optional[int]]:
    """``(LOCAL_RANK, LOCAL_WORLD_SIZE)`` as torchrun sets them, or ``(None, None)``."""
    rank, size = launcher_env.torchrun_local_rank()
    return (None, None) if rank is None else (rank, size)


def choose_device(device_id: Optional[int], local_rank: Optional[int],
                  device_count: int) -> int:
    """The device index: ``device_id`` if given, else ``local_rank % device_count``."""
    if device_count <= 0:
        raise DistError("no CUDA device is visible to this process (CUDA_VISIBLE_DEVICES?)")
    if device_id is not None:
        if device_id >= device_count:
            raise DistError(f"device_id {device_id} is out of range: {device_count} CUDA "
                            f"device(s) visible")
        return device_id
    return (local_rank or 0) % device_count


def bound_device() -> int:
    """This process's GPU index, resolved once (made the current CuPy device then)."""
    if binding.device is None:
        cp = cupy()
        count = cp.cuda.runtime.getDeviceCount()
        local_rank = binding.local_rank
        if binding.device_id is None and local_rank is None:
            local_rank = local_rank_from_env()[0] or 0
        binding.device = choose_device(binding.device_id, local_rank, count)
        cp.cuda.Device(binding.device).use()
    return binding.device


# -- the caller's stream and graph capture ----------------------------------------------------
def caller_stream(cp: Any) -> Tuple[Any, bool]:
    """``(stream, capturing)``: the stream a call is ordered on and whether it is capturing
    a CUDA graph. That is CuPy's current stream, unless torch is capturing on its own
    current stream (``torch.cuda.graph``): then torch's, so the operation joins torch's
    graph. Costs a ``cudaStreamIsCapturing``, and with torch's CUDA initialized, torch's
    own check.
    """
    current = cp.cuda.get_current_stream()
    try:
        if current.is_capturing():
            return current, True
        refused = None
    except Exception as exc:  # the legacy stream while some capture is in progress
        refused = exc
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized() and cuda.is_current_stream_capturing():
            return cp.cuda.ExternalStream(cuda.current_stream().cuda_stream), True
    if refused is not None:
        raise DistError(f"CUDA refuses this call's stream, CuPy's current stream {current!r}, "
                        f"while a graph is being captured ({refused}); make the capturing "
                        f"stream current, or use a non-blocking stream") from refused
    return current, False


class _Captured:
    """The done "event" of an operation captured in a CUDA graph: nothing to wait for or
    query on the host (the operation runs when the graph is launched, ordered on its
    stream), so its Work is complete at once."""

    done = True

    def __repr__(self) -> str:
        return "CAPTURED"


CAPTURED = _Captured()


# -- stream-ordered work --------------------------------------------------------------------
class CudaWork(Work):
    """A GPU operation: ``test()`` queries its done event; ``wait()`` orders the stream.

    ``owner`` is the backend communicator; its ``failure`` (a timeout or async NCCL
    error recorded by the watchdog) fails every pending Work of it.
    """

    __slots__ = ("event", "owner")

    def __init__(self, owner: Any, event: Any = None, keep: Any = None,
                 finish: Optional[Callable[[], Any]] = None):
        super().__init__(self._query, finish, keep)
        self.owner = owner
        self.event = event  # None until the batch it belongs to is closed

    def _query(self) -> bool:
        failure = self.owner.failure
        if failure is not None:
            raise failure
        event = self.event
        return event is not None and event.done

    def wait(self, timeout: Any = None) -> bool:
        """Make the current stream wait for this operation (CPU returns at once).

        With ``HPCCOMM_NCCL_BLOCKING_WAIT=1`` the CPU waits instead, under the timeout.
        """
        if self._state or self.owner.blocking:
            return super().wait(timeout)
        failure = self.owner.failure
        if failure is not None:
            self._fail(failure)
            raise failure
        event = self.event
        if event is None:
            raise DistError(f"{self.describe()}: wait() before the batch_isend_irecv "
                            f"batch holding it was closed")
        if event is not CAPTURED:
            cupy().cuda.get_current_stream().wait_event(event)
        self._complete()
        return True

    synchronize = wait

    def block_current_stream(self) -> None:
        self.wait()

    def timed_out(self, waited: float, limit: Optional[float]) -> None:
        try:
            self.owner.fail(None, f"{self.describe()} timed out after {waited:.3f} s "
                                  f"(blocking wait)", abort=True)
        finally:
            super().timed_out(waited, limit)


class Watchdog:
    """Tracks a communicator's outstanding events; aborts it when one outlives its timeout.

    The main thread appends ``(start, event, work, keep, recycle)``: ``work`` is the
    operation's Work, or for a synchronous call made without one the operation's name;
    ``keep`` holds its arrays. Finished heads are dropped (:meth:`reap`), which releases
    those arrays and gives the event back to ``pool`` if ``recycle`` (an event shared by
    several entries is not) and no pending Work holds it. A daemon
    thread polls every ``interval`` seconds; it never enqueues GPU work, it only queries
    events, asks NCCL for asynchronous errors and, on a deadline, calls
    ``owner.fail(..., abort=True)``.
    """

    def __init__(self, owner: Any, device: int, timeout: Optional[float],
                 pool: Optional[List[Any]] = None):
        self.owner = owner
        self.device = device
        self.timeout = timeout
        self.pool: List[Any] = [] if pool is None else pool
        self.entries: Deque[Tuple[float, Any, Any, Any, bool]] = collections.deque()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.interval = 0.05 if timeout is None else min(1.0, max(0.01, timeout / 20))

    def track(self, event: Any, work: Any, keep: Any = None, recycle: bool = True) -> None:
        """Watch ``event``, recorded after ``work`` (a Work, or a synchronous call's name)."""
        entry = (_monotonic(), event, work, keep, recycle)
        with self.lock:
            self.entries.append(entry)
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="hpccomm-nccl-watchdog",
                                           daemon=True)
            self.thread.start()

    def reap(self) -> None:
        """Drop the finished heads; each event goes back to the pool unless a Work that
        is still pending holds it (a Work waited for later releases nothing: its event
        is simply dropped)."""
        entries, pool = self.entries, self.pool
        with self.lock:
            while entries and entries[0][1].done:
                _, event, work, _, recycle = entries.popleft()
                if recycle and (type(work) is str or work.state != "pending"):
                    pool.append(event)

    def pending(self) -> List[Tuple[float, Any, Any, Any, bool]]:
        self.reap()
        with self.lock:
            return list(self.entries)

    def _run(self) -> None:
        try:
            cupy().cuda.Device(self.device).use()
        except Exception:
            pass
        while not self.stop.wait(self.interval):
            if self.owner.failure is not None:
                return
            try:
                # a round may time an operation out, whose hooks (the roll call) call MPI:
                # like every helper thread's, under helper_lock
                with helper_lock:
                    self.check(_monotonic())
            except Exception:  # never let the watchdog die silently on a query error
                pass

    def check(self, now: float) -> None:
        """One watchdog round (also called directly by tests)."""
        error = self.owner.async_error()
        if error is not None:
            self.owner.fail(None, f"NCCL reported an asynchronous error: {error}",
                            abort=True, timeout=False)
            return
        for start, event, work, _, _ in self.pending():
            if event.done:
                continue
            if type(work) is str:  # a synchronous call: the group's timeout
                limit, what, work = self.timeout, f"a synchronous {work}", None
            else:
                limit = work.timeout if work.timeout is not None else self.timeout
                what = work.describe()
            if limit is not None and now - start > limit:
                self.owner.fail(work, f"{what} did not finish on the GPU within "
                                      f"{limit} s", abort=True, waited=now - start)
                return

    def close(self) -> None:
        self.stop.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self.lock:
            self.entries.clear()


def run_timeout_hooks(work: Optional[Work], waited: float) -> None:
    """Tell the observers of timeouts (flight recorder) about a GPU timeout."""
    if work is not None:
        observe.timed_out(work, waited)  # errors of observers are skipped there


# -- bfloat16 bit conversions (no bfloat16 kernels needed; work on NumPy and CuPy) -------------
def bf16_bits_to_float32(xp: Any, bits: Any) -> Any:
    """uint16 bfloat16 bit patterns -> float32 values."""
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


def float32_to_bf16_bits(xp: Any, values: Any) -> Any:
    """float32 values -> uint16 bfloat16 bit patterns, rounded to nearest even (NaN kept)."""
    bits = values.view(xp.uint32)
    rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
    nan = values != values
    out = rounded.astype(xp.uint16)
    if bool(nan.any()):
        out[nan] = 0x7FC0
    return out


def is_bfloat16(dtype: Any) -> bool:
    return getattr(dtype, "name", "") == "bfloat16"


def premultiply(xp: Any, src: Any, factor: Any, out: Any) -> Any:
    """``out = src * factor`` in ``src``'s dtype (bfloat16 through float32 bit patterns)."""
    if is_bfloat16(src.dtype):
        scaled = bf16_bits_to_float32(xp, src.view(xp.uint16)) * np.float32(scalar(factor))
        out.view(xp.uint16)[...] = float32_to_bf16_bits(xp, scaled.astype(xp.float32))
        return out
    xp.multiply(src, scalar(factor), out=out)
    return out


def scalar(factor: Any) -> Any:
    """A Python number from a number or a one-element array (a PREMUL_SUM factor)."""
    return factor.item() if hasattr(factor, "item") else factor
