"""``TCPStore``: torch's TCP key-value store, with a Python server thread.

The master process (``is_master=True``) starts a :class:`TCPStoreServer` thread
bound to ``host_name`` (only that interface; ``""``/``"0.0.0.0"``/``"::"`` mean all)
and every process, the master included, talks to it as a client over one TCP
connection. With a shared secret (``token=`` or ``HPCCOMM_STORE_TOKEN``) the server
challenges every connection and refuses clients that cannot answer.

A client sends its request, then polls for the reply without blocking for a short window
(:data:`~hpccomm.stores._spin.CLIENT_SPIN_S`), so a reply that comes within microseconds
is read without a kernel wake-up; after the window, or at once if the polling loses its
core, it blocks in ``recv``, waking every second to check its deadline. A client in the
same process as its server never polls: it would compete with the server thread for the
GIL. Clients on the server's host talk over its local Unix socket (see
:mod:`~hpccomm.stores.tcp_server`).
"""
from __future__ import annotations

import select
import socket
import struct
import threading
import time
import weakref
from typing import Dict, List, Optional, Sequence, Tuple, Union

from hpccomm import launcher_env, settings
from hpccomm.errors import DistNetworkError, DistStoreError
from hpccomm.stores import _spin
from hpccomm.stores._deferred import Deferred
from hpccomm.stores._state import INTERNAL_PREFIX
from hpccomm.stores._wire import (FRAME_HEAD, MAX_PAYLOAD, ProtocolError, Status,
                                  decode_reply, encode_framed_request, frame)
from hpccomm.stores._wire import unpack_framed_reply_none as _unpack_reply_none
from hpccomm.stores._wire import unpack_framed_reply_one as _unpack_reply_one
from hpccomm.stores._wire import op_name
from hpccomm.stores.base import DEFAULT_TIMEOUT, RequestStore, Store, Timeout, milliseconds
from hpccomm.stores.tcp_server import AUTH_OK, TCPStoreServer, auth_digest, parse_hello

_WILDCARDS = ("", "0.0.0.0", "::", "*")
#: Extra seconds a client waits beyond a request's own timeout before giving up
#: on the server (the server answers timeouts itself).
_GRACE_S = 30.0
_JOINED = (INTERNAL_PREFIX + b"workers").decode()
_ALL_JOINED = (INTERNAL_PREFIX + b"workers_all").decode()
_unpack_len = FRAME_HEAD.unpack_from
_STATUSES = tuple(Status)
_OK = Status.OK
_RECV_SIZE = 4096  # most replies fit; small reads allocate less
#: A blocked client wakes at least this often to check its deadline.
_SLICE_S = 1.0
_SLICE = struct.pack("ll", int(_SLICE_S), 0)

#: Multi-tenant servers of this process by ``(host, port)``; with ``refs`` of every
#: server, changed only under ``_tenants_lock``, which is never held while a thread
#: starts or anything blocks.
_tenants: Dict[Tuple[str, int], TCPStoreServer] = {}
_tenants_lock = threading.Lock()
_deferred = Deferred()
#: Ports served by a server thread of this process (its clients must not spin).
_local_ports: Dict[int, int] = {}


def _secret(token: Union[str, bytes, None]) -> Optional[bytes]:
    if token is None:
        token = settings.STORE_TOKEN.get()
    if isinstance(token, str):
        token = token.encode("utf-8")
    if token is not None and not isinstance(token, bytes):
        raise TypeError(f"TCPStore token must be str or bytes, got {type(token).__name__}")
    return token


def _flag(name: str, value: object) -> bool:
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"TCPStore {name} must be a bool, got {value!r}")


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"TCPStore {name} must be an integer, got {value!r}")
    return value.__index__()


def _agent_serves(port: int) -> bool:
    """torchelastic's agent already serves the store on ``port`` (torch's rule)."""
    return launcher_env.torchelastic_agent_store() and launcher_env.master_address()[1] == port


