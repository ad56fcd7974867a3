"""hpccomm's operations in torch's profiler, recorded as torch's own backends record theirs.

While a torch profiler runs (``torch.profiler.profile``, ``torch.autograd.profiler.profile``
and the other profilers torch starts from Python), every operation of an hpccomm group
records one event named ``"<backend>:<operation>"`` (``hpccomm:all_reduce``, or
``mpi:all_reduce`` on a group made as backend ``"mpi"``) with its input tensors' shapes,
from its start to its completion, exactly as ProcessGroupMPI and ProcessGroupGloo name
theirs. torch marks those events asynchronous because they may end on another thread
than the one that began them; hpccomm's end there too, so ``FunctionEvent.is_async`` holds
as it does for gloo and MPI: an asynchronous operation ends its event on the thread that
completes it, and one that completes on its own caller's thread (every synchronous
operation) hands its end to a small closing thread and waits for it (two thread
hand-offs, about 125 µs on a 2-core machine, spent only while a profiler runs).

Without a profiler the cost is one test of torch's own flag for Python-side profiling
checks (``torch.autograd.profiler._is_profiler_enabled``) per operation.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Dict, Optional, Sequence

import torch.autograd.profiler as _profiler
from torch._C import _autograd

_enter = _autograd._record_function_with_args_enter
_exit = _autograd._record_function_with_args_exit
_ident = threading.get_ident
#: Seconds a caller waits for the closing thread to end its event: ending one takes
#: microseconds; past this the caller goes on (the event ends late, or not at all, in
#: the profile) rather than wait on a helper thread without a deadline.
CLOSE_WAIT_S = 5.0

#: Event names that differ from hpccomm's name for the operation (torch's backends name
#: both all-to-alls ``all_to_all`` and a receive from any rank ``recvAnySource``).
TITLES: Dict[str, str] = {"all_to_all_single": "all_to_all",
                          "recv_anysource": "recvAnySource"}


def recording() -> bool:
    """Whether a torch profiler started from Python is running."""
    return _profiler._is_profiler_enabled


def title(backend: str, op: str) -> str:
    """The event name of operation ``op`` on a group of backend ``backend``."""
    return f"{backend}:{TITLES.get(op, op)}"


class Record:
    """One operation's profiler event, from its start to :meth:`end`."""

    __slots__ = ("_handle", "_thread", "_lock")

    def __init__(self, name: str, inputs: Sequence[Any]):
        self._handle: Optional[Any] = _enter(name, *inputs)
        self._thread = _ident()
        self._lock = threading.Lock()

    def end(self) -> None:
        """End the event (once; later calls do nothing), on another thread than the one
        that began it."""
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is None:
            return
        if _ident() != self._thread:
            _exit(handle)
        else:
            _closer.close(handle)


class _Closer:
    """The thread that ends the events of operations completed by their own caller."""

    def __init__(self) -> None:
        self._requests: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._starting = threading.Lock()

    def close(self, handle: Any) -> None:
        """End ``handle``'s event on the closing thread, and wait until it has (at most
        :data:`CLOSE_WAIT_S`)."""
        done = threading.Lock()
        done.acquire()
        self._requests.put((handle, done))
        if self._thread is None:
            with self._starting:
                if self._thread is None:
                    thread = threading.Thread(target=self._serve, daemon=True,
                                              name="hpccomm-profiler-events")
                    thread.start()
                    self._thread = thread
        done.acquire(timeout=CLOSE_WAIT_S)

    def _serve(self) -> None:
        while True:
            handle, done = self._requests.get()
            try:
                _exit(handle)
            except Exception:  # pragma: no cover - the profiler went away; nothing to end
                pass
            finally:
                done.release()


_closer = _Closer()
