"""``MPIStore``: the store API over an MPI communicator, served by its rank 0.

This is the default store of a job started by ``mpiexec``/``srun``: it needs no
port, no file and no address exchange. Construction is collective: every rank
duplicates the communicator (so store traffic never matches the user's messages),
and rank 0 starts a daemon thread that serves requests with the same
:class:`~hpccomm.stores._core.StoreCore` as the TCPStore server. Requests and replies
are the byte payloads of :mod:`hpccomm.stores._wire` sent as ``MPI.BYTE`` messages;
each store handle (``clone()`` included) talks on its own tag, so a handle blocked in
``get`` in one thread never holds up another handle.

How it waits. MPI has no blocking receive that does not busy-poll a core (MPICH's
does), and rank 0's server thread shares the GIL with rank 0's own work, so the
server must neither block in MPI nor spin for ever:

* after each request it keeps polling (``Improbe`` and ``sched_yield``) for
  :data:`~hpccomm.stores._spin.SERVER_SPIN_S`, so a burst of requests (start-up,
  barriers through the store) is served without any sleep. Unlike the TCP side it keeps
  yielding even when the core is contended: the alternative is a timer sleep, which on
  a busy node costs far more latency than a yield that lets the other ranks run;
* then it sleeps between polls, from 50 µs growing to :data:`_IDLE_SLEEP_S`, so an
  idle job pays about a hundred short wake-ups per second on rank 0 and nothing on
  the other ranks.

Rank 0's own requests do not travel through MPI at all: they are applied to the
server's state directly, under the lock the server thread takes for each request. A
client rank polls for its reply for :data:`~hpccomm.stores._spin.CLIENT_SPIN_S`, then
sleeps between polls (growing to 1 ms) until the request's deadline. Importing this
module imports ``mpi4py.MPI``.
"""
from __future__ import annotations

import atexit
import collections
import itertools
import logging
import threading
import time
from typing import Any, Callable, Deque, List, Optional, Sequence, Tuple

from hpccomm import mpi_level

mpi_level.prepare()  # the level HPCCOMM_MPI_THREAD_LEVEL names, if MPI starts here
from mpi4py import MPI  # noqa: E402

from hpccomm.errors import DistError, DistStoreError
from hpccomm.stores import _spin
from hpccomm.stores._core import Outgoing, StoreCore
from hpccomm.stores._wire import (Op, ProtocolError, Status, decode_reply, encode_reply,
                                  encode_request)
from hpccomm.stores.base import DEFAULT_TIMEOUT, RequestStore, Store, Timeout, milliseconds
from hpccomm.stores.tcp import TCPStore
from hpccomm.types import timeout_seconds

log = logging.getLogger("hpccomm.stores")

#: Longest sleep of an idle server between two polls.
_IDLE_SLEEP_S = 10e-3
#: Longest sleep of a client between two polls for its reply.
_CLIENT_SLEEP_S = 1e-3
_MIN_SLEEP_S = 50e-6
#: Extra seconds a client waits beyond a request's own timeout (the server answers
#: timeouts itself; this only catches a server that is gone).
_GRACE_S = 30.0
#: Tags of this process's handles; tag 0 is never used.
_tags = itertools.count(1)
_tag_lock = threading.Lock()


def _new_tag() -> int:
    upper = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767
    with _tag_lock:
        return 1 + (next(_tags) - 1) % (upper - 1)


def _wait_request(request: MPI.Request, seconds: float, what: str,
                  store: str = "MPIStore") -> None:
    """Poll ``request`` until it completes; ``DistStoreError`` after ``seconds``, naming
    the ``store`` and ``what`` it waited for."""
    now = time.monotonic()
    deadline, spin_end = now + seconds, now + _spin.CLIENT_SPIN_S
    delay = _MIN_SLEEP_S
    while not request.Test():
        now = time.monotonic()
        if now < spin_end:
            _spin.sched_yield()
            continue
        if now > deadline:
            raise DistStoreError(f"{store}: {what} did not complete within {seconds:g}s "
                                 "(does every rank of the communicator take part?)")
        time.sleep(delay)
        delay = min(delay * 2, _CLIENT_SLEEP_S)


