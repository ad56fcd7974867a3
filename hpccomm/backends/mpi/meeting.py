"""Meetings under a deadline on an MPI communicator, before calls that cannot time out.

MPI's communicator constructors (``MPI_Comm_create_group``, ``MPI_Comm_split``,
``MPI_Cart_create``) and NCCL's blocking communicator creation wait until every
participant calls them, with no deadline. So the participants first meet, under the
group's timeout; once all have met, the blocking call has no rank left to wait for. A
rank that never comes turns into an error on every rank that came, naming the ranks
that did not, instead of a silent hang.

A meeting is point-to-point on a pair of tags reserved for its kind (:data:`RENDEZVOUS`,
:data:`NCCL_CREATION`), never a collective of the communicator: a collective could pair
with a user's collective on the same communicator (a ``barrier`` that one rank calls
while another makes a DeviceMesh group), and both would go on with wrong partners.

The first participant, the leader, receives from each other participant its record (a
one-byte token, or a fixed-size record such as the GPU it uses). Once all have come, the
leader may judge the records (:func:`meet`'s ``judge``) and answer with a few bytes (an
NCCL unique id) or refuse with a message. Then it sends each participant its verdict:
go on with the answer, the refusal (every participant raises the same
:class:`~hpccomm.errors.DistBackendError`), or the ranks that never came (every
participant raises the error ``missing`` makes, in its caller's words). Messages per
meeting: two per participant, all through the leader; bytes per rank: its record and
one verdict. Each record carries the time its sender stops waiting: a leader that comes
after some gave up does not count their arrivals (left from the meeting it missed), so
it never goes on into the blocking call alone.
"""
from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import DistBackendError
from ...types import Tag
from ...work import Work, poll

#: (arrive tag, verdict tag) of the meetings before MPI's communicator constructors.
RENDEZVOUS = (int(Tag.RENDEZVOUS_ARRIVE), int(Tag.RENDEZVOUS_RELEASE))
#: (arrive tag, verdict tag) of the meetings before NCCL communicator creation.
NCCL_CREATION = (int(Tag.NCCL_DEVICE_CHECK), int(Tag.NCCL_CREATION_RELEASE))
#: Seconds a participant waits for the leader's verdict past the meeting's deadline
#: (the leader gives up at the deadline too, then sends it).
VERDICT_GRACE_S = 1.0
#: Seconds a participant must still be waiting, by its own clock's word, for its arrival
#: to count: the arrival of one that gave up (it came to an earlier meeting that this
#: rank, the leader, came too late for) is not counted, so a late leader never goes on
#: into the blocking call alone. (Clocks of a cluster's nodes agree to far better.)
FRESH_S = 0.25
#: Bytes before each arrival's record: when its sender stops waiting (wall clock, float64).
_STAMP = 8
#: Ranks a verdict names at most (the count is always there).
NAMED = 64
#: Bytes of the leader's answer or refusal at most (a refusal's text is cut there).
ANSWER_BYTES = 4096
#: The verdict: int64 [status, count or length, NAMED ranks], then ANSWER_BYTES bytes.
_HEADER = 2 + NAMED
_VERDICT_BYTES = _HEADER * 8 + ANSWER_BYTES
GO, ABSENT, REFUSED = 0, 1, 2
#: The receives a failed meeting left posted for the ranks that never came, with their
#: buffers: MPI may still write into them (when a late rank sends its record).
_abandoned: List[Any] = []

#: ``missing(named, count, leader)``: the error of a meeting that ``count`` participants
#: never came to, ``named`` (positions in the communicator) the first of them; ``leader``
#: the leader's position when this rank heard it from the leader, ``None`` on the leader.
Missing = Callable[[List[int], int, Optional[int]], BaseException]
#: ``dress(work, peer)``: names one wait of the meeting (its Work's ``op``, ``group``...)
#: for the error a wait that runs out of time raises.
Dress = Callable[[Work, int], None]
#: ``judge(records)``: the leader's answer (bytes) from every participant's record, in
#: the order of ``members``; raising refuses the meeting with the exception's text.
Judge = Callable[[List[np.ndarray]], bytes]


def _wait(request: Any, keep: Any, what: str, deadline: float, peer: int,
          dress: Optional[Dress]) -> None:
    work = Work(request.Test, None, keep)
    work.op, work.peer = what, peer
    if dress is not None:
        dress(work, peer)
    work.timeout = max(deadline - time.monotonic(), 1e-3)
    work.wait()


