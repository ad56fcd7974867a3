"""Meeting points under a deadline, before MPI calls that cannot time out.

``MPI_Comm_create_group``, ``MPI_Comm_split``, ``MPI_Cart_create`` and ``MPI_Cart_sub``
block until every participant calls them, and MPI has no nonblocking form of them. So
the participants first meet under the timeout; once all have met, the blocking call
cannot hang. A rank that never comes turns into a
:class:`~hpccomm.errors.DistTimeoutError` on every rank that came, naming the ranks that
did not, instead of a silent hang.

A meeting is point-to-point on hpccomm's reserved tags, never a collective of the
group: a collective could pair with a user's collective on the same communicator (a
``barrier`` that one rank calls while another makes a DeviceMesh group), and both would
go on with wrong partners. The first participant, the leader, collects a token from
each other participant, then sends each its verdict: go on, or the ranks that never
came (then every participant raises the same error). Participants that are not all of a
group's ranks (``new_group`` is members-only) are named in the group's numbering.
"""
from __future__ import annotations

import time
from typing import Any, List, Optional, Sequence

import numpy as np

from .errors import DistTimeoutError
from .types import Tag
from .work import as_work, poll

ARRIVE_TAG = Tag.RENDEZVOUS_ARRIVE
RELEASE_TAG = Tag.RENDEZVOUS_RELEASE
#: Seconds a participant waits for the leader's verdict past the meeting's deadline
#: (the leader gives up at the deadline too, then sends it).
VERDICT_GRACE_S = 1.0
#: Ranks a verdict names at most (the count is always there).
NAMED = 64
#: The verdict: [status (0: go on, 1: some never came), how many, their ranks...].
_VERDICT = 2 + NAMED
#: The receives a failed meeting left posted for the ranks that never came, with their
#: buffers: MPI may still write into them (when a late rank sends its token).
_abandoned: List[Any] = []


def _wait(outcome: Any, pg: Any, op: str, deadline: float, peer: Optional[int] = None) -> None:
    work = as_work(outcome)
    work.group, work.op, work.seq, work.peer = pg, op, pg.seq, peer
    work.timeout = max(deadline - time.monotonic(), 1e-3)
    work.wait()


def meet_all(pg: Any, op: str, timeout: Optional[float]) -> None:
    """Return once every rank of ``pg`` has arrived (a barrier with a deadline, on
    reserved tags)."""
    _meet(pg, list(range(pg.size())), f"{op} (waiting for every rank of the group)",
          pg.timeout if timeout is None else timeout)


def meet_members(world: Any, members: Sequence[int], op: str, timeout: Optional[float]) -> None:
    """Return once every rank in ``members`` (ranks of ``world``) has arrived; ranks
    outside ``members`` take no part (``new_group`` is members-only)."""
    _meet(world, list(members), f"{op} (waiting for the members {list(members)})",
          world.timeout if timeout is None else timeout)


def _meet(pg: Any, members: List[int], what: str, limit: Optional[float]) -> None:
    """The meeting of ``members`` (ranks of ``pg``), led by the first of them."""
    if len(members) < 2:
        return
    deadline = time.monotonic() + (limit if limit is not None else 1e12)
    comm, me, leader = pg.cpu, pg.rank(), members[0]
    if me != leader:
        token = np.zeros(1, dtype=np.int8)
        _wait(comm.send(token, leader, ARRIVE_TAG), pg, what, deadline, leader)
        verdict = np.zeros(_VERDICT, dtype=np.int64)  # the leader gives up at the same
        _wait(comm.recv(verdict, leader, RELEASE_TAG), pg, what,  # time: its verdict's
              deadline + VERDICT_GRACE_S, leader)                  # way is the grace

        if verdict[0]:
            raise _missing(pg, what, limit, [int(r) for r in verdict[2:2 + min(
                int(verdict[1]), NAMED)]], int(verdict[1]), leader)
        return
    others = [m for m in members if m != leader]
    arrivals = [comm.recv(np.zeros(1, dtype=np.int8), m, ARRIVE_TAG) for m in others]
    tests = [started[0] for started in arrivals]
    arrived = [False] * len(others)

    def all_arrived() -> bool:
        done = True
        for i, test in enumerate(tests):
            if not arrived[i]:
                arrived[i] = bool(test())
                done = done and arrived[i]
        return done
    poll(all_arrived, max(deadline - time.monotonic(), 0.0))
    missing = [m for m, came in zip(others, arrived) if not came]
    verdict = np.zeros(_VERDICT, dtype=np.int64)
    if missing:
        verdict[0], verdict[1] = 1, len(missing)
        named = missing[:NAMED]
        verdict[2:2 + len(named)] = named
    # the verdict goes to those who came; the receives of the others stay posted
    for member, came in zip(others, arrived):
        if came:
            _wait(comm.send(verdict, member, RELEASE_TAG), pg, what,
                  max(deadline, time.monotonic() + 1.0), member)
    if missing:
        _abandoned.extend(started for started, came in zip(arrivals, arrived) if not came)
        raise _missing(pg, what, limit, missing[:NAMED], len(missing), None)


def _missing(pg: Any, what: str, limit: Optional[float], named: List[int], count: int,
             leader: Optional[int]) -> DistTimeoutError:
    """The error of a meeting some participants never came to."""
    ranks = pg.ranks
    shown = [int(ranks[r]) for r in named]
    more = f" (and {count - len(named)} more)" if count > len(named) else ""
    told = f", as global rank {int(ranks[leader])}, the first participant, found" \
        if leader is not None else ""
    who = f"global rank {shown[0]}" if count == 1 else f"global ranks {shown}{more}"
    return DistTimeoutError(
        f"hpccomm.{what} on rank {pg.rank()}/{pg.size()} of group '{pg.group_name}': "
        f"{who} never came within {limit} s{told}; nothing was created")
