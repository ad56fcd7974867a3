"""``Store``: torch.distributed's key-value store API, as a base class.

Two layers, as in torch:

* :class:`Store` is what a user subclasses to write a store in Python. Like torch's
  ``Store``, the core methods (``set``, ``get``, ``add``, ``compare_set``, ``wait``,
  ``check``, ``num_keys``, ``delete_key``, ``clone``) must be overridden, ``append``,
  ``multi_get`` and ``multi_set`` fall back on them, ``has_extended_api()`` is False,
  and queues and ``list_keys`` are not implemented. Values reach a subclass as
  ``bytes`` when hpccomm calls it (through :class:`~hpccomm.stores.PrefixStore` or a
  fallback), as torch's C++ layer passes them.
* :class:`RequestStore` is the base of hpccomm's own stores. A concrete store
  implements just :meth:`RequestStore._call` (run one encoded request, return its
  decoded reply) and :meth:`~Store.clone`; this class turns the public methods into
  requests and replies into results or exceptions, so all of them agree on argument
  handling, timeouts and error messages.
"""
from __future__ import annotations

import datetime
import operator
from typing import List, Optional, Sequence, Tuple, Union

from hpccomm.errors import DistStoreError
from hpccomm.stores._wire import Op, Status, op_name
from hpccomm.types import timeout_seconds

Key = Union[str, bytes]
Value = Union[str, bytes, bytearray, memoryview]
Timeout = Union[datetime.timedelta, float, int, None]

#: torch's default store timeout.
DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)
_INT64 = (-(1 << 63), (1 << 63) - 1)
# Opcodes as plain ints: looking up an enum member costs more than a request's encoding.
(_SET, _GET, _ADD, _COMPARE_SET, _WAIT, _CHECK, _NUM_KEYS, _DELETE_KEY, _MULTI_GET,
 _MULTI_SET, _APPEND, _QUEUE_PUSH, _QUEUE_POP, _QUEUE_LEN, _LIST_KEYS) = (
    int(op) for op in list(Op)[:15])
_OK = Status.OK


class QueueEmptyError(DistStoreError):
    """``queue_pop(key, block=False)`` found the queue empty (as torch's)."""


