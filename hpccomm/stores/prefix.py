"""``PrefixStore``: a namespace inside another store.

Every key is stored as ``"<prefix>/<key>"`` in the wrapped store, so several groups
or libraries can share one store without their keys colliding. ``list_keys`` and
``num_keys`` see only the keys under the prefix.
"""
from __future__ import annotations

import datetime
from typing import List, Optional, Sequence, Tuple

from hpccomm.stores._wire import Op, Status
from hpccomm.stores.base import Store, Timeout, Value


class PrefixStore(Store):
    """Wrap ``store`` so that all keys live under ``prefix + "/"``."""

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(store, Store):
            raise TypeError(f"PrefixStore wraps a Store, got {type(store).__name__}")
        super().__init__(store.timeout)
        self._prefix = prefix
        self._store = store

    @property
    def underlying_store(self) -> Store:
        """The store this one wraps."""
        return self._store

    def _k(self, key: str) -> str:
        if not isinstance(key, str):
            raise TypeError(f"store keys must be str, got {type(key).__name__}")
        return f"{self._prefix}/{key}"

    def _ks(self, keys: Sequence[str]) -> List[str]:
        if isinstance(keys, (str, bytes)):
            raise TypeError("expected a list of keys, got a single key")
        return [self._k(k) for k in keys]

    def _call(self, op: Op, fields: Sequence[bytes],
              timeout_s: Optional[float] = None) -> Tuple[Status, List[bytes]]:
        raise NotImplementedError("PrefixStore forwards the public methods instead")

    @property
    def timeout(self) -> datetime.timedelta:
        """The wrapped store's timeout (they share it, as in torch)."""
        return self._store.timeout

    def set_timeout(self, timeout: Timeout) -> None:
        """Set the wrapped store's timeout."""
        self._store.set_timeout(timeout)

    def set(self, key: str, value: Value) -> None:
        self._store.set(self._k(key), value)

    def get(self, key: str) -> bytes:
        return self._store.get(self._k(key))

    def add(self, key: str, amount: int) -> int:
        return self._store.add(self._k(key), amount)

    def compare_set(self, key: str, expected_value: Value, desired_value: Value) -> bytes:
        return self._store.compare_set(self._k(key), expected_value, desired_value)

    def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        self._store.wait(self._ks(keys), timeout)

    def check(self, keys: Sequence[str]) -> bool:
        return self._store.check(self._ks(keys))

    def delete_key(self, key: str) -> bool:
        return self._store.delete_key(self._k(key))

    def multi_get(self, keys: Sequence[str]) -> List[bytes]:
        return self._store.multi_get(self._ks(keys))

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        self._store.multi_set(self._ks(keys), values)

    def append(self, key: str, value: Value) -> None:
        self._store.append(self._k(key), value)

    def queue_push(self, key: str, value: Value) -> None:
        self._store.queue_push(self._k(key), value)

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        return self._store.queue_pop(self._k(key), block)

    def queue_len(self, key: str) -> int:
        return self._store.queue_len(self._k(key))

    def list_keys(self) -> List[str]:
        """The keys under the prefix, with the prefix taken off."""
        head = self._prefix + "/"
        return [k[len(head):] for k in self._store.list_keys() if k.startswith(head)]

    def num_keys(self) -> int:
        """How many keys live under the prefix."""
        return len(self.list_keys())

    def has_extended_api(self) -> bool:
        return self._store.has_extended_api()

    def clone(self) -> "PrefixStore":
        return PrefixStore(self._prefix, self._store.clone())

    def __repr__(self) -> str:
        return f"<PrefixStore {self._prefix!r} over {self._store!r}>"
