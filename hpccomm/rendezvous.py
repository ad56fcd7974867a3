"""Meeting points under a deadline, before MPI calls that cannot time out.

``MPI_Comm_create_group``, ``MPI_Comm_split``, ``MPI_Cart_create`` and ``MPI_Cart_sub``
block until every participant calls them, with the same arguments, and MPI has no
nonblocking form of them. So the participants first meet under the timeout
(:mod:`hpccomm.backends.mpi.meeting`: point-to-point on the group's channel, never a
collective of the group, led by the first participant), each saying what it came for:
the constructor, its members or splits, the mesh's shape, and the group it makes. Once
all have met for the same call, the blocking call cannot hang. A rank that never comes
turns into a :class:`~hpccomm.errors.DistTimeoutError` on every rank that came, naming
the ranks that did not; ranks that came for different calls all raise a
:class:`~hpccomm.errors.DistDesyncError` naming each rank's call. Participants that are
not all of a group's ranks (``new_group`` is members-only) are named in the global
numbering.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .backends.mpi import meeting
from .errors import DistDesyncError, DistTimeoutError

#: Seconds past a creation's timeout by which every participant has its answer.
GRACE_S = meeting.VERDICT_GRACE_S


def meet_all(pg: Any, op: str, timeout: Optional[float], call: Optional[str] = None) -> None:
    """Return once every rank of ``pg`` has arrived for ``call`` (the constructor and its
    arguments in words; ``op`` if not given): a barrier with a deadline, on the group's
    channel."""
    _meet(pg, list(range(pg.size())), op, "waiting for every rank of the group",
          pg.timeout if timeout is None else timeout, call or op)


def meet_members(world: Any, members: Sequence[int], op: str, timeout: Optional[float],
                 call: Optional[str] = None) -> None:
    """Return once every rank in ``members`` (ranks of ``world``) has arrived for
    ``call`` (``op`` and the members if not given); ranks outside ``members`` take no
    part (``new_group`` is members-only)."""
    members = [int(m) for m in members]
    _meet(world, members, op, f"waiting for the members {members}",
          world.timeout if timeout is None else timeout, call or f"{op}({members})")


def _meet(pg: Any, members: List[int], op: str, waiting: str, limit: Optional[float],
          call: str) -> None:
    """The meeting of ``members`` (ranks of ``pg``), led by the first of them."""
    if len(members) < 2:
        return
    meeting.meet(pg.comm, members, call, limit, _GroupWords(pg, op, waiting, limit))


def _names(ranks: Sequence[int]) -> str:
    words = [str(r) for r in ranks]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


class _GroupWords(meeting.Words):
    """A creation's failures, named in the group's (global) ranks."""

    def __init__(self, pg: Any, op: str, waiting: str, limit: Optional[float]):
        super().__init__(f"{op} ({waiting})")
        self.pg, self.limit, self.waiting = pg, limit, waiting
        self.where = f"hpccomm.{op} on rank {pg.rank()}/{pg.size()} of group '{pg.group_name}'"

    def _global(self, position: int) -> int:
        return int(self.pg.ranks[position])

    def missing(self, named: List[int], count: int, leader: Optional[int]) -> BaseException:
        shown = [self._global(r) for r in named]
        more = f" (and {count - len(named)} more)" if count > len(named) else ""
        told = (f", as global rank {self._global(leader)}, the first participant, found"
                if leader is not None else "")
        who = f"global rank {shown[0]}" if count == 1 else f"global ranks {shown}{more}"
        return DistTimeoutError(f"{self.where} ({self.waiting}): {who} never came within "
                                f"{self.limit} s{told}; nothing was created")

    def unanswered(self, leader: int, limit: Optional[float]) -> BaseException:
        return DistTimeoutError(
            f"{self.where} ({self.waiting}): global rank {self._global(leader)}, the first "
            f"participant, did not answer within {limit} s and {GRACE_S:g} s of grace (it "
            f"never came, or gave up before this rank came); nothing was created")

    def differ(self, calls: List[Tuple[int, str]], absent: List[int]) -> str:
        by_call: Dict[str, List[int]] = {}
        for position, call in calls:
            by_call.setdefault(call, []).append(self._global(position))
        parts = [f"global rank{'s' if len(ranks) > 1 else ''} {_names(sorted(ranks))} "
                 f"came for {call}" for call, ranks in by_call.items()]
        if absent:
            missing = sorted(self._global(r) for r in absent)
            parts.append(f"global rank{'s' if len(missing) > 1 else ''} {_names(missing)} "
                         f"never came")
        return ("the ranks came to make different groups: " + "; ".join(parts) +
                "; nothing was created")

    def desync(self, text: str) -> BaseException:
        return DistDesyncError(f"{self.where}: {text}")
