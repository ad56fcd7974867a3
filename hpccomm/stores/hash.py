"""``HashStore``: a thread-safe store inside one process.

Useful for tests and for single-process groups; the state machine is the shared
:class:`~hpccomm.stores._state.KVState`, guarded by a condition variable so a
blocked ``get``/``wait``/``queue_pop`` sleeps until another thread changes the state.
"""
from __future__ import annotations

import threading
import time
from typing import List, Optional, Sequence, Tuple

from hpccomm.stores._state import PENDING, KVState
from hpccomm.stores._wire import Op, Status
from hpccomm.stores.base import RequestStore, Store


class _Shared:
    __slots__ = ("state", "cond")

    def __init__(self) -> None:
        self.state = KVState()
        self.cond = threading.Condition()


class HashStore(RequestStore):
    """An in-process store; ``clone()`` shares the same keys."""

    def __init__(self) -> None:
        super().__init__()
        self._shared = _Shared()

    def _call(self, op: Op, fields: Sequence[bytes],
              timeout_s: Optional[float] = None) -> Tuple[Status, List[bytes]]:
        shared = self._shared
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with shared.cond:
            while True:
                before = shared.state.version
                result = shared.state.apply(op, fields)
                if shared.state.version != before:
                    shared.cond.notify_all()
                if result is not PENDING:
                    return result
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return Status.TIMEOUT, shared.state.missing(op, fields)
                shared.cond.wait(left)

    def clone(self) -> "HashStore":
        twin = HashStore.__new__(HashStore)
        Store.__init__(twin, self._timeout_s)
        twin._shared = self._shared
        return twin
