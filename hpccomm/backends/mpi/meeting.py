"""Meetings under a deadline on an MPI communicator, before calls that cannot time out.

MPI's communicator constructors (``MPI_Comm_create_group``, ``MPI_Comm_split``,
``MPI_Cart_create``) and NCCL's blocking communicator creation wait until every
participant calls them, with no deadline, and take on trust that every participant
calls them with the same arguments. So the participants first meet, under the group's
timeout, and each says what it came for; once all have met for the same thing, the
blocking call has no rank left to wait for. A rank that never comes turns into an error
on every rank that came, naming the ranks that did not, and ranks that came for
different things (other members, another constructor) into a
:class:`~hpccomm.errors.DistDesyncError` on all of them, naming each rank's call,
instead of a silent hang.

A meeting is point-to-point on the group's channel (:mod:`.hidden`: a duplicate of its
communicator that only hpccomm sends on), never a collective: a collective could pair
with a user's collective on the same ranks. Every meeting of a channel, whatever it is
for (a group, a split, a mesh, an NCCL communicator), uses the same two tags, so that a
rank that came for one thing and a rank that came for another meet and find out.

The first participant, the leader, takes each other participant's arrival: when the
sender stops waiting, a sequence number of the sender's own, the sender's call (a digest
of its words: the constructor, its members or splits, the mesh's shape, the group it
makes; and the words themselves, cut at :data:`CALL_BYTES`), and a record the caller
adds (the GPU an NCCL rank uses). It waits until every participant of its call has come,
or until its deadline. A participant that came for another call is a mistake (it cannot
be ahead: its next call needs this one first); a rank outside the call that came for
another one may be ahead (``new_group([0, 1])`` returns at once on rank 2, which may go
on to the next group's meeting while ranks 0 and 1 still meet): its arrival is kept for
this rank's later meetings. Then the leader sends each rank that came its verdict, its
sequence number echoed: go on (with the answer of the caller's ``judge``: an NCCL unique
id), the calls differ (the ranks and their calls in words), some never came (their
ranks), or the judge refused (its words). Messages per meeting: two per participant, all
through the leader.

Nothing is left behind that a later meeting could take. The leader and the participants
take their messages by matched probe (:meth:`.hidden.Channel.take`), so no receive stays
posted when a meeting ends, in success or not. An arrival whose sender has stopped
waiting (it came to a meeting this rank, the leader, came too late for) is dropped, so a
late leader never goes on into the blocking call alone; a verdict whose sequence number
is not the waiting rank's (the verdict of a meeting it gave up) is dropped too. So a
creation retried after a timeout meets afresh on every rank.

Every participant ends within the meeting's timeout plus :data:`VERDICT_GRACE_S`: the
leader decides at its deadline at the latest, and the others wait that much longer for
its word.
"""
from __future__ import annotations

import hashlib
import itertools
import time
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from ...errors import DistBackendError, DistDesyncError, DistTimeoutError
from ...types import Tag
from ...work import abandon, poll

#: The tags of every meeting: a participant's arrival, the leader's verdict.
ARRIVE, VERDICT = int(Tag.MEETING_ARRIVE), int(Tag.MEETING_VERDICT)
#: Seconds a participant waits for the leader's verdict past the meeting's deadline
#: (the leader gives up at the deadline too, then sends it): the stated grace.
VERDICT_GRACE_S = 1.0
#: Seconds a participant must still be waiting, by its own clock's word, for its arrival
#: to count: the arrival of one that gave up (it came to an earlier meeting that this
#: rank, the leader, came too late for) is not counted, so a late leader never goes on
#: into the blocking call alone. (Clocks of a cluster's nodes agree to far better.)
FRESH_S = 0.25
#: Ranks a verdict names at most (the count is always there).
NAMED = 64
#: Bytes of the leader's answer, refusal or account of the calls at most (text is cut).
ANSWER_BYTES = 4096
#: Bytes of a call's words that travel with it (its digest covers all of them).
CALL_BYTES = 400
GO, ABSENT, REFUSED, DIFFER = 0, 1, 2, 3
#: An arrival: float64 when its sender stops waiting, int64 its sequence number, the
#: bytes of its words and of its record; then the digest of its call, its words, its
#: record.
_ARRIVAL_HEAD = 32
_DIGEST = 16
#: A verdict: int64 [status, the participant's sequence number, count, answer bytes,
#: NAMED ranks], then the answer.
_VERDICT_HEAD = (4 + NAMED) * 8
#: This process's meetings, numbered (a number travels with each arrival, and comes back
#: with its verdict).
_numbers = itertools.count(1)


