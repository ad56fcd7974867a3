"""After a collective times out: ask the group who else is stuck, name who is not.

A timed-out rank cannot learn from MPI which peer never joined. So each rank whose
collective timed out sends ``[seq, op code, waited ms, group]`` to every other rank of the
group (point-to-point, on the group's channel: a communicator of hpccomm's own, where no
user message and no collective can match it) and listens for the others' reports for a
short grace period (:data:`GRACE_S`, at most the timeout), taking each by matched probe,
so that no receive stays posted when it stops listening. Ranks that report the same
operation are stuck with us; ranks that report another one are elsewhere; ranks that
never report are not inside an hpccomm collective of this group at all: they are the
ones named. The result
is a sentence for the timeout error and :data:`last` for the flight recorder. Groups
larger than :data:`MAX_RANKS` skip it (the message count grows as the square of the
size); ``HPCCOMM_ROLLCALL_GRACE=0`` turns it off. It is an observer of timeouts,
registered by :func:`install` (``init_process_group`` does it) before all others.

A rank that never times out never reads the reports sent to it; they stay in MPI's queue
of the group's channel, and MPI may give a later communicator the same context once
the group is destroyed. So each report names its group (a hash of the group's name, which
its members agree on), and a report of another group is not counted.
"""
from __future__ import annotations

import os
import time
import zlib
from typing import Any, Dict, List, Optional

import numpy as np

from .. import observe, settings
from ..types import Tag
from ..work import as_work
from .ops import CODES, NAMES

#: Reserved tag of roll-call messages.
TAG = Tag.ROLLCALL
#: How long a timed-out rank listens for the others' reports.
GRACE_S = settings.ROLLCALL_GRACE.get()
#: Largest group that runs a roll call: every stuck rank messages every other rank, so
#: the message count grows as the square of the group size.
MAX_RANKS = settings.ROLLCALL_MAX_RANKS.get()
_DESYNC_OFFSET = 100

#: The latest roll call's result (for the flight recorder dump), or ``None``.
last: Optional[Dict[str, Any]] = None


def _code(op: str) -> int:
    if op.startswith("desync "):
        base = CODES.get(op.rsplit(" ", 1)[-1])
        return _DESYNC_OFFSET + base if base else -1
    return CODES.get(op, -1)


def _name(code: int) -> str:
    if code > _DESYNC_OFFSET:
        return f"desync check before {NAMES.get(code - _DESYNC_OFFSET, '?')}"
    return NAMES.get(code, "an unknown operation")


def _short(ranks: List[int]) -> str:
    return ", ".join(map(str, ranks))


def hook(work: Any, waited: float) -> Optional[str]:
    """Timeout hook: run the roll call for a timed-out collective; a sentence or ``None``."""
    global last
    pg = work.group
    code = _code(work.op)
    if pg is None or not pg.live or pg.size() == 1 or code < 0:
        return None
    me, size, ranks = pg.rank(), pg.size(), pg.ranks
    if size > MAX_RANKS or GRACE_S <= 0:
        return (f"(No roll call: the group has {size} ranks, more than "
                f"{settings.ROLLCALL_MAX_RANKS.name}={MAX_RANKS}; see the flight recorder dumps.)"
                if size > MAX_RANKS else None)
    group = zlib.crc32(pg.group_name.encode())
    report = np.array([work.seq, code, int(waited * 1000), group], dtype=np.int64)
    channel = pg.hidden
    sends = [as_work(channel.send(report, peer, TAG)) for peer in range(size) if peer != me]
    heard: Dict[int, List[int]] = {}
    limit = work.timeout if work.timeout is not None else GRACE_S
    deadline = time.monotonic() + min(GRACE_S, max(limit, 0.05))
    polls = 0
    while len(heard) < size - 1 and time.monotonic() < deadline:
        taken = channel.take(TAG)  # a matched probe: nothing stays posted after the loop
        if taken is not None:
            source, data = taken  # the sender's group rank, its report
            if data.size == report.nbytes and 0 <= source < size and source != me:
                got = data.view(np.int64)
                if got[3] == group:
                    heard[source] = got[:3].tolist()
            continue
        polls += 1
        if polls > 200:
            time.sleep(0.001)
        else:
            os.sched_yield()
    for send in sends:  # small messages leave eagerly; do not wait for absent ranks
        send.is_completed()
    here = [ranks[r] for r, (seq, other, _) in sorted(heard.items()) if other == code]
    elsewhere = {ranks[r]: f"{_name(other)} (seq {seq})"
                 for r, (seq, other, _) in sorted(heard.items()) if other != code}
    missing = [ranks[r] for r in range(size) if r != me and r not in heard]
    last = {"group": pg.group_name, "op": work.op, "seq": work.seq, "rank": ranks[me],
            "stuck_with_me": here, "elsewhere": elsewhere, "missing": missing,
            "grace_s": GRACE_S}
    return sentence(last)


def sentence(result: Dict[str, Any]) -> str:
    """The roll call's finding in words (global ranks)."""
    parts = []
    if result["missing"]:
        which = "rank" if len(result["missing"]) == 1 else "ranks"
        parts.append(f"Global {which} {_short(result['missing'])} never joined: not inside an "
                     f"hpccomm collective of this group (no roll-call answer within "
                     f"{result['grace_s']:g} s).")
    for rank, where in result["elsewhere"].items():
        parts.append(f"Global rank {rank} is stuck in {where} instead (desync).")
    if result["stuck_with_me"]:
        parts.append(f"Also stuck here: global ranks {_short(result['stuck_with_me'])}.")
    return " ".join(parts)


class RollCall(observe.Observer):
    """The observer that runs the roll call when a collective times out."""

    def on_timeout(self, work: Any, waited: float) -> Optional[str]:
        return hook(work, waited)


_observer = RollCall()


def install() -> None:
    """Run the roll call on every collective timeout from now on, before other observers
    of timeouts (the flight recorder's dump reads :data:`last`)."""
    observe.register(_observer, first=True)
