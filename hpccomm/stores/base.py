"""``Store``: the key-value API every hpccomm store implements, written once.

A concrete store implements just :meth:`Store._call` (send one encoded request,
return its decoded reply) and :meth:`Store.clone`; this class turns the public
torch-style methods into requests and replies into results or exceptions, so all
stores agree on argument handling, timeouts and error messages.
"""
from __future__ import annotations

import datetime
from typing import List, Optional, Sequence, Tuple, Union

from hpccomm.errors import DistStoreError
from hpccomm.stores._wire import Op, Status
from hpccomm.types import timeout_seconds

Value = Union[str, bytes, bytearray, memoryview]
Timeout = Union[datetime.timedelta, float, int, None]

#: torch's default store timeout.
DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)


class QueueEmptyError(DistStoreError):
    """``queue_pop(key, block=False)`` found the queue empty (as torch's)."""


def to_bytes(value: Value) -> bytes:
    """A value or key as bytes (``str`` is UTF-8 encoded)."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"store values must be str or bytes, got {type(value).__name__}")


def key_bytes(key: str) -> bytes:
    """A key as bytes; keys must be ``str`` as in torch."""
    if not isinstance(key, str):
        raise TypeError(f"store keys must be str, got {type(key).__name__}")
    return key.encode("utf-8")


def _ms(seconds: Optional[float]) -> int:
    return -1 if seconds is None else int(round(seconds * 1000))


class Store:
    """Base class of all stores: torch's ``Store`` API over :meth:`_call`."""

    def __init__(self, timeout: Timeout = DEFAULT_TIMEOUT) -> None:
        self._timeout_s: float = timeout_seconds(timeout, DEFAULT_TIMEOUT.total_seconds())

    # -- what a concrete store provides --------------------------------------------
    def _call(self, op: Op, fields: Sequence[bytes],
              timeout_s: Optional[float] = None) -> Tuple[Status, List[bytes]]:
        """Run one request; ``timeout_s`` bounds how long a blocking op may wait."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _call")

    def clone(self) -> "Store":
        """Another handle on the same store, safe to use from another thread."""
        raise NotImplementedError(f"{type(self).__name__} does not implement clone")

    # -- timeouts --------------------------------------------------------------------
    @property
    def timeout(self) -> datetime.timedelta:
        """How long blocking calls wait by default."""
        return datetime.timedelta(seconds=self._timeout_s)

    def set_timeout(self, timeout: Timeout) -> None:
        """Change the default timeout of blocking calls (``timedelta`` or seconds)."""
        self._timeout_s = timeout_seconds(timeout, self._timeout_s)

    def _ok(self, op: Op, fields: Sequence[bytes], timeout_s: Optional[float] = None,
            what: str = "") -> List[bytes]:
        status, out = self._call(op, fields, timeout_s)
        if status is Status.OK:
            return out
        if status is Status.TIMEOUT:
            waited = self._timeout_s if timeout_s is None else timeout_s
            keys = ", ".join(k.decode("utf-8", "replace") for k in out) or "<none>"
            raise DistStoreError(
                f"{type(self).__name__}: {what or op.name.lower()} timed out after "
                f"{int(waited * 1000)}ms waiting for keys: {keys}")
        if status is Status.QUEUE_EMPTY:
            raise QueueEmptyError("queue is empty")
        message = out[0].decode("utf-8", "replace") if out else "unknown error"
        raise DistStoreError(f"{type(self).__name__}: {message}")

    # -- the API ---------------------------------------------------------------------
    def set(self, key: str, value: Value) -> None:
        """Set ``key`` to ``value``, overwriting it."""
        self._ok(Op.SET, [key_bytes(key), to_bytes(value)])

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to :attr:`timeout` for it to be set."""
        return self._ok(Op.GET, [key_bytes(key)], self._timeout_s, "get")[0]

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer in ``key`` (missing: 0); the new value."""
        return int(self._ok(Op.ADD, [key_bytes(key), str(int(amount)).encode()])[0])

    def compare_set(self, key: str, expected_value: Value, desired_value: Value) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value``.

        A missing key counts as holding ``""``. Returns the value now stored, or
        ``expected_value`` when the key is missing and ``expected_value`` is not empty
        (torch's rule).
        """
        fields = [key_bytes(key), to_bytes(expected_value), to_bytes(desired_value)]
        return self._ok(Op.COMPARE_SET, fields)[0]

    def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        """Block until all ``keys`` exist, up to ``timeout`` (default :attr:`timeout`)."""
        seconds = timeout_seconds(timeout, self._timeout_s)
        self._ok(Op.WAIT, [key_bytes(k) for k in _key_list(keys)], seconds, "wait")

    def check(self, keys: Sequence[str]) -> bool:
        """Whether all ``keys`` exist now (no waiting)."""
        return self._ok(Op.CHECK, [key_bytes(k) for k in _key_list(keys)])[0] == b"1"

    def num_keys(self) -> int:
        """How many plain keys the store holds (queues and internal keys not counted)."""
        return int(self._ok(Op.NUM_KEYS, [])[0])

    def delete_key(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        return self._ok(Op.DELETE_KEY, [key_bytes(key)])[0] == b"1"

    def multi_get(self, keys: Sequence[str]) -> List[bytes]:
        """The values of ``keys``, waiting up to :attr:`timeout` for all of them."""
        return self._ok(Op.MULTI_GET, [key_bytes(k) for k in _key_list(keys)],
                        self._timeout_s, "multi_get")

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        """Set each of ``keys`` to the matching value, in one request."""
        keys, values = _key_list(keys), list(values)
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys but {len(values)} values")
        fields: List[bytes] = []
        for k, v in zip(keys, values):
            fields += [key_bytes(k), to_bytes(v)]
        self._ok(Op.MULTI_SET, fields)

    def append(self, key: str, value: Value) -> None:
        """Append ``value`` to ``key`` (a missing key starts empty)."""
        self._ok(Op.APPEND, [key_bytes(key), to_bytes(value)])

    def queue_push(self, key: str, value: Value) -> None:
        """Push ``value`` onto the FIFO queue ``key``."""
        self._ok(Op.QUEUE_PUSH, [key_bytes(key), to_bytes(value)])

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        """Pop the oldest item of queue ``key``.

        With ``block=True`` wait up to :attr:`timeout` for one; with ``block=False``
        raise :class:`QueueEmptyError` at once if the queue is empty.
        """
        flag = b"1" if block else b"0"
        return self._ok(Op.QUEUE_POP, [key_bytes(key), flag], self._timeout_s, "queue_pop")[0]

    def queue_len(self, key: str) -> int:
        """How many items queue ``key`` holds (0 if it never existed)."""
        return int(self._ok(Op.QUEUE_LEN, [key_bytes(key)])[0])

    def list_keys(self) -> List[str]:
        """All plain keys (queues and internal keys left out), in no set order."""
        return [k.decode("utf-8", "surrogateescape") for k in self._ok(Op.LIST_KEYS, [])]

    def has_extended_api(self) -> bool:
        """Whether the queue/append/multi ops are native (true for every hpccomm store)."""
        return True

    def barrier(self, key: str, world_size: int, timeout: Timeout = None) -> None:
        """Wait until ``world_size`` callers have called ``barrier`` with this ``key``.

        Like torch, it leaves ``<key>/num_members`` and ``<key>/last_member`` behind;
        use a fresh key for each barrier.
        """
        seconds = timeout_seconds(timeout, self._timeout_s)
        if self.add(f"{key}/num_members", 1) == world_size:
            self.set(f"{key}/last_member", "1")
        self.wait([f"{key}/last_member"], seconds)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} timeout={self.timeout}>"


def _key_list(keys: Sequence[str]) -> List[str]:
    if isinstance(keys, (str, bytes)):
        raise TypeError("expected a list of keys, got a single key")
    return list(keys)
