"""``save``: every rank writes its slices into one HDF5 file, committed by an atomic rename.

Steps: the ranks agree on the global arrays (one ``all_gather_object``); rank 0 creates
``path``'s missing folders (and tells the others if it cannot), then
``.<name>.tmp-<id>`` next to ``path`` with every dataset allocated; the ranks write their
bytes; rank 0 sets ``complete``, fsyncs, renames the file to ``path`` and fsyncs the
directory. A failure or crash before the rename leaves ``path`` (an older checkpoint, if
any) untouched, and a leftover temporary file never has ``complete`` set.

Without MPI-enabled h5py every rank ``pwrite``s its slices at the dataset offsets rank 0
got from HDF5 (no extra memory beyond a contiguous copy of a non-contiguous slice). With
``h5py.get_config().mpi`` the ranks open the file with the ``mpio`` driver and write with
collective ``H5Dwrite`` calls instead.
"""
from __future__ import annotations

import os
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..group import GroupLike, get_world_size, resolve
from ..objects import broadcast_object_list
from . import layout
from .layout import CheckpointError, Entry
from .progress import Progress
from .state import Leaf, Shard, agree, array_of
from .transfer import Task, raise_agreed, transfer


def save(state: Dict[str, Any], path: str, *, group: GroupLike = None) -> None:
    """Save ``state`` (nested dicts of arrays and :class:`Shard`) to the HDF5 file ``path``.

    Collective over ``group`` (default: the world); rank 0's ``path`` is used. Plain arrays
    are replicated (rank 0's or another rank's copy is written once); a :class:`Shard` is
    this rank's slice, placed after the lower group ranks' slices. Overwrites ``path``
    atomically; rank 0 creates its missing folders first. Raises :class:`CheckpointError`
    on every rank if any rank fails, and ImportError if h5py is missing.
    """
    what = "hpccomm.checkpoint.save"
    layout.require_h5py()  # before any communication, so every rank stops here alike
    pg = resolve(group, "checkpoint.save")
    leaves, entries = agree(pg, state, what)
    writers = _writers(entries, pg.size())
    target: List[Any] = [None]
    if pg.rank() == 0:
        final = os.path.abspath(os.fspath(path))
        folder, base = os.path.split(final)
        problem = _make_folder(folder)
        if problem:
            problem = (f"{what}: cannot create the folder {folder!r} for {final!r} (on rank 0 "
                       f"of group '{pg.group_name}'): {problem}")
        target[0] = (final, os.path.join(folder, f".{base}.tmp-{uuid.uuid4().hex[:12]}"),
                     time.time(), problem)
    broadcast_object_list(target, group_src=0, group=pg)
    final, tmp, created, problem = target[0]
    if problem:  # rank 0's outcome, so that every rank raises the same error
        raise CheckpointError(problem)
    if _use_mpio() and pg.size() > 1:
        failure: Optional[BaseException] = None
        try:
            _save_mpio(pg, tmp, entries, leaves, writers, created)
        except Exception as exc:  # parallel HDF5 errors reach every rank of a collective
            failure = exc
        try:
            raise_agreed(pg, failure, f"{what}: writing {tmp!r}")
        except CheckpointError:
            if pg.rank() == 0:
                _remove(tmp)
            raise
    else:
        _save_pwrite(pg, tmp, entries, leaves, writers, created)
    error: Optional[BaseException] = None
    if pg.rank() == 0:
        try:
            layout.mark_complete(tmp)
            os.replace(tmp, final)
            _fsync_dir(os.path.dirname(final))
        except Exception as exc:
            error = exc
            _remove(tmp)
    raise_agreed(pg, error, f"{what} to {final!r}")


def _make_folder(folder: str) -> Optional[str]:
    """Create ``folder`` and its missing parents, as ``mkdir -p``; why not, where it fails.

    Rank 0 alone creates it, before the others touch the folder: they open the file rank
    0 created in it only after hearing from rank 0 again.
    """
    try:
        os.makedirs(folder, exist_ok=True)
        return None
    except OSError as exc:
        blocker = folder
        while not os.path.lexists(blocker) and os.path.dirname(blocker) != blocker:
            blocker = os.path.dirname(blocker)
        if os.path.lexists(blocker) and not os.path.isdir(blocker):
            return f"{blocker!r} is in the way: it exists and is not a folder"
        return f"{type(exc).__name__}: {exc}"


def _use_mpio() -> bool:
    import h5py

    return bool(h5py.get_config().mpi)


def _writers(entries: List[Entry], size: int) -> Dict[str, int]:
    """Which rank writes each replicated entry: the least loaded so far, biggest first."""
    load = [0] * size
    for entry in entries:
        if entry.placement == "shard":
            itemsize = entry.nbytes // (entry.shape[entry.axis] or 1)
            for rank, length in enumerate(entry.lengths):
                load[rank] += itemsize * length
    writers = {}
    replicated = [e for e in entries if e.placement == "replicated"]
    for entry in sorted(replicated, key=lambda e: (-e.nbytes, e.name)):
        rank = min(range(size), key=lambda r: (load[r], r))
        writers[entry.name] = rank
        load[rank] += entry.nbytes
    return writers


