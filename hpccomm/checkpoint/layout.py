"""The checkpoint file: one HDF5 file holding every global array, plus its metadata.

Every array is a contiguous, unfiltered HDF5 dataset whose storage is allocated when it
is created, so its bytes lie at a fixed file offset in C order. Root attributes mark the
format (``hpccomm_format``, ``format_version``), the saving job (``world_size``,
``group_size``, ``hpccomm_version``) and ``complete``, set last. Each dataset records
``placement`` (``"shard"`` or ``"replicated"``), ``axis`` and the saved slice
``lengths`` per rank; shape and dtype are the dataset's own.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .._version import __version__
from ..errors import DistValueError

FORMAT = "hpccomm.checkpoint"
FORMAT_VERSION = 1
#: How to install what checkpoints need (h5py).
INSTALL = "pip install 'hpccomm[ckpt]'"


class CheckpointError(DistValueError):
    """A checkpoint cannot be saved or loaded: bad state, foreign, truncated or incomplete file."""


@dataclass
class Entry:
    """One global array of a checkpoint."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    placement: str  # "shard" or "replicated"
    axis: int
    lengths: Tuple[int, ...]  # saved slice lengths per rank (shards only)
    offset: Optional[int] = None  # byte offset of the data in the file (None if empty)
    value: Optional[np.ndarray] = None  # a 0-d array's value (HDF5 keeps no offset for it)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def require_h5py() -> Any:
    """The h5py module, or an ImportError that says how to install it.

    A missing h5py gives a ``ModuleNotFoundError``; an h5py that is installed but fails
    to import (a broken HDF5 library) an ``ImportError`` that keeps h5py's own reason.
    """
    try:
        import h5py
    except ImportError as exc:
        kind = ModuleNotFoundError if isinstance(exc, ModuleNotFoundError) else ImportError
        raise kind(f"hpccomm.checkpoint needs h5py, which cannot be imported here ({exc}); "
                   f"install it with: {INSTALL}", name="h5py") from None
    return h5py


def runs(base: int, shape: Sequence[int], itemsize: int, axis: int, start: int,
         stop: int) -> Iterator[Tuple[int, int, int]]:
    """``(file offset, buffer offset, nbytes)`` runs of rows ``start:stop`` along ``axis``.

    The buffer is the C-contiguous slice itself; the file holds the global array of
    ``shape`` from ``base``. A slice along axis 0 (or a full one) is one run; along a later
    axis it is one run per index of the axes before it.
    """
    count = stop - start
    if count <= 0 or 0 in shape:
        return
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64)) * itemsize
    row = count * inner
    if count == shape[axis]:  # the whole array: one run
        yield base, 0, outer * row
        return
    stride = shape[axis] * inner
    for index in range(outer):
        yield base + index * stride + start * inner, index * row, row


def _dcpl() -> Any:
    from h5py import h5d, h5p

    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_layout(h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)  # storage (and so the offset) exists now
    dcpl.set_fill_time(h5d.FILL_TIME_NEVER)  # ranks write every byte; no zero pass
    return dcpl


def create(h5file: Any, entries: List[Entry], world_size: int, group_size: int,
           created: float) -> None:
    """Write the root attributes and create every dataset in ``h5file``.

    Data is written later by the ranks, except a 0-d array's ``entry.value`` (h5py gives
    scalar datasets no early allocation, so they are written here).
    """
    attrs = h5file.attrs
    attrs["hpccomm_format"] = FORMAT
    attrs["format_version"] = FORMAT_VERSION
    attrs["hpccomm_version"] = __version__
    attrs["world_size"] = world_size
    attrs["group_size"] = group_size
    attrs["created_unix"] = created  # the same on all ranks (mpio)
    attrs["complete"] = False
    for entry in entries:
        dset = h5file.create_dataset(entry.name, shape=entry.shape, dtype=np.dtype(entry.dtype),
                                     dcpl=_dcpl())
        dset.attrs["placement"] = entry.placement
        dset.attrs["axis"] = entry.axis
        dset.attrs["lengths"] = np.asarray(entry.lengths, dtype=np.int64)
        if entry.value is not None:
            dset[()] = entry.value


def offsets(h5file: Any, entries: List[Entry]) -> None:
    """Fill ``entry.offset`` from the created datasets."""
    for entry in entries:
        entry.offset = h5file[entry.name].id.get_offset()


def mark_complete(path: str) -> None:
    """Set ``complete`` (the last write of a save) and force the file to disk."""
    import h5py

    with h5py.File(path, "r+") as h5file:
        h5file.attrs["complete"] = True
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_index(path: str) -> Dict[str, Any]:
    """The checkpoint's root attributes and ``entries`` (name -> Entry), validated.

    Raises :class:`CheckpointError` naming ``path`` for a missing, foreign, truncated or
    incomplete file.
    """
    import h5py
    from h5py import h5d

    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist or is not a file")
    try:
        h5file = h5py.File(path, "r")
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path!r} is not a readable HDF5 file (truncated, "
                              f"corrupted or foreign): {exc}") from exc
    with h5file:
        attrs = dict(h5file.attrs)
        marker = attrs.get("hpccomm_format")
        if isinstance(marker, bytes):
            marker = marker.decode()
        if marker != FORMAT:
            raise CheckpointError(f"{path!r} is an HDF5 file but not an hpccomm checkpoint "
                                  f"(no '{FORMAT}' format marker)")
        version = int(attrs.get("format_version", -1))
        if version != FORMAT_VERSION:
            raise CheckpointError(f"checkpoint {path!r} has format version {version}; this "
                                  f"hpccomm reads version {FORMAT_VERSION}")
        if not bool(attrs.get("complete", False)):
            raise CheckpointError(f"checkpoint {path!r} is incomplete: its save did not finish")
        entries: Dict[str, Entry] = {}
        datasets: List[Tuple[str, Any]] = []
        h5file.visititems(lambda name, obj: datasets.append((name, obj))
                          if isinstance(obj, h5py.Dataset) else None)
        file_size = os.path.getsize(path)
        for name, dset in datasets:
            entry = Entry(name, tuple(int(n) for n in dset.shape), dset.dtype.str,
                          str(dset.attrs.get("placement", "")), int(dset.attrs.get("axis", -1)),
                          tuple(int(n) for n in dset.attrs.get("lengths", ())))
            if entry.shape == ():
                entry.value = np.asarray(dset[()], dtype=entry.dtype)
                entries[name] = entry
                continue
            plist = dset.id.get_create_plist()
            if plist.get_layout() != h5d.CONTIGUOUS or plist.get_nfilters():
                raise CheckpointError(f"checkpoint {path!r}: dataset {name!r} is not stored "
                                      f"contiguously without filters")
            entry.offset = dset.id.get_offset()
            if entry.nbytes and (entry.offset is None
                                 or dset.id.get_storage_size() != entry.nbytes
                                 or entry.offset + entry.nbytes > file_size):
                raise CheckpointError(f"checkpoint {path!r} is truncated or corrupted: dataset "
                                      f"{name!r} ({entry.nbytes} bytes) does not fit the file "
                                      f"({file_size} bytes)")
            entries[name] = entry
    attrs["entries"] = entries
    return attrs