class Words:
    """How a meeting's caller names its failures. The leader's words about the calls
    (:meth:`differ`) go to every rank that came; each rank raises its own error."""

    def __init__(self, what: str):
        #: The meeting, in words (``"new_group (waiting for the members [0, 1, 2])"``).
        self.what = what

    def missing(self, named: List[int], count: int, leader: Optional[int]) -> BaseException:
        """``count`` participants never came, ``named`` (positions) the first of them;
        ``leader`` is the leader's position when this rank heard it from the leader,
        ``None`` on the leader."""
        return DistTimeoutError(f"{self.what}: ranks {named} never came")

    def unanswered(self, leader: int, limit: Optional[float]) -> BaseException:
        """The leader (a position) sent no verdict within ``limit`` seconds and the grace."""
        return DistTimeoutError(f"{self.what}: rank {leader}, the first participant, did "
                                f"not answer within {limit} s")

    def differ(self, calls: List[Tuple[int, str]], absent: List[int]) -> str:
        """The leader's account (sent to all) of participants that came for different
        things: ``calls`` are (position, call in words), ``absent`` the positions
        expected that never came."""
        return "the ranks came for different calls: " + "; ".join(
            f"rank {p} came for {call}" for p, call in calls)

    def desync(self, text: str) -> BaseException:
        """The error each rank raises from the leader's account of the calls."""
        return DistDesyncError(f"{self.what}: {text}")

    def refused(self, text: str) -> BaseException:
        """The error each rank raises when the leader's judge refused the meeting."""
        return DistBackendError(text)


#: ``judge(records)``: the leader's answer (bytes) from every participant's record, in
#: the order of ``members``; raising refuses the meeting with the exception's text.
Judge = Any


class _Arrival(NamedTuple):
    gives_up: float
    number: int
    digest: bytes
    call: str
    record: np.ndarray


def meet(comm: Any, members: Sequence[int], call: str, limit: Optional[float],
         words: Words, *, record: Optional[np.ndarray] = None,
         judge: Optional[Judge] = None) -> bytes:
    """The meeting of ``members`` (positions in the mpi4py communicator ``comm``, this
    rank among them), led by the first, for ``call`` (what this rank came to do, in
    words, compared whole); returns the leader's answer (``b""`` without a ``judge``)
    once all have come for the same call within ``limit`` seconds (``None``: no limit).

    ``record`` (a uint8 array) goes to the leader; ``judge`` runs on the leader once all
    records are there. Raises ``words.missing(...)`` if some never came,
    ``words.desync(...)`` if some came for another call, ``words.refused(...)`` with the
    judge's words if it refused, ``words.unanswered(...)`` if the leader never answered.
    """
    members = [int(m) for m in members]
    mine = np.zeros(0, np.uint8) if record is None else np.ascontiguousarray(record, np.uint8)
    if len(members) < 2:
        return judge([mine]) if judge else b""
    from . import hidden  # (MPI itself: not at ``import hpccomm``)

    channel = hidden.of(comm)
    deadline = time.monotonic() + (limit if limit is not None else 1e12)
    me, leader = channel.rank, members[0]
    if me != leader:
        return _attend(channel, leader, call, mine, deadline, limit, words)
    return _lead(channel, members, call, mine, deadline, words, judge)


def _digest(call: str) -> bytes:
    return hashlib.blake2b(call.encode(), digest_size=_DIGEST).digest()


def _arrival(gives_up: float, number: int, call: str, record: np.ndarray) -> np.ndarray:
    text = call.encode()[:CALL_BYTES]
    head = np.zeros(4, dtype=np.int64)
    head.view(np.float64)[0] = gives_up
    head[1:] = number, len(text), record.size
    return np.concatenate([head.view(np.uint8), np.frombuffer(_digest(call), np.uint8),
                           np.frombuffer(text, np.uint8), record])


def _parse(data: np.ndarray) -> Optional[_Arrival]:
    """An arrival's parts, or ``None`` for bytes that are not one."""
    at = _ARRIVAL_HEAD + _DIGEST
    if data.size < at:
        return None
    head = data[:_ARRIVAL_HEAD].view(np.int64)
    texts, records = int(head[2]), int(head[3])
    if texts < 0 or records < 0 or data.size != at + texts + records:
        return None
    return _Arrival(float(head[:1].view(np.float64)[0]), int(head[1]),
                    bytes(data[_ARRIVAL_HEAD:at]),
                    bytes(data[at:at + texts]).decode(errors="replace"),
                    data[at + texts:])


