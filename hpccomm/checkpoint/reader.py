"""``load``: fill the caller's arrays in place from a checkpoint, resharding as needed.

Rank 0 opens the file with h5py, validates it (format marker, version, ``complete``,
contiguous datasets that fit the file) and broadcasts the index. Every rank then reads
only the bytes of its own slices with ``pread`` (a replicated target reads the whole
array on every rank). The placement saved does not matter: a :class:`Shard` target takes
the slice of the global array at the offset given by the lower ranks' slice lengths.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..group import GroupLike, resolve
from ..objects import broadcast_object_list
from . import layout
from .layout import CheckpointError, Entry
from .state import Shard, agree, array_of
from .transfer import Task, raise_agreed, transfer


def load(state: Dict[str, Any], path: str, *, group: GroupLike = None) -> None:
    """Fill every array of ``state`` (nested dicts of arrays and :class:`Shard`) from ``path``.

    Collective over ``group`` (default: the world); rank 0's ``path`` is used. Each entry
    must exist in the checkpoint with the same dtype and global shape; entries of the file
    that ``state`` lacks are ignored. Raises :class:`CheckpointError` on every rank for a
    missing, foreign, truncated or incomplete file or a mismatching state, and ImportError
    if h5py is missing.
    """
    what = "hpccomm.checkpoint.load"
    layout.require_h5py()  # before any communication, so every rank stops here alike
    pg = resolve(group, "checkpoint.load")
    leaves, wanted = agree(pg, state, what)
    found: List[Any] = [None, None, None]
    if pg.rank() == 0:
        found[0] = os.path.abspath(os.fspath(path))
        try:
            found[1] = layout.read_index(found[0])["entries"]
        except CheckpointError as exc:
            found[2] = str(exc)
        except Exception as exc:  # an unexpected h5py failure: still name the file
            found[2] = f"cannot read checkpoint {found[0]!r}: {type(exc).__name__}: {exc}"
    broadcast_object_list(found, group_src=0, group=pg)
    final, index, problem = found
    if problem:
        raise CheckpointError(problem)
    _check(final, index, wanted)
    tasks, copies, error = _tasks(pg.rank(), index, wanted, leaves)
    raise_agreed(pg, error, f"{what} from {final!r}")
    transfer(pg, final, tasks, write=False, label="load")
    for target, buffer in copies:
        target[...] = buffer


def _check(path: str, index: Dict[str, Entry], wanted: List[Entry]) -> None:
    """Every wanted entry exists with the same dtype and global shape (same on all ranks)."""
    for entry in wanted:
        saved = index.get(entry.name)
        if saved is None:
            raise CheckpointError(f"checkpoint {path!r} has no entry {entry.name!r} (it has "
                                  f"{sorted(index)[:20]})")
        if np.dtype(saved.dtype) != np.dtype(entry.dtype):
            raise CheckpointError(f"checkpoint {path!r}: entry {entry.name!r} is "
                                  f"{np.dtype(saved.dtype)} in the file but "
                                  f"{np.dtype(entry.dtype)} in the state")
        if saved.shape != entry.shape:
            placement = (f"sharded along axis {entry.axis} with lengths {list(entry.lengths)}"
                         if entry.placement == "shard" else "replicated")
            raise CheckpointError(f"checkpoint {path!r}: entry {entry.name!r} has global shape "
                                  f"{saved.shape} in the file but {entry.shape} in the state "
                                  f"({placement})")


def _tasks(rank: int, index: Dict[str, Entry], wanted: List[Entry], leaves: List[Tuple[str, Any]]
           ) -> Tuple[List[Task], List[Tuple[np.ndarray, np.ndarray]], Optional[Exception]]:
    """This rank's reads, the copies to make after them, and a local problem (if any)."""
    tasks, copies = [], []
    for entry, (name, leaf) in zip(wanted, leaves):
        target = array_of(leaf)
        if not target.flags.writeable:
            return [], [], CheckpointError(f"the state's array for {name!r} is read-only")
        if target.size == 0:
            continue
        buffer = target
        if not target.flags.c_contiguous:
            buffer = np.empty(target.shape, dtype=target.dtype)
            copies.append((target, buffer))
        saved = index[name]
        if saved.value is not None:
            copies.append((target, saved.value))
            continue
        if isinstance(leaf, Shard):
            start = sum(entry.lengths[:rank])
            runs = layout.runs(saved.offset, saved.shape, buffer.itemsize, leaf.axis, start,
                               start + target.shape[leaf.axis])
        else:
            runs = [(saved.offset, 0, saved.nbytes)]
        tasks.append(Task(buffer, runs, buffer.nbytes))
    return tasks, copies, None
