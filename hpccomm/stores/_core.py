"""A store server's request loop body, shared by the TCPStore and MPIStore servers.

:class:`StoreCore` owns one :class:`KVState`, decodes request payloads, answers what
can be answered now and parks the rest (``get`` of a missing key, ``wait``, blocking
``queue_pop``) until a later change satisfies them or their deadline passes. It does
no I/O and takes no locks: each server calls it from its single server thread and
ships the ``(token, reply)`` pairs back to whoever ``token`` names.
"""
from __future__ import annotations

import math
from typing import Any, Hashable, List, Optional, Sequence, Tuple

from hpccomm.stores._state import PENDING, KVState
from hpccomm.stores._wire import Op, Status, decode_request, encode_reply

Outgoing = List[Tuple[Hashable, bytes]]


class _Waiter:
    __slots__ = ("token", "op", "fields", "deadline")

    def __init__(self, token: Hashable, op: Op, fields: Sequence[bytes], deadline: float):
        self.token, self.op, self.fields, self.deadline = token, op, fields, deadline


class StoreCore:
    """Apply request payloads to a :class:`KVState`, holding blocked requests."""

    def __init__(self, default_timeout_s: Optional[float]) -> None:
        self.state = KVState()
        self.default_timeout_s = default_timeout_s
        self._waiters: List[_Waiter] = []

    def submit(self, token: Hashable, payload: bytes, now: float) -> Outgoing:
        """Handle one request from ``token``; the replies now due (to anyone).

        Raises :class:`~hpccomm.stores._wire.ProtocolError` for a malformed payload,
        before the state is touched.
        """
        op, timeout_ms, fields = decode_request(payload)
        before = self.state.version
        result = self.state.apply(op, fields)
        out: Outgoing = []
        if result is PENDING:
            if timeout_ms >= 0:
                timeout = timeout_ms / 1000.0
            else:
                timeout = math.inf if self.default_timeout_s is None else self.default_timeout_s
            self._waiters.append(_Waiter(token, op, fields, now + timeout))
        else:
            out.append((token, encode_reply(*result)))
        if self.state.version != before:
            out += self._retry()
        return out

    def _retry(self) -> Outgoing:
        """Answer every waiter the state now satisfies (a pop may unblock others)."""
        out: Outgoing = []
        progress = True
        while progress and self._waiters:
            progress = False
            for waiter in list(self._waiters):
                result = self.state.apply(waiter.op, waiter.fields)
                if result is not PENDING:
                    self._waiters.remove(waiter)
                    out.append((waiter.token, encode_reply(*result)))
                    progress = True
        return out

    def expire(self, now: float) -> Outgoing:
        """Time out the waiters whose deadline has passed; their replies."""
        out: Outgoing = []
        for waiter in [w for w in self._waiters if w.deadline <= now]:
            self._waiters.remove(waiter)
            missing = self.state.missing(waiter.op, waiter.fields)
            out.append((waiter.token, encode_reply(Status.TIMEOUT, missing)))
        return out

    def next_deadline(self) -> Optional[float]:
        """The earliest waiter deadline, or None when nobody waits."""
        finite = [w.deadline for w in self._waiters if w.deadline != math.inf]
        return min(finite) if finite else None

    def drop(self, token: Any) -> None:
        """Forget the waiters of a client that went away."""
        self._waiters = [w for w in self._waiters if w.token != token]