def to_bytes(value: Value) -> bytes:
    """A value as bytes (``str`` is UTF-8 encoded)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"store values must be str or bytes, got {type(value).__name__}")


def key_bytes(key: Key) -> bytes:
    """A key as bytes on the wire. Keys are ``str`` (or ``bytes``, as torch accepts)."""
    if isinstance(key, str):
        return key.encode("utf-8", "surrogateescape")
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    raise TypeError(f"store keys must be str, got {type(key).__name__}")


def key_str(key: Key) -> str:
    """A key as ``str`` (bytes keys decoded as UTF-8, undecodable bytes kept)."""
    if isinstance(key, str):
        return key
    if isinstance(key, (bytes, bytearray)):
        return bytes(key).decode("utf-8", "surrogateescape")
    raise TypeError(f"store keys must be str, got {type(key).__name__}")


def key_list(keys: Sequence[Key]) -> List[Key]:
    """``keys`` as a list; a single key where a list is due is a ``TypeError`` (torch's)."""
    if isinstance(keys, (str, bytes, bytearray)):
        raise TypeError("expected a list of keys, got a single key")
    return list(keys)


def add_amount(amount: int) -> int:
    """``add``'s amount: an integer that fits in int64 (``TypeError`` otherwise, as torch)."""
    try:
        value = operator.index(amount)
    except TypeError:
        raise TypeError(f"store add() needs an integer amount, got "
                        f"{type(amount).__name__}") from None
    if not _INT64[0] <= value <= _INT64[1]:
        raise TypeError(f"store add() amount {value} does not fit in int64")
    return value


def as_timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def milliseconds(seconds: Optional[float]) -> int:
    """A request's timeout on the wire: whole milliseconds, -1 for the server's default."""
    return -1 if seconds is None else int(round(seconds * 1000))


def timeout_message(waited_s: float, keys: Sequence[bytes]) -> str:
    """torch's wording for a store wait that ran out of time (``"wait timeout after
    100ms, keys: /a, /b"``); torch prints its keys with a leading ``/``."""
    shown = ", ".join("/" + k.decode("utf-8", "replace") for k in keys) or "<none>"
    return f"wait timeout after {int(round(waited_s * 1000))}ms, keys: {shown}"


def _missing(store: "Store", method: str) -> NotImplementedError:
    return NotImplementedError(
        f"{type(store).__name__}.{method}(): Not implemented. A Store subclass must "
        f"override {method}()")


class Store:
    """Base class of all stores, with torch's ``Store`` contract for subclasses."""

    def __init__(self, timeout: Timeout = DEFAULT_TIMEOUT) -> None:
        self._timeout_s: float = timeout_seconds(timeout, DEFAULT_TIMEOUT.total_seconds())

    # -- timeouts --------------------------------------------------------------------
    @property
    def timeout(self) -> datetime.timedelta:
        """How long blocking calls wait by default."""
        return datetime.timedelta(seconds=self._timeout_s)

    def set_timeout(self, timeout: Timeout) -> None:
        """Change the default timeout of blocking calls (``timedelta`` or seconds)."""
        self._timeout_s = timeout_seconds(timeout, self._timeout_s)

    # -- what every store must provide (torch's pure virtual methods) ------------------
    def set(self, key: Key, value: Value) -> None:
        """Set ``key`` to ``value``, overwriting it."""
        raise _missing(self, "set")

    def get(self, key: Key) -> bytes:
        """The value of ``key``, waiting up to :attr:`timeout` for it to be set."""
        raise _missing(self, "get")

    def add(self, key: Key, amount: int) -> int:
        """Atomically add ``amount`` to the integer in ``key`` (missing: 0); the new value."""
        raise _missing(self, "add")

    def compare_set(self, key: Key, expected_value: Value, desired_value: Value) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value``; the value now."""
        raise _missing(self, "compare_set")

    def wait(self, keys: Sequence[Key], timeout: Timeout = None) -> None:
        """Block until all ``keys`` exist, up to ``timeout`` (default :attr:`timeout`)."""
        raise _missing(self, "wait")

    def check(self, keys: Sequence[Key]) -> bool:
        """Whether all ``keys`` exist now (no waiting)."""
        raise _missing(self, "check")

    def num_keys(self) -> int:
        """How many keys the store holds."""
        raise _missing(self, "num_keys")

    def delete_key(self, key: Key) -> bool:
        """Delete ``key``; whether it existed."""
        raise _missing(self, "delete_key")

    def clone(self) -> "Store":
        """Another handle on the same store, safe to use from another thread."""
        raise _missing(self, "clone")

    # -- extended API: torch's fallbacks on the core methods ---------------------------
    def has_extended_api(self) -> bool:
        """Whether ``append``/``multi_get``/``multi_set`` are native (False here, as torch)."""
        return False

    def append(self, key: Key, value: Value) -> None:
        """Append ``value`` to ``key`` (torch's fallback: a ``compare_set`` loop)."""
        data = to_bytes(value)
        expected = data
        current = self.compare_set(key, b"", expected)
        while current != expected:
            expected = bytes(current) + data
            current = self.compare_set(key, current, expected)

    def multi_get(self, keys: Sequence[Key]) -> List[bytes]:
        """The values of ``keys`` (fallback: one ``get`` each)."""
        return [self.get(k) for k in key_list(keys)]

    def multi_set(self, keys: Sequence[Key], values: Sequence[Value]) -> None:
        """Set each of ``keys`` to the matching value (fallback: one ``set`` each)."""
        keys, values = key_list(keys), list(values)
        _check_pairs(keys, values)
        for k, v in zip(keys, values):
            self.set(k, to_bytes(v))

    def queue_push(self, key: Key, value: Value) -> None:
        """Push ``value`` onto the FIFO queue ``key``."""
        raise NotImplementedError("queue support is not implemented.")

    def queue_pop(self, key: Key, block: bool = True) -> bytes:
        """Pop the oldest item of queue ``key``."""
        raise NotImplementedError("queue support is not implemented.")

    def queue_len(self, key: Key) -> int:
        """How many items queue ``key`` holds."""
        raise NotImplementedError("queue support is not implemented.")

    def list_keys(self) -> List[str]:
        """All keys of the store."""
        raise NotImplementedError("listKeys support is not implemented.")

    def barrier(self, key: Key, world_size: int, timeout: Timeout = None) -> None:
        """Wait until ``world_size`` callers have called ``barrier`` with this ``key``.

        Like torch, it leaves ``<key>/num_members`` and ``<key>/last_member`` behind;
        use a fresh key for each barrier.
        """
        seconds = timeout_seconds(timeout, self.timeout.total_seconds())
        name = key_str(key)
        if self.add(f"{name}/num_members", 1) == world_size:
            self.set(f"{name}/last_member", b"1")
        self.wait([f"{name}/last_member"], as_timedelta(seconds))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} timeout={self.timeout}>"


def _check_pairs(keys: Sequence[Key], values: Sequence[Value]) -> None:
    if len(keys) != len(values):
        raise DistStoreError(f"multi_set keys and values must be of same size: "
                             f"{len(keys)} keys, {len(values)} values")


class RequestStore(Store):
    """Base of hpccomm's stores: every method is one request run by :meth:`_call`."""

    # -- what a concrete store provides --------------------------------------------
    def _call(self, op: int, fields: Sequence[bytes],
              timeout_s: Optional[float] = None) -> Tuple[Status, List[bytes]]:
        """Run one request; ``timeout_s`` bounds how long a blocking op may wait."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _call")

    def _where(self) -> str:
        """Where this store lives, for error messages (``"TCPStore 10.0.0.1:29500"``)."""
        return type(self).__name__

    def _ok(self, op: int, fields: Sequence[bytes], timeout_s: Optional[float] = None,
            what: str = "") -> List[bytes]:
        status, out = self._call(op, fields, timeout_s)
        if status is _OK:
            return out
        raise self._error(status, out, what or op_name(op).lower(), timeout_s)

    def _error(self, status: Status, out: List[bytes], what: str,
               timeout_s: Optional[float]) -> DistStoreError:
        """The exception for a reply that is not OK."""
        if status is Status.TIMEOUT:
            waited = self._timeout_s if timeout_s is None else timeout_s
            return DistStoreError(f"{timeout_message(waited, out)} ({self._where()}, {what})")
        if status is Status.QUEUE_EMPTY:
            return QueueEmptyError("queue is empty")
        message = out[0].decode("utf-8", "replace") if out else "unknown error"
        return DistStoreError(f"{self._where()}: {message}")

    # -- the API ---------------------------------------------------------------------
    def set(self, key: Key, value: Value) -> None:
        self._ok(_SET, [key.encode("utf-8", "surrogateescape") if type(key) is str
                        else key_bytes(key), value if type(value) is bytes else to_bytes(value)])

    def get(self, key: Key) -> bytes:
        return self._ok(_GET, [key.encode("utf-8", "surrogateescape") if type(key) is str
                               else key_bytes(key)], self._timeout_s, "get")[0]

    def add(self, key: Key, amount: int) -> int:
        delta = str(amount if type(amount) is int and _INT64[0] <= amount <= _INT64[1]
                    else add_amount(amount)).encode()
        return int(self._ok(_ADD, [key.encode("utf-8", "surrogateescape") if type(key) is str
                                   else key_bytes(key), delta])[0])

    def compare_set(self, key: Key, expected_value: Value, desired_value: Value) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value``.

        A missing key counts as holding ``""``. Returns the value now stored, or
        ``expected_value`` when the key is missing and ``expected_value`` is not empty
        (torch's rule).
        """
        fields = [key_bytes(key), to_bytes(expected_value), to_bytes(desired_value)]
        return self._ok(_COMPARE_SET, fields)[0]

    def wait(self, keys: Sequence[Key], timeout: Timeout = None) -> None:
        seconds = timeout_seconds(timeout, self._timeout_s)
        self._ok(_WAIT, [key_bytes(k) for k in key_list(keys)], seconds, "wait")

    def check(self, keys: Sequence[Key]) -> bool:
        return self._ok(_CHECK, [key_bytes(k) for k in key_list(keys)])[0] == b"1"

    def num_keys(self) -> int:
        """How many plain keys the store holds (queues and internal keys not counted)."""
        return int(self._ok(_NUM_KEYS, [])[0])

    def delete_key(self, key: Key) -> bool:
        return self._ok(_DELETE_KEY, [key_bytes(key)])[0] == b"1"

    def has_extended_api(self) -> bool:
        """True: queues, ``append`` and the ``multi_*`` ops are native in hpccomm's stores."""
        return True

    def multi_get(self, keys: Sequence[Key]) -> List[bytes]:
        """The values of ``keys``, waiting up to :attr:`timeout` for all of them."""
        return self._ok(_MULTI_GET, [key_bytes(k) for k in key_list(keys)],
                        self._timeout_s, "multi_get")

    def multi_set(self, keys: Sequence[Key], values: Sequence[Value]) -> None:
        """Set each of ``keys`` to the matching value, in one request."""
        keys, values = key_list(keys), list(values)
        _check_pairs(keys, values)
        fields: List[bytes] = []
        for k, v in zip(keys, values):
            fields += [key_bytes(k), to_bytes(v)]
        self._ok(_MULTI_SET, fields)

    def append(self, key: Key, value: Value) -> None:
        """Append ``value`` to ``key`` (a missing key starts empty), in one request."""
        self._ok(_APPEND, [key_bytes(key), to_bytes(value)])

    def queue_push(self, key: Key, value: Value) -> None:
        """Push ``value`` onto the FIFO queue ``key``."""
        self._ok(_QUEUE_PUSH, [key_bytes(key), to_bytes(value)])

    def queue_pop(self, key: Key, block: bool = True) -> bytes:
        """Pop the oldest item of queue ``key``.

        With ``block=True`` wait up to :attr:`timeout` for one; with ``block=False``
        raise :class:`QueueEmptyError` at once if the queue is empty.
        """
        flag = b"1" if block else b"0"
        return self._ok(_QUEUE_POP, [key_bytes(key), flag], self._timeout_s, "queue_pop")[0]

    def queue_len(self, key: Key) -> int:
        """How many items queue ``key`` holds (0 if it never existed)."""
        return int(self._ok(_QUEUE_LEN, [key_bytes(key)])[0])

    def list_keys(self) -> List[str]:
        """All plain keys (queues and internal keys left out), in no set order."""
        return [k.decode("utf-8", "surrogateescape") for k in self._ok(_LIST_KEYS, [])]

    def barrier(self, key: Key, world_size: int, timeout: Timeout = None) -> None:
        """Wait until ``world_size`` callers have called ``barrier`` with this ``key``.

        Like torch, it leaves ``<key>/num_members`` and ``<key>/last_member`` behind;
        use a fresh key for each barrier. Times out with torch's ``"barrier timeout"``.
        """
        seconds = timeout_seconds(timeout, self._timeout_s)
        name = key_str(key)
        if self.add(f"{name}/num_members", 1) == world_size:
            self.set(f"{name}/last_member", b"1")
        status, out = self._call(_WAIT, [key_bytes(f"{name}/last_member")], seconds)
        if status is Status.TIMEOUT:
            raise DistStoreError(f"barrier timeout after {int(round(seconds * 1000))}ms, "
                                 f"key: {name} ({self._where()}, {world_size} members)")
        if status is not Status.OK:
            raise self._error(status, out, "barrier", seconds)