def _rank_failed(comm: MPI.Intracomm, exc: MPI.Exception) -> bool:
    """Whether ``exc`` says a rank of ``comm`` died (MPI with ULFM); if so the failure is
    acknowledged, so that receives from any source work again among the survivors."""
    failures = {getattr(MPI, name, None) for name in ("ERR_PROC_FAILED",
                                                      "ERR_PROC_FAILED_PENDING")}
    if exc.Get_error_class() not in failures or not hasattr(comm, "Ack_failed"):
        return False
    log.info("MPIStore: a rank of the store's communicator failed; serving the others")
    comm.Ack_failed()
    return True


class _Local:
    """A request of rank 0 itself, parked in the core until its reply comes."""

    __slots__ = ("reply", "done")

    def __init__(self) -> None:
        self.reply: Optional[bytes] = None
        self.done = threading.Event()


class _Server:
    """Rank 0's serving thread and the state it serves."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.comm = comm
        self.core = StoreCore(default_timeout_s=None)
        self.lock = threading.Lock()  # the core, for the thread and rank 0's own calls
        self.sends: Deque[Tuple[MPI.Request, bytes]] = collections.deque()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="hpccomm-mpistore", daemon=True)
        self.thread.start()

    # -- rank 0's own requests -------------------------------------------------------
    def local(self, payload: bytes, limit: float) -> bytes:
        """Apply one request of rank 0 and return its reply (waiting if it parks)."""
        me = _Local()
        with self.lock:
            reply = self.core.submit(me, payload)
            out = self._take_outbox()
        if out:
            self._deliver(out)
        if reply is not None:
            return reply
        if not me.done.wait(limit):
            with self.lock:
                self.core.drop(me)
            if me.reply is None:
                raise DistStoreError(f"MPIStore: no reply from the store within "
                                     f"{limit:.0f}s (is its server thread alive?)")
        return me.reply

    def _take_outbox(self) -> Outgoing:
        out = self.core.outbox
        if out:
            self.core.outbox = []
        return out

    # -- the serving thread ----------------------------------------------------------
    def _deliver(self, out: Outgoing) -> None:
        """Hand replies to their requesters: rank 0's own ones directly, others by MPI."""
        for token, reply in out:
            if type(token) is _Local:
                token.reply = reply
                token.done.set()
            else:
                self._send(token, reply)

    def _send(self, token: Tuple[int, int], reply: bytes) -> None:
        source, tag = token
        self.sends.append((self.comm.Isend([reply, MPI.BYTE], source, tag), reply))

    def _run(self) -> None:
        monotonic, sched_yield, sleep = time.monotonic, _spin.sched_yield, time.sleep
        helper, status = mpi_level.helper_lock, MPI.Status()
        spin_s = _spin.SERVER_SPIN_S
        spin_until, delay = 0.0, _MIN_SLEEP_S
        try:
            while not self.stopping:
                with helper:  # never inside MPI while an agreement progresses
                    served = self._round(status)
                now = monotonic()
                if served:
                    spin_until, delay = now + spin_s, _MIN_SLEEP_S
                    continue
                if now < spin_until:
                    sched_yield()
                    continue
                sleep(delay)
                delay = min(delay * 2, _IDLE_SLEEP_S)
        except Exception:  # the thread must never die silently
            log.exception("MPIStore server thread failed")
        finally:
            self._finish_sends()

    def _round(self, status: MPI.Status) -> bool:
        """One round of the server's MPI calls: serve the request that came (true), else
        deliver the replies whose waits expired and test those in flight."""
        comm, core = self.comm, self.core
        try:
            msg = comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        except MPI.Exception as exc:
            if not _rank_failed(comm, exc):
                raise
            return True  # acknowledged: go on serving the live ranks
        now = time.monotonic()
        if msg is not None:
            buf = bytearray(status.Get_count(MPI.BYTE))
            token = (status.Get_source(), status.Get_tag())
            msg.Recv([buf, MPI.BYTE])
            with self.lock:
                try:
                    reply = core.submit(token, bytes(buf), now)
                except ProtocolError as exc:  # ranks are trusted: answer, don't drop
                    reply = encode_reply(Status.ERROR, [str(exc).encode()])
                out = self._take_outbox()
            if reply is not None:
                self._send(token, reply)
            if out:
                self._deliver(out)
            return True
        if core.due(now):
            with self.lock:
                out = core.expire(now)
            self._deliver(out)
        if self.sends:
            self._test_sends()
        return False

    def _test_sends(self) -> None:
        sends = self.sends
        for _ in range(len(sends)):
            request, reply = sends.popleft()
            if not request.Test():
                sends.append((request, reply))

    def _finish_sends(self, seconds: float = 5.0) -> None:
        """Give the last replies time to leave (they usually completed long ago)."""
        deadline = time.monotonic() + seconds
        while self.sends and time.monotonic() < deadline:
            with mpi_level.helper_lock:
                self._test_sends()
            if self.sends:
                time.sleep(_MIN_SLEEP_S)

    def stop(self) -> None:
        """Stop the thread (local, idempotent)."""
        self.stopping = True
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=10)


