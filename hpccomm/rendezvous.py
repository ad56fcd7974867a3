"""Meeting points under a deadline, before MPI calls that cannot time out.

``MPI_Comm_create_group``, ``MPI_Comm_split``, ``MPI_Cart_create`` and ``MPI_Cart_sub``
block until every participant calls them, and MPI has no nonblocking form of them. So
the participants first meet under the timeout (:mod:`hpccomm.backends.mpi.meeting`:
point-to-point on hpccomm's reserved tags, never a collective of the group, led by the
first participant); once all have met, the blocking call cannot hang. A rank that never
comes turns into a :class:`~hpccomm.errors.DistTimeoutError` on every rank that came,
naming the ranks that did not, instead of a silent hang. Participants that are not all
of a group's ranks (``new_group`` is members-only) are named in the group's numbering.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

from .backends.mpi import meeting
from .errors import DistTimeoutError


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

    def dress(work: Any, peer: int) -> None:
        work.group, work.seq = pg, pg.seq

    def missing(named: List[int], count: int, leader: Optional[int]) -> DistTimeoutError:
        return _missing(pg, what, limit, named, count, leader)
    meeting.meet(pg.comm, members, meeting.RENDEZVOUS, what, limit, missing, dress=dress)


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
