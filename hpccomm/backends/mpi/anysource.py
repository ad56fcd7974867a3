"""Receives from any source, matched by probing instead of a posted wildcard receive.

``recv(src=None)`` could post ``MPI_Irecv(MPI_ANY_SOURCE)`` and test it. With MPICH
across nodes (its shared-memory and network paths both able to deliver the message),
such a receive, tested while another thread probes another communicator with
``MPI_ANY_SOURCE`` (hpccomm's MPI store server on rank 0 does), was never completed in
about half of the runs of a 4-rank, 2-node job, although the message had been sent;
raw mpi4py reproduces it. A matched probe (``MPI_Improbe``) followed by a receive of
the very message it found never hung there, so every receive from any source takes
that way, on every MPI library.

MPI matches posted receives in the order they were posted; this queue keeps that order
among the receives from any source of one communicator and tag: only the oldest
unmatched one probes, and a test of a younger one first advances the older ones.
(A receive from a named source posted meanwhile is not ordered against them: MPI would
give a message from that source to the older wildcard receive.)
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Deque, Dict, Optional

from mpi4py import MPI

from ...errors import DistBackendError

_ANY_SOURCE = MPI.ANY_SOURCE
_COMM_NULL = MPI.COMM_NULL


class Receive:
    """One receive from any source: a callable test (``True`` once received); its
    ``source`` is the sender's rank once matched."""

    __slots__ = ("queue", "buf", "tag", "request", "source")

    def __init__(self, queue: "AnySourceQueue", buf: Any, tag: int):
        self.queue, self.buf, self.tag = queue, buf, tag
        self.request: Optional[Any] = None
        self.source = -1

    def __call__(self) -> bool:
        if self.request is None:
            self.queue.advance(self.tag)
            if self.request is None:
                return False
        return self.request.Test()

    def get_source(self) -> int:
        return self.source


class AnySourceQueue:
    """The pending receives from any source of one communicator, oldest first per tag."""

    def __init__(self, comm: Any):
        self.comm = comm
        self.pending: Dict[int, Deque[Receive]] = {}
        self.lock = threading.Lock()  # the torch progress thread may test them too
        self.status = MPI.Status()

    def post(self, buf: Any, tag: int) -> Receive:
        """A new receive of ``buf`` (a buffer spec) with ``tag`` from any source."""
        receive = Receive(self, buf, tag)
        with self.lock:
            self.pending.setdefault(tag, collections.deque()).append(receive)
        self.advance(tag)
        return receive

    def advance(self, tag: int) -> None:
        """Match the oldest pending receives of ``tag`` with the messages that arrived."""
        with self.lock:
            waiting = self.pending.get(tag)
            status = self.status
            while waiting:
                if self.comm == _COMM_NULL:  # freed (its group destroyed): no match ever
                    raise DistBackendError(
                        f"a receive from any source with tag {tag} was still unmatched "
                        f"when its communicator was freed (its group was destroyed)")
                message = self.comm.Improbe(_ANY_SOURCE, tag, status)
                if message is None:
                    return
                receive = waiting.popleft()
                receive.source = status.Get_source()
                receive.request = message.Irecv(receive.buf)