class _Shared:
    """What an MPIStore and its clones share: the communicator and rank 0's server."""

    def __init__(self, comm: MPI.Intracomm, server: Optional[_Server], timeout_s: float):
        self.comm = comm
        self.server = server
        self.timeout_s = timeout_s
        self.closed = False
        self.close_lock = threading.Lock()

    def _retire(self) -> bool:
        """Mark the store closed (once: ``False`` if it already was) and forget it."""
        with self.close_lock:
            if self.closed:
                return False
            self.closed = True
        if self in _open:
            _open.remove(self)
        return True

    def close(self) -> None:
        """Collective shutdown: every rank done with its requests, then stop and free
        (once every rank came: see :func:`_close_collectively`)."""
        if not self._retire():
            return

        def stop() -> None:
            if self.server is not None:
                self.server.stop()
        _close_collectively(self.comm, stop, self.timeout_s, "MPIStore")

    def abandon(self) -> None:
        """Forget the store without a collective close (a member died): stop rank 0's
        server thread here, and never wait for the communicator again."""
        if self._retire() and self.server is not None:
            self.server.stop()


#: Stores not closed yet (MPIStores' shared state, JobTCPStores), in creation order (the
#: same on every rank).
_open: List[Any] = []
#: Collective closes still waiting for ranks that came later than the store's timeout:
#: ``(barrier request, communicator, stop, store's name, timeout)``.
_closing: List[Tuple[Any, Any, Callable[[], None], str, float]] = []


def _close_collectively(comm: Any, stop: Callable[[], None], seconds: float,
                        store: str) -> None:
    """A store's collective close: a barrier of ``comm`` (every rank done with its
    requests), then ``stop()`` (rank 0 stops serving) and ``comm`` freed.

    A rank that reaches its close later than ``seconds`` after this one (a rank late to
    ``destroy_process_group``) is no failure: this rank goes on, and the close finishes
    once that rank came (tested whenever a store is made or closed, waited for at exit;
    rank 0 serves until then). Only a rank that has not come by the end of the process
    is reported (:func:`_close_at_exit`)."""
    _reap_closes()
    try:
        request = comm.Ibarrier()
        try:
            _wait_request(request, seconds, "close (a barrier)", store)
        except DistStoreError:  # late, not lost: finished when it comes
            _closing.append((request, comm, stop, store, seconds))
            return
    except MPI.Exception as exc:  # a rank died (MPI with ULFM): nobody left to wait for
        log.info("%s: closed without the other ranks: %s", store,
                 exc.Get_error_string().strip())
    stop()
    comm.Free()


def _reap_closes() -> None:
    """Finish the pending closes whose late ranks have come (one test each)."""
    for entry in list(_closing):
        try:
            done = entry[0].Test()
        except MPI.Exception:  # a rank died (ULFM): nobody left to wait for
            done = True
        if done:
            _closing.remove(entry)
            entry[2]()
            entry[1].Free()


@atexit.register
def _close_at_exit() -> None:
    """Close forgotten stores before mpi4py finalizes MPI (atexit is LIFO, so this runs
    first), and finish the closes that waited for late ranks. Collective like
    MPI_Finalize itself: rank 0 keeps serving until every rank has reached exit (or its
    close), so no rank loses the answer to its last request."""
    for shared in list(_open):
        if MPI.Is_finalized():
            return
        try:
            shared.close()
        except DistStoreError as exc:
            log.warning("%s", exc)
    while _closing and not MPI.Is_finalized():
        request, comm, stop, store, seconds = _closing.pop(0)
        try:
            _wait_request(request, seconds, "close", store)
        except DistStoreError:  # the communicator stays, its barrier pending: freeing it
            stop()              # with an operation in flight crashes Open MPI's finalize
            log.warning(
                "hpccomm: %s: this rank exits, but other ranks never closed the store "
                "(by destroy_process_group() or at their exit) within %gs of its close "
                "and %gs more at its exit: a rank that never got there is stuck or "
                "gone, and its own output says where; the store stops serving now",
                store, seconds, seconds)
            continue
        except MPI.Exception:  # a rank died (ULFM)
            pass
        stop()
        comm.Free()