def _attend(channel: Any, leader: int, call: str, record: np.ndarray,
            deadline: float, limit: Optional[float], words: Words) -> bytes:
    """A participant's side: the arrival to the leader, then its verdict."""
    number = next(_numbers)
    gives_up = deadline + VERDICT_GRACE_S  # the leader gives up at the same time: the
    #                                        grace is its way here
    sent = _arrival(time.time() + (gives_up - time.monotonic()), number, call, record)
    test, _, keep = channel.send(sent, leader, ARRIVE)
    found: List[np.ndarray] = []

    def answered() -> bool:
        while True:
            taken = channel.take(VERDICT, leader)
            if taken is None:
                return False
            verdict = taken[1]
            if verdict.size >= _VERDICT_HEAD and \
                    int(verdict[:_VERDICT_HEAD].view(np.int64)[1]) == number:
                found.append(verdict)
                return True
            # the verdict of an earlier meeting this rank gave up on: dropped
    poll(answered, max(gives_up - time.monotonic(), 0.0))
    if not found:
        answered()  # one last look: a verdict sent just before this rank gave up
    if not test():  # small arrivals leave at once; one that did not keeps its bytes
        abandon(test, keep)
    if not found:
        raise words.unanswered(leader, limit)
    return _outcome(found[0], words, leader)


def _lead(channel: Any, members: List[int], call: str, record: np.ndarray,
          deadline: float, words: Words, judge: Optional[Judge]) -> bytes:
    """The leader's side: the arrivals until every expected rank came, then the verdicts."""
    me = channel.rank
    digest = _digest(call)
    arrivals: Dict[int, _Arrival] = {}
    expected: Set[int] = set(members) - {me}
    ahead: List[Tuple[int, np.ndarray]] = []  # arrivals of ranks outside this call

    def fresh(now: float) -> Dict[int, _Arrival]:
        return {r: a for r, a in arrivals.items() if a.gives_up > now + FRESH_S}

    def consider(source: int, data: np.ndarray) -> None:
        came = _parse(data)
        if came is None or came.gives_up <= time.time() + FRESH_S:
            return  # from a meeting this rank came too late for: dropped
        if source in expected:
            arrivals[source] = came  # for this call, or for another: a mistake
        else:
            ahead.append((source, data))  # for a later meeting of this rank's, maybe

    kept, channel.kept = channel.kept, []
    for source, data in kept:  # arrivals taken by an earlier meeting, in their order
        consider(source, data)

    def complete() -> bool:
        while True:
            taken = channel.take(ARRIVE)
            if taken is None:
                break
            consider(*taken)
        return expected <= set(fresh(time.time()))
    try:
        poll(complete, max(deadline - time.monotonic(), 0.0))
        complete()  # the arrivals that came while this rank last looked
    finally:
        channel.kept.extend(ahead)
    came = fresh(time.time())
    order = members[1:]
    absent = [r for r in order if r not in came]
    head = np.zeros(4 + NAMED, dtype=np.int64)
    answer = b""
    if any(a.digest != digest for a in came.values()):
        calls = [(me, call)] + [(r, came[r].call) for r in order if r in came]
        answer = words.differ(calls, absent).encode()
        head[0] = DIFFER
    elif absent:
        head[0], head[2] = ABSENT, len(absent)
        named = absent[:NAMED]
        head[4:4 + len(named)] = named
    elif judge is not None:
        try:
            answer = bytes(judge([record] + [came[r].record for r in members[1:]]))
            if len(answer) > ANSWER_BYTES:
                raise ValueError(f"a meeting's answer takes at most {ANSWER_BYTES} bytes, "
                                 f"got {len(answer)}")
            head[0] = GO
        except Exception as exc:  # refused (or could not answer): everyone says why
            answer = str(exc).encode()
            head[0] = REFUSED
    answer = answer[:ANSWER_BYTES]
    head[3] = len(answer)
    verdict = np.concatenate([head.view(np.uint8), np.frombuffer(answer, np.uint8)])
    sends = []
    for rank, arrival in came.items():  # to every rank still waiting, its number echoed
        own = verdict.copy()
        own[8:16].view(np.int64)[0] = arrival.number
        sends.append(channel.send(own, rank, VERDICT))
    until = time.monotonic() + VERDICT_GRACE_S  # small verdicts leave at once
    poll(lambda: all(test() for test, _, _ in sends), until - time.monotonic())
    for test, _, keep in sends:
        if not test():
            abandon(test, keep)
    return _outcome(verdict, words, None)


def _outcome(verdict: np.ndarray, words: Words, leader: Optional[int]) -> bytes:
    head = verdict[:_VERDICT_HEAD].view(np.int64)
    status, count, length = int(head[0]), int(head[2]), int(head[3])
    answer = bytes(verdict[_VERDICT_HEAD:_VERDICT_HEAD + length])
    if status == ABSENT:
        raise words.missing([int(r) for r in head[4:4 + min(count, NAMED)]], count, leader)
    if status == DIFFER:
        raise words.desync(answer.decode(errors="replace"))
    if status == REFUSED:
        raise words.refused(answer.decode(errors="replace"))
    return answer
