"""Arrays in shared memory: collectives on them skip the copy into shared buffers.

On one node, hpccomm runs large ``all_reduce``, ``reduce_scatter(_tensor)`` and
``all_gather(_into_tensor)`` of CPU arrays through shared memory. An ordinary NumPy array
is private to its process, so a rank either copies what its peers need into a shared
buffer or, where the kernel allows it, lets them read it by cross-memory attach (a
system call per chunk). An array made by :func:`empty` already lies in memory every
rank of the group maps, so the peers read it where it is, with plain loads::

    import hpccomm as dist
    import hpccomm.shm

    grad = hpccomm.shm.empty((1 << 24,), np.float32)   # collective over the group
    grad[...] = compute()
    dist.all_reduce(grad)                               # no copy-in

:func:`empty` is collective over the group (every rank calls it, in the same order as
its other collectives); ranks may ask for different shapes. The memory lives as long as
the group: it is released by ``destroy_process_group``, after which the array must not
be used. Where the group cannot use shared memory (it spans nodes, has one rank, or
``HPCCOMM_SHM=0``), :func:`empty` returns an ordinary array and every collective works
the same. Only the rank's own array is read in place: a view of it passed to a
collective is recognised too, since the address is what counts.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np

from .group import GroupLike, resolve

__all__ = ["empty", "is_shared"]


def empty(shape: Union[int, Sequence[int]], dtype: Any = np.float32,
          group: GroupLike = None) -> np.ndarray:
    """An uninitialized array in shared memory of ``group`` (default: the world).

    Collective over ``group``; raises a timeout error if some rank does not call it
    within the group's timeout. An ordinary array where shared memory is not used.
    """
    pg = resolve(group, "shm.empty")
    allocate = getattr(pg.cpu, "shared_empty", None)
    if allocate is None:
        return np.empty(shape, dtype)
    return allocate(shape, dtype)


def is_shared(arr: np.ndarray, group: GroupLike = None) -> bool:
    """Whether ``arr`` lies in shared memory made by :func:`empty` for ``group``."""
    pg = resolve(group, "shm.is_shared")
    locate = getattr(pg.cpu, "in_segment", None)
    return isinstance(arr, np.ndarray) and locate is not None and locate(arr)