def job_store(comm: Optional[Any] = None, timeout: Timeout = DEFAULT_TIMEOUT) -> RequestStore:
    """The store of a job over ``comm`` (default ``MPI.COMM_WORLD``), collective: an
    :class:`MPIStore` when MPI runs at MPI_THREAD_MULTIPLE, else a :class:`JobTCPStore`
    (rank 0's server thread may not call MPI below that level)."""
    _reap_closes()
    if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
        return MPIStore(comm, timeout)
    return JobTCPStore(comm, timeout)


#: Bytes of the host, port and token rank 0 broadcasts for a :class:`JobTCPStore`.
_ADDRESS_BYTES = 512


class JobTCPStore(TCPStore):
    """The job's store where MPI runs below MPI_THREAD_MULTIPLE: rank 0 of ``comm``
    serves a TCPStore on a free port of its host, with a random access token, and the
    address and token reach the other ranks over MPI, so nothing needs ``MASTER_ADDR``.
    Construction and :meth:`close` are collective, as :class:`MPIStore`'s."""

    def __init__(self, comm: Optional[Any] = None, timeout: Timeout = DEFAULT_TIMEOUT) -> None:
        import secrets
        import socket

        base = MPI.COMM_WORLD if comm is None else comm
        seconds = timeout_seconds(timeout, DEFAULT_TIMEOUT.total_seconds())
        dup, request = base.Idup()  # for the collective close, apart from the user's
        _wait_request(request, seconds, "construction (duplicating the communicator)",
                      "JobTCPStore")
        address = bytearray(_ADDRESS_BYTES)
        rank = dup.Get_rank()
        master = rank == 0
        if master:  # every interface: the host name may resolve to loopback here
            token = secrets.token_hex(16)
            super().__init__("", 0, None, is_master=True, timeout=timeout,
                             wait_for_workers=False, token=token)
            host, port = socket.gethostname(), self.port
            address[:] = f"{host} {port} {token}".encode().ljust(_ADDRESS_BYTES, b"\0")
        _wait_request(dup.Ibcast([address, MPI.BYTE], 0), seconds,
                      "construction (rank 0 telling the store's address)", "JobTCPStore")
        error: Optional[DistError] = None
        if not master:
            host, port, token = address.rstrip(b"\0").decode().split()
            try:
                super().__init__(host, int(port), None, is_master=False, timeout=timeout,
                                 token=token)
            except DistError as exc:
                error = exc
        # every rank learns who could not connect, so that all raise, none waits for ever
        mine, every = bytearray([error is not None]), bytearray(dup.Get_size())
        _wait_request(dup.Iallgather([mine, MPI.BYTE], [every, MPI.BYTE]), seconds,
                      "construction (ranks agreeing that they reached the store)",
                      "JobTCPStore")
        failed = [rank for rank, bad in enumerate(every) if bad]
        if failed:
            if master:
                super().close()
            dup.Free()
            why = (f"the job's store, which rank 0 serves over TCP because MPI runs below "
                   f"MPI_THREAD_MULTIPLE, at {host}:{port}; let every node reach {host} by "
                   f"TCP, or set HPCCOMM_MPI_THREAD_LEVEL=multiple to serve the store over MPI")
            if error is not None:
                raise type(error)(f"rank {rank} cannot reach {why} ({error})"
                                  ) from error
            raise DistStoreError(f"rank(s) {failed} cannot reach {why} (see their errors)")
        self._comm: Optional[Any] = dup
        self._rank, self._size = rank, dup.Get_size()
        _open.append(self)  # closed at exit if the program forgets to

    @property
    def rank(self) -> int:
        """This process's rank in the store's communicator."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The size of the store's communicator."""
        return self._size

    def close(self) -> None:
        """Collective: every rank done with its requests, then the server stops (once
        every rank came: see :func:`_close_collectively`)."""
        comm, self._comm = self._comm, None
        if self in _open:
            _open.remove(self)
        if comm is None:
            super().close()
            return

        _close_collectively(comm, lambda: TCPStore.close(self), self._timeout_s,
                            "JobTCPStore")

    def abandon(self) -> None:
        """Give the store up without the collective close (a member died); local."""
        self._comm = None
        if self in _open:
            _open.remove(self)
        super().close()


