"""Point-to-point messages: send/recv, isend/irecv, batch_isend_irecv, P2POp.

Peers are global ranks (``dst``/``src``) or group ranks (``group_dst``/``group_src``).
``recv`` with no source takes a message from any rank and returns the sender's global
rank. Tags are user tags in ``[0, MAX_USER_TAG]``; the tags above are reserved for
hpccomm's own messages (object transfer, monitored barrier), so they never mix.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

from . import _call
from .group import GroupLike, ProcessGroup, resolve
from .types import INTERNAL_TAG, MAX_USER_TAG  # noqa: F401  (INTERNAL_TAG: used by others)
from .work import Work


def _check_tag(pg: ProcessGroup, op: str, tag: int, internal: bool) -> None:
    if internal:
        return
    if not isinstance(tag, int) or isinstance(tag, bool) or not 0 <= tag <= MAX_USER_TAG:
        raise pg.error(op, f"tag {tag!r} must be an int in [0, {MAX_USER_TAG}]")


def _peer(pg: ProcessGroup, op: str, rank: Optional[int], group_rank: Optional[int],
          name: str) -> int:
    peer = _call.root(pg, op, rank, group_rank, name)
    if peer == pg.rank():
        raise pg.error(op, f"{name} is this rank itself ({pg.ranks[peer]}); a process cannot "
                           f"send to or receive from itself")
    return peer


def _start_send(tensor: Any, dst: Optional[int], group: GroupLike, tag: int,
                group_dst: Optional[int], op: str, async_op: bool,
                internal: bool = False) -> Optional[Work]:
    pg = resolve(group, op)
    _check_tag(pg, op, tag, internal)
    peer = _peer(pg, op, dst, group_dst, "dst")
    comm, arr = _call.array(pg, op, tensor, output=False)
    return _call.launch(pg, op, comm.send, (arr, peer, tag), arr, async_op, pg.ranks[peer])


def _start_recv(tensor: Any, src: Optional[int], group: GroupLike, tag: int,
                group_src: Optional[int], op: str, async_op: bool,
                internal: bool = False) -> "tuple[ProcessGroup, Any]":
    """``(group, Work)`` if ``async_op``, else ``(group, the sender's group rank)``."""
    pg = resolve(group, op)
    _check_tag(pg, op, tag, internal)
    peer = None
    if src is not None or group_src is not None:
        peer = _peer(pg, op, src, group_src, "src")
    comm, arr = _call.array(pg, op, tensor)
    if peer is None:  # the backend's finishing step reports the sender
        return pg, _call.launch(pg, op, comm.recv, (arr, None, tag), arr, async_op,
                                result=(tensor,))
    outcome = _call.launch(pg, op, comm.recv, (arr, peer, tag), arr, async_op, pg.ranks[peer],
                           result=(tensor,))
    if not async_op:
        return pg, peer
    if outcome._value is None:
        outcome._value = peer  # what source_rank() reports once the receive completes
    return pg, outcome


def send(tensor: Any, dst: Optional[int] = None, group: GroupLike = None, tag: int = 0,
         group_dst: Optional[int] = None) -> None:
    """Send ``tensor`` to ``dst`` and wait until the send buffer may be reused."""
    _start_send(tensor, dst, group, tag, group_dst, "send", False)


def isend(tensor: Any, dst: Optional[int] = None, group: GroupLike = None, tag: int = 0,
          group_dst: Optional[int] = None) -> Optional[Work]:
    """Start sending ``tensor`` to ``dst``; do not modify it before ``wait()``."""
    return _start_send(tensor, dst, group, tag, group_dst, "isend", True)


def recv(tensor: Any, src: Optional[int] = None, group: GroupLike = None, tag: int = 0,
         group_src: Optional[int] = None) -> int:
    """Receive into ``tensor`` from ``src`` (any rank if ``None``); return the sender.

    The sender is a global rank, or a group rank when ``group_src`` was given.
    """
    pg, source = _start_recv(tensor, src, group, tag, group_src, "recv", False)
    return source if group_src is not None else pg.ranks[source]


def irecv(tensor: Any, src: Optional[int] = None, group: GroupLike = None, tag: int = 0,
          group_src: Optional[int] = None) -> Optional[Work]:
    """Start receiving into ``tensor``; ``Work.source_rank()`` gives the sender's group rank."""
    return _start_recv(tensor, src, group, tag, group_src, "irecv", True)[1]


class P2POp:
    """One send or receive for :func:`batch_isend_irecv`: ``P2POp(isend, tensor, peer)``."""

    def __init__(self, op: Callable[..., Any], tensor: Any, peer: Optional[int] = None,
                 group: GroupLike = None, tag: int = 0, group_peer: Optional[int] = None):
        if op not in (isend, irecv, send, recv):
            raise ValueError("P2POp's op must be hpccomm.isend or hpccomm.irecv")
        if peer is None and group_peer is None:
            raise ValueError("P2POp needs a peer (global rank) or group_peer")
        self.op = isend if op in (isend, send) else irecv
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag
        self.group_peer = group_peer

    def __repr__(self) -> str:
        peer = self.peer if self.peer is not None else f"group_peer={self.group_peer}"
        return f"P2POp({self.op.__name__}, peer={peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: List[P2POp]) -> List[Work]:
    """Start all sends and receives at once (no ordering deadlock); return their Works."""
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list:
        raise ValueError("batch_isend_irecv needs a non-empty list of P2POp")
    for item in p2p_op_list:
        if not isinstance(item, P2POp):
            raise TypeError(f"batch_isend_irecv takes P2POp objects, got {type(item).__name__}")
    works: List[Work] = []
    batches: List[Any] = []
    for item in p2p_op_list:
        pg = resolve(item.group, "batch_isend_irecv")
        comm, _ = _call.array(pg, "batch_isend_irecv", item.tensor, output=item.op is irecv)
        if all(comm is not other for other in batches):
            batches.append(comm)
            comm.start_batch()
    try:
        for item in p2p_op_list:
            if item.op is isend:
                works.append(isend(item.tensor, item.peer, item.group, item.tag,
                                   item.group_peer))
            else:
                works.append(irecv(item.tensor, item.peer, item.group, item.tag,
                                   item.group_peer))
    finally:
        for comm in batches:
            comm.end_batch()
    return works
