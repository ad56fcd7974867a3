"""Distributed key-value stores with torch.distributed's ``Store`` API.

``HashStore`` (one process), ``FileStore`` (a shared file), ``TCPStore`` (a server
thread in one process), ``PrefixStore`` (a namespace in another store) and
``MPIStore`` (served by rank 0 over an MPI communicator, no port needed); ``free_port`` picks
a port for a server that is yet to start. See ``docs/stores.md`` for which to use when.

``MPIStore`` is imported lazily: importing ``mpi4py.MPI`` initializes MPI, and
``import hpccomm.stores`` must stay cheap.
"""
from __future__ import annotations

from typing import Any

from hpccomm.stores.base import QueueEmptyError, Store
from hpccomm.stores.file import FileStore
from hpccomm.stores.hash import HashStore
from hpccomm.stores.ports import free_port
from hpccomm.stores.prefix import PrefixStore
from hpccomm.stores.tcp import TCPStore

__all__ = ["Store", "HashStore", "PrefixStore", "FileStore", "TCPStore", "MPIStore",
           "QueueEmptyError", "free_port"]


def __getattr__(name: str) -> Any:
    if name == "MPIStore":
        from hpccomm.stores.mpi import MPIStore

        return MPIStore
    raise AttributeError(f"module 'hpccomm.stores' has no attribute {name!r}")