class MPIStore(RequestStore):
    """A store served by rank 0 of ``comm`` (default ``MPI.COMM_WORLD``); collective."""

    def __init__(self, comm: Optional[Any] = None, timeout: Timeout = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout)
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise DistStoreError(
                "MPIStore needs MPI initialized with MPI_THREAD_MULTIPLE (its server is a "
                "thread on rank 0); set mpi4py.rc.thread_level = 'multiple' before importing "
                "mpi4py.MPI, or use job_store(), which serves a TCPStore at lower levels")
        base = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(base, MPI.Intracomm) or base == MPI.COMM_NULL or base.Is_inter():
            raise DistStoreError(f"MPIStore needs an intracommunicator, got {base!r}")
        dup, request = base.Idup()
        _wait_request(request, self._timeout_s, "construction (duplicating the communicator)")
        dup.Set_name("hpccomm-store")
        server = _Server(dup) if dup.Get_rank() == 0 else None
        self._shared = _Shared(dup, server, self._timeout_s)
        self._tag = _new_tag()
        self._lock = threading.Lock()  # one request in flight per handle
        _open.append(self._shared)

    @property
    def rank(self) -> int:
        """This process's rank in the store's communicator."""
        return self._shared.comm.Get_rank()

    @property
    def world_size(self) -> int:
        """The size of the store's communicator."""
        return self._shared.comm.Get_size()

    def _where(self) -> str:
        shared = self._shared
        if shared.closed:
            return "MPIStore (closed)"
        return f"MPIStore rank {shared.comm.Get_rank()}/{shared.comm.Get_size()}"

    def _call(self, op: Op, fields: Sequence[bytes],
              timeout_s: Optional[float] = None) -> Tuple[Status, List[bytes]]:
        shared = self._shared
        payload = encode_request(op, fields, milliseconds(timeout_s))
        limit = (self._timeout_s if timeout_s is None else timeout_s) + _GRACE_S
        if shared.closed:
            raise DistStoreError("MPIStore: the store was closed")
        if shared.server is not None:
            return decode_reply(shared.server.local(payload, limit))
        with self._lock:
            return decode_reply(self._remote(shared.comm, payload, limit))

    def _remote(self, comm: MPI.Intracomm, payload: bytes, limit: float) -> bytes:
        """Send ``payload`` to rank 0 and wait for the reply on this handle's tag."""
        tag, status = self._tag, MPI.Status()
        comm.Send([payload, MPI.BYTE], 0, tag)
        msg = comm.Improbe(0, tag, status)
        if msg is None:
            now = time.monotonic()
            deadline, spin_end, delay = now + limit, now + _spin.CLIENT_SPIN_S, _MIN_SLEEP_S
            while msg is None:
                now = time.monotonic()
                if now < spin_end:
                    _spin.sched_yield()
                else:
                    if now > deadline:
                        raise DistStoreError(
                            f"MPIStore: no reply from rank 0 within {limit:.0f}s (has rank 0 "
                            "exited or closed the store?)")
                    time.sleep(delay)
                    delay = min(delay * 2, _CLIENT_SLEEP_S)
                msg = comm.Improbe(0, tag, status)
        buf = bytearray(status.Get_count(MPI.BYTE))
        msg.Recv([buf, MPI.BYTE])
        return bytes(buf)

    def clone(self) -> "MPIStore":
        """Another handle on the same store (not collective; its own tag)."""
        twin = MPIStore.__new__(MPIStore)
        Store.__init__(twin, self._timeout_s)
        twin._shared = self._shared
        twin._tag = _new_tag()
        twin._lock = threading.Lock()
        return twin

    def abandon(self) -> None:
        """Give the store up without the collective close, as after a member of its
        communicator died; local, idempotent. Its clones are abandoned too."""
        self._shared.abandon()

    def close(self) -> None:
        """Shut the store down: collective over the communicator, idempotent.

        A store still open at interpreter exit is closed then (collectively), so a
        program that forgets ``close()`` still exits cleanly.
        """
        self._shared.close()

    def __repr__(self) -> str:
        return f"<{self._where()}>"
