"""Desync detection at debug level DETAIL: do all ranks call the same collective?

Before each collective, :func:`check` reduces a small int64 fingerprint
``[op, dtype, count, shape, root, reduce op]`` over the group with one
``Iallreduce(MIN)`` of ``[f, -f]`` (so minimum and maximum come in one call). Fields an
operation lets differ between ranks (``all_gather`` block sizes, ``gather`` inputs) are
left at 0. If minimum and maximum differ anywhere, every rank all-gathers a fixed-size
text description of its call and raises :class:`DistDesyncError` with a table of what
each rank called. Every rank took part in the same check operations and none started the
real collective, so the group stays usable. The check runs on the group's CPU (MPI)
communicator under the call's timeout, as an observer that runs before each operation
starts; it is registered while the debug level is DETAIL.
"""
from __future__ import annotations

import logging
import zlib
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .. import observe
from ..errors import CallsDiffer, DistDesyncError, described
from ..types import DebugLevel, RedOpType
from ..work import as_work
from . import debug, flight_recorder
from .ops import CODES

logger = logging.getLogger("hpccomm")
FIELDS = ("op", "dtype", "count", "shape", "root", "reduce op")
_FAR = np.iinfo(np.int64).max  # a slot this rank has nothing to say about (MIN skips it)
_MASK = (1 << 62) - 1
_DESC_BYTES = 192
_NONE = -1


def _count(arr: Any, args: tuple) -> int:
    return arr.size if arr is not None else 0


def _out_count(arr: Any, args: tuple) -> int:
    return args[1].size


def _in_count(arr: Any, args: tuple) -> int:
    return args[0].size


def _no_count(arr: Any, args: tuple) -> int:
    return 0


def _a2a_count(arr: Any, args: tuple) -> int:
    return arr.size if args[2] is None else 0


# (count function, shape must match, index of the reduce kind in args) of the
# collectives whose ranks must agree on more than the operation and the root
_FIELDS_OF: Dict[str, tuple] = {
    "broadcast": (_count, True, None),
    "all_reduce": (_count, True, 1),
    "reduce": (_count, True, 1),
    "all_gather": (_out_count, False, None),
    "all_gather_into_tensor": (_out_count, True, None),
    "gather_single": (_in_count, True, None),
    "reduce_scatter": (_in_count, False, 2),
    "reduce_scatter_tensor": (_in_count, True, 2),
    "all_to_all_single": (_a2a_count, False, None),
}
_NOTHING_MORE = (_no_count, False, None)


