"""``monitored_barrier``: a barrier that names the ranks that did not arrive.

Point-to-point acknowledgements under one deadline, on the group's channel (a
communicator of hpccomm's own, ``pg.hidden``), for any backend. Every rank but 0 sends an
acknowledgement to group rank 0 and waits for rank 0's release. Rank 0 collects the
acknowledgements until the deadline, then sends each arrived rank a release that says
"passed" or which ranks were missing, and raises naming them (the first one, or all of
them with ``wait_all_ranks=True``). Arrived ranks raise too, with the same names, and a
rank that hears nothing from rank 0 raises after the timeout plus a grace period: no rank
hangs. Waiting polls with growing sleeps (up to 10 ms), so it does not burn a core.

Messages are taken by matched probe, so a failed monitored barrier leaves no receive
posted. An acknowledgement carries the time its sender stops waiting, and the release
echoes it: rank 0 drops the acknowledgement of a rank that came after it had given up
(and has given up itself since), and a rank drops a release meant for a barrier it gave
up, so the next monitored barrier of the group counts only its own.
"""
from __future__ import annotations

import datetime
import os
import time
from typing import Any, Dict, List, Optional, Union

import numpy as np

from .. import _call
from ..errors import DistTimeoutError
from ..group import GroupLike, ProcessGroup
from ..types import Tag, timeout_seconds
from ..work import as_work

ACK_TAG = Tag.BARRIER_ACK
RELEASE_TAG = Tag.BARRIER_RELEASE
#: Extra time non-zero ranks wait for rank 0's verdict beyond the timeout.
GRACE_S = 1.0
#: Seconds an arrived rank must still be waiting, by its word, for rank 0 to count it
#: (time for the release to reach it).
FRESH_S = 0.25
_PASSED, _FAILED = 0, 1


class _Poller:
    """Spin briefly, then sleep in growing steps (at most 10 ms)."""

    def __init__(self) -> None:
        self.polls = 0

    def pause(self) -> None:
        self.polls += 1
        if self.polls < 1000:
            os.sched_yield()
        else:
            time.sleep(min(0.01, 1e-5 * (self.polls - 999)))


def monitored_barrier(group: GroupLike = None,
                      timeout: Union[datetime.timedelta, float, None] = None,
                      wait_all_ranks: bool = False) -> None:
    """Barrier that raises, on every arrived rank, naming the ranks that did not arrive.

    ``timeout`` (``timedelta`` or seconds) defaults to the group's timeout. Rank 0 names
    the first missing rank, or all of them with ``wait_all_ranks=True``.
    """
    pg = _call.member(group, "monitored_barrier")
    if pg is None:  # not a member: return at once, as torch does
        return None
    limit = timeout_seconds(timeout, pg.timeout)
    run_on(pg, float("inf") if limit is None else limit, wait_all_ranks)


def run_on(pg: ProcessGroup, limit: float, wait_all_ranks: bool = False) -> None:
    """The monitored barrier on the members of ``pg`` within ``limit`` seconds (also for
    groups that no default group owns, such as the torch adapter's)."""
    if pg.size() == 1:
        return
    deadline = time.monotonic() + limit
    if pg.rank() == 0:
        _collect(pg, limit, deadline, wait_all_ranks)
    else:
        _acknowledge(pg, limit, deadline)


def _collect(pg: ProcessGroup, limit: float, deadline: float, wait_all: bool) -> None:
    size, channel = pg.size(), pg.hidden
    stamps: Dict[int, float] = {}  # rank -> when it stops waiting, as it said
    poller = _Poller()

    def take() -> bool:
        """Take the acknowledgements that came; whether one did."""
        came = False
        while True:
            taken = channel.take(ACK_TAG)
            if taken is None:
                return came
            source, data = taken
            if data.size == 16 and 0 < source < size:
                stamps[source] = float(data[8:].view(np.float64)[0])
                came = True

    def arrived() -> List[int]:  # those still waiting for the release, for a while yet
        now = time.time() + FRESH_S
        return sorted(rank for rank, stamp in stamps.items() if stamp > now)
    while len(arrived()) < size - 1 and time.monotonic() < deadline:
        if not take():
            poller.pause()
    take()
    here = arrived()
    missing = sorted(set(range(1, size)) - set(here))
    named = missing if wait_all else missing[:1]
    verdict = np.full(size + 3, -1, dtype=np.int64)
    verdict[0] = _FAILED if missing else _PASSED
    verdict[1] = len(named)
    verdict[3:3 + len(named)] = [pg.ranks[r] for r in named]
    sends = []
    for rank in here:  # each release echoes its rank's acknowledgement
        own = verdict.copy()
        own[2:3].view(np.float64)[0] = stamps[rank]
        sends.append(as_work(channel.send(own, rank, RELEASE_TAG)))
    release_deadline = time.monotonic() + GRACE_S
    while sends and time.monotonic() < release_deadline:
        sends = [work for work in sends if not work.is_completed()]
        if sends:
            poller.pause()
    if missing:
        raise DistTimeoutError(_failure(pg, [pg.ranks[r] for r in named], limit, 0))


def _acknowledge(pg: ProcessGroup, limit: float, deadline: float) -> None:
    channel = pg.hidden
    final = deadline + GRACE_S
    stamp = time.time() + (final - time.monotonic())
    mine = np.array([pg.rank(), 0], dtype=np.int64)
    mine[1:].view(np.float64)[0] = stamp
    ack = as_work(channel.send(mine, 0, ACK_TAG))
    poller = _Poller()
    verdict: Optional[np.ndarray] = None
    while verdict is None:
        taken = channel.take(RELEASE_TAG, 0)
        if taken is not None:
            got = taken[1].view(np.int64)
            if got.size == pg.size() + 3 and float(got[2:3].view(np.float64)[0]) == stamp:
                verdict = got
            continue  # (a release of a barrier this rank gave up: dropped)
        if time.monotonic() > final:
            raise DistTimeoutError(
                f"hpccomm.monitored_barrier on rank {pg.rank()}/{pg.size()} of group "
                f"'{pg.group_name}': rank 0 (global rank {pg.ranks[0]}) sent no verdict "
                f"within {limit:g} s + {GRACE_S:g} s: global rank {pg.ranks[0]} failed to "
                f"pass monitoredBarrier (it did not arrive, or is stuck).")
        poller.pause()
    ack.is_completed()
    if verdict[0] != _PASSED:
        named = [int(r) for r in verdict[3:3 + int(verdict[1])]]
        raise DistTimeoutError(_failure(pg, named, limit, pg.ranks[0]))


def _failure(pg: ProcessGroup, named: List[int], limit: float, reporter: Any) -> str:
    which = "Rank" if len(named) == 1 else "Ranks"
    listed = ", ".join(map(str, named))
    return (f"{which} {listed} failed to pass monitoredBarrier in {limit * 1000:.0f} ms "
            f"(hpccomm.monitored_barrier on rank {pg.rank()}/{pg.size()} of group "
            f"'{pg.group_name}'; global ranks, as reported by global rank {reporter}).")
