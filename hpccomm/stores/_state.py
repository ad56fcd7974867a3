"""The in-memory key-value state machine behind every store.

HashStore, the TCPStore server, the MPIStore server and FileStore (which loads the
state from its file under a lock) all apply requests through :meth:`KVState.apply`,
so the semantics of every op are written once, here. ``apply`` never blocks: a
request that has to wait (``get`` of a missing key, ``wait``, ``multi_get``,
blocking ``queue_pop``) returns :data:`PENDING` and the caller retries it when the
state changes (:attr:`KVState.version`) or gives up at its deadline.

Semantics follow torch 2.13's HashStore/TCPStore (checked against the real thing):
``add`` parses an existing value like C's ``stoll`` (leading integer, ``""`` is 0);
``compare_set`` on a missing key sets it only when the expected value is empty and
otherwise returns the expected value; queues live beside the plain keys (``check``
and ``wait`` see a non-empty queue, ``get``/``list_keys``/``num_keys``/``delete_key``
do not). Keys starting with ``NUL`` are internal and hidden from ``list_keys`` and
``num_keys``.
"""
from __future__ import annotations

import collections
import re
from typing import Deque, Dict, List, Optional, Sequence, Tuple

from hpccomm.stores._wire import Op, Status

#: Returned by :meth:`KVState.apply` for a request that must wait.
PENDING = None
#: Prefix of keys the stores use internally (worker counts, FileStore membership).
INTERNAL_PREFIX = b"\0hpccomm/"

Reply = Tuple[Status, List[bytes]]
_INT_RE = re.compile(rb"\s*([+-]?\d+)")
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _name(key: bytes) -> str:
    return repr(key.decode("utf-8", "replace"))


def parse_counter(value: bytes) -> int:
    """The integer ``add`` sees in ``value`` (``stoll`` rules: leading integer, ``""`` is 0)."""
    if not value:
        return 0
    if value.isdigit():
        return int(value)
    match = _INT_RE.match(value)
    if match is None:
        raise ValueError(f"value {_name(value[:40])} is not an integer counter")
    return int(match.group(1))


