"""``MPITorchStore``: torch's ``Store`` interface served over MPI by hpccomm's MPIStore.

torch needs a key-value store for every process group (its ``PrefixStore`` wraps it);
``mpi://`` hands it this one, so no address is exchanged by hand (at MPI_THREAD_MULTIPLE
nothing listens on a port at all).
It is a ``torch.distributed.Store`` subclass, so torch's C++ code (``PrefixStore``, NCCL's
bootstrap of ``"cpu:hpccomm,cuda:nccl"``) reaches it through torch's store trampoline.

It forwards the core operations (set, get, add, compare_set, wait, check, delete_key,
num_keys); torch builds append and the multi-key calls on them. One job store serves
the whole process (:func:`~hpccomm.stores.mpi.job_store`: an ``MPIStore``, whose server is
a thread on rank 0, or below MPI_THREAD_MULTIPLE a ``JobTCPStore``; creating either is
collective); each rendezvous gets its own key namespace in it, so a second
``init_process_group`` after ``destroy_process_group`` never reads the first one's keys.
The rendezvous keeps each store alive: torch holds it only from C++, which does not keep
a Python subclass's methods alive. Timeouts follow torch's ``set_timeout``; errors are
raised as classes that are both hpccomm's and torch's ``DistStoreError``.
"""
from __future__ import annotations

import datetime
from typing import Any, Optional, Sequence

import torch.distributed as dist

from .. import errors


class DistStoreError(errors.DistStoreError, dist.DistStoreError):
    """A store operation failed or timed out (hpccomm's and torch's class at once)."""


def _torch_error(exc: errors.DistStoreError) -> DistStoreError:
    converted = DistStoreError(*exc.args)
    converted.__cause__ = exc.__cause__
    converted.__suppress_context__ = True
    return converted


class MPITorchStore(dist.Store):
    """A torch Store over an hpccomm store (the job's store), under key prefix ``prefix``."""

    def __init__(self, inner: Any, prefix: str = "",
                 timeout: datetime.timedelta = datetime.timedelta(seconds=300)):
        super().__init__()
        self._inner = inner
        self._prefix = prefix
        self.set_timeout(timeout)

    def _key(self, key: str) -> str:
        return self._prefix + key

    def _call(self, method: str, *args: Any) -> Any:
        inner = self._inner
        inner.set_timeout(self.timeout)
        try:
            return getattr(inner, method)(*args)
        except errors.DistStoreError as exc:
            raise _torch_error(exc) from None

    # -- what torch's store trampoline calls --------------------------------------------
    def set(self, key: str, value: Any) -> None:
        self._call("set", self._key(key), value)

    def get(self, key: str) -> bytes:
        return self._call("get", self._key(key))

    def add(self, key: str, value: int) -> int:
        return self._call("add", self._key(key), value)

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        return self._call("compare_set", self._key(key), expected_value, desired_value)

    def check(self, keys: Sequence[str]) -> bool:
        return self._call("check", [self._key(k) for k in keys])

    def wait(self, keys: Sequence[str], timeout: Optional[datetime.timedelta] = None) -> None:
        self._call("wait", [self._key(k) for k in keys],
                   self.timeout if timeout is None else timeout)

    def deleteKey(self, key: str) -> bool:
        return self._call("delete_key", self._key(key))

    def getNumKeys(self) -> int:
        return self._call("num_keys")

    def clone(self) -> "MPITorchStore":
        """The store itself: it is thread-safe, and a new Python object handed to C++
        would die at once (torch's trampoline keeps no reference to it), leaving C++
        with a store whose methods are gone."""
        return self

    # Python callers reach these names directly.
    delete_key = deleteKey
    num_keys = getNumKeys

    def __repr__(self) -> str:
        return f"<MPITorchStore prefix={self._prefix!r} over {self._inner!r}>"
