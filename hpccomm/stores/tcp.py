"""``TCPStore``: torch's TCP key-value store, with a Python server thread.

The master process (``is_master=True``) starts a :class:`TCPStoreServer` thread
bound to ``host_name`` (only that interface; ``""``/``"0.0.0.0"``/``"::"`` mean all)
and every process, the master included, talks to it as a client over one TCP
connection. With a shared secret (``token=`` or ``HPCCOMM_STORE_TOKEN``) the server
challenges every connection and refuses clients that cannot answer.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import weakref
from typing import Dict, List, Optional, Sequence, Tuple, Union

from hpccomm.errors import DistNetworkError, DistStoreError
from hpccomm.stores._state import INTERNAL_PREFIX
from hpccomm.stores._wire import (FRAME_HEAD, MAX_PAYLOAD, Op, ProtocolError, Status,
                                  decode_reply, encode_request, frame)
from hpccomm.stores.base import DEFAULT_TIMEOUT, Store, Timeout, _ms
from hpccomm.stores.tcp_server import AUTH_OK, HELLO_MAGIC, TCPStoreServer, auth_digest

TOKEN_ENV = "HPCCOMM_STORE_TOKEN"
_WILDCARDS = ("", "0.0.0.0", "::", "*")
#: Extra seconds a client waits beyond a request's own timeout before giving up
#: on the server (the server answers timeouts itself).
_GRACE_S = 30.0
_JOINED = (INTERNAL_PREFIX + b"workers").decode()
_ALL_JOINED = (INTERNAL_PREFIX + b"workers_all").decode()

_tenants: Dict[Tuple[str, int], TCPStoreServer] = {}
_tenants_lock = threading.Lock()


def _secret(token: Union[str, bytes, None]) -> Optional[bytes]:
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if isinstance(token, str):
        token = token.encode("utf-8")
    return token


def _listen(host: str, port: int, listen_fd: Optional[int]) -> socket.socket:
    """A listening socket on exactly ``host`` (all interfaces only for a wildcard)."""
    if listen_fd is not None:
        return socket.socket(fileno=listen_fd)
    bind_host = None if host in _WILDCARDS else host
    try:
        infos = socket.getaddrinfo(bind_host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise DistNetworkError(f"TCPStore: cannot resolve host {host!r}: {exc}") from exc
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise DistNetworkError(f"TCPStore: cannot listen on {host}:{port}: {exc}") from exc
    return sock


def _release(server: TCPStoreServer) -> None:
    with _tenants_lock:
        server.refs -= 1
        if server.refs > 0:
            return
        for key, value in list(_tenants.items()):
            if value is server:
                del _tenants[key]
    server.stop()


class _Client:
    """One synchronous connection to the server (reconnects after a failure)."""

    def __init__(self, host: str, port: int, secret: Optional[bytes], connect_timeout: float):
        self.host, self.port, self.secret = host, port, secret
        self.connect_timeout = connect_timeout
        self.lock = threading.Lock()
        self.sock: Optional[socket.socket] = None
        self._connect()

    def _connect(self) -> None:
        deadline = time.monotonic() + self.connect_timeout
        delay = 0.01
        while True:
            try:
                sock = socket.create_connection((self.host, self.port),
                                                timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise DistNetworkError(
                        f"TCPStore: cannot connect to {self.host}:{self.port} within "
                        f"{self.connect_timeout:.0f}s: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            hello = self._recv(sock)
            if not hello.startswith(HELLO_MAGIC) or len(hello) < len(HELLO_MAGIC) + 1:
                raise DistNetworkError(f"TCPStore: {self.host}:{self.port} is not a store")
            if hello[len(HELLO_MAGIC)] == 1:
                if self.secret is None:
                    raise DistStoreError(
                        f"TCPStore at {self.host}:{self.port} requires a shared secret: pass "
                        f"token= or set {TOKEN_ENV}")
                sock.sendall(frame(auth_digest(self.secret, hello[len(HELLO_MAGIC) + 1:])))
                try:
                    ack = self._recv(sock)
                except DistNetworkError:
                    ack = b""
                if ack != AUTH_OK:
                    raise DistStoreError(f"TCPStore at {self.host}:{self.port} refused "
                                         "the shared secret")
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    @staticmethod
    def _recv(sock: socket.socket) -> bytes:
        head = _recv_exact(sock, FRAME_HEAD.size)
        (size,) = FRAME_HEAD.unpack(head)
        if size > MAX_PAYLOAD:
            raise DistNetworkError(f"TCPStore: reply of {size} bytes exceeds the limit")
        return _recv_exact(sock, size)

    def request(self, payload: bytes, wait_s: float) -> bytes:
        with self.lock:
            if self.sock is None:
                self._connect()
            sock = self.sock
            try:
                sock.settimeout(wait_s)
                sock.sendall(frame(payload))
                return self._recv(sock)
            except (OSError, DistNetworkError) as exc:
                sock.close()  # the stream is out of step now: reconnect next time
                self.sock = None
                if isinstance(exc, socket.timeout):
                    raise DistStoreError(f"TCPStore: no reply from {self.host}:{self.port} "
                                         f"within {wait_s:.0f}s") from exc
                if isinstance(exc, DistNetworkError):
                    raise
                raise DistNetworkError(f"TCPStore: connection to {self.host}:{self.port} "
                                       f"failed: {exc}") from exc

    def close(self) -> None:
        with self.lock:
            if self.sock is not None:
                self.sock.close()
                self.sock = None


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


class TCPStore(Store):
    """A store served over TCP by the master process (torch's constructor signature).

    ``port=0`` on the master binds a free port (see :attr:`port`). ``world_size``
    with ``wait_for_workers`` makes the master's constructor wait until that many
    stores (itself included) have connected. ``multi_tenant`` lets several stores
    in one process share one server on the same port. ``token`` (or the
    ``HPCCOMM_STORE_TOKEN`` variable) turns on HMAC challenge authentication.
    ``use_libuv`` is accepted for compatibility and ignored.
    """

    def __init__(self, host_name: str, port: int, world_size: Optional[int] = None,
                 is_master: bool = False, timeout: Timeout = DEFAULT_TIMEOUT,
                 wait_for_workers: bool = True, multi_tenant: bool = False,
                 master_listen_fd: Optional[int] = None, use_libuv: bool = True, *,
                 token: Union[str, bytes, None] = None) -> None:
        super().__init__(timeout)
        self._secret = _secret(token)
        self._server: Optional[TCPStoreServer] = None
        self._host = host_name
        if is_master:
            self._server = self._start_server(host_name, port, multi_tenant, master_listen_fd)
            port = self._server.address[1]
            self._finalizer = weakref.finalize(self, _release, self._server)
        self._port = int(port)
        self._world_size = world_size
        connect_host = "127.0.0.1" if host_name in _WILDCARDS else host_name
        self._client = _Client(connect_host, self._port, self._secret, self._timeout_s)
        if world_size is not None and world_size > 0:
            self._join(world_size, is_master and wait_for_workers)

    def _start_server(self, host: str, port: int, multi_tenant: bool,
                      listen_fd: Optional[int]) -> TCPStoreServer:
        with _tenants_lock:
            if multi_tenant and port and (host, port) in _tenants:
                server = _tenants[(host, port)]
                server.refs += 1
                return server
            server = TCPStoreServer(_listen(host, port, listen_fd), self._secret)
            if multi_tenant:
                _tenants[(host, server.address[1])] = server
            return server

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

    def _call(self, op: Op, fields: Sequence[bytes],
              timeout_s: Optional[float] = None) -> Tuple[Status, List[bytes]]:
        payload = encode_request(op, fields, _ms(timeout_s))
        wait = (self._timeout_s if timeout_s is None else timeout_s) + _GRACE_S
        try:
            return decode_reply(self._client.request(payload, wait))
        except ProtocolError as exc:
            self._client.close()
            raise DistNetworkError(f"TCPStore: malformed reply: {exc}") from exc

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
        """Always False: the server is a Python ``selectors`` loop."""
        return False

    def clone(self) -> "TCPStore":
        """A new connection to the same server (keeps the server alive while used)."""
        twin = TCPStore.__new__(TCPStore)
        Store.__init__(twin, self._timeout_s)
        twin._secret, twin._host, twin._port = self._secret, self._host, self._port
        twin._world_size = self._world_size
        twin._server = self._server
        if self._server is not None:  # the server lives until its last handle is closed
            with _tenants_lock:
                self._server.refs += 1
            twin._finalizer = weakref.finalize(twin, _release, self._server)
        twin._client = _Client(self._client.host, self._port, self._secret, self._timeout_s)
        return twin

    def close(self) -> None:
        """Close this client; the master also stops its server (unless others share it)."""
        self._client.close()
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

    def __repr__(self) -> str:
        role = "master" if getattr(self, "_finalizer", None) else "client"
        return f"<TCPStore {role} {self._host}:{self._port}>"
