"""The request/reply encoding shared by TCPStore, MPIStore and FileStore.

Every store request is one *payload*::

    op:u8  timeout_ms:i64  nfields:u32  (len:u32 bytes)*nfields

and every reply::

    status:u8  nfields:u32  (len:u32 bytes)*nfields

All integers are big-endian. On TCP each payload travels in a frame prefixed by its
length (``u32``); MPI messages carry their own length. Integers inside fields
(``add`` deltas, counters, lengths) are ASCII decimal, as torch's stores keep them.
Decoding is strict: a payload that does not parse exactly, names an unknown op or
has the wrong number of fields raises :class:`ProtocolError`, and the TCP server
closes that connection without touching any key.

Servers answer thousands of requests per second from Python, so the codecs avoid
enum construction, intermediate lists and copies: ops and statuses travel as plain
ints (``Op``/``Status`` members compare and hash equal to them), and
:func:`decode_request` reads a payload in place inside a larger receive buffer.
"""
from __future__ import annotations

import enum
import struct
from typing import List, Sequence, Tuple

#: Largest payload a server accepts (and a client sends): 64 MiB.
MAX_PAYLOAD = 64 << 20
#: Most fields one request may carry (``multi_set`` of 32k keys).
MAX_FIELDS = 1 << 16

_REQ_HEAD = struct.Struct(">BqI")
_REP_HEAD = struct.Struct(">BI")
_LEN = struct.Struct(">I")
_REP_ONE = struct.Struct(">BII")          # a reply with exactly one field
_FRAMED_REQ_HEAD = struct.Struct(">IBqI")  # frame length + request header
_FRAMED_REQ_ONE = struct.Struct(">IBqII")  # ... + the length of the first field
_FRAMED_REP_ONE = struct.Struct(">IBII")   # frame length + a one-field reply header
FRAME_HEAD = _LEN

_unpack_req_head = _REQ_HEAD.unpack_from
_unpack_rep_head = _REP_HEAD.unpack_from
_unpack_len = _LEN.unpack_from
_pack_len = _LEN.pack
_pack_rep_one = _REP_ONE.pack
_pack_framed_head = _FRAMED_REQ_HEAD.pack
_pack_framed_one = _FRAMED_REQ_ONE.pack
_pack_framed_rep_one = _FRAMED_REP_ONE.pack


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
_EMPTY_FRAMED_REPLIES = {int(st): _LEN.pack(5) + _REP_HEAD.pack(st, 0) for st in Status}


def op_name(op: int) -> str:
    """``"SET"`` for 1, and so on (for messages)."""
    return _OP_NAMES.get(op, str(op))


def _encode_fields(fields: Sequence[bytes]) -> List[bytes]:
    parts = []
    for f in fields:
        parts.append(_pack_len(len(f)))
        parts.append(f)
    return parts


def _decode_fields(data, offset: int, end: int, count: int,
                   max_fields: int = MAX_FIELDS) -> List[bytes]:
    """``count`` length-prefixed fields of ``data[offset:end]``, which they must fill."""
    if count > max_fields or count * 4 > end - offset:
        raise ProtocolError(f"implausible field count {count}")
    fields = []
    append = fields.append
    for _ in range(count):
        if offset + 4 > end:
            raise ProtocolError("truncated field length")
        (n,) = _unpack_len(data, offset)
        offset += 4
        nxt = offset + n
        if nxt > end:
            raise ProtocolError("truncated field")
        append(data[offset:nxt])
        offset = nxt
    if offset != end:
        raise ProtocolError("trailing bytes after the last field")
    return fields


def encode_request(op: int, fields: Sequence[bytes], timeout_ms: int = -1) -> bytes:
    """The payload of one request (``timeout_ms`` < 0: the server's default)."""
    return b"".join([_REQ_HEAD.pack(op, timeout_ms, len(fields)), *_encode_fields(fields)])


