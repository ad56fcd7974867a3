"""Moving array bytes between ranks' buffers and the checkpoint file, in agreed rounds.

Each rank reads or writes its own byte runs with ``pread``/``pwrite`` on its own file
descriptor, so all ranks transfer at once. Work goes in rounds of at most ``CHUNK`` bytes
per rank; after each round one small ``all_reduce`` tells every rank the bytes done (for
rank 0's progress bar), whether any rank failed (then all stop) and whether any has more.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from ..collectives import all_reduce
from ..objects import all_gather_object
from ..types import ReduceOp
from .layout import CheckpointError
from .progress import Progress

CHUNK = 64 * 2**20

Run = Tuple[int, int, int]  # (file offset, buffer offset, nbytes)


@dataclass
class Task:
    """The runs that move the bytes of one C-contiguous ``buffer`` to or from the file."""

    buffer: np.ndarray
    runs: Iterable[Run]
    nbytes: int


def _pieces(tasks: List[Task], chunk: int) -> Iterator[Tuple[int, memoryview]]:
    for task in tasks:
        view = memoryview(task.buffer.reshape(-1).view(np.uint8))
        for file_offset, offset, nbytes in task.runs:
            for lo in range(0, nbytes, chunk):
                hi = min(nbytes, lo + chunk)
                yield file_offset + lo, view[offset + lo:offset + hi]


def _write(fd: int, offset: int, view: memoryview) -> None:
    while len(view):
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _read(fd: int, offset: int, view: memoryview, path: str) -> None:
    while len(view):
        got = os.preadv(fd, [view], offset)
        if got == 0:
            raise CheckpointError(f"checkpoint {path!r} ends at byte {offset}, before the data "
                                  f"it describes (truncated file)")
        view, offset = view[got:], offset + got


def transfer(pg: Any, path: str, tasks: List[Task], *, write: bool, label: str,
             chunk: int = CHUNK) -> None:
    """Write (``write=True``) or read every task of this rank; collective over ``pg``.

    Raises :class:`CheckpointError` on every rank if any rank failed, naming the ranks.
    """
    totals = np.array([sum(task.nbytes for task in tasks)], dtype=np.int64)
    all_reduce(totals, op=ReduceOp.SUM, group=pg)
    progress = Progress(int(totals[0]), label, enabled=pg.rank() == 0)
    error: Optional[BaseException] = None
    fd = -1
    try:
        fd = os.open(path, os.O_WRONLY if write else os.O_RDONLY)
    except OSError as exc:
        error = exc
    pieces = _pieces(tasks, chunk)
    more = True
    status = np.zeros(3, dtype=np.int64)
    try:
        while True:
            done = 0
            if error is None and more:
                try:
                    while done < chunk:
                        piece = next(pieces, None)
                        if piece is None:
                            more = False
                            if write:
                                os.fsync(fd)
                            break
                        offset, view = piece
                        _write(fd, offset, view) if write else _read(fd, offset, view, path)
                        done += len(view)
                except Exception as exc:  # reported to every rank below
                    error = exc
            status[:] = (done, error is not None, more and error is None)
            all_reduce(status, op=ReduceOp.SUM, group=pg)
            progress.update(int(status[0]))
            if status[1] or not status[2]:
                break
    finally:
        if fd >= 0:
            os.close(fd)
        progress.close()
    if status[1]:
        raise_agreed(pg, error, f"{label} {path!r}")


def raise_agreed(pg: Any, error: Optional[BaseException], what: str) -> None:
    """Collective: raise one CheckpointError on every rank, naming each failed rank's error."""
    reports: List[Any] = [None] * pg.size()
    all_gather_object(reports, None if error is None else f"{type(error).__name__}: {error}",
                      group=pg)
    failed = [f"rank {rank}: {report}" for rank, report in enumerate(reports) if report]
    if failed:
        raise CheckpointError(f"{what} failed on {len(failed)} rank(s): "
                              + "; ".join(failed)) from error
