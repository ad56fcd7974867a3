"""``monitored_barrier``: a barrier that names the ranks that did not arrive.

Point-to-point acknowledgements under one deadline, on the group's CPU (MPI)
communicator with reserved tags, for any backend. Every rank but 0 sends an
acknowledgement to group rank 0 and waits for rank 0's release. Rank 0 collects the
acknowledgements until the deadline, then sends each arrived rank a release that says
"passed" or which ranks were missing, and raises naming them (the first one, or all of
them with ``wait_all_ranks=True``). Arrived ranks raise too, with the same names, and a
rank that hears nothing from rank 0 raises after the timeout plus a grace period: no rank
hangs. Waiting polls with growing sleeps (up to 10 ms), so it does not burn a core.

After a failed monitored barrier, rank 0 keeps receives pending for the absent ranks:
treat the group as broken (destroy it or end the job), as after a timeout.
"""
from __future__ import annotations

import datetime
import os
import time
from typing import Any, List, Union

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
    size = pg.size()
    acks = {rank: as_work(pg.cpu.recv(np.zeros(1, dtype=np.int64), rank, ACK_TAG))
            for rank in range(1, size)}
    arrived: List[int] = []
    poller = _Poller()
    while acks and time.monotonic() < deadline:
        progressed = False
        for rank, work in list(acks.items()):
            if work.is_completed():
                arrived.append(rank)
                del acks[rank]
                progressed = True
        if not progressed:
            poller.pause()
    missing = sorted(acks)
    named = missing if wait_all else missing[:1]
    verdict = np.full(size + 2, -1, dtype=np.int64)
    verdict[0] = _FAILED if missing else _PASSED
    verdict[1] = len(named)
    verdict[2:2 + len(named)] = [pg.ranks[r] for r in named]
    sends = [as_work(pg.cpu.send(verdict, rank, RELEASE_TAG)) for rank in arrived]
    release_deadline = time.monotonic() + GRACE_S
    while sends and time.monotonic() < release_deadline:
        sends = [work for work in sends if not work.is_completed()]
        if sends:
            poller.pause()
    if missing:
        raise DistTimeoutError(_failure(pg, [pg.ranks[r] for r in named], limit, 0))


def _acknowledge(pg: ProcessGroup, limit: float, deadline: float) -> None:
    ack = as_work(pg.cpu.send(np.array([pg.rank()], dtype=np.int64), 0, ACK_TAG))
    verdict = np.zeros(pg.size() + 2, dtype=np.int64)
    release = as_work(pg.cpu.recv(verdict, 0, RELEASE_TAG))
    poller = _Poller()
    final = deadline + GRACE_S
    while not release.is_completed():
        if time.monotonic() > final:
            raise DistTimeoutError(
                f"hpccomm.monitored_barrier on rank {pg.rank()}/{pg.size()} of group "
                f"'{pg.group_name}': rank 0 (global rank {pg.ranks[0]}) sent no verdict "
                f"within {limit:g} s + {GRACE_S:g} s: global rank {pg.ranks[0]} failed to "
                f"pass monitoredBarrier (it did not arrive, or is stuck).")
        poller.pause()
    ack.is_completed()
    if verdict[0] != _PASSED:
        named = [int(r) for r in verdict[2:2 + int(verdict[1])]]
        raise DistTimeoutError(_failure(pg, named, limit, pg.ranks[0]))


def _failure(pg: ProcessGroup, named: List[int], limit: float, reporter: Any) -> str:
    which = "Rank" if len(named) == 1 else "Ranks"
    listed = ", ".join(map(str, named))
    return (f"{which} {listed} failed to pass monitoredBarrier in {limit * 1000:.0f} ms "
            f"(hpccomm.monitored_barrier on rank {pg.rank()}/{pg.size()} of group "
            f"'{pg.group_name}'; global ranks, as reported by global rank {reporter}).")
