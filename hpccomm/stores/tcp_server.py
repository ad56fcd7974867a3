"""The TCPStore server: one thread, one ``epoll`` loop, one :class:`StoreCore`.

Connection protocol (all frames are ``len:u32`` + payload, big-endian):

1. The server sends a hello: ``b"HPCS2"`` + ``auth:u8`` (+ a 32-byte nonce when
   ``auth`` is 1) (+ the name of the server's local socket, on Linux).
2. With auth, the client answers ``HMAC-SHA256(secret, b"HPCS2" + nonce)`` (32 bytes)
   and the server acknowledges with ``b"\\x01"``; a wrong or missing answer is logged
   on the ``hpccomm.stores`` logger and the connection is closed.
3. Then each request frame (see :mod:`hpccomm.stores._wire`) gets one reply frame,
   in order. Blocked requests (``get``/``wait``/``queue_pop``) are answered when
   satisfied or, with status TIMEOUT, at the deadline the request carried.

A frame that is oversized or does not decode closes that connection only; the keys
are never touched by a request that failed to decode.

Local clients: on Linux the server also listens on a Unix socket with a random name in
the abstract namespace and announces the name in its TCP hello. A client that can
connect to it (the same host and network namespace) moves there, and the handshake,
authentication included, starts again on it: a Unix socket costs the kernel about half
of a TCP loopback connection per message. Set ``HPCCOMM_STORE_LOCAL_SOCKET=0`` to
serve TCP only.

Serving: each wake-up handles every ready connection and every complete frame it has
received, decoding in place from the receive buffer, and sends each connection its
replies in one ``send``. After handling requests the loop polls without blocking for
a short window (:data:`~hpccomm.stores._spin.SERVER_SPIN_S`, yielding the core and the
GIL on each turn), so a burst of requests never waits for a kernel wake-up; otherwise
it blocks in ``epoll`` until a socket is ready, a parked request's deadline passes, or
:meth:`TCPStoreServer.stop` wakes it, and costs no CPU while idle.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import select
import socket
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

from hpccomm import settings
from hpccomm.stores import _spin
from hpccomm.stores._core import StoreCore
from hpccomm.stores._wire import FRAME_HEAD, MAX_PAYLOAD, ProtocolError, frame

log = logging.getLogger("hpccomm.stores")

HELLO_MAGIC = b"HPCS2"
AUTH_OK = b"\x01"
#: A client that has not authenticated within this many seconds is dropped.
AUTH_GRACE_S = 10.0
_RECV_SIZE = 4096  # small reads allocate less; big frames arrive in pieces
_unpack_len = FRAME_HEAD.unpack_from
_pack_len = FRAME_HEAD.pack

if hasattr(select, "epoll"):
    _IN, _OUT, _ERR = select.EPOLLIN, select.EPOLLOUT, select.EPOLLERR | select.EPOLLHUP
else:  # pragma: no cover - macOS and other non-Linux systems
    _IN, _OUT, _ERR = select.POLLIN, select.POLLOUT, select.POLLERR | select.POLLHUP


class _Poller:
    """``epoll`` where there is one, ``poll`` elsewhere; timeouts in seconds."""

    def __init__(self) -> None:
        self._epoll = hasattr(select, "epoll")
        self._p = select.epoll() if self._epoll else select.poll()
        self.register, self.modify, self.unregister = (self._p.register, self._p.modify,
                                                       self._p.unregister)

    def poll(self, timeout: Optional[float]) -> List[Tuple[int, int]]:
        if self._epoll:
            return self._p.poll(-1 if timeout is None else timeout)
        return self._p.poll(None if timeout is None else timeout * 1000.0)

    def close(self) -> None:
        if self._epoll:
            self._p.close()


def local_listener() -> Optional[socket.socket]:
    """A listening Unix socket in the abstract namespace (Linux), or None."""
    if not hasattr(socket, "AF_UNIX") or not sys.platform.startswith("linux"):
        return None
    if not settings.STORE_LOCAL_SOCKET.get():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(b"\0hpccomm-store-" + os.urandom(12).hex().encode())
        sock.listen(1024)
    except OSError:
        sock.close()
        return None
    return sock


def parse_hello(hello: bytes) -> Tuple[Optional[bytes], bytes]:
    """``(nonce or None, local socket name or b"")`` of a server hello; raises
    ``ValueError`` if it is not one."""
    head = len(HELLO_MAGIC)
    if not hello.startswith(HELLO_MAGIC) or len(hello) < head + 1 or hello[head] > 1:
        raise ValueError("not a store server hello")
    if hello[head] == 1:
        nonce = hello[head + 1:head + 33]
        if len(nonce) != 32:
            raise ValueError("truncated hello")
        return nonce, hello[head + 33:]
    return None, hello[head + 1:]


def auth_digest(secret: bytes, nonce: bytes) -> bytes:
    """The answer to the server's challenge ``nonce``."""
    return hmac.new(secret, HELLO_MAGIC + nonce, hashlib.sha256).digest()


