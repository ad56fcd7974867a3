"""A store server's request loop body, shared by the TCPStore and MPIStore servers.

:class:`StoreCore` owns one :class:`KVState`, decodes request payloads, answers what
can be answered now and parks the rest (``get`` of a missing key, ``wait``, blocking
``queue_pop``) until a later change satisfies them or their deadline passes. It does
no I/O and takes no locks: each server calls it from one thread at a time. A reply
to the request just submitted is returned; replies that a change makes due to parked
requests of other clients are queued in :attr:`StoreCore.outbox` as ``(token, reply)``
pairs for the server to ship to whoever ``token`` names.

:meth:`StoreCore.submit` is the servers' hot path: one decode, one handler call, one
encode, no allocation beyond the reply, and the parked requests are looked at only
when some exist and the state changed.
"""
from __future__ import annotations

import math
import time
from typing import Any, Hashable, List, Optional, Sequence, Tuple

from hpccomm.stores._state import HANDLERS, PENDING, KVState
from hpccomm.stores._wire import Status, decode_request, encode_framed_reply, encode_reply

Outgoing = List[Tuple[Hashable, bytes]]


class _Waiter:
    __slots__ = ("token", "op", "fields", "deadline")

    def __init__(self, token: Hashable, op: int, fields: Sequence[bytes], deadline: float):
        self.token, self.op, self.fields, self.deadline = token, op, fields, deadline


class StoreCore:
    """Apply request payloads to a :class:`KVState`, holding blocked requests."""

    def __init__(self, default_timeout_s: Optional[float], framed: bool = False) -> None:
        self.state = KVState()
        self.default_timeout_s = default_timeout_s
        #: Replies carry the TCP length prefix (TCPStore) or not (MPIStore).
        self._encode = encode_framed_reply if framed else encode_reply
        self._waiters: List[_Waiter] = []
        self._earliest = math.inf  # no waiter's deadline is before this
        #: Replies due to parked requests, ``(token, reply)``; the server empties it.
        self.outbox: Outgoing = []

    def submit(self, token: Hashable, payload: bytes, now: Optional[float] = None,
               start: int = 0, end: int = -1) -> Optional[bytes]:
        """Handle the request ``payload[start:end]`` from ``token``: its reply, or None
        when it parks. Replies it makes due to others land in :attr:`outbox`.
        ``now`` (``time.monotonic()``) is read only if the request parks.

        Raises :class:`~hpccomm.stores._wire.ProtocolError` for a malformed payload,
        before the state is touched.
        """
        op, timeout_ms, fields = decode_request(payload, start, end)
        state = self.state
        before = state.version
        result = HANDLERS[op](state, fields)
        if result is PENDING:
            if timeout_ms >= 0:
                timeout = timeout_ms / 1000.0
            else:
                timeout = math.inf if self.default_timeout_s is None else self.default_timeout_s
            deadline = (time.monotonic() if now is None else now) + timeout
            self._waiters.append(_Waiter(token, op, fields, deadline))
            if deadline < self._earliest:
                self._earliest = deadline
            return None
        if self._waiters and state.version != before:
            self.outbox += self._retry()
        status, out = result
        return self._encode(status, out)

    def _retry(self) -> Outgoing:
        """Answer every waiter the state now satisfies (a pop may unblock others)."""
        out: Outgoing = []
        state = self.state
        progress = True
        while progress and self._waiters:
            progress = False
            for waiter in list(self._waiters):
                result = HANDLERS[waiter.op](state, waiter.fields)
                if result is not PENDING:
                    self._waiters.remove(waiter)
                    out.append((waiter.token, self._encode(*result)))
                    progress = True
        return out

    @property
    def waiting(self) -> int:
        """How many requests are parked."""
        return len(self._waiters)

    def due(self, now: float) -> bool:
        """Whether some parked request's deadline has passed (cheap)."""
        return now >= self._earliest

    @property
    def next_expiry(self) -> float:
        """No parked request's deadline comes before this (``math.inf``: none parked)."""
        return self._earliest

    def expire(self, now: float) -> Outgoing:
        """Time out the waiters whose deadline has passed; their replies."""
        if now < self._earliest or not self._waiters:
            return []
        out: Outgoing = []
        for waiter in [w for w in self._waiters if w.deadline <= now]:
            self._waiters.remove(waiter)
            missing = self.state.missing(waiter.op, waiter.fields)
            out.append((waiter.token, self._encode(Status.TIMEOUT, missing)))
        self._earliest = min((w.deadline for w in self._waiters), default=math.inf)
        return out

    def next_deadline(self) -> Optional[float]:
        """The earliest waiter deadline, or None when nobody waits."""
        finite = [w.deadline for w in self._waiters if w.deadline != math.inf]
        return min(finite) if finite else None

    def drop(self, token: Any) -> None:
        """Forget the waiters of a client that went away."""
        if self._waiters:
            self._waiters = [w for w in self._waiters if w.token != token]