def meet(comm: Any, members: Sequence[int], tags: Tuple[int, int], what: str,
         limit: Optional[float], missing: Missing, *, record: Optional[np.ndarray] = None,
         judge: Optional[Judge] = None, dress: Optional[Dress] = None) -> bytes:
    """The meeting of ``members`` (positions in the mpi4py communicator ``comm``, this
    rank among them), led by the first; returns the leader's answer (``b""`` without a
    ``judge``) once all have come within ``limit`` seconds (``None``: no limit).

    ``record`` (a uint8 array, the same size on every participant) goes to the leader;
    ``judge`` runs on the leader once all records are there. ``what`` names the meeting
    in the errors of its waits. Raises ``missing(...)`` if some never came, a
    :class:`~hpccomm.errors.DistBackendError` with the judge's words if it refused.
    """
    members = [int(m) for m in members]
    if len(members) < 2:
        return judge([record if record is not None else _token()]) if judge else b""
    arrive, release = tags
    mine = _token() if record is None else np.ascontiguousarray(record, dtype=np.uint8)
    deadline = time.monotonic() + (limit if limit is not None else 1e12)
    me, leader = comm.Get_rank(), members[0]
    if me != leader:  # the record goes with the time this rank stops waiting for a verdict
        gives_up = deadline + VERDICT_GRACE_S
        sent = np.empty(_STAMP + mine.size, dtype=np.uint8)
        sent[:_STAMP].view(np.float64)[0] = time.time() + (gives_up - time.monotonic())
        sent[_STAMP:] = mine
        _wait(comm.Isend(sent, dest=leader, tag=arrive), sent, what, deadline, leader, dress)
        verdict = np.zeros(_VERDICT_BYTES, dtype=np.uint8)  # the leader gives up at the
        _wait(comm.Irecv(verdict, source=leader, tag=release), verdict, what,  # same time:
              gives_up, leader, dress)                               # the grace is its way
        return _outcome(verdict, missing, leader)
    others = members[1:]
    records = [np.empty(_STAMP + mine.size, dtype=np.uint8) for _ in others]
    requests = [comm.Irecv(buf, source=m, tag=arrive) for m, buf in zip(others, records)]
    arrived = [False] * len(others)

    def all_arrived() -> bool:
        done = True
        for i, request in enumerate(requests):
            if not arrived[i]:
                arrived[i] = bool(request.Test())
                done = done and arrived[i]
        return done
    while True:
        poll(all_arrived, max(deadline - time.monotonic(), 0.0))
        # an arrival whose sender has stopped waiting (it came to a meeting this rank
        # missed, or is about to leave) does not count: its receive is posted afresh
        now = time.time()
        stale = [i for i, came in enumerate(arrived)
                 if came and records[i][:_STAMP].view(np.float64)[0] < now + FRESH_S]
        for i in stale:
            arrived[i] = False
            records[i] = np.empty_like(records[i])
            requests[i] = comm.Irecv(records[i], source=others[i], tag=arrive)
        if not stale or time.monotonic() >= deadline:
            break
    absent = [m for m, came in zip(others, arrived) if not came]
    verdict = np.zeros(_VERDICT_BYTES, dtype=np.uint8)
    header = verdict[:_HEADER * 8].view(np.int64)
    if absent:
        header[0], header[1] = ABSENT, len(absent)
        named = absent[:NAMED]
        header[2:2 + len(named)] = named
    elif judge is not None:
        try:
            answer = bytes(judge([mine] + [r[_STAMP:] for r in records]))
            header[0] = GO
        except Exception as exc:  # refused (or could not answer): everyone says why
            answer = str(exc).encode()[:ANSWER_BYTES]
            header[0] = REFUSED
        if len(answer) > ANSWER_BYTES:
            raise ValueError(f"a meeting's answer takes at most {ANSWER_BYTES} bytes, "
                             f"got {len(answer)}")
        header[1] = len(answer)
        verdict[_HEADER * 8:_HEADER * 8 + len(answer)] = np.frombuffer(answer, np.uint8)
    # the verdict goes to those who came; the receives of the others stay posted
    for member, came in zip(others, arrived):
        if came:
            _wait(comm.Isend(verdict, dest=member, tag=release), verdict, what,
                  max(deadline, time.monotonic() + 1.0), member, dress)
    if absent:
        _abandoned.extend((request, buf) for request, buf, came
                          in zip(requests, records, arrived) if not came)
    return _outcome(verdict, missing, None)


def _token() -> np.ndarray:
    return np.zeros(1, dtype=np.uint8)


def _outcome(verdict: np.ndarray, missing: Missing, leader: Optional[int]) -> bytes:
    header = verdict[:_HEADER * 8].view(np.int64)
    status, count = int(header[0]), int(header[1])
    if status == ABSENT:
        raise missing([int(r) for r in header[2:2 + min(count, NAMED)]], count, leader)
    answer = bytes(verdict[_HEADER * 8:_HEADER * 8 + count])
    if status == REFUSED:
        raise DistBackendError(answer.decode(errors="replace"))
    return answer
