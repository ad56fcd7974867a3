"""``FileStore``: a store kept in one file, shared by processes through ``fcntl`` locks.

Each request takes an exclusive POSIX record lock (``lockf``, which NFS and Lustre
honour), reads the file, applies the request with the shared state machine, writes
the file back if it changed and unlocks. Blocking requests poll with a growing
back-off (1 ms to 50 ms). The kernel drops the lock of a process that dies, so a
crashed user never leaves the file locked.

The file also records its membership: the ``world_size`` it was made for, how many
users joined, and who is attached now (``host:pid:nonce``). Joining a file whose
listed users are dead processes on this host, whose job already had all its
``world_size`` users, or which was made for another ``world_size`` raises
:class:`DistStoreError` naming the stale file, instead of silently mixing two jobs
or waiting forever. The last user to leave (once all expected users joined)
deletes the file.

A *user* is a process: every ``FileStore`` a process opens on one file shares the
process's membership (as torch's FileStore counts references), so a process may open
the same file any number of times; it leaves when its last handle is closed or
garbage-collected.
"""
from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from hpccomm.errors import DistStoreError
from hpccomm.stores._deferred import Deferred
from hpccomm.stores._state import PENDING, KVState
from hpccomm.stores._wire import Op, ProtocolError, Status, pack_fields, unpack_fields
from hpccomm.stores.base import RequestStore, Store

MAGIC = b"HPCCOMM-FILESTORE-2\n"
_LOCK_TIMEOUT_S = 60.0
#: POSIX locks belong to the process: threads of one process take this first.
_thread_locks: Dict[str, threading.Lock] = {}
_thread_locks_lock = threading.Lock()
#: This process's membership of each file, by ``(path, pid)``; guarded (with every
#: membership's ``refs``) by ``_registry_lock``, which finalizers only ever try.
_memberships: Dict[Tuple[str, int], "_Membership"] = {}
_registry_lock = threading.Lock()
_deferred = Deferred()


def _thread_lock(path: str) -> threading.Lock:
    with _thread_locks_lock:
        return _thread_locks.setdefault(path, threading.Lock())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Image:
    """The decoded file: membership plus the key-value state."""

    def __init__(self, world_size: int, joined: int, members: List[bytes], state: KVState):
        self.world_size, self.joined, self.members, self.state = (world_size, joined,
                                                                  members, state)

    def encode(self) -> bytes:
        head = [str(self.world_size).encode(), str(self.joined).encode(),
                str(len(self.members)).encode(), *self.members]
        return MAGIC + pack_fields(head + self.state.to_fields())

    @classmethod
    def decode(cls, data: bytes, path: str) -> "_Image":
        if not data:
            return cls(-1, 0, [], KVState())
        try:
            if not data.startswith(MAGIC):
                raise ValueError("missing header")
            fields = unpack_fields(data[len(MAGIC):])
            n = int(fields[2])
            return cls(int(fields[0]), int(fields[1]), list(fields[3:3 + n]),
                       KVState.from_fields(fields[3 + n:]))
        except (ValueError, IndexError, ProtocolError) as exc:
            raise DistStoreError(f"FileStore: {path} is not a FileStore file or is "
                                 f"corrupt ({exc}); remove it and retry") from None


