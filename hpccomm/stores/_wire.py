"""The request/reply encoding shared by TCPStore, MPIStore and FileStore.

Every store request is one *payload*::

    op:u8  timeout_ms:i64  nfields:u32  len:u32 * nfields  field bytes, concatenated

and every reply::

    status:u8  nfields:u32  len:u32 * nfields  field bytes, concatenated

All integers are big-endian; the lengths come before the bytes so that any message is
one ``struct`` unpack plus slices. On TCP each payload travels in a frame prefixed by
its length (``u32``); MPI messages carry their own length. Integers inside fields
(``add`` deltas, counters, lengths) are ASCII decimal, as torch's stores keep them.
Decoding is strict: a payload that does not parse exactly, names an unknown op or has
the wrong number of fields raises :class:`ProtocolError`, and the TCP server closes
that connection without touching any key.

Servers answer tens of thousands of requests per second from Python, so the codecs
avoid enum construction, intermediate lists and copies: ops and statuses travel as
plain ints (``Op``/``Status`` members compare and hash equal to them), the common one-
and two-field messages have their own precompiled formats, and :func:`decode_request`
reads a payload in place inside a larger receive buffer.
"""
from __future__ import annotations

import enum
import struct
from typing import Dict, List, Sequence, Tuple

#: Largest payload a server accepts (and a client sends): 64 MiB.
MAX_PAYLOAD = 64 << 20
#: Most fields one request may carry (``multi_set`` of 32k keys).
MAX_FIELDS = 1 << 16

_LEN = struct.Struct(">I")
FRAME_HEAD = _LEN
_REQ_HEAD = struct.Struct(">BqI")          # op, timeout, nfields
_REQ_HEAD_1 = struct.Struct(">BqII")       # ... + one length
_REQ_HEAD_2 = struct.Struct(">BqIII")      # ... + two lengths
_REP_HEAD = struct.Struct(">BI")           # status, nfields
_FRAMED_REQ_0 = struct.Struct(">IBqI")     # frame length + a request header, no field
_FRAMED_REQ_1 = struct.Struct(">IBqII")    # ... with one field
_FRAMED_REQ_2 = struct.Struct(">IBqIII")   # ... with two fields
_FRAMED_REP_0 = struct.Struct(">IBI")      # frame length + a reply header, no field
_FRAMED_REP_1 = struct.Struct(">IBII")     # ... with one field

_pack_len = _LEN.pack
_unpack_len = _LEN.unpack_from
_unpack_req_head = _REQ_HEAD.unpack_from
_unpack_req_head_1 = _REQ_HEAD_1.unpack_from
_unpack_req_head_2 = _REQ_HEAD_2.unpack_from
_unpack_rep_head = _REP_HEAD.unpack_from
_pack_framed_req_0 = _FRAMED_REQ_0.pack
_pack_framed_req_1 = _FRAMED_REQ_1.pack
_pack_framed_req_2 = _FRAMED_REQ_2.pack
_pack_framed_rep_1 = _FRAMED_REP_1.pack
#: ``(frame length, status, nfields, first length)`` of a framed one-field reply.
unpack_framed_reply_one = _FRAMED_REP_1.unpack_from
#: ``(frame length, status, nfields)`` of a framed reply.
unpack_framed_reply_none = _FRAMED_REP_0.unpack_from

_lengths: Dict[int, struct.Struct] = {}


def _lengths_format(count: int) -> struct.Struct:
    fmt = _lengths.get(count)
    if fmt is None:
        fmt = struct.Struct(f">{count}I")
        if count <= 256:
            _lengths[count] = fmt
    return fmt


class ProtocolError(ValueError):
    """A payload that is not a well-formed store request or reply."""


class Op(enum.IntEnum):
    """Request opcodes. ``(min_fields, max_fields)`` per op lives in :data:`ARITY`."""

    SET = 1
    GET = 2
    ADD = 3
    COMPARE_SET = 4
    WAIT = 5
    CHECK = 6
    NUM_KEYS = 7
    DELETE_KEY = 8
    MULTI_GET = 9
    MULTI_SET = 10
    APPEND = 11
    QUEUE_PUSH = 12
    QUEUE_POP = 13
    QUEUE_LEN = 14
    LIST_KEYS = 15
    PING = 16


