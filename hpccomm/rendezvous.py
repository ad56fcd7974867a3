"""Meeting points under a deadline, before MPI calls that cannot time out.

``MPI_Comm_create_group``, ``MPI_Comm_split`` and ``MPI_Cart_sub`` block until every
participant calls them, and MPI has no nonblocking form of them. So the participants
first meet through nonblocking operations polled under the timeout; once all have met,
the blocking call cannot hang. A rank that never comes turns into a
:class:`~hpccomm.errors.DistTimeoutError` naming the call instead of a silent hang.
"""
from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import numpy as np

from .types import Tag
from .work import as_work

ARRIVE_TAG = Tag.RENDEZVOUS_ARRIVE
RELEASE_TAG = Tag.RENDEZVOUS_RELEASE


def _wait(outcome: Any, pg: Any, op: str, deadline: float, peer: Optional[int] = None) -> None:
    work = as_work(outcome)
    work.group, work.op, work.seq, work.peer = pg, op, pg.seq, peer
    work.timeout = max(deadline - time.monotonic(), 1e-3)
    work.wait()


def meet_all(pg: Any, op: str, timeout: Optional[float]) -> None:
    """Return once every rank of ``pg`` has arrived (a barrier with a deadline)."""
    deadline = time.monotonic() + (pg.timeout if timeout is None else timeout)
    _wait(pg.cpu.barrier(), pg, f"{op} (waiting for every rank of the parent group)", deadline)


def meet_members(world: Any, members: Sequence[int], op: str, timeout: Optional[float]) -> None:
    """Return once every rank in ``members`` (global ranks) has arrived.

    The first member collects one token from each other member, then releases them, so
    ranks outside ``members`` take no part (``new_group`` is members-only).
    """
    deadline = time.monotonic() + (world.timeout if timeout is None else timeout)
    what = f"{op} (waiting for the members {list(members)})"
    comm, me, leader = world.cpu, world.rank(), members[0]
    token = np.zeros(1, dtype=np.int8)
    if me == leader:
        others = [m for m in members if m != leader]
        arrivals = [(m, comm.recv(np.zeros(1, dtype=np.int8), m, ARRIVE_TAG)) for m in others]
        for member, work in arrivals:
            _wait(work, world, what, deadline, member)
        for member, work in [(m, comm.send(token, m, RELEASE_TAG)) for m in others]:
            _wait(work, world, what, deadline, member)
        return
    _wait(comm.send(token, leader, ARRIVE_TAG), world, what, deadline, leader)
    _wait(comm.recv(np.zeros(1, dtype=np.int8), leader, RELEASE_TAG), world, what, deadline,
          leader)
