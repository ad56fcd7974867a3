"""Point-to-point messages: send/recv, isend/irecv, batch_isend_irecv, P2POp.

Peers are global ranks (``dst``/``src``) or group ranks (``group_dst``/``group_src``).
``recv`` with no source takes a message from any rank and returns the sender's global
rank. Tags are user tags in ``[0, MAX_USER_TAG]``. hpccomm's own messages (object
transfer, monitored barrier) go on the group's channel (``pg.hidden``, a communicator of
their own) with the tags above, so they never mix with a user's.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

from . import _call
from .group import GroupLike, ProcessGroup, member_group, resolve, skip
from .types import MAX_USER_TAG
from .work import Work


def _check_tag(pg: ProcessGroup, op: str, tag: int, internal: bool) -> None:
    if internal:
        return
    if not isinstance(tag, int) or isinstance(tag, bool) or not 0 <= tag <= MAX_USER_TAG:
        raise pg.error(op, f"tag {tag!r} must be an int in [0, {MAX_USER_TAG}]")


def peer_rank(pg: ProcessGroup, op: str, rank: Optional[int], group_rank: Optional[int],
              name: str, blocking: bool) -> int:
    """The peer's group rank. Blocking calls may not name this rank itself (they would
    wait forever, and torch refuses them too); ``isend``/``irecv`` may."""
    peer = _call.root(pg, op, rank, group_rank, name)
    if blocking and peer == pg.rank():
        raise pg.error(op, f"{name} is this rank itself ({pg.ranks[peer]}); a blocking "
                           f"{op} cannot talk to itself (isend/irecv can)")
    return peer


def start_send(pg: ProcessGroup, tensor: Any, dst: Optional[int], tag: int,
               group_dst: Optional[int], op: str, async_op: bool,
               internal: bool = False) -> Optional[Work]:
    """Validate and start a send on ``pg`` (the Work if ``async_op``, else ``None``);
    ``internal``: a reserved tag (:class:`~hpccomm.types.Tag`) of hpccomm's own messages."""
    _check_tag(pg, op, tag, internal)
    peer = peer_rank(pg, op, dst, group_dst, "dst", not async_op)
    if internal:
        _, arr = _call.array(pg, op, tensor, output=False)
        return _call.launch(pg, op, pg.hidden.send, (arr, peer, tag), arr, async_op,
                            pg.ranks[peer])
    return _send_to(pg, tensor, peer, tag, op, async_op)


def _send_to(pg: ProcessGroup, tensor: Any, peer: int, tag: int, op: str,
             async_op: bool) -> Optional[Work]:
    """:func:`start_send` once ``peer`` (a group rank) and ``tag`` are checked: a
    blocking send in the backend's direct form where it takes it."""
    if not async_op and _call.transfer(pg, op, False, tensor, pg.ranks[peer], tag):
        return None
    comm, arr = _call.array(pg, op, tensor, output=False)
    return _call.launch(pg, op, comm.send, (arr, peer, tag), arr, async_op, pg.ranks[peer])


def start_recv(pg: ProcessGroup, tensor: Any, src: Optional[int], tag: int,
               group_src: Optional[int], op: str, async_op: bool,
               internal: bool = False) -> Any:
    """Validate and start a receive on ``pg``: the Work if ``async_op``, else the
    sender's group rank; ``internal`` as for :func:`start_send`."""
    _check_tag(pg, op, tag, internal)
    if internal:  # hpccomm's own: on the group's channel
        _, arr = _call.array(pg, op, tensor)
        peer = None if src is None and group_src is None else \
            peer_rank(pg, op, src, group_src, "src", not async_op)
        outcome = _call.launch(pg, op, pg.hidden.recv, (arr, peer, tag), arr, async_op,
                               None if peer is None else pg.ranks[peer], result=(tensor,))
        return outcome if async_op or peer is None else peer
    if src is not None or group_src is not None:
        return _recv_from(pg, tensor, peer_rank(pg, op, src, group_src, "src", not async_op),
                          tag, op, async_op)
    comm, arr = _call.array(pg, op, tensor)
    # from any rank: the backend's finishing step reports the sender
    return _call.launch(pg, op, comm.recv, (arr, None, tag), arr, async_op, result=(tensor,))


def _recv_from(pg: ProcessGroup, tensor: Any, peer: int, tag: int, op: str,
               async_op: bool) -> Any:
    """:func:`start_recv` from a checked ``peer`` (a group rank) with a checked ``tag``:
    a blocking receive in the backend's direct form where it takes it."""
    if not async_op and _call.transfer(pg, op, True, tensor, pg.ranks[peer], tag):
        return peer
    comm, arr = _call.array(pg, op, tensor)
    outcome = _call.launch(pg, op, comm.recv, (arr, peer, tag), arr, async_op, pg.ranks[peer],
                           result=(tensor,))
    if not async_op:
        return peer
    if outcome.value is None:
        outcome.value = peer  # what source_rank() reports once the receive completes
    return outcome