class Status(enum.IntEnum):
    """Reply status codes."""

    OK = 0
    TIMEOUT = 1      # fields: the keys still missing
    ERROR = 2        # field 0: message
    QUEUE_EMPTY = 3  # non-blocking queue_pop on an empty queue


_BIG = MAX_FIELDS
#: Allowed field counts per op (``_BIG``: any count up to MAX_FIELDS), keyed by int.
ARITY = {
    int(Op.SET): (2, 2), int(Op.GET): (1, 1), int(Op.ADD): (2, 2),
    int(Op.COMPARE_SET): (3, 3), int(Op.WAIT): (0, _BIG), int(Op.CHECK): (0, _BIG),
    int(Op.NUM_KEYS): (0, 0), int(Op.DELETE_KEY): (1, 1), int(Op.MULTI_GET): (0, _BIG),
    int(Op.MULTI_SET): (0, _BIG), int(Op.APPEND): (2, 2), int(Op.QUEUE_PUSH): (2, 2),
    int(Op.QUEUE_POP): (2, 2), int(Op.QUEUE_LEN): (1, 1), int(Op.LIST_KEYS): (0, 0),
    int(Op.PING): (0, 0),
}
_OP_NAMES = {int(op): op.name for op in Op}
_STATUSES = tuple(Status)
_EMPTY_REPLIES = {int(st): _REP_HEAD.pack(st, 0) for st in Status}
_EMPTY_FRAMED_REPLIES = {int(st): _pack_len(5) + _REP_HEAD.pack(st, 0) for st in Status}


def op_name(op: int) -> str:
    """``"SET"`` for 1, and so on (for messages)."""
    return _OP_NAMES.get(op, str(op))


def _join_fields(fields: Sequence[bytes]) -> Tuple[bytes, bytes, int]:
    """``(packed lengths, concatenated bytes, their total size)`` of ``fields``."""
    sizes = [len(f) for f in fields]
    return _lengths_format(len(sizes)).pack(*sizes), b"".join(fields), sum(sizes)


def _split_fields(data, offset: int, end: int, count: int,
                  max_fields: int = MAX_FIELDS) -> List[bytes]:
    """The ``count`` fields whose lengths start at ``data[offset]``; with their bytes
    they must fill ``data[offset:end]`` exactly."""
    if count > max_fields or count * 4 > end - offset:
        raise ProtocolError(f"implausible field count {count}")
    sizes = _lengths_format(count).unpack_from(data, offset)
    offset += 4 * count
    if offset + sum(sizes) != end:
        raise ProtocolError("fields do not fill the message exactly")
    fields = []
    append = fields.append
    for n in sizes:
        append(data[offset:offset + n])
        offset += n
    return fields


def encode_request(op: int, fields: Sequence[bytes], timeout_ms: int = -1) -> bytes:
    """The payload of one request (``timeout_ms`` < 0: the server's default)."""
    lengths, body, _ = _join_fields(fields)
    return b"".join((_REQ_HEAD.pack(op, timeout_ms, len(fields)), lengths, body))


def encode_framed_request(op: int, fields: Sequence[bytes], timeout_ms: int = -1) -> bytes:
    """:func:`encode_request` with its TCP length prefix, in one allocation."""
    count = len(fields)
    if count == 2:
        key, value = fields
        lk, lv = len(key), len(value)
        return b"".join((_pack_framed_req_2(21 + lk + lv, op, timeout_ms, 2, lk, lv),
                         key, value))
    if count == 1:
        key = fields[0]
        return _pack_framed_req_1(17 + len(key), op, timeout_ms, 1, len(key)) + key
    if not count:
        return _pack_framed_req_0(13, op, timeout_ms, 0)
    lengths, body, size = _join_fields(fields)
    return b"".join((_pack_framed_req_0(13 + 4 * count + size, op, timeout_ms, count),
                     lengths, body))


