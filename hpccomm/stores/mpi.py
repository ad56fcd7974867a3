"""``MPIStore``: the store API over an MPI communicator, served by its rank 0.

This is the default store of a job started by ``mpiexec``/``srun``: it needs no
port, no file and no address exchange. Construction is collective: every rank
duplicates the communicator (so store traffic never matches the user's messages),
and rank 0 starts a daemon thread that serves requests with the same
:class:`~hpccomm.stores._core.StoreCore` as the TCPStore server. Requests and replies
are the byte payloads of :mod:`hpccomm.stores._wire` sent as ``MPI.BYTE`` messages.

The ranks' main threads run microsecond-scale collectives, often on oversubscribed
cores, so neither side spins: the server polls with ``Improbe`` and sleeps between
polls (50 µs after a request, growing to 2 ms when idle), and a client waiting for
its reply polls the same way. Importing this module imports ``mpi4py.MPI``.
"""
from __future__ import annotations

import atexit
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple

from mpi4py import MPI

from hpccomm.errors import DistStoreError
from hpccomm.stores._core import StoreCore
from hpccomm.stores._wire import (Op, ProtocolError, Status, decode_reply, encode_reply,
                                  encode_request)
from hpccomm.stores.base import DEFAULT_TIMEOUT, Store, Timeout, _ms

_REQ_TAG = 1
_REP_TAG = 2
_MIN_SLEEP_S = 50e-6
_MAX_SLEEP_S = 2e-3
_GRACE_S = 30.0



class _Server:
    """Rank 0's serving thread."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.comm = comm
        self.core = StoreCore(default_timeout_s=None)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hpccomm-mpistore", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        comm, core, status = self.comm, self.core, MPI.Status()
        sends: List[Tuple[MPI.Request, bytes]] = []
        delay = _MIN_SLEEP_S
        while not self.stopping.is_set():
            msg = comm.Improbe(MPI.ANY_SOURCE, _REQ_TAG, status)
            now = time.monotonic()
            if msg is None:
                replies = core.expire(now)
                if not replies:
                    if sends:
                        sends = [(r, p) for r, p in sends if not r.Test()]
                    self.stopping.wait(delay)
                    delay = min(delay * 1.5, _MAX_SLEEP_S)
                    continue
            else:
                delay = _MIN_SLEEP_S
                buf = bytearray(status.Get_count(MPI.BYTE))
                source = status.Get_source()
                msg.Recv([buf, MPI.BYTE])
                try:
                    replies = core.submit(source, bytes(buf), now)
                except ProtocolError as exc:  # ranks are trusted: answer, don't drop
                    replies = [(source, encode_reply(Status.ERROR, [str(exc).encode()]))]
            for dest, payload in replies:
                sends.append((comm.Isend([payload, MPI.BYTE], dest, _REP_TAG), payload))
        for req, _ in sends:  # eager replies complete locally; give them a last chance
            req.Test()

    def stop(self) -> None:
        """Stop the thread (local, idempotent)."""
        self.stopping.set()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=10)


class _Shared:
    """What an MPIStore and its clones share: the communicator, the server, a lock."""

    def __init__(self, comm: MPI.Intracomm, server: Optional[_Server]) -> None:
        self.comm = comm
        self.server = server
        self.lock = threading.Lock()  # one request in flight per rank
        self.closed = False

    def close(self) -> None:
        """Collective shutdown: barrier, stop the server, free the communicator."""
        if self.closed:
            return
        self.comm.Barrier()  # every rank is done with its requests
        with self.lock:
            self.closed = True
        if self.server is not None:
            self.server.stop()
        self.comm.Free()
        if self in _open:
            _open.remove(self)


#: Stores not closed yet, in creation order (the same on every rank).
_open: List[_Shared] = []


@atexit.register
def _close_at_exit() -> None:
    """Close forgotten stores before mpi4py finalizes MPI (atexit is LIFO, so this runs
    first). Collective like MPI_Finalize itself: rank 0 keeps serving until every rank
    has reached exit, so no rank loses the answer to its last request."""
    for shared in list(_open):
        if MPI.Is_finalized():
            return
        shared.close()


class MPIStore(Store):
    """A store served by rank 0 of ``comm`` (default ``MPI.COMM_WORLD``); collective."""

    def __init__(self, comm: Optional[Any] = None, timeout: Timeout = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout)
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise DistStoreError(
                "MPIStore needs MPI initialized with MPI_THREAD_MULTIPLE (its server is a "
                "thread on rank 0); set mpi4py.rc.thread_level = 'multiple' before importing "
                "mpi4py.MPI, or use TCPStore/FileStore")
        base = MPI.COMM_WORLD if comm is None else comm
        if base == MPI.COMM_NULL or not isinstance(base, MPI.Intracomm) or base.Is_inter():
            raise DistStoreError(f"MPIStore needs an intracommunicator, got {base!r}")
        dup = base.Dup()
        dup.Set_name("hpccomm-store")
        server = _Server(dup) if dup.Get_rank() == 0 else None
        self._shared = _Shared(dup, server)
        _open.append(self._shared)

    @property
    def rank(self) -> int:
        """This process's rank in the store's communicator."""
        return self._shared.comm.Get_rank()

    @property
    def world_size(self) -> int:
        """The size of the store's communicator."""
        return self._shared.comm.Get_size()

    def _call(self, op: Op, fields: Sequence[bytes],
              timeout_s: Optional[float] = None) -> Tuple[Status, List[bytes]]:
        shared = self._shared
        payload = encode_request(op, fields, _ms(timeout_s))
        limit = (self._timeout_s if timeout_s is None else timeout_s) + _GRACE_S
        status = MPI.Status()
        with shared.lock:
            if shared.closed:
                raise DistStoreError("MPIStore: the store was closed")
            comm = shared.comm
            comm.Send([payload, MPI.BYTE], 0, _REQ_TAG)
            deadline = time.monotonic() + limit
            delay = _MIN_SLEEP_S / 5
            while True:
                msg = comm.Improbe(0, _REP_TAG, status)
                if msg is not None:
                    break
                if time.monotonic() > deadline:
                    raise DistStoreError(f"MPIStore: no reply from rank 0 within {limit:.0f}s "
                                         "(has rank 0 exited or closed the store?)")
                time.sleep(delay)
                delay = min(delay * 2, _MAX_SLEEP_S)
            buf = bytearray(status.Get_count(MPI.BYTE))
            msg.Recv([buf, MPI.BYTE])
        return decode_reply(bytes(buf))

    def clone(self) -> "MPIStore":
        """Another handle on the same store (not collective; shares the communicator)."""
        twin = MPIStore.__new__(MPIStore)
        Store.__init__(twin, self._timeout_s)
        twin._shared = self._shared
        return twin

    def close(self) -> None:
        """Shut the store down: collective over the communicator, idempotent.

        A store still open at interpreter exit is closed then (collectively), so a
        program that forgets ``close()`` still exits cleanly.
        """
        self._shared.close()

    def __repr__(self) -> str:
        state = "closed" if self._shared.closed else f"rank {self.rank}/{self.world_size}"
        return f"<MPIStore {state}>"
