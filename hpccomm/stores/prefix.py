"""``PrefixStore``: a namespace inside another store.

Every key is stored as ``"<prefix>/<key>"`` in the wrapped store, so several groups
or libraries can share one store without their keys colliding. It forwards each call
to the wrapped store as torch's ``PrefixStore`` does: values as ``bytes``, ``wait``
with a timeout only when one was given, ``num_keys`` and ``has_extended_api`` as the
wrapped store answers them, and ``append``/``multi_get``/``multi_set`` to the wrapped
store's own methods (or to the fallbacks of :class:`~hpccomm.stores.Store`). So any
``Store`` subclass, a user's Python store included, can be wrapped.
"""
from __future__ import annotations

import datetime
from typing import List, Sequence

from hpccomm.stores.base import (Key, Store, Timeout, Value, key_list, key_str, to_bytes)
from hpccomm.types import timeout_seconds


class PrefixStore(Store):
    """Wrap ``store`` so that all keys live under ``prefix + "/"``."""

    def __init__(self, prefix: str, store: Store) -> None:
        if store is None:
            raise ValueError("store argument cannot be None")
        if not isinstance(store, Store):
            raise TypeError(f"PrefixStore wraps a Store, got {type(store).__name__}")
        if not isinstance(prefix, (str, bytes)):
            raise TypeError(f"PrefixStore prefix must be str, got {type(prefix).__name__}")
        super().__init__(store.timeout)
        self._prefix = key_str(prefix)
        self._store = store

    @property
    def underlying_store(self) -> Store:
        """The store this one wraps."""
        return self._store

    @property
    def _underlying_non_prefix_store(self) -> Store:
        """The first wrapped store that is not a PrefixStore (torch's name)."""
        store = self._store
        while isinstance(store, PrefixStore):
            store = store._store
        return store

    def _k(self, key: Key) -> str:
        return f"{self._prefix}/{key_str(key)}"

    def _ks(self, keys: Sequence[Key]) -> List[str]:
        return [self._k(k) for k in key_list(keys)]

    @property
    def timeout(self) -> datetime.timedelta:
        """The wrapped store's timeout (they share it, as in torch)."""
        return self._store.timeout

    def set_timeout(self, timeout: Timeout) -> None:
        """Set the wrapped store's timeout."""
        self._store.set_timeout(timeout)

    def set(self, key: Key, value: Value) -> None:
        self._store.set(self._k(key), to_bytes(value))

    def get(self, key: Key) -> bytes:
        return self._store.get(self._k(key))

    def add(self, key: Key, amount: int) -> int:
        return self._store.add(self._k(key), amount)

    def compare_set(self, key: Key, expected_value: Value, desired_value: Value) -> bytes:
        return self._store.compare_set(self._k(key), to_bytes(expected_value),
                                       to_bytes(desired_value))

    def wait(self, keys: Sequence[Key], timeout: Timeout = None) -> None:
        if timeout is None:
            self._store.wait(self._ks(keys))
        else:
            seconds = timeout_seconds(timeout)
            self._store.wait(self._ks(keys), datetime.timedelta(seconds=seconds))

    def check(self, keys: Sequence[Key]) -> bool:
        return self._store.check(self._ks(keys))

    def delete_key(self, key: Key) -> bool:
        return self._store.delete_key(self._k(key))

    def num_keys(self) -> int:
        """The wrapped store's ``num_keys`` (all its keys, as torch's PrefixStore)."""
        return self._store.num_keys()

    def has_extended_api(self) -> bool:
        return self._store.has_extended_api()

    def multi_get(self, keys: Sequence[Key]) -> List[bytes]:
        return self._store.multi_get(self._ks(keys))

    def multi_set(self, keys: Sequence[Key], values: Sequence[Value]) -> None:
        self._store.multi_set(self._ks(keys), [to_bytes(v) for v in values])

    def append(self, key: Key, value: Value) -> None:
        self._store.append(self._k(key), to_bytes(value))

    def queue_push(self, key: Key, value: Value) -> None:
        self._store.queue_push(self._k(key), to_bytes(value))

    def queue_pop(self, key: Key, block: bool = True) -> bytes:
        return self._store.queue_pop(self._k(key), block)

    def queue_len(self, key: Key) -> int:
        return self._store.queue_len(self._k(key))

    def list_keys(self) -> List[str]:
        """The keys under the prefix, with the prefix taken off."""
        head = self._prefix + "/"
        return [k[len(head):] for k in self._store.list_keys() if k.startswith(head)]

    def clone(self) -> "PrefixStore":
        return PrefixStore(self._prefix, self._store.clone())

    def __repr__(self) -> str:
        return f"<PrefixStore {self._prefix!r} over {self._store!r}>"
