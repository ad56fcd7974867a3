"""Collectives and point-to-point transfers of picklable Python objects.

Objects are pickled to bytes and moved over the group's CPU (MPI) communicator,
whatever ``device`` says: first the byte counts, then the bytes. ``broadcast_object_list``
and ``all_gather_object`` send each rank's count in a fixed slot of :data:`SLOT` bytes
that also carries the pickle when it fits, so small objects (the usual metadata) take one
collective instead of two. Every step is an ordinary hpccomm operation, so timeouts and
error messages apply as for arrays. As in torch, unpickling runs code chosen by the
sender: only exchange objects with processes you trust (your own job's ranks), or turn
on weights-only unpickling (:mod:`.unpickling`: an allowlist of types).

A rank outside ``group`` returns at once, as in torch (``recv_object_list`` returns -1).
"""
from __future__ import annotations

import pickle
from typing import Any, List, Optional

import numpy as np

from . import _call, p2p, unpickling
from .group import GroupLike, ProcessGroup
from .types import Tag
from .unpickling import (add_safe_globals, clear_safe_globals, get_safe_globals,  # noqa: F401
                         safe_globals, set_weights_only, weights_only)

_HEADER_TAG = Tag.OBJECT_HEADER
_PAYLOAD_TAG = Tag.OBJECT_PAYLOAD

#: Bytes per rank in the first round: an int64 byte count, then the pickle if it fits.
SLOT = 256
_INLINE = SLOT - 8