class _Membership:
    """This process's attachment to the file: the fd, the lock, the member id."""

    def __init__(self, path: str, world_size: int, lock_timeout_s: float) -> None:
        self.path = path
        self.lock_timeout_s = lock_timeout_s
        self.thread_lock = _thread_lock(path)
        self.member = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}".encode()
        self.fd = -1
        self.closed = False
        self.world_size = world_size
        self.refs = 1
        try:
            with self.locked() as image:
                self._admit(image, world_size)
                image.world_size = world_size if image.world_size <= 0 else image.world_size
                image.joined += 1
                image.members.append(self.member)
                self.write(image)
        except BaseException:
            if self.fd >= 0:
                os.close(self.fd)
            raise

    def _admit(self, image: _Image, world_size: int) -> None:
        host = socket.gethostname()
        for member in image.members:
            m_host, m_pid, _ = (member.decode("utf-8", "replace").split(":", 2) + ["", ""])[:3]
            if m_host == host and m_pid.isdigit() and not _pid_alive(int(m_pid)):
                raise DistStoreError(
                    f"FileStore: {self.path} is stale: it lists process {m_pid} on {host}, "
                    "which is no longer running (left over from an earlier job?); remove "
                    "the file and retry")
        if world_size > 0 and image.world_size > 0:
            if image.world_size != world_size:
                raise DistStoreError(
                    f"FileStore: {self.path} was made for world_size={image.world_size}, "
                    f"not {world_size} (stale file from another job?); remove it and retry")
            if image.joined >= world_size:
                raise DistStoreError(
                    f"FileStore: all {world_size} users of {self.path} already joined; the "
                    "file is stale (left over from an earlier job?); remove it and retry")

    def _open(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

    @contextmanager
    def locked(self) -> Iterator[_Image]:
        """Hold the file lock and yield its decoded content."""
        deadline = time.monotonic() + self.lock_timeout_s
        with self.thread_lock:
            if self.closed:
                raise DistStoreError(f"FileStore: {self.path} was closed")
            delay = 0.0005
            while True:
                if self.fd < 0:
                    self._open()
                try:
                    fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    if time.monotonic() > deadline:
                        raise DistStoreError(f"FileStore: could not lock {self.path} within "
                                             f"{self.lock_timeout_s:.0f}s") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.05)
                    continue
                if self._same_file():
                    break
                # the last user deleted the file between our open and lock: reopen
                fcntl.lockf(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
                self.fd = -1
            try:
                size = os.fstat(self.fd).st_size
                yield _Image.decode(os.pread(self.fd, size, 0) if size else b"", self.path)
            finally:
                fcntl.lockf(self.fd, fcntl.LOCK_UN)
        if _deferred:
            _deferred.run()  # releases a finalizer could not do while we held the lock

    def _same_file(self) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(self.fd).st_ino
        except (FileNotFoundError, OSError):
            return False

    def usable(self) -> bool:
        """Whether a new handle may share this membership (still attached to the file)."""
        return not self.closed and self.fd >= 0 and self._same_file()

    def write(self, image: _Image) -> None:
        data = image.encode()
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def leave(self, blocking: bool = True) -> bool:
        """Detach; delete the file if this was the last expected user. With
        ``blocking=False`` do nothing and return False while another thread is inside
        an operation on the file (a finalizer must not wait for it)."""
        if self.closed:
            return True
        if not blocking and self.thread_lock.locked():
            return False
        try:
            with self.locked() as image:
                if self.member in image.members:
                    image.members.remove(self.member)
                if not image.members and (image.world_size <= 0
                                          or image.joined >= image.world_size):
                    os.unlink(self.path)
                else:
                    self.write(image)
        except (OSError, DistStoreError):
            pass  # best effort: the file may be gone already
        finally:
            with self.thread_lock:
                self.closed = True
                if self.fd >= 0:
                    os.close(self.fd)
                    self.fd = -1
        return True


def _attach(path: str, world_size: int) -> _Membership:
    """This process's membership of ``path``: the existing one, or a new join."""
    key = (path, os.getpid())
    try:
        with _registry_lock:
            member = _memberships.get(key)
            if member is not None and member.usable():
                if world_size > 0 and member.world_size > 0 and world_size != member.world_size:
                    raise DistStoreError(
                        f"FileStore: {path} is open in this process with world_size="
                        f"{member.world_size}, not {world_size}")
                member.refs += 1
                return member
            member = _Membership(path, world_size, _LOCK_TIMEOUT_S)
            _memberships[key] = member
            return member
    finally:
        _deferred.run()


def _detach(member: _Membership, blocking: bool) -> bool:
    """Drop one handle of ``member``; the last one leaves the file. Returns False
    (nothing done) when ``blocking`` is False and a lock is busy."""
    if not _registry_lock.acquire(blocking):
        return False
    try:
        member.refs -= 1
        last = member.refs == 0
        if last and _memberships.get((member.path, os.getpid())) is member:
            del _memberships[(member.path, os.getpid())]
    finally:
        _registry_lock.release()
    if last:
        if blocking:
            member.leave()
        else:
            _deferred.submit(lambda: member.leave(blocking=False))
    return True


def _detach_from_gc(member: _Membership) -> None:
    """The finalizer of a handle: never blocks (see :mod:`._deferred`)."""
    _deferred.submit(lambda: _detach(member, blocking=False))


class FileStore(RequestStore):
    """A store in the file ``file_name`` for ``world_size`` processes (-1: unknown)."""

    def __init__(self, file_name: str, world_size: int = -1) -> None:
        if not isinstance(file_name, (str, os.PathLike)):
            raise TypeError(f"FileStore file_name must be str, got {file_name!r}")
        if isinstance(world_size, bool) or not hasattr(world_size, "__index__"):
            raise TypeError(f"FileStore world_size must be an integer, got {world_size!r}")
        super().__init__()
        self._path = os.path.abspath(os.fspath(file_name))
        self._world_size = world_size.__index__()
        self._member = _attach(self._path, self._world_size)
        self._finalizer = weakref.finalize(self, _detach_from_gc, self._member)

    @property
    def path(self) -> str:
        """The file holding the store."""
        return self._path

    def _where(self) -> str:
        return f"FileStore {self._path}"

    def _call(self, op: Op, fields: Sequence[bytes],
              timeout_s: Optional[float] = None) -> Tuple[Status, List[bytes]]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delay = 0.001
        while True:
            with self._member.locked() as image:
                before = image.state.version
                result = image.state.apply(op, fields)
                if image.state.version != before:
                    self._member.write(image)
                if result is not PENDING:
                    return result
                if deadline is not None and time.monotonic() >= deadline:
                    return Status.TIMEOUT, image.state.missing(op, fields)
            pause = delay if deadline is None else min(delay, deadline - time.monotonic())
            time.sleep(max(pause, 0.0))
            delay = min(delay * 1.5, 0.05)

    def clone(self) -> "FileStore":
        """Another handle on the file; the process leaves when all handles are closed."""
        twin = FileStore.__new__(FileStore)
        Store.__init__(twin, self._timeout_s)
        twin._path, twin._world_size, twin._member = self._path, self._world_size, self._member
        with _registry_lock:
            self._member.refs += 1
        _deferred.run()
        twin._finalizer = weakref.finalize(twin, _detach_from_gc, self._member)
        return twin

    def close(self) -> None:
        """Close this handle; the last user of the file deletes it (idempotent)."""
        if self._finalizer.detach() is not None:
            _detach(self._member, blocking=True)
        _deferred.run()

    def __repr__(self) -> str:
        return f"<FileStore {self._path} world_size={self._world_size}>"