def _blocks(op: str, args: tuple, size: int) -> Optional[tuple]:
    """For the collectives whose ranks' blocks may differ in size (the list forms of
    gather, scatter, all_gather, reduce_scatter): ``(this rank's block, the blocks this
    rank expects of every rank or None)``; ``None`` for the others."""
    if op == "gather":
        return args[0].size, (list(args[3]) if args[3] else None)
    if op == "scatter":
        return args[1].size, (list(args[3]) if args[3] else None)
    if op == "all_gather":
        mine = args[0].size if args[0] is not None else args[1].size // size
        return mine, list(args[2]) if args[2] is not None else [args[1].size // size] * size
    if op == "reduce_scatter":
        return args[1].size, list(args[4]) if args[4] is not None else [args[1].size] * size
    return None
# every collective of ops.CODES -> (code, *fields); point-to-point is not checked
_OPS: Dict[str, tuple] = {op: (code, *_FIELDS_OF.get(op, _NOTHING_MORE))
                          for op, code in CODES.items()}
_DTYPE_CODES: Dict[Any, int] = {}


def _dtype_code(dtype: Any) -> int:
    code = _DTYPE_CODES.get(dtype)
    if code is None:
        code = _DTYPE_CODES[dtype] = zlib.crc32(np.dtype(dtype).str.encode()) + 1
    return code


def checked(op: str) -> bool:
    """Whether ``op`` is a collective that DETAIL checks."""
    return op in _OPS


def _describe(pg: Any, op: str, args: tuple, arr: Any, root: Optional[int],
              red: Optional[int], seq: int, block: Optional[int] = None) -> str:
    shape = "-" if arr is None else str(tuple(arr.shape))
    dtype = "-" if arr is None else str(arr.dtype)
    count = ("-" if arr is None else str(block) if block is not None
             else str(_OPS[op][1](arr, args)))
    where = "-" if root is None else str(pg.ranks[root])
    reduce = "-" if red is None else RedOpType(red).name
    return "|".join((op, dtype, shape, count, where, reduce, str(seq)))


def check(pg: Any, op: str, args: tuple, arr: Any, root: Optional[int],
          timeout: Optional[float]) -> None:
    """Raise :class:`DistDesyncError` on every rank unless all ranks call the same ``op``."""
    spec = _OPS.get(op)
    if spec is None or pg.size() == 1:
        return
    code, count_of, shape_matters, red_index = spec
    red = None if red_index is None else int(args[red_index])
    fingerprint = np.zeros(12, dtype=np.int64)  # one size for every operation
    fingerprint[0] = code
    if arr is not None:
        fingerprint[1] = _dtype_code(arr.dtype)
        fingerprint[2] = count_of(arr, args)
        if shape_matters:
            fingerprint[3] = hash(tuple(arr.shape)) & _MASK
    fingerprint[4] = _NONE if root is None else pg.ranks[root]
    fingerprint[5] = _NONE if red is None else red
    fingerprint[6:12] = -fingerprint[:6]
    what = f"desync check before {op}"
    _run(pg, what, pg.cpu.all_reduce, (fingerprint, RedOpType.MIN, None), timeout)
    low, high = fingerprint[:6], -fingerprint[6:12]
    if logger.isEnabledFor(5):
        logger.log(5, "hpccomm: rank %d of group '%s': %s (seq %d) agreed on by all ranks",
                   pg.rank(), pg.group_name, op, pg.seq + 1)
    blocks = _blocks(op, args, pg.size()) if arr is not None else None
    uneven = False
    if blocks is not None and np.array_equal(low, high):  # all make this uneven call:
        uneven = _uneven(pg, what, blocks, timeout)        # are its blocks the expected?
    if np.array_equal(low, high) and not uneven:
        return
    differing = [FIELDS[i] for i in range(6) if low[i] != high[i]]
    if uneven:
        differing.append("block sizes")
    mine = _describe(pg, op, args, arr, root, red, pg.seq + 1,
                     blocks[0] if blocks is not None else None)
    table = _gather_descriptions(pg, mine, timeout)
    error = DistDesyncError(_message(pg, op, differing, table))
    _dump(error)
    raise error


def _run(pg: Any, what: str, start: Any, args: tuple, timeout: Optional[float]) -> None:
    try:
        started = start(*args)
    except CallsDiffer as exc:  # the group's channel found the calls differing first
        raise described(pg.at(what), exc) from None
    work = as_work(started)
    work.op = what
    work.group = pg
    work.seq = pg.seq + 1
    work.timeout = pg.timeout if timeout is None else timeout
    work.wait()


def _uneven(pg: Any, what: str, blocks: tuple, timeout: Optional[float]) -> bool:
    """Whether some rank's block of an uneven collective differs from what a rank
    expects of it. One MIN all_reduce of 3 n int64: each rank's block at its slot, and
    the least and (negated) the most the ranks that know expect of each rank."""
    size, (mine, expected) = pg.size(), blocks
    slots = np.full(3 * size, _FAR, dtype=np.int64)  # MIN passes over _FAR
    slots[pg.rank()] = mine
    if expected is not None:
        slots[size:2 * size] = expected
        slots[2 * size:] = [-e for e in expected]
    _run(pg, what, pg.cpu.all_reduce, (slots, RedOpType.MIN, None), timeout)
    actual, least, most = slots[:size], slots[size:2 * size], -slots[2 * size:]
    expecting = least != _FAR  # the ranks some rank expects something of
    return bool(np.any(expecting & ((least != actual) | (most != actual))))


def _gather_descriptions(pg: Any, mine: str, timeout: Optional[float]) -> List[str]:
    raw = mine.encode()[:_DESC_BYTES]
    send = np.zeros(_DESC_BYTES, dtype=np.uint8)
    send[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    recv = np.zeros(_DESC_BYTES * pg.size(), dtype=np.uint8)
    _run(pg, "desync report", pg.cpu.all_gather, (send, recv, None), timeout)
    return [recv[i * _DESC_BYTES:(i + 1) * _DESC_BYTES].tobytes().rstrip(b"\0").decode(
        errors="replace") for i in range(pg.size())]


def format_table(pg: Any, rows: Sequence[str]) -> str:
    """A fixed-width table: one line per group rank of what it called."""
    header = ("rank", "global", "op", "dtype", "shape", "count", "root", "reduce op", "seq")
    lines = [header]
    for rank, row in enumerate(rows):
        lines.append((str(rank), str(pg.ranks[rank]), *row.split("|")))
    widths = [max(len(line[i]) if i < len(line) else 0 for line in lines)
              for i in range(len(header))]
    return "\n".join("  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line))
                     .rstrip() for line in lines)


def _message(pg: Any, op: str, differing: List[str], rows: Sequence[str]) -> str:
    return (f"hpccomm.{op} on rank {pg.rank()}/{pg.size()} of group '{pg.group_name}': "
            f"ranks called different collectives (differing: {', '.join(differing)}). "
            f"No rank started it; the group is still usable.\n{format_table(pg, rows)}")


def _dump(error: BaseException) -> None:
    try:
        flight_recorder.dump_on_error("desync", str(error))
    except Exception as exc:  # a failing dump must not hide the desync
        logger.warning("hpccomm: flight recorder dump failed: %s", exc)


class DesyncCheck(observe.Observer):
    """The observer that runs :func:`check` before every operation (DETAIL)."""

    def before_start(self, pg: Any, op: str, args: tuple, arr: Any, peer: Optional[int],
                     timeout: Optional[float]) -> None:
        check(pg, op, args, arr, peer, timeout)


_observer = DesyncCheck()


def _follow(level: DebugLevel) -> None:
    """Check collectives exactly while the debug level is DETAIL."""
    if level >= DebugLevel.DETAIL:
        observe.register(_observer)
    else:
        observe.unregister(_observer)


def install() -> None:
    """Check every collective from now on whenever the debug level is DETAIL."""
    debug.on_change(_follow)