def _pickle(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _dumps(obj: Any) -> np.ndarray:
    return np.frombuffer(_pickle(obj), np.uint8)


def _loads(payload: Any, pg: ProcessGroup, op: str) -> Any:
    """The object pickled in ``payload`` (bytes or a uint8 array), by the unpickling rules."""
    data = payload if isinstance(payload, bytes) else payload.tobytes()
    return unpickling.loads(data, lambda: f"hpccomm.{op} on rank {pg.rank()}/{pg.size()} "
                                          f"of group '{pg.group_name}'")


def _run(pg: ProcessGroup, op: str, start: Any, args: tuple, arr: Any) -> None:
    _call.launch(pg, op, start, args, arr, False)


def _slot(data: Optional[bytes]) -> np.ndarray:
    """A first-round slot: the byte count (int64, little-endian), then the pickle if it
    fits. ``None`` (a receiving rank) gives an empty, writable slot."""
    if data is None:
        return np.zeros(SLOT, np.uint8)
    inline = data if len(data) <= _INLINE else b""
    return np.frombuffer(len(data).to_bytes(8, "little") + inline +
                         bytes(_INLINE - len(inline)), np.uint8)


def _unslot(raw: bytes, pg: ProcessGroup, op: str, offset: int = 0
            ) -> "tuple[int, Optional[Any]]":
    """``(byte count, object)`` of the slot at ``offset``; the object is ``None`` when the
    pickle did not fit (it comes in a second round)."""
    size = int.from_bytes(raw[offset:offset + 8], "little")
    if size > _INLINE:
        return size, None
    return size, _loads(raw[offset + 8:offset + 8 + size], pg, op)


def _blocks(payload: np.ndarray, sizes: Any, pg: ProcessGroup, op: str) -> List[Any]:
    objects, offset = [], 0
    for size in list(sizes):
        objects.append(_loads(payload[offset:offset + size], pg, op))
        offset += size
    return objects


def broadcast_object_list(object_list: List[Any], src: Optional[int] = None,
                          group: GroupLike = None, device: Any = None,
                          group_src: Optional[int] = None) -> None:
    """Replace ``object_list``'s entries on every rank with those of rank ``src``
    (global rank 0 when neither ``src`` nor ``group_src`` is given, as in torch)."""
    op = "broadcast_object_list"
    rooted = _call.rooted(group, op, src, group_src, "src", default=0)
    if rooted is None:
        return None
    pg, root = rooted
    at_root = pg.rank() == root
    if not isinstance(object_list, list):
        raise pg.error(op, f"object_list must be a list, got {type(object_list).__name__}")
    data = _pickle(list(object_list)) if at_root else None
    slot = _slot(data)
    _run(pg, op, pg.cpu.broadcast, (slot, root), slot)
    if at_root:
        if len(data) > _INLINE:  # too big for the slot: a second broadcast with it all
            payload = np.frombuffer(data, np.uint8)
            _run(pg, op, pg.cpu.broadcast, (payload, root), payload)
        return
    size, received = _unslot(slot.tobytes(), pg, op)
    if size > _INLINE:
        payload = np.empty(size, np.uint8)
        _run(pg, op, pg.cpu.broadcast, (payload, root), payload)
        received = _loads(payload, pg, op)
    if len(received) != len(object_list):
        raise pg.error(op, f"object_list has {len(object_list)} entries here but "
                           f"{len(received)} on the source rank")
    object_list[:] = received


def all_gather_object(object_list: List[Any], obj: Any, group: GroupLike = None) -> None:
    """Fill ``object_list[i]`` with rank ``i``'s ``obj``, on every rank."""
    op = "all_gather_object"
    pg = _call.member(group, op)
    if pg is None:
        return None
    _call.count_list(pg, op, object_list, "object_list")
    data = _pickle(obj)
    mine = _slot(data)
    slots = np.empty(pg.size() * SLOT, np.uint8)
    _run(pg, op, pg.cpu.all_gather, (mine, slots, None), mine)
    raw = slots.tobytes()
    found = [_unslot(raw, pg, op, offset) for offset in range(0, len(raw), SLOT)]
    sizes = [size for size, _ in found]
    if max(sizes) <= _INLINE:  # every pickle came in its slot
        object_list[:] = [item for _, item in found]
        return
    gathered = np.empty(sum(sizes), np.uint8)
    payload = np.frombuffer(data, np.uint8)
    _run(pg, op, pg.cpu.all_gather, (payload, gathered, sizes), payload)
    object_list[:] = _blocks(gathered, sizes, pg, op)


def gather_object(obj: Any, object_gather_list: Optional[List[Any]] = None,
                  dst: Optional[int] = None, group: GroupLike = None,
                  group_dst: Optional[int] = None) -> None:
    """Fill ``object_gather_list[i]`` on rank ``dst`` with rank ``i``'s ``obj`` (global
    rank 0 when neither ``dst`` nor ``group_dst`` is given, as in torch)."""
    op = "gather_object"
    rooted = _call.rooted(group, op, dst, group_dst, "dst", default=0)
    if rooted is None:
        return None
    pg, root = rooted
    at_root = pg.rank() == root
    if at_root:
        if object_gather_list is None:
            raise pg.error(op, "object_gather_list is required on the destination rank")
        _call.count_list(pg, op, object_gather_list, "object_gather_list")
    elif object_gather_list:
        raise pg.error(op, "object_gather_list must be None on ranks other than dst")
    payload = _dumps(obj)
    mine = np.array([payload.size], dtype=np.int64)
    sizes = np.empty(pg.size(), dtype=np.int64) if at_root else None
    _run(pg, op, pg.cpu.gather, (mine, sizes, root, None), mine)
    gathered = np.empty(int(sizes.sum()), dtype=np.uint8) if at_root else None
    counts = sizes.tolist() if at_root else []
    _run(pg, op, pg.cpu.gather, (payload, gathered, root, counts), payload)
    if at_root:
        object_gather_list[:] = _blocks(gathered, sizes, pg, op)


def scatter_object_list(scatter_object_output_list: List[Any],
                        scatter_object_input_list: Optional[List[Any]] = None,
                        src: Optional[int] = None, group: GroupLike = None,
                        group_src: Optional[int] = None) -> None:
    """Put entry ``i`` of rank ``src``'s input list into ``output_list[0]`` on rank ``i``
    (global rank 0 when neither ``src`` nor ``group_src`` is given, as in torch)."""
    op = "scatter_object_list"
    rooted = _call.rooted(group, op, src, group_src, "src", default=0)
    if rooted is None:
        return None
    pg, root = rooted
    at_root = pg.rank() == root
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise pg.error(op, "scatter_object_output_list must be a list with at least one entry")
    sizes = payload = None
    if at_root:
        if scatter_object_input_list is None:
            raise pg.error(op, "scatter_object_input_list is required on the source rank")
        items = _call.count_list(pg, op, scatter_object_input_list, "scatter_object_input_list")
        pieces = [_dumps(item) for item in items]
        sizes = np.array([piece.size for piece in pieces], dtype=np.int64)
        payload = np.concatenate(pieces) if pieces else np.empty(0, np.uint8)
    size = np.zeros(1, dtype=np.int64)
    _run(pg, op, pg.cpu.scatter, (sizes, size, root, None), size)
    received = np.empty(int(size[0]), dtype=np.uint8)
    counts = sizes.tolist() if at_root else []
    _run(pg, op, pg.cpu.scatter, (payload, received, root, counts), received)
    scatter_object_output_list[0] = _loads(received, pg, op)


def send_object_list(object_list: List[Any], dst: Optional[int] = None, group: GroupLike = None,
                     device: Any = None, group_dst: Optional[int] = None,
                     use_batch: bool = False) -> None:
    """Send the objects of ``object_list`` to ``dst`` (received by ``recv_object_list``)."""
    op = "send_object_list"
    pg = _call.member(group, op, dst, group_dst, "dst", required=True)
    if pg is None:
        return None
    peer = p2p.peer_rank(pg, op, dst, group_dst, "dst", True)
    payload = _dumps(list(object_list))
    header = np.array([payload.size, len(object_list)], dtype=np.int64)
    first = p2p.start_send(pg, header, None, _HEADER_TAG, peer, op, True, internal=True)
    p2p.start_send(pg, payload, None, _PAYLOAD_TAG, peer, op, False, internal=True)
    first.wait()


def recv_object_list(object_list: List[Any], src: Optional[int] = None, group: GroupLike = None,
                     device: Any = None, group_src: Optional[int] = None,
                     use_batch: bool = False) -> int:
    """Fill ``object_list`` with objects sent by ``send_object_list``; return the sender's
    global rank (-1 on a rank outside ``group``), as torch does.

    With no source, the first sender wins and the payload is then taken from that rank.
    """
    op = "recv_object_list"
    pg = _call.member(group, op, src, group_src, "src")
    if pg is None:
        return -1
    header = np.zeros(2, dtype=np.int64)
    source = p2p.start_recv(pg, header, src, _HEADER_TAG, group_src, op, False, internal=True)
    payload = np.empty(int(header[0]), dtype=np.uint8)
    p2p.start_recv(pg, payload, None, _PAYLOAD_TAG, source, op, False, internal=True)
    received = _loads(payload, pg, op)
    sender = pg.ranks[source]
    if len(received) != len(object_list):
        raise pg.error(op, f"object_list has {len(object_list)} entries but "
                           f"{len(received)} objects arrived from rank {sender}")
    object_list[:] = received
    return sender