class KVState:
    """Plain keys and FIFO queues, with the store ops applied to them."""

    __slots__ = ("values", "queues", "version")

    def __init__(self) -> None:
        self.values: Dict[bytes, bytes] = {}
        self.queues: Dict[bytes, Deque[bytes]] = {}
        #: Bumped on every change, so waiters know when to retry.
        self.version = 0

    # -- queries ---------------------------------------------------------------------
    def present(self, key: bytes) -> bool:
        """Whether ``wait``/``check`` consider ``key`` present."""
        return key in self.values or bool(self.queues.get(key))

    def missing(self, op: int, fields: Sequence[bytes]) -> List[bytes]:
        """The keys a pending request is still waiting for (for timeout messages)."""
        if op == Op.GET or op == Op.MULTI_GET:
            return [k for k in fields if k not in self.values]
        if op == Op.WAIT:
            return [k for k in fields if not self.present(k)]
        if op == Op.QUEUE_POP:
            return [fields[0]]
        return []

    # -- the ops ---------------------------------------------------------------------
    def apply(self, op: int, fields: Sequence[bytes]) -> Optional[Reply]:
        """Apply one decoded request: its reply, or :data:`PENDING` if it must wait."""
        return HANDLERS[op](self, fields)

    def _set(self, f: Sequence[bytes]) -> Reply:
        self.values[f[0]] = f[1]
        self.version += 1
        return Status.OK, []

    def _get(self, f: Sequence[bytes]) -> Optional[Reply]:
        value = self.values.get(f[0])
        return PENDING if value is None else (Status.OK, [value])

    def _add(self, f: Sequence[bytes]) -> Reply:
        try:
            delta = int(f[1])
            total = parse_counter(self.values.get(f[0], b"")) + delta
        except ValueError as exc:
            return Status.ERROR, [f"add on key {_name(f[0])}: {exc}".encode()]
        if not _INT64[0] <= total <= _INT64[1]:
            return Status.ERROR, [f"add on key {_name(f[0])} overflows int64".encode()]
        out = str(total).encode()
        self.values[f[0]] = out
        self.version += 1
        return Status.OK, [out]

    def _compare_set(self, f: Sequence[bytes]) -> Reply:
        key, expected, desired = f
        current = self.values.get(key)
        if current is None:
            if expected:
                return Status.OK, [expected]
        elif current != expected:
            return Status.OK, [current]
        self.values[key] = desired
        self.version += 1
        return Status.OK, [desired]

    def _wait(self, f: Sequence[bytes]) -> Optional[Reply]:
        return (Status.OK, []) if all(self.present(k) for k in f) else PENDING

    def _check(self, f: Sequence[bytes]) -> Reply:
        return Status.OK, [b"1" if all(self.present(k) for k in f) else b"0"]

    def _num_keys(self, f: Sequence[bytes]) -> Reply:
        return Status.OK, [str(len(self.user_keys())).encode()]

    def _delete_key(self, f: Sequence[bytes]) -> Reply:
        existed = self.values.pop(f[0], None) is not None
        if existed:
            self.version += 1
        return Status.OK, [b"1" if existed else b"0"]

    def _multi_get(self, f: Sequence[bytes]) -> Optional[Reply]:
        if all(k in self.values for k in f):
            return Status.OK, [self.values[k] for k in f]
        return PENDING

    def _multi_set(self, f: Sequence[bytes]) -> Reply:
        for i in range(0, len(f), 2):
            self.values[f[i]] = f[i + 1]
        self.version += 1
        return Status.OK, []

    def _append(self, f: Sequence[bytes]) -> Reply:
        self.values[f[0]] = self.values.get(f[0], b"") + f[1]
        self.version += 1
        return Status.OK, []

    def _queue_push(self, f: Sequence[bytes]) -> Reply:
        self.queues.setdefault(f[0], collections.deque()).append(f[1])
        self.version += 1
        return Status.OK, []

    def _queue_pop(self, f: Sequence[bytes]) -> Optional[Reply]:
        queue = self.queues.get(f[0])
        if not queue:
            return PENDING if f[1] == b"1" else (Status.QUEUE_EMPTY, [])
        item = queue.popleft()
        if not queue:
            del self.queues[f[0]]
        self.version += 1
        return Status.OK, [item]

    def _queue_len(self, f: Sequence[bytes]) -> Reply:
        return Status.OK, [str(len(self.queues.get(f[0], ()))).encode()]

    def _list_keys(self, f: Sequence[bytes]) -> Reply:
        return Status.OK, self.user_keys()

    def _ping(self, f: Sequence[bytes]) -> Reply:
        return Status.OK, []

    def user_keys(self) -> List[bytes]:
        """Plain keys, internal ones left out."""
        return [k for k in self.values if not k.startswith(INTERNAL_PREFIX)]

    # -- persistence (FileStore) -----------------------------------------------------
    def to_fields(self) -> List[bytes]:
        """The whole state as a flat field list: values, then queues."""
        out = [str(len(self.values)).encode()]
        for k, v in self.values.items():
            out += [k, v]
        out.append(str(len(self.queues)).encode())
        for k, q in self.queues.items():
            out += [k, str(len(q)).encode(), *q]
        return out

    @classmethod
    def from_fields(cls, fields: Sequence[bytes]) -> "KVState":
        """Inverse of :meth:`to_fields`; raises ``ValueError`` if the list is inconsistent."""
        state = cls()
        it = iter(fields)
        try:
            for _ in range(int(next(it))):
                k = next(it)
                state.values[k] = next(it)
            for _ in range(int(next(it))):
                k = next(it)
                queue: Deque[bytes] = collections.deque()
                for _ in range(int(next(it))):
                    queue.append(next(it))
                state.queues[k] = queue
        except StopIteration:
            raise ValueError("truncated store state") from None
        if next(it, None) is not None:
            raise ValueError("trailing data after store state")
        return state


#: The handler of each op, keyed by its int code; ``HANDLERS[op](state, fields)``.
HANDLERS = {
    Op.SET: KVState._set, Op.GET: KVState._get, Op.ADD: KVState._add,
    Op.COMPARE_SET: KVState._compare_set, Op.WAIT: KVState._wait, Op.CHECK: KVState._check,
    Op.NUM_KEYS: KVState._num_keys, Op.DELETE_KEY: KVState._delete_key,
    Op.MULTI_GET: KVState._multi_get, Op.MULTI_SET: KVState._multi_set,
    Op.APPEND: KVState._append, Op.QUEUE_PUSH: KVState._queue_push,
    Op.QUEUE_POP: KVState._queue_pop, Op.QUEUE_LEN: KVState._queue_len,
    Op.LIST_KEYS: KVState._list_keys, Op.PING: KVState._ping,
}