def _listen(host: str, port: int, listen_fd: Optional[int]) -> socket.socket:
    """A listening socket on exactly ``host`` (all interfaces only for a wildcard)."""
    if listen_fd is not None:
        sock = socket.socket(fileno=listen_fd)
        try:
            sock.listen(1024)
        except OSError as exc:
            raise DistNetworkError(f"TCPStore: master_listen_fd={listen_fd} is not a "
                                   f"bound TCP socket: {exc}") from exc
        return sock
    bind_host = None if host in _WILDCARDS else host
    try:
        infos = socket.getaddrinfo(bind_host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise DistNetworkError(f"The server socket has failed to listen on any local "
                               f"network address. host: {host}, port: {port}: cannot "
                               f"resolve {host!r}: {exc}") from exc
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise DistNetworkError(f"The server socket has failed to listen on any local "
                               f"network address. host: {host}, port: {port}: "
                               f"{exc.strerror or exc}") from exc
    return sock


def _drop_ref(server: TCPStoreServer, blocking: bool) -> bool:
    """Release one handle's hold on ``server``; stop it with the last one. Returns
    False (nothing done) when ``blocking`` is False and the registry lock is busy."""
    if not _tenants_lock.acquire(blocking):
        return False
    try:
        server.refs -= 1
        last = server.refs == 0
        if last:
            for key, value in list(_tenants.items()):
                if value is server:
                    del _tenants[key]
            if _local_ports.get(server.port, 0) > 0:
                _local_ports[server.port] -= 1
    finally:
        _tenants_lock.release()
    if last:
        server.stop(join=blocking)
    return True


def _release_from_gc(server: TCPStoreServer) -> None:
    """The finalizer of a master handle: never blocks (see :mod:`._deferred`)."""
    _deferred.submit(lambda: _drop_ref(server, blocking=False))


class _Connection:
    """One synchronous client connection (reconnects after a failure).

    The socket stays in blocking mode with a kernel receive timeout of
    :data:`_SLICE_S`, so waiting for a reply is one ``recv`` call that releases the
    GIL, and a deadline is still checked at least every slice; a send that makes no
    progress for the store's timeout fails.
    """

    def __init__(self, host: str, port: int, secret: Optional[bytes],
                 connect_timeout: float, spin_s: float):
        self.host, self.port, self.secret = host, port, secret
        self.connect_timeout = connect_timeout
        self.spin_s = spin_s
        self.lock = threading.Lock()
        self.sock: Optional[socket.socket] = None
        self._poll = None
        self._connect()

    def _connect(self) -> None:
        deadline = time.monotonic() + self.connect_timeout
        delay = 0.01
        while True:
            try:
                sock = socket.create_connection(
                    (self.host, self.port), timeout=max(0.05, deadline - time.monotonic()))
                break
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise DistNetworkError(
                        f"The client socket has timed out after "
                        f"{int(self.connect_timeout * 1000)}ms while trying to connect to "
                        f"({self.host}, {self.port}): {exc}") from exc
                time.sleep(delay)  # the server may not be up yet: retry until the deadline
                delay = min(delay * 2, 1.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            sock, nonce = self._greet(sock)
            if nonce is not None:
                self._authenticate(sock, nonce)
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _SLICE)
            # a send that makes no progress for a whole store timeout fails
            stuck = max(1.0, self.connect_timeout)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                            struct.pack("ll", int(stuck), int((stuck % 1) * 1e6)))
        except BaseException:
            sock.close()
            raise
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        self.sock, self._poll = sock, poller.poll

    def _greet(self, sock: socket.socket) -> Tuple[socket.socket, Optional[bytes]]:
        """Read the server's hello; move to its local socket when reachable. Returns
        the socket to use and the nonce to answer (None: no authentication)."""
        nonce, local = self._hello(sock)
        if local and hasattr(socket, "AF_UNIX"):
            near = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                near.settimeout(sock.gettimeout())
                near.connect(local)
                nonce, _ = self._hello(near)
            except (OSError, DistNetworkError):
                near.close()  # another host or network namespace: stay on TCP
            else:
                sock.close()
                return near, nonce
        return sock, nonce

    def _hello(self, sock: socket.socket) -> Tuple[Optional[bytes], bytes]:
        try:
            hello = _recv_frame(sock)
        except (OSError, DistNetworkError) as exc:
            raise DistNetworkError(f"TCPStore: {self.host}:{self.port} did not greet as a "
                                   f"store server: {exc}") from exc
        try:
            return parse_hello(hello)
        except ValueError:
            raise DistNetworkError(f"TCPStore: {self.host}:{self.port} is not a store "
                                   "server") from None

    def _authenticate(self, sock: socket.socket, nonce: bytes) -> None:
        if self.secret is None:
            raise DistStoreError(f"TCPStore at {self.host}:{self.port} requires a shared "
                                 f"secret: pass token= or set {settings.STORE_TOKEN.name}")
        sock.sendall(frame(auth_digest(self.secret, nonce)))
        try:
            ack = _recv_frame(sock)
        except (OSError, DistNetworkError):
            ack = b""
        if ack != AUTH_OK:
            raise DistStoreError(f"TCPStore at {self.host}:{self.port} refused the shared "
                                 "secret")

    def request(self, framed: bytes, wait_s: float) -> Tuple[Status, List[bytes]]:
        """Send one framed request and return its decoded reply, within ``wait_s``."""
        with self.lock:
            sock = self.sock
            if sock is None:
                self._connect()
                sock = self.sock
            try:
                sock.sendall(framed)
                if self.spin_s:
                    self._spin()
                try:
                    data = sock.recv(_RECV_SIZE)
                except BlockingIOError:  # a receive-timeout slice passed
                    data = None
                else:  # the common replies, one unpack each
                    size = len(data)
                    if size >= 13:
                        flen, status, count, n = _unpack_reply_one(data)
                        if count == 1 and flen == size - 4 and n == size - 13 and status < 4:
                            return _STATUSES[status], [data[13:]]
                    elif size == 9:
                        flen, status, count = _unpack_reply_none(data)
                        if flen == 5 and not count and status < 4:
                            return _STATUSES[status], []
                return decode_reply(self._rest(sock, data, wait_s), 4)
            except BaseException as exc:
                self._drop()  # the stream is out of step now: reconnect next time
                if isinstance(exc, ProtocolError):
                    raise DistNetworkError(f"TCPStore: malformed reply from {self.host}:"
                                           f"{self.port}: {exc}") from exc
                if isinstance(exc, BlockingIOError):
                    raise DistStoreError(f"TCPStore: could not send to {self.host}:"
                                         f"{self.port} in time") from exc
                if isinstance(exc, OSError):
                    raise DistNetworkError(f"TCPStore: connection to {self.host}:"
                                           f"{self.port} failed: {exc}") from exc
                raise

    def _spin(self) -> None:
        """Poll for the reply for :attr:`spin_s` before the blocking receive; stop at
        once if the core turns out to be contended (see :mod:`._spin`)."""
        poll, monotonic, sched_yield = self._poll, time.monotonic, _spin.sched_yield
        last = monotonic()
        spin_end = last + self.spin_s
        while not poll(0):
            sched_yield()
            now = monotonic()
            if now > spin_end or now - last > _spin.PREEMPTED_S:
                return
            last = now

    def _rest(self, sock: socket.socket, data: Optional[bytes], wait_s: float) -> bytes:
        """Receive until ``data`` is one whole reply frame (the rare slow path: a reply
        that is parked on the server, large, or split). Pieces are joined once."""
        deadline = time.monotonic() + wait_s
        parts: List[bytes] = [data] if data else []
        have, need = len(data or b""), 0
        while True:
            if data is not None and not data:
                raise DistNetworkError(f"TCPStore: connection closed by the server "
                                       f"{self.host}:{self.port}")
            if not need and have >= 4:
                head = b"".join(parts)
                parts, need = [head], 4 + _unpack_len(head, 0)[0]
                if need > MAX_PAYLOAD + 4:
                    raise DistNetworkError(f"TCPStore: reply of {need} bytes exceeds the "
                                           "limit")
            if need and have >= need:
                if have > need:
                    raise ProtocolError("bytes after the reply")
                return parts[0] if len(parts) == 1 else b"".join(parts)
            try:
                data = sock.recv(min(need - have, 1 << 20) if need else _RECV_SIZE)
            except BlockingIOError:  # one receive-timeout slice passed
                if time.monotonic() >= deadline:
                    raise DistStoreError(f"TCPStore: no reply from {self.host}:{self.port} "
                                         f"within {wait_s:.0f}s") from None
                data = None
                continue
            if data:
                parts.append(data)
                have += len(data)

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock, self._poll = None, None

    def close(self) -> None:
        with self.lock:
            self._drop()

    def describe(self) -> str:
        """torch's shape: ``SocketImpl(fd=…, addr=…, remote=…)``."""
        sock = self.sock
        if sock is None:
            return "SocketImpl(closed)"
        if sock.family != socket.AF_UNIX:
            try:
                local, remote = _addr(sock.getsockname()), _addr(sock.getpeername())
            except OSError:
                return f"SocketImpl(fd={sock.fileno()})"
        else:  # moved to the server's local socket: show the TCP address it came by
            local, remote = "local", _addr((self.host, self.port))
        return f"SocketImpl(fd={sock.fileno()}, addr={local}, remote={remote})"


