"""hpccomm's own point-to-point messages of a group, on a communicator of their own.

Besides the operations a user asks for, hpccomm sends messages of its own between the
ranks of a group: the meetings before communicator constructors (:mod:`.meeting`), the
roll call after a timeout, ``monitored_barrier``'s acknowledgements and verdicts, the
sizes and payloads of ``send_object_list``. On the group's own communicator they would
share MPI's matching with the user's messages, kept apart only by reserved tags, and a
message left unread after a failure could meet a later one. So each group has a
:class:`Channel`: a duplicate of its communicator (``MPI_Comm_idup``, made once, when the
group is made, under its timeout), on which only hpccomm sends, with the tags of
:class:`~hpccomm.types.Tag`. No user message, whatever its tag, can match a message of
the channel, and the channel is freed with its group.

:func:`of` finds the channel of a group's communicator for a backend that only knows the
communicator (the NCCL backend's meeting). A communicator no group made (one a test
hands in) has no duplicate: its channel is the communicator itself, on the reserved
tags, as before.

A receive from any source that the channel's owner may give up (the roll call, the
meeting's leader) is a matched probe (:meth:`Channel.take`): nothing stays posted when
the wait ends, so no later receive can lose its message to it.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from ...work import Started
from .anysource import AnySourceQueue
from .gate import dup_within

_ANY_SOURCE = MPI.ANY_SOURCE
#: Channels by the handle of the communicator they serve (:func:`of`).
_channels: Dict[int, "Channel"] = {}


class Channel:
    """The messages hpccomm sends for itself among the ranks of ``parent`` (an mpi4py
    communicator), on ``comm``: a duplicate it owns, or ``parent`` itself."""

    def __init__(self, parent: Any, comm: Any, owned: bool):
        self.parent = parent
        self.comm = comm
        self.owned = owned
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._any_source = AnySourceQueue(comm)
        #: Messages taken (:meth:`take`) before their time, for a later exchange of this
        #: rank to use, as ``(sender, bytes)`` in the order they came (a meeting's
        #: arrival from a rank that is ahead: :mod:`.meeting`).
        self.kept: List[Tuple[int, np.ndarray]] = []

    # -- the operations' form: (test, finish, keep), for Work and _call.launch ----------
    def send(self, buf: np.ndarray, dst: int, tag: int) -> Started:
        """Send ``buf`` (a contiguous array, sent as bytes) to ``dst``."""
        spec = [buf, MPI.BYTE]
        return self.comm.Isend(spec, dst, int(tag)).Test, None, spec

    def recv(self, buf: np.ndarray, src: Optional[int], tag: int) -> Started:
        """Receive into ``buf`` from ``src``, or from any source (``None``; its finishing
        step gives the sender's rank)."""
        spec = [buf, MPI.BYTE]
        if src is not None:
            return self.comm.Irecv(spec, src, int(tag)).Test, None, spec
        receive = self._any_source.post(spec, int(tag))
        return receive, receive.get_source, buf

    # -- messages taken whole, leaving nothing posted -----------------------------------
    def take(self, tag: int, source: Optional[int] = None) -> Optional[Tuple[int, np.ndarray]]:
        """The next message with ``tag`` from ``source`` (``None``: any) that has arrived,
        as ``(sender, bytes)``, or ``None`` if none has: a matched probe, then the
        receive of that very message, whatever its size. Nothing stays posted. (Its
        status is its own: the progress thread's roll call and the caller's meeting may
        take from one channel at once.)"""
        status = MPI.Status()
        message = self.comm.Improbe(_ANY_SOURCE if source is None else source, int(tag),
                                    status)
        if message is None:
            return None
        data = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
        message.Recv([data, MPI.BYTE])  # matched: it has arrived, it completes at once
        return status.Get_source(), data

    def free(self) -> None:
        """Forget the channel, and free its duplicate (once operations on it are over:
        :func:`~.plumbing.free`)."""
        if _channels.get(_handle(self.parent)) is self:
            del _channels[_handle(self.parent)]
        if self.owned:
            from .plumbing import free

            free(self.comm)
        self.comm = None


def attach(parent: Any, timeout: Optional[float], what: str) -> Channel:
    """A channel of its own for ``parent``'s ranks: ``parent`` duplicated under
    ``timeout`` (collective over ``parent``: every rank calls it when the group is made;
    ``what`` names that creation if a rank never comes). A communicator of one rank
    needs none: its channel is itself."""
    if parent.Get_size() == 1:
        channel = Channel(parent, parent, owned=False)
    else:
        channel = Channel(parent, dup_within(parent, timeout, what), owned=True)
    _channels[_handle(parent)] = channel
    return channel


def of(parent: Any) -> Channel:
    """The channel of ``parent`` (:func:`attach`), or, for a communicator no group made,
    ``parent`` itself on hpccomm's reserved tags."""
    found = _channels.get(_handle(parent))
    return found if found is not None else Channel(parent, parent, owned=False)


def _handle(comm: Any) -> int:
    return MPI._handleof(comm)