def encode_framed_request(op: int, fields: Sequence[bytes], timeout_ms: int = -1) -> bytes:
    """:func:`encode_request` with its TCP length prefix, in one allocation."""
    count = len(fields)
    if count == 1:
        key = fields[0]
        return _pack_framed_one(17 + len(key), op, timeout_ms, 1, len(key)) + key
    if count == 2:
        key, value = fields
        return b"".join((_pack_framed_one(21 + len(key) + len(value), op, timeout_ms, 2,
                                          len(key)), key, _pack_len(len(value)), value))
    parts = [b""]
    size = 13
    for f in fields:
        n = len(f)
        parts.append(_pack_len(n))
        parts.append(f)
        size += 4 + n
    parts[0] = _pack_framed_head(size, op, timeout_ms, len(fields))
    return b"".join(parts)


def decode_request(payload, start: int = 0, end: int = -1) -> Tuple[int, int, List[bytes]]:
    """``(op, timeout_ms, fields)`` of the payload ``payload[start:end]``.

    ``payload`` is ``bytes`` (fields come back as ``bytes``) and ``end`` < 0 means its
    end. Raises :class:`ProtocolError` on anything malformed.
    """
    if end < 0:
        end = len(payload)
    if end - start < 13:
        raise ProtocolError("request shorter than its header")
    op, timeout_ms, count = _unpack_req_head(payload, start)
    arity = ARITY.get(op)
    if arity is None:
        raise ProtocolError(f"unknown op {op}")
    if count < arity[0] or count > arity[1]:
        raise ProtocolError(f"{op_name(op)} takes {arity[0]}..{arity[1]} fields, got {count}")
    if op == 10 and count % 2:  # MULTI_SET
        raise ProtocolError("MULTI_SET needs key/value pairs")
    if count == 1 and end - start >= 17:  # the common cases, without the loop
        (n,) = _unpack_len(payload, start + 13)
        if start + 17 + n != end:
            raise ProtocolError("field does not fill the request")
        return op, timeout_ms, [payload[start + 17:end]]
    if count == 2 and end - start >= 21:
        (n,) = _unpack_len(payload, start + 13)
        mid = start + 17 + n
        if mid + 4 <= end:
            (m,) = _unpack_len(payload, mid)
            if mid + 4 + m == end:
                return op, timeout_ms, [payload[start + 17:mid], payload[mid + 4:end]]
    return op, timeout_ms, _decode_fields(payload, start + 13, end, count)


def encode_reply(status: int, fields: Sequence[bytes] = ()) -> bytes:
    """The payload of one reply."""
    count = len(fields)
    if count == 1:
        value = fields[0]
        return _pack_rep_one(status, 1, len(value)) + value
    if not count:
        return _EMPTY_REPLIES[status]
    return b"".join([_REP_HEAD.pack(status, count), *_encode_fields(fields)])


def encode_framed_reply(status: int, fields: Sequence[bytes] = ()) -> bytes:
    """:func:`encode_reply` with its TCP length prefix, in one allocation."""
    count = len(fields)
    if count == 1:
        value = fields[0]
        return _pack_framed_rep_one(9 + len(value), status, 1, len(value)) + value
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
    if count == 1 and end - start >= 9:  # the common case, without the loop
        (n,) = _unpack_len(payload, start + 5)
        if start + 9 + n != end:
            raise ProtocolError("field does not fill the reply")
        return _STATUSES[raw], [payload[start + 9:end]]
    return _STATUSES[raw], _decode_fields(payload, start + 5, end, count)


def frame(payload: bytes) -> bytes:
    """``payload`` with its u32 length prefix, as it goes on a TCP stream."""
    return _pack_len(len(payload)) + payload


def pack_fields(fields: Sequence[bytes]) -> bytes:
    """A bare field list (``nfields:u32`` then the fields), as FileStore keeps its state."""
    return b"".join([_pack_len(len(fields)), *_encode_fields(fields)])


def unpack_fields(data: bytes, max_fields: int = 1 << 31) -> List[bytes]:
    """Inverse of :func:`pack_fields`; raises :class:`ProtocolError` if malformed."""
    if len(data) < 4:
        raise ProtocolError("field list shorter than its header")
    (count,) = _unpack_len(data, 0)
    return _decode_fields(data, 4, len(data), count, max_fields)