def _my_slice(entry: Entry, leaf: Leaf, rank: int,
              writers: Dict[str, int]) -> Optional[Tuple[np.ndarray, int]]:
    """This rank's (contiguous data, start along the axis) for ``entry``, or ``None``."""
    if isinstance(leaf, Shard):
        start = sum(entry.lengths[:rank])
        return np.ascontiguousarray(leaf.local), start
    if writers[entry.name] != rank or entry.shape == ():  # 0-d: written by rank 0 in create
        return None
    return np.ascontiguousarray(array_of(leaf)), 0


def _save_pwrite(pg: Any, tmp: str, entries: List[Entry], leaves: List[Tuple[str, Leaf]],
                 writers: Dict[str, int], created: float) -> None:
    error: Optional[BaseException] = None
    offsets: List[Any] = [None]
    if pg.rank() == 0:
        import h5py

        for entry, (_, leaf) in zip(entries, leaves):
            if entry.shape == ():
                entry.value = np.asarray(array_of(leaf))
        try:
            with h5py.File(tmp, "w") as h5file:
                layout.create(h5file, entries, get_world_size(), pg.size(), created)
                layout.offsets(h5file, entries)
            offsets[0] = [entry.offset for entry in entries]
        except Exception as exc:
            error = exc
            _remove(tmp)
    raise_agreed(pg, error, f"hpccomm.checkpoint.save: creating {tmp!r}")
    broadcast_object_list(offsets, group_src=0, group=pg)
    tasks = []
    for entry, offset, (_, leaf) in zip(entries, offsets[0], leaves):
        entry.offset = offset
        mine = _my_slice(entry, leaf, pg.rank(), writers)
        if mine is None or mine[0].size == 0:
            continue
        data, start = mine
        tasks.append(Task(data, _runs(entry, start, data), data.nbytes))
    try:
        transfer(pg, tmp, tasks, write=True, label="save")
    except CheckpointError:
        if pg.rank() == 0:
            _remove(tmp)
        raise


def _runs(entry: Entry, start: int, data: np.ndarray):
    itemsize = np.dtype(entry.dtype).itemsize
    if entry.placement == "replicated":
        return [(entry.offset, 0, entry.nbytes)]
    return layout.runs(entry.offset, entry.shape, itemsize, entry.axis, start,
                       start + data.shape[entry.axis])


def _save_mpio(pg: Any, tmp: str, entries: List[Entry], leaves: List[Tuple[str, Leaf]],
               writers: Dict[str, int], created: float) -> None:
    """Collective writes through parallel HDF5 (h5py built with MPI)."""
    import h5py
    from h5py import h5fd, h5p

    total = sum(entry.nbytes for entry in entries)
    for entry, (_, leaf) in zip(entries, leaves):
        if entry.shape == ():  # written in create(), as every rank holds the same value
            entry.value = np.asarray(array_of(leaf))
    progress = Progress(total, "save", enabled=pg.rank() == 0)
    with h5py.File(tmp, "w", driver="mpio", comm=pg.comm) as h5file:
        layout.create(h5file, entries, get_world_size(), pg.size(), created)
        dxpl = h5p.create(h5p.DATASET_XFER)
        dxpl.set_dxpl_mpio(h5fd.MPIO_COLLECTIVE)
        for entry, (_, leaf) in zip(entries, leaves):
            mine = _my_slice(entry, leaf, pg.rank(), writers)
            write_selection(h5file[entry.name], entry, mine, dxpl)
            progress.update(entry.nbytes)
    progress.close()


def write_selection(dset: Any, entry: Entry, mine: Optional[Tuple[np.ndarray, int]],
                    dxpl: Any = None) -> None:
    """One rank's ``H5Dwrite`` of its slice ``mine`` (or of nothing) into ``dset``.

    Every rank calls it for every entry, so it can be a collective transfer (``dxpl``).
    """
    from h5py import h5s

    fspace = dset.id.get_space()
    if mine is None or mine[0].size == 0:  # still takes part in the collective
        fspace.select_none()
        mspace = h5s.create_simple((1,))
        mspace.select_none()
        data = np.zeros(1, dtype=entry.dtype)
    else:
        data, start = mine
        if entry.placement == "shard":
            origin = [0] * data.ndim
            origin[entry.axis] = start
            fspace.select_hyperslab(tuple(origin), data.shape)
        mspace = h5s.create_simple(data.shape) if data.ndim else h5s.create(h5s.SCALAR)
    dset.id.write(mspace, fspace, data, dxpl=dxpl)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
