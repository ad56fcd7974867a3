"""The TCPStore server: one thread, one ``selectors`` loop, one :class:`StoreCore`.

Connection protocol (all frames are ``len:u32`` + payload, big-endian):

1. The server sends a hello: ``b"HPCS1"`` + ``auth:u8`` (+ a 32-byte nonce when
   ``auth`` is 1).
2. With auth, the client answers ``HMAC-SHA256(secret, b"HPCS1" + nonce)`` (32 bytes)
   and the server acknowledges with ``b"\\x01"``; a wrong or missing answer is logged
   on the ``hpccomm.stores`` logger and the connection is closed.
3. Then each request frame (see :mod:`hpccomm.stores._wire`) gets one reply frame,
   in order. Blocked requests (``get``/``wait``/``queue_pop``) are answered when
   satisfied or, with status TIMEOUT, at the deadline the request carried.

A frame that is oversized or does not decode closes that connection only; the keys
are never touched by a request that failed to decode. The thread sleeps in
``select`` until a socket is ready, a waiter's deadline passes, or it is woken to stop.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import selectors
import socket
import threading
import time
from typing import Dict, Optional, Tuple

from hpccomm.stores._core import Outgoing, StoreCore
from hpccomm.stores._wire import FRAME_HEAD, MAX_PAYLOAD, ProtocolError, frame

log = logging.getLogger("hpccomm.stores")

HELLO_MAGIC = b"HPCS1"
AUTH_OK = b"\x01"
#: A client that has not authenticated within this many seconds is dropped.
AUTH_GRACE_S = 10.0


def auth_digest(secret: bytes, nonce: bytes) -> bytes:
    """The answer to the server's challenge ``nonce``."""
    return hmac.new(secret, HELLO_MAGIC + nonce, hashlib.sha256).digest()


class _Conn:
    __slots__ = ("sock", "peer", "inbuf", "outbuf", "nonce", "authed", "opened", "closed",
                 "writing")

    def __init__(self, sock: socket.socket, peer: str, nonce: Optional[bytes]):
        self.sock, self.peer, self.nonce = sock, peer, nonce
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.authed = nonce is None
        self.opened = time.monotonic()
        self.closed = False
        self.writing = False


class TCPStoreServer:
    """Serve a store on a listening socket from a daemon thread."""

    def __init__(self, listener: socket.socket, secret: Optional[bytes] = None,
                 max_payload: int = MAX_PAYLOAD) -> None:
        self.listener = listener
        self.secret = secret
        self.max_payload = max_payload
        self.core = StoreCore(default_timeout_s=None)
        self.refs = 1
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._conns: Dict[_Conn, None] = {}
        self._stopping = False
        listener.setblocking(False)
        self._wake_r.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="hpccomm-tcpstore", daemon=True)
        self._thread.start()

    @property
    def address(self) -> Tuple[str, int]:
        """``(host, port)`` the server listens on."""
        host, port = self.listener.getsockname()[:2]
        return host, port

    # -- lifecycle -------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the thread and close every socket (idempotent)."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            while not self._stopping:
                for key, mask in self._sel.select(self._select_timeout()):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._wake_r.recv(4096)
                    else:
                        conn = key.data
                        if mask & selectors.EVENT_READ:
                            self._read(conn)
                        if mask & selectors.EVENT_WRITE and not conn.closed:
                            self._flush(conn)
                now = time.monotonic()
                self._dispatch(self.core.expire(now))
                for conn in [c for c in self._conns if not c.authed]:
                    if now - conn.opened > AUTH_GRACE_S:
                        log.warning("TCPStore: refused client %s: no authentication within "
                                    "%.0fs", conn.peer, AUTH_GRACE_S)
                        self._close(conn)
        except Exception:  # the thread must never die silently
            log.exception("TCPStore server thread failed")
        finally:
            for conn in list(self._conns):
                self._close(conn)
            self._sel.close()
            for sock in (self.listener, self._wake_r, self._wake_w):
                sock.close()

    def _select_timeout(self) -> Optional[float]:
        deadlines = [c.opened + AUTH_GRACE_S for c in self._conns if not c.authed]
        nxt = self.core.next_deadline()
        if nxt is not None:
            deadlines.append(nxt)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    # -- connections -----------------------------------------------------------------
    def _accept(self) -> None:
        try:
            sock, addr = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # e.g. EMFILE: keep serving the others
            log.warning("TCPStore: accept failed: %s", exc)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nonce = os.urandom(32) if self.secret is not None else None
        conn = _Conn(sock, f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr),
                     nonce)
        self._conns[conn] = None
        self._sel.register(sock, selectors.EVENT_READ, conn)
        hello = HELLO_MAGIC + (b"\x01" + nonce if nonce is not None else b"\x00")
        self._send(conn, hello)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.pop(conn, None)
        self.core.drop(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.inbuf += data
        head = FRAME_HEAD.size
        while not conn.closed and len(conn.inbuf) >= head:
            (size,) = FRAME_HEAD.unpack_from(conn.inbuf, 0)
            if size > self.max_payload:
                log.warning("TCPStore: closing %s: frame of %d bytes exceeds the %d limit",
                            conn.peer, size, self.max_payload)
                self._close(conn)
                return
            if len(conn.inbuf) < head + size:
                return
            payload = bytes(conn.inbuf[head:head + size])
            del conn.inbuf[:head + size]
            self._handle(conn, payload)

    def _handle(self, conn: _Conn, payload: bytes) -> None:
        if not conn.authed:
            expected = auth_digest(self.secret, conn.nonce)
            if hmac.compare_digest(payload, expected):
                conn.authed = True
                self._send(conn, AUTH_OK)
            else:
                log.warning("TCPStore: refused client %s: authentication failed", conn.peer)
                self._close(conn)
            return
        try:
            replies = self.core.submit(conn, payload, time.monotonic())
        except ProtocolError as exc:
            log.warning("TCPStore: closing %s: malformed request: %s", conn.peer, exc)
            self._close(conn)
            return
        self._dispatch(replies)

    def _dispatch(self, replies: Outgoing) -> None:
        for conn, payload in replies:
            if not conn.closed:
                self._send(conn, payload)

    def _send(self, conn: _Conn, payload: bytes) -> None:
        conn.outbuf += frame(payload)
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        del conn.outbuf[:sent]
        if bool(conn.outbuf) != conn.writing:  # only touch the selector on a change
            conn.writing = bool(conn.outbuf)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.writing else 0)
            self._sel.modify(conn.sock, events, conn)
