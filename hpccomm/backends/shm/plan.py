"""Which path a collective of a group on one node takes, and why, in words.

The same rules the communicators apply (:mod:`.small`'s limits and split size,
:mod:`.communicator`'s thresholds), stated for a group of ``n`` ranks without making
one, so that ``hpccomm bench --explain`` can say what each size does at a rank count
before a job runs. Sizes are nccl-tests' (:mod:`hpccomm.cli.bench`): the buffer of
all_reduce and broadcast, the whole output of all_gather, the whole input of
reduce_scatter, the whole per-rank buffer of all_to_all.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence, Tuple

from .. import base
from . import small
from .communicator import NEVER, channel_caps, ring_thresholds

#: nccl-tests' operation names -> the channel's code and the ring's threshold name.
OPERATIONS = {
    "all_reduce": (base.ALL_REDUCE, "all_reduce"),
    "broadcast": (base.BROADCAST, "broadcast"),
    "all_gather_into_tensor": (base.ALL_GATHER, "all_gather"),
    "reduce_scatter_tensor": (base.REDUCE_SCATTER, "reduce_scatter"),
    "all_to_all_single": (base.ALL_TO_ALL, None),
}


class Path(NamedTuple):
    name: str  # "channel", "channel, split", "shared-memory ring", "pair kernel", "MPI"
    why: str


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"



def path(op: str, nbytes: int, n: int, vendor: str, crowded: bool = False,
         kernel: bool = True) -> Path:
    """The path of ``op`` (an nccl-tests name) on ``nbytes`` at ``n`` ranks of one node
    with the MPI library ``vendor`` (``MPI.get_vendor()[0]``), and why."""
    if n < 2:  # a group of one rank gets no shared memory (cpu_communicator)
        return Path("MPI", "a group of one rank communicates nothing (MPI's own call)")
    if op not in OPERATIONS:
        return Path("MPI", "point-to-point goes through MPI")
    code, ring_name = OPERATIONS[op]
    per_rank = op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")
    counted = nbytes // n if per_rank else nbytes
    rings = ring_thresholds(n, crowded, kernel, vendor)
    limit = (small.capped(n, channel_caps(rings, n), vendor)[code] if small.available()
             else 0)
    what = "one rank's block" if per_rank else "the buffer"
    if 0 < counted <= limit:
        if code == base.ALL_REDUCE:
            split = small.split_from(n, crowded)
            if split and counted >= split:
                return Path("channel, split",
                            f"{_size(counted)} <= the channel's {_size(limit)}; from "
                            f"{_size(split)} each rank reduces 1/{n} and copies the rest: "
                            f"reads 3 S instead of {n + 1} S")
            why = (f"below the split size {_size(split)}, one hand-off is cheaper than "
                   f"reading {n - 2} S more" if split else "2 ranks: each reads the other's")
            return Path("channel", f"{what} {_size(counted)} <= the channel's "
                                   f"{_size(limit)} ({vendor}); {why}")
        return Path("channel", f"{what} {_size(counted)} <= the channel's {_size(limit)} "
                               f"({vendor})")
    ring = rings.get(ring_name, NEVER) if ring_name else NEVER
    if nbytes >= ring:
        name = "pair kernel" if kernel and n == 2 and code == base.ALL_REDUCE \
            else "shared-memory ring"
        return Path(name, f"{_size(nbytes)} >= the ring's {_size(ring)}"
                          f"{' (crowded node)' if crowded else ''}")
    whole_slot = small.available() and small.in_pieces(
        n, small.capped(n, channel_caps(rings, n), vendor)[base.ALL_REDUCE])
    if code == base.ALL_REDUCE and whole_slot and nbytes < ring:
        split = small.split_from(n, crowded)
        each = "each split" if split and limit >= split else "each whole"
        return Path("channel, in pieces",
                    f"{_size(nbytes)} between the channel's {_size(limit)} and the ring's "
                    f"{_size(ring)}: pieces of {_size(limit)}, up to {small.SLOTS} at once, "
                    f"{each}")
    if code == base.REDUCE_SCATTER and whole_slot and limit and nbytes < ring:
        return Path("channel, in pieces",
                    f"one rank's block {_size(counted)} above the channel's {_size(limit)}, "
                    f"input below the ring's {_size(ring)}: pieces of {_size(limit)} of "
                    f"every block, up to {small.SLOTS} at once; a rank reads 2 S")
    above = f"above the channel's {_size(limit)}" if limit else "no channel"
    below = f"below the ring's {_size(ring)}" if ring < NEVER else "MPI's own is as fast"
    return Path("MPI", f"{above}; {below}")


def explain(cases: Sequence[Tuple[str, int]], n: int, vendor: str, crowded: bool = False,
            kernel: bool = True) -> str:
    """A table of :func:`path` for every ``(operation, bytes)`` of ``cases``."""
    lines = [f"paths at {n} rank{'s' if n != 1 else ''} on one node ({vendor}"
             f"{', more ranks than CPUs' if crowded else ''}), as hpccomm chooses them:",
             f"{'operation':<24}{'size':>9}  {'path':<20}why"]
    for op, nbytes in cases:
        chosen = path(op, nbytes, n, vendor, crowded, kernel)
        lines.append(f"{op:<24}{_size(nbytes):>9}  {chosen.name:<20}{chosen.why}")
    return "\n".join(lines)