def send(tensor: Any, dst: Optional[int] = None, group: GroupLike = None, tag: int = 0,
         group_dst: Optional[int] = None) -> None:
    """Send ``tensor`` to ``dst`` and wait until the send buffer may be reused."""
    # the common case in one call: each Python call costs tens of ns on top of a
    # message's microsecond
    if group_dst is None and _call.transfer(group, "send", False, tensor, dst, tag):
        return None
    rooted = _call.rooted(group, "send", dst, group_dst, "dst", True)
    if rooted is None:
        return None
    pg, peer = rooted
    if type(tag) is int and 0 <= tag <= MAX_USER_TAG and peer != pg.rank():
        _send_to(pg, tensor, peer, tag, "send", False)
    else:  # raises what is wrong
        start_send(pg, tensor, dst, tag, group_dst, "send", False)


def isend(tensor: Any, dst: Optional[int] = None, group: GroupLike = None, tag: int = 0,
          group_dst: Optional[int] = None) -> Optional[Work]:
    """Start sending ``tensor`` to ``dst``; do not modify it before ``wait()``."""
    pg = _call.member(group, "isend", dst, group_dst, "dst", required=True)
    if pg is None:
        return None
    return start_send(pg, tensor, dst, tag, group_dst, "isend", True)


def recv(tensor: Any, src: Optional[int] = None, group: GroupLike = None, tag: int = 0,
         group_src: Optional[int] = None) -> int:
    """Receive into ``tensor`` from ``src`` (any rank if ``None``); return the sender's
    global rank (also when ``group_src`` named it, as torch does); -1 on a rank outside
    ``group``.
    """
    if group_src is None and _call.transfer(group, "recv", True, tensor, src, tag):
        return src  # as in send()
    if src is not None or group_src is not None:
        rooted = _call.rooted(group, "recv", src, group_src, "src")
        if rooted is None:
            return -1
        pg, peer = rooted
        if type(tag) is int and 0 <= tag <= MAX_USER_TAG and peer != pg.rank():
            return pg.ranks[_recv_from(pg, tensor, peer, tag, "recv", False)]
        return pg.ranks[start_recv(pg, tensor, src, tag, group_src, "recv", False)]
    pg = _call.member(group, "recv", src, group_src, "src")
    if pg is None:
        return -1
    return pg.ranks[start_recv(pg, tensor, src, tag, group_src, "recv", False)]


def irecv(tensor: Any, src: Optional[int] = None, group: GroupLike = None, tag: int = 0,
          group_src: Optional[int] = None) -> Optional[Work]:
    """Start receiving into ``tensor``; ``Work.source_rank()`` gives the sender's group rank."""
    pg = _call.member(group, "irecv", src, group_src, "src")
    if pg is None:
        return None
    return start_recv(pg, tensor, src, tag, group_src, "irecv", True)


class P2POp:
    """One send or receive for :func:`batch_isend_irecv`: ``P2POp(isend, tensor, peer)``.

    As in torch, ``group`` defaults to the default group, and ``peer`` (global rank) and
    ``group_peer`` (group rank) are both filled in from whichever was given.
    """

    def __init__(self, op: Callable[..., Any], tensor: Any, peer: Optional[int] = None,
                 group: GroupLike = None, tag: int = 0, group_peer: Optional[int] = None):
        if op is not isend and op is not irecv:
            raise ValueError("Invalid ``op``: P2POp's op must be hpccomm.isend or "
                             "hpccomm.irecv")
        if peer is not None and group_peer is not None:
            raise ValueError("P2POp: give peer (a global rank) or group_peer, not both")
        if peer is None and group_peer is None:
            raise ValueError("P2POp needs a peer (global rank) or group_peer")
        self.op = op
        self.tensor = tensor
        self.group = resolve(None, "P2POp") if group is None else group
        self.tag = tag
        pg = member_group(self.group, "P2POp")
        if pg is not None:  # on a non-member, keep what was given (nothing will be sent)
            group_peer = _call.root(pg, "P2POp", peer, group_peer, "peer")
            peer = pg.ranks[group_peer]
        self.peer = peer
        self.group_peer = group_peer

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: List[P2POp]) -> List[Work]:
    """Start all sends and receives at once (no ordering deadlock); return their Works.

    All operations use one group, as torch requires; on a rank outside it the list is
    empty (nothing is sent).
    """
    if not isinstance(p2p_op_list, list) or not all(isinstance(item, P2POp)
                                                    for item in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``: batch_isend_irecv takes a list of P2POp")
    if not p2p_op_list:
        raise ValueError("batch_isend_irecv needs a non-empty list of P2POp")
    group = p2p_op_list[0].group
    if any(item.group != group for item in p2p_op_list):
        raise ValueError("batch_isend_irecv: all ops need to use the same group")
    pg = member_group(group, "batch_isend_irecv")
    if pg is None:
        for item in p2p_op_list:
            skip(item.op.__name__)
        return []
    works: List[Work] = []
    batches: List[Any] = []
    for item in p2p_op_list:
        comm, _ = _call.array(pg, "batch_isend_irecv", item.tensor, output=item.op is irecv)
        if all(comm is not other for other in batches):
            batches.append(comm)
            comm.start_batch()
    try:
        for item in p2p_op_list:
            if item.op is isend:
                works.append(start_send(pg, item.tensor, None, item.tag, item.group_peer,
                                        "isend", True))
            else:
                works.append(start_recv(pg, item.tensor, None, item.tag, item.group_peer,
                                        "irecv", True))
    finally:
        for comm in batches:
            comm.end_batch()
    return works
