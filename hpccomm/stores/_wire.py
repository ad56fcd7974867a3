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
FRAME_HEAD = _LEN


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


#: Allowed field counts (None: any count up to MAX_FIELDS; "even": pairs).
ARITY = {
    Op.SET: (2, 2), Op.GET: (1, 1), Op.ADD: (2, 2), Op.COMPARE_SET: (3, 3),
    Op.WAIT: (0, None), Op.CHECK: (0, None), Op.NUM_KEYS: (0, 0), Op.DELETE_KEY: (1, 1),
    Op.MULTI_GET: (0, None), Op.MULTI_SET: (0, None), Op.APPEND: (2, 2),
    Op.QUEUE_PUSH: (2, 2), Op.QUEUE_POP: (2, 2), Op.QUEUE_LEN: (1, 1),
    Op.LIST_KEYS: (0, 0), Op.PING: (0, 0),
}


def _encode_fields(fields: Sequence[bytes]) -> List[bytes]:
    parts = []
    for f in fields:
        parts.append(_LEN.pack(len(f)))
        parts.append(bytes(f))
    return parts


def _decode_fields(data: memoryview, offset: int, count: int,
                   max_fields: int = MAX_FIELDS) -> List[bytes]:
    if count > max_fields or count * 4 > len(data) - offset:
        raise ProtocolError(f"implausible field count {count}")
    fields = []
    end = len(data)
    for _ in range(count):
        if offset + 4 > end:
            raise ProtocolError("truncated field length")
        (n,) = _LEN.unpack_from(data, offset)
        offset += 4
        if offset + n > end:
            raise ProtocolError("truncated field")
        fields.append(bytes(data[offset:offset + n]))
        offset += n
    if offset != end:
        raise ProtocolError("trailing bytes after the last field")
    return fields


def encode_request(op: Op, fields: Sequence[bytes], timeout_ms: int = -1) -> bytes:
    """The payload of one request (``timeout_ms`` < 0: the server's default)."""
    return b"".join([_REQ_HEAD.pack(op, timeout_ms, len(fields)), *_encode_fields(fields)])


def decode_request(payload: bytes) -> Tuple[Op, int, List[bytes]]:
    """``(op, timeout_ms, fields)``; raises :class:`ProtocolError` on anything malformed."""
    data = memoryview(payload)
    if len(data) < _REQ_HEAD.size:
        raise ProtocolError("request shorter than its header")
    raw_op, timeout_ms, count = _REQ_HEAD.unpack_from(data, 0)
    try:
        op = Op(raw_op)
    except ValueError:
        raise ProtocolError(f"unknown op {raw_op}") from None
    fields = _decode_fields(data, _REQ_HEAD.size, count)
    lo, hi = ARITY[op]
    if len(fields) < lo or (hi is not None and len(fields) > hi):
        raise ProtocolError(f"{op.name} takes {lo}..{hi} fields, got {len(fields)}")
    if op is Op.MULTI_SET and len(fields) % 2:
        raise ProtocolError("MULTI_SET needs key/value pairs")
    return op, timeout_ms, fields


def encode_reply(status: Status, fields: Sequence[bytes] = ()) -> bytes:
    """The payload of one reply."""
    return b"".join([_REP_HEAD.pack(status, len(fields)), *_encode_fields(fields)])


def decode_reply(payload: bytes) -> Tuple[Status, List[bytes]]:
    """``(status, fields)``; raises :class:`ProtocolError` on anything malformed."""
    data = memoryview(payload)
    if len(data) < _REP_HEAD.size:
        raise ProtocolError("reply shorter than its header")
    raw, count = _REP_HEAD.unpack_from(data, 0)
    try:
        status = Status(raw)
    except ValueError:
        raise ProtocolError(f"unknown status {raw}") from None
    return status, _decode_fields(data, _REP_HEAD.size, count)


def frame(payload: bytes) -> bytes:
    """``payload`` with its u32 length prefix, as it goes on a TCP stream."""
    return _LEN.pack(len(payload)) + payload


def pack_fields(fields: Sequence[bytes]) -> bytes:
    """A bare field list (``nfields:u32`` then the fields), as FileStore keeps its state."""
    return b"".join([_LEN.pack(len(fields)), *_encode_fields(fields)])


def unpack_fields(data: bytes, max_fields: int = 1 << 31) -> List[bytes]:
    """Inverse of :func:`pack_fields`; raises :class:`ProtocolError` if malformed."""
    view = memoryview(data)
    if len(view) < 4:
        raise ProtocolError("field list shorter than its header")
    (count,) = _LEN.unpack_from(view, 0)
    return _decode_fields(view, 4, count, max_fields)