class _Conn:
    __slots__ = ("sock", "fd", "peer", "parts", "have", "need", "outbuf", "outpos", "nonce",
                 "authed", "opened", "closed", "writing", "replies")

    def __init__(self, sock: socket.socket, peer: str, nonce: Optional[bytes]):
        self.sock, self.fd, self.peer, self.nonce = sock, sock.fileno(), peer, nonce
        self.parts: List[bytes] = []  # received pieces of a frame not complete yet
        self.have = 0                 # how many bytes ``parts`` hold
        self.need = 0                 # how many the frame needs (4: length unknown yet)
        self.outbuf = b""             # reply bytes the socket did not take yet...
        self.outpos = 0               # ...from this offset on
        self.authed = nonce is None
        self.opened = time.monotonic()
        self.closed = False
        self.writing = False
        self.replies: List[bytes] = []  # posted replies to parked requests, not sent yet


class TCPStoreServer:
    """Serve a store on a listening socket from a daemon thread (call :meth:`start`)."""

    def __init__(self, listener: socket.socket, secret: Optional[bytes] = None,
                 max_payload: int = MAX_PAYLOAD) -> None:
        self.listener = listener
        self.port: int = listener.getsockname()[1]
        self.secret = secret
        self.max_payload = max_payload
        self.core = StoreCore(default_timeout_s=None, framed=True)
        #: Store handles using this server; changed only under tcp.py's registry lock.
        self.refs = 1
        self._poller = _Poller()
        self._wake_r, self._wake_w = socket.socketpair()
        self._conns: Dict[int, _Conn] = {}
        self._pending: List[_Conn] = []  # connections with posted replies
        self._unauthed = 0
        self._stopping = False
        listener.setblocking(False)
        self._wake_r.setblocking(False)
        self._listen_fd, self._wake_fd = listener.fileno(), self._wake_r.fileno()
        self._poller.register(self._listen_fd, _IN)
        self._poller.register(self._wake_fd, _IN)
        self._local = local_listener()
        self._local_fd = -1
        #: The abstract name local clients may connect to (b"": none).
        self.local_name = b""
        if self._local is not None:
            self._local.setblocking(False)
            self._local_fd = self._local.fileno()
            self.local_name = self._local.getsockname()
            self._poller.register(self._local_fd, _IN)
        self._thread = threading.Thread(target=self._run, name="hpccomm-tcpstore", daemon=True)

    @property
    def address(self) -> Tuple[str, int]:
        """``(host, port)`` the server listens on."""
        host, port = self.listener.getsockname()[:2]
        return host, port

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> "TCPStoreServer":
        """Start the serving thread. Never call it while holding a lock a garbage
        collection finalizer may take: the new thread can run finalizers."""
        self._thread.start()
        return self

    def stop(self, join: bool = True) -> None:
        """Stop the thread and close every socket (idempotent). ``join=False`` only
        signals it, for callers that must not block (GC finalizers)."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if not self._thread.is_alive() and self._thread.ident is None:
            self._cleanup()  # never started
        elif join and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    def _cleanup(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        self._poller.close()
        for sock in (self.listener, self._wake_r, self._wake_w, self._local):
            if sock is not None:
                sock.close()

    def _run(self) -> None:
        poll, conns, core = self._poller.poll, self._conns, self.core
        monotonic, sched_yield = time.monotonic, _spin.sched_yield
        readable, writable, inf = _IN | _ERR, _OUT, math.inf
        spin_s, preempted = _spin.SERVER_SPIN_S, _spin.PREEMPTED_S
        spin_until = last = 0.0
        try:
            while not self._stopping:
                if spin_until:
                    events = poll(0)
                    if not events:
                        now = monotonic()
                        if now >= spin_until or now - last > preempted:
                            spin_until = 0.0  # window over, or the core is contended
                        if core.due(now):
                            self._expire(now)
                        sched_yield()
                        last = monotonic()
                        continue
                else:
                    events = poll(self._block_timeout())
                served = False
                for fd, mask in events:
                    conn = conns.get(fd)
                    if conn is not None:
                        if mask & readable and self._read(conn):
                            served = True
                        if mask & writable and not conn.closed:
                            self._flush(conn)
                    elif fd == self._listen_fd:
                        self._accept(self.listener, self.local_name)
                    elif fd == self._local_fd:
                        self._accept(self._local, b"")
                    elif fd == self._wake_fd:
                        try:
                            self._wake_r.recv(4096)
                        except OSError:
                            pass
                if core.outbox:
                    self._route()
                if self._unauthed or core.next_expiry != inf:
                    now = monotonic()
                    if self._unauthed or core.due(now):
                        self._expire(now)
                if served and spin_s > 0:
                    last = monotonic()
                    spin_until = last + spin_s
        except Exception:  # the thread must never die silently
            log.exception("TCPStore server thread failed")
        finally:
            self._cleanup()

    def _block_timeout(self) -> Optional[float]:
        """How long the loop may block: until the next deadline, or for ever."""
        deadlines = [c.opened + AUTH_GRACE_S for c in self._conns.values() if not c.authed]
        nxt = self.core.next_deadline()
        if nxt is not None:
            deadlines.append(nxt)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _expire(self, now: float) -> None:
        """Answer parked requests whose deadline passed; drop slow authenticators."""
        for conn, reply in self.core.expire(now):
            self._post(conn, reply)
        if self._pending:
            self._send_round()
        if self._unauthed:
            for conn in [c for c in self._conns.values() if not c.authed]:
                if now - conn.opened > AUTH_GRACE_S:
                    log.warning("TCPStore: refused client %s: no authentication within "
                                "%.0fs", conn.peer, AUTH_GRACE_S)
                    self._close(conn)

    # -- connections -----------------------------------------------------------------
    def _accept(self, listener: socket.socket, announce: bytes) -> None:
        while True:
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: keep serving the others
                log.warning("TCPStore: accept failed: %s", exc)
                return
            sock.setblocking(False)
            if listener is self.listener:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = os.urandom(32) if self.secret is not None else None
            peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else "local socket"
            conn = _Conn(sock, peer, nonce)
            self._conns[conn.fd] = conn
            if nonce is not None:
                self._unauthed += 1
            self._poller.register(conn.fd, _IN)
            hello = HELLO_MAGIC + (b"\x01" + nonce if nonce is not None else b"\x00")
            self._write(conn, frame(hello + announce))

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if not conn.authed:
            self._unauthed -= 1
        self._conns.pop(conn.fd, None)
        self.core.drop(conn)
        try:
            self._poller.unregister(conn.fd)
        except (KeyError, ValueError, OSError):
            pass
        conn.sock.close()

    def _read(self, conn: _Conn) -> bool:
        """Receive from ``conn`` and handle every complete frame; whether any request
        was served."""
        try:
            data = conn.sock.recv(_RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return False
        if conn.parts:
            data = self._gather(conn, data)
            if data is None:
                return False
        size = len(data)
        if size > 4 and conn.authed and _unpack_len(data, 0)[0] == size - 4:
            # the common case: exactly one whole request
            try:
                reply = self.core.submit(conn, data, None, 4, size)
            except ProtocolError as exc:
                self._malformed(conn, exc)
                return False
            if reply is not None:
                self._write(conn, reply)
            return True
        return self._frames(conn, data)

    def _frames(self, conn: _Conn, data: bytes) -> bool:
        """Handle every complete frame in ``data``; keep the start of an incomplete one."""
        size, off, served = len(data), 0, False
        mine: List[bytes] = []
        while size - off >= 4:
            (n,) = _unpack_len(data, off)
            if n > self.max_payload:
                log.warning("TCPStore: closing %s: frame of %d bytes exceeds the %d limit",
                            conn.peer, n, self.max_payload)
                self._close(conn)
                return False
            end = off + 4 + n
            if end > size:
                break
            if not conn.authed:
                if not self._authenticate(conn, data[off + 4:end]):
                    return False
            else:
                try:
                    reply = self.core.submit(conn, data, None, off + 4, end)
                except ProtocolError as exc:
                    self._malformed(conn, exc)
                    return False
                served = True
                if reply is not None:
                    mine.append(reply)
            off = end
        if mine:
            self._write(conn, mine[0] if len(mine) == 1 else b"".join(mine))
        if off < size:
            rest = data[off:]
            conn.parts, conn.have = [rest], len(rest)
            conn.need = 4 + _unpack_len(rest, 0)[0] if len(rest) >= 4 else 4
        return served

    def _gather(self, conn: _Conn, data: bytes) -> Optional[bytes]:
        """Add ``data`` to a frame received in pieces: the bytes once it is complete
        (joined once, so a large value is not copied again and again), else None."""
        conn.parts.append(data)
        conn.have += len(data)
        if conn.need == 4 and conn.have >= 4:  # the length prefix itself was split
            head = b"".join(conn.parts)
            conn.parts, conn.need = [head], 4 + _unpack_len(head, 0)[0]
            if conn.need - 4 > self.max_payload:
                conn.parts, conn.have, conn.need = [], 0, 0
                return head  # _frames rejects it
        if conn.have < conn.need:
            return None
        data = b"".join(conn.parts)
        conn.parts, conn.have, conn.need = [], 0, 0
        return data

    def _malformed(self, conn: _Conn, exc: Exception) -> None:
        log.warning("TCPStore: closing %s: malformed request: %s", conn.peer, exc)
        self._close(conn)

    def _authenticate(self, conn: _Conn, answer: bytes) -> bool:
        if hmac.compare_digest(answer, auth_digest(self.secret, conn.nonce)):
            conn.authed = True
            self._unauthed -= 1
            self._write(conn, frame(AUTH_OK))
            return True
        log.warning("TCPStore: refused client %s: authentication failed", conn.peer)
        self._close(conn)
        return False

    def _route(self) -> None:
        """Ship the replies to parked requests that the last requests answered."""
        out, self.core.outbox = self.core.outbox, []
        for conn, reply in out:
            self._post(conn, reply)
        self._send_round()

    def _post(self, conn: _Conn, reply: bytes) -> None:
        if not conn.closed:
            if not conn.replies:
                self._pending.append(conn)
            conn.replies.append(reply)

    def _send_round(self) -> None:
        """Send the posted replies, one ``send`` per connection."""
        pending, self._pending = self._pending, []
        for conn in pending:
            replies, conn.replies = conn.replies, []
            if not conn.closed:
                self._write(conn, replies[0] if len(replies) == 1 else b"".join(replies))

    def _write(self, conn: _Conn, data: bytes) -> None:
        if conn.outbuf:  # still sending earlier bytes: queue behind them
            conn.outbuf, conn.outpos = conn.outbuf[conn.outpos:] + data, 0
            return
        try:
            sent = conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        if sent < len(data):
            conn.outbuf, conn.outpos = data, sent
            self._want_write(conn, True)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(memoryview(conn.outbuf)[conn.outpos:])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        conn.outpos += sent
        if conn.outpos >= len(conn.outbuf):
            conn.outbuf, conn.outpos = b"", 0
            self._want_write(conn, False)

    def _want_write(self, conn: _Conn, on: bool) -> None:
        if conn.writing != on and not conn.closed:
            conn.writing = on
            self._poller.modify(conn.fd, _IN | (_OUT if on else 0))