def decode_request(payload, start: int = 0, end: int = -1) -> Tuple[int, int, List[bytes]]:
    """``(op, timeout_ms, fields)`` of the payload ``payload[start:end]``.

    ``payload`` is ``bytes`` (fields come back as ``bytes``) and ``end`` < 0 means its
    end. Raises :class:`ProtocolError` on anything malformed.
    """
    if end < 0:
        end = len(payload)
    size = end - start
    if size < 13:
        raise ProtocolError("request shorter than its header")
    # the common one- and two-field requests: one unpack, then slices
    if size >= 21:
        op, timeout_ms, count, n, m = _unpack_req_head_2(payload, start)
        if count == 2 and size == 21 + n + m and op in _TWO:
            mid = start + 21 + n
            return op, timeout_ms, [payload[start + 21:mid], payload[mid:end]]
        if count == 1 and size == 17 + n and op in _ONE:
            return op, timeout_ms, [payload[start + 17:end]]
    elif size >= 17:
        op, timeout_ms, count, n = _unpack_req_head_1(payload, start)
        if count == 1 and size == 17 + n and op in _ONE:
            return op, timeout_ms, [payload[start + 17:end]]
    else:
        op, timeout_ms, count = _unpack_req_head(payload, start)
    arity = ARITY.get(op)
    if arity is None:
        raise ProtocolError(f"unknown op {op}")
    if count < arity[0] or count > arity[1]:
        raise ProtocolError(f"{op_name(op)} takes {arity[0]}..{arity[1]} fields, got {count}")
    if op == Op.MULTI_SET and count % 2:
        raise ProtocolError("MULTI_SET needs key/value pairs")
    return op, timeout_ms, _split_fields(payload, start + 13, end, count)


#: Ops whose requests may take the one-/two-field shortcuts of :func:`decode_request`.
_ONE = frozenset(op for op, (lo, hi) in ARITY.items() if lo <= 1 <= hi) - {Op.MULTI_SET}
_TWO = frozenset(op for op, (lo, hi) in ARITY.items() if lo <= 2 <= hi)


def encode_reply(status: int, fields: Sequence[bytes] = ()) -> bytes:
    """The payload of one reply."""
    count = len(fields)
    if count == 1:
        value = fields[0]
        return _REP_HEAD.pack(status, 1) + _pack_len(len(value)) + value
    if not count:
        return _EMPTY_REPLIES[status]
    lengths, body, _ = _join_fields(fields)
    return b"".join((_REP_HEAD.pack(status, count), lengths, body))


def encode_framed_reply(status: int, fields: Sequence[bytes] = ()) -> bytes:
    """:func:`encode_reply` with its TCP length prefix, in one allocation."""
    count = len(fields)
    if count == 1:
        value = fields[0]
        return _pack_framed_rep_1(9 + len(value), status, 1, len(value)) + value
    if not count:
        return _EMPTY_FRAMED_REPLIES[status]
    return frame(encode_reply(status, fields))


def decode_reply(payload, start: int = 0, end: int = -1) -> Tuple[Status, List[bytes]]:
    """``(status, fields)`` of ``payload[start:end]``; raises :class:`ProtocolError`."""
    if end < 0:
        end = len(payload)
    if end - start < 5:
        raise ProtocolError("reply shorter than its header")
    raw, count = _unpack_rep_head(payload, start)
    if raw >= len(_STATUSES):
        raise ProtocolError(f"unknown status {raw}")
    return _STATUSES[raw], _split_fields(payload, start + 5, end, count)


def frame(payload: bytes) -> bytes:
    """``payload`` with its u32 length prefix, as it goes on a TCP stream."""
    return _pack_len(len(payload)) + payload


def pack_fields(fields: Sequence[bytes]) -> bytes:
    """A bare field list (``nfields:u32``, the lengths, the bytes), as FileStore keeps
    its state."""
    lengths, body, _ = _join_fields(fields)
    return b"".join((_pack_len(len(fields)), lengths, body))


def unpack_fields(data: bytes, max_fields: int = 1 << 31) -> List[bytes]:
    """Inverse of :func:`pack_fields`; raises :class:`ProtocolError` if malformed."""
    if len(data) < 4:
        raise ProtocolError("field list shorter than its header")
    (count,) = _unpack_len(data, 0)
    return _split_fields(data, 4, len(data), count, max_fields)