def _addr(address: tuple) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _recv_frame(sock: socket.socket) -> bytes:
    head = _recv_exact(sock, 4)
    (size,) = FRAME_HEAD.unpack(head)
    if size > MAX_PAYLOAD:
        raise DistNetworkError(f"TCPStore: frame of {size} bytes exceeds the limit")
    return _recv_exact(sock, size)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise DistNetworkError("TCPStore: connection closed by the server")
        got += k
    return bytes(buf)


class TCPStore(RequestStore):
    """A store served over TCP by the master process (torch's constructor signature).

    ``port=0`` on the master binds a free port (see :attr:`port`). ``world_size``
    with ``wait_for_workers`` makes the master's constructor wait until that many
    stores (itself included) have connected. ``multi_tenant`` lets several stores
    in one process share one server on the same port. ``token`` (or the
    ``HPCCOMM_STORE_TOKEN`` variable) turns on HMAC challenge authentication.
    ``use_libuv`` is accepted for compatibility and ignored. As in torch, a master
    whose port is the one torchelastic's agent serves (``TORCHELASTIC_USE_AGENT_STORE``
    set and ``MASTER_PORT`` equal to ``port``) connects to it instead of serving.
    """

    def __init__(self, host_name: str, port: int, world_size: Optional[int] = None,
                 is_master: bool = False, timeout: Timeout = DEFAULT_TIMEOUT,
                 wait_for_workers: bool = True, multi_tenant: bool = False,
                 master_listen_fd: Optional[int] = None, use_libuv: bool = True, *,
                 token: Union[str, bytes, None] = None) -> None:
        if not isinstance(host_name, str):
            raise TypeError(f"TCPStore host_name must be str, got {host_name!r}")
        port = _integer("port", port)
        if not 0 <= port <= 65535:
            raise TypeError(f"TCPStore port must be in 0..65535, got {port}")
        if world_size is not None:
            world_size = _integer("world_size", world_size)
            if world_size == 0:
                raise ValueError("TCPStore world size cannot be 0")
        is_master = _flag("is_master", is_master)
        wait_for_workers = _flag("wait_for_workers", wait_for_workers)
        multi_tenant = _flag("multi_tenant", multi_tenant)
        _flag("use_libuv", use_libuv)
        if master_listen_fd is not None:
            master_listen_fd = _integer("master_listen_fd", master_listen_fd)
        super().__init__(timeout)
        self._secret = _secret(token)
        self._server: Optional[TCPStoreServer] = None
        self._finalizer: Optional[weakref.finalize] = None
        self._host = host_name
        if is_master and _agent_serves(port):
            is_master = False
        if is_master:
            self._server = self._start_server(host_name, port, multi_tenant, master_listen_fd)
            port = self._server.port
            self._finalizer = weakref.finalize(self, _release_from_gc, self._server)
        self._port = port
        self._world_size = world_size
        self._client = self._connection()
        if world_size is not None and world_size > 0:
            self._join(world_size, is_master and wait_for_workers)

    def _connection(self) -> _Connection:
        connect_host = "127.0.0.1" if self._host in _WILDCARDS else self._host
        local = self._server is not None or _local_ports.get(self._port, 0) > 0
        return _Connection(connect_host, self._port, self._secret, self._timeout_s,
                           0.0 if local else _spin.CLIENT_SPIN_S)

    def _start_server(self, host: str, port: int, multi_tenant: bool,
                      listen_fd: Optional[int]) -> TCPStoreServer:
        with _tenants_lock:
            if multi_tenant and port and (host, port) in _tenants:
                server = _tenants[(host, port)]
                server.refs += 1
                return server
            server = TCPStoreServer(_listen(host, port, listen_fd), self._secret)
            if multi_tenant:
                _tenants[(host, server.port)] = server
            _local_ports[server.port] = _local_ports.get(server.port, 0) + 1
        _deferred.run()
        return server.start()  # outside the lock: the new thread may run finalizers

    def _join(self, world_size: int, wait: bool) -> None:
        if self.add(_JOINED, 1) == world_size:
            self.set(_ALL_JOINED, "1")
        if wait:
            try:
                self.wait([_ALL_JOINED])
            except DistStoreError:
                joined = int(self.get(_JOINED))
                raise DistStoreError(
                    f"Timed out after {self._timeout_s:.0f} seconds waiting for clients. "
                    f"{joined}/{world_size} clients joined.") from None

    def _call(self, op: int, fields: Sequence[bytes],
              timeout_s: Optional[float] = None) -> Tuple[Status, List[bytes]]:
        if timeout_s is None:
            return self._client.request(encode_framed_request(op, fields),
                                        self._timeout_s + _GRACE_S)
        return self._client.request(encode_framed_request(op, fields, milliseconds(timeout_s)),
                                    timeout_s + _GRACE_S)

    def _ok(self, op: int, fields: Sequence[bytes], timeout_s: Optional[float] = None,
            what: str = "") -> List[bytes]:
        # _call inlined: this is every request's path
        if timeout_s is None:
            status, out = self._client.request(encode_framed_request(op, fields),
                                               self._timeout_s + _GRACE_S)
        else:
            status, out = self._client.request(
                encode_framed_request(op, fields, milliseconds(timeout_s)), timeout_s + _GRACE_S)
        if status is _OK:
            return out
        raise self._error(status, out, what or op_name(op).lower(), timeout_s)

    def _where(self) -> str:
        return f"TCPStore {self._host}:{self._port}"

    @property
    def host(self) -> str:
        """The host name this store was given."""
        return self._host

    @property
    def port(self) -> int:
        """The port the server listens on (the real one when 0 was asked)."""
        return self._port

    @property
    def libuvBackend(self) -> bool:  # noqa: N802 (torch's name)
        """Always False: the server is hpccomm's own Python ``epoll`` loop."""
        return False

    def clone(self) -> "TCPStore":
        """A new connection to the same server (keeps the server alive while used)."""
        twin = TCPStore.__new__(TCPStore)
        Store.__init__(twin, self._timeout_s)
        twin._secret, twin._host, twin._port = self._secret, self._host, self._port
        twin._world_size = self._world_size
        twin._server, twin._finalizer = self._server, None
        if self._server is not None:  # the server lives until its last handle is closed
            with _tenants_lock:
                self._server.refs += 1
            _deferred.run()
            twin._finalizer = weakref.finalize(twin, _release_from_gc, self._server)
        twin._client = twin._connection()
        return twin

    def close(self) -> None:
        """Close this client; the master also stops its server (unless others share it)."""
        self._client.close()
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None and finalizer.detach() is not None:
            _drop_ref(self._server, blocking=True)
        _deferred.run()

    def __repr__(self) -> str:
        server = (f"TCPServer(port={self._port})" if self._finalizer is not None
                  else "<nullptr>")
        return f"TCPStore(client=TCPClient({self._client.describe()}), server={server})"
