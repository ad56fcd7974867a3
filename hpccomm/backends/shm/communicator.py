"""The CPU communicator of a group whose ranks share one node: shared memory above a size.

:class:`SharedMemoryCommunicator` is an :class:`~hpccomm.backends.mpi.communicator.MPICommunicator`
that runs all_reduce, reduce_scatter, all_gather and broadcast above a size threshold
per operation through shared memory (:mod:`.algorithms`) and everything else, and
every smaller message, through MPI as before. :func:`cpu_communicator` is what the group
layer calls for the "mpi" backend's CPU arrays: it picks this class when the group has
two or more ranks, all on one node, and ``HPCCOMM_SHM`` is not ``0``; a group that spans
nodes with two or more of its ranks on each gets :mod:`.hier`'s hierarchical
all_reduce; otherwise the plain MPI communicator.

Operations return ``(test, finish, keep)`` like every host-side backend: ``test()``
advances the operation's state machine without waiting, so the caller's deadline,
``async_op`` and the flight recorder work unchanged. Operations of one communicator run
in the order they were started (they share one ring), and every wait of any operation
of the process (shared-memory or MPI) advances the pending shared-memory operations of
every group between its polls (:data:`hpccomm.work.while_waiting`), so that a rank
waiting on a later operation still does its part of an earlier one, as MPI's progress
engine would; and a
shared-memory wait probes MPI every few polls, so MPI requests that peers wait on keep
moving (Open MPI progresses a request only inside MPI calls).

Settings, read when a group is created:

* ``HPCCOMM_SHM=0``: never use shared memory;
* ``HPCCOMM_SHM_MIN_BYTES``: messages of at least this many bytes go through shared
  memory, for all four operations (defaults per operation: :data:`DEFAULT_MIN_BYTES`;
  tests set it to 1);
* ``HPCCOMM_SHM_CHUNK``: bytes of one ring slot (:data:`DEFAULT_CHUNK`).
"""
from __future__ import annotations

import collections
import ctypes
import math
import threading
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np
from mpi4py import MPI

from ... import settings
from ...errors import CallsDiffer, DistBackendError
from ...types import RedOpType, Tag
from ... import work as _work
from ...work import Started
from ..mpi import communicator as _mpi_backend
from ..mpi.communicator import MPICommunicator
from ..mpi import ft as mpi_ft, placement, plumbing as _mpi_plumbing
from . import cma as shm_cma, hier as shm_hier, pair as shm_pair, segment as shm_segment
from . import progress as _progress
from . import small as shm_small
from .small import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BARRIER, BROADCAST, REDUCE_SCATTER
from .algorithms import (AllGather, AllReduce, Broadcast, Collective, ReduceScatter,
                         KERNEL_LAYOUT, chunks, descriptor, tag_of)
from .reduce import Reducer
from .segment import Segment, rendezvous

#: Smallest message (bytes) per operation that goes through shared memory by default,
#: from the interleaved runs in docs/performance.md: all_reduce in NumPy steps is faster than MPI from
#: 16 MiB (1.3-1.4x; 1.8-2.3x at 64 MiB) and at parity or below between 256 KiB and
#: 4 MiB, so it starts at 8 MiB; reduce_scatter is faster from 256 KiB when every rank
#: has a core (1.1-2.1x at 2 ranks) but only from 16 MiB when ranks share cores (0.5-1.0x
#: below at 4 ranks on 2 cores: each handshake may wait for a context switch). all_gather
#: and broadcast stay on MPI: MPICH's own single-copy algorithms were as fast or faster at
#: every size measured. ``HPCCOMM_SHM_MIN_BYTES`` sets one threshold for all four.
NEVER = 1 << 62
DEFAULT_MIN_BYTES = {"all_reduce": 8 * 1024 * 1024, "reduce_scatter": 256 * 1024,
                     "all_gather": NEVER, "broadcast": NEVER}
#: The defaults that differ when the node runs more ranks than it has CPUs.
CROWDED_MIN_BYTES = {"reduce_scatter": 8 * 1024 * 1024}
#: The defaults that differ from 3 ranks on, each with a CPU. The ring's reduce_scatter
#: takes n - 1 hand-offs per slot, so its fixed cost grows with n: at 8 and 16 ranks
#: (one 16-core node, MPICH) it ran 0.63x MPI at 1 MiB and 0.87x at 8 MiB, and
#: 1.27-1.40x at 64 MiB.
MANY_RANKS_MIN_BYTES = {"reduce_scatter": 16 * 1024 * 1024}
#: From 3 ranks on, crowded or not, all_reduce goes through the small channel in pieces
#: (:meth:`SharedMemoryCommunicator._small_pieces`) up to here, the ring from here: 16
#: ranks with a core each, pieces 6.1 ms at 8 MiB and 52 ms at 64 MiB, the ring 8.9 and
#: 78; 4 ranks on 2 cores, 1.8 and 7.1 ms at 8 and 32 MiB, the ring 3.8 and 12.2.
PIECES_TO = 128 * 1024 * 1024
#: The defaults that differ at two ranks, each with a CPU, where the C kernel runs sums
#: (:mod:`.shm_pair`): all_reduce through shared memory from 256 KiB, where the NumPy
#: path measured 1.08x mpi4py at 256 KiB, 1.15-1.25x at 512 KiB-2 MiB and 1.07x at
#: 8 MiB. (A synchronous torch sum, in the kernel's direct form, wins from 16 KiB; both
#: forms of one operation must take the same path, so the slower one sets the start.)
KERNEL_MIN_BYTES = {"all_reduce": 256 * 1024}
#: Bytes of one ring slot per rank at two ranks; a slot holds one piece per rank, and
#: pieces stay at least :data:`MIN_PIECE` bytes at larger groups.
DEFAULT_CHUNK = 512 * 1024
MIN_PIECE = 64 * 1024
#: Ring slots per rank.
SLOTS = 4

#: Whether the MPI path reduces float16 natively (else it stages it in float32, as here).
_HALF_NATIVE = _mpi_backend.HALF_NATIVE
#: A tag nothing is sent with: probing it only runs MPI's progress engine.
_PROGRESS_TAG = int(Tag.SHM_PROGRESS)  # a plain int on the polling path


def enabled() -> bool:
    """Whether ``HPCCOMM_SHM`` allows the shared-memory path (default: yes)."""
    return settings.SHM.get()


def cpu_communicator(comm: Any, timeout: Optional[float] = None) -> MPICommunicator:
    """The communicator for a group's CPU arrays (collective over ``comm``).

    Shared memory when every rank of ``comm`` is on this node, there are at least two,
    ``HPCCOMM_SHM`` allows it on every rank and ``/dev/shm`` has room; MPI otherwise,
    and always with ULFM on (:mod:`.mpi_ft`): a dead peer of a shared-memory step is
    never reported, so only MPI can name it.
    The ranks agree on the choice and take rank 0's chunk and threshold settings, so
    environments that differ between ranks cannot split a group between two paths.
    """
    if comm.Get_size() < 2 or mpi_ft.enabled():  # a dead peer's memory reports nothing
        return MPICommunicator(comm, timeout)
    node = placement.node_comm(comm)
    if node.Get_size() < comm.Get_size():  # the group spans nodes (every rank sees it)
        return _across_nodes(comm, timeout, node)
    piece = _piece_bytes(settings.SHM_CHUNK.get(), comm.Get_size())
    need = 2 * SLOTS * piece * comm.Get_size() * comm.Get_size()
    fits = enabled() and shm_segment.available() and shm_segment.space_ok(need)
    if node.allreduce(fits, op=MPI.LAND):
        kernel = node.allreduce(shm_pair.available(), op=MPI.LAND)  # used by all or none
        forced = settings.SHM_MIN_BYTES.get()
        # the node's CPUs together, not this rank's mask
        defaults = ring_thresholds(node.Get_size(), placement.crowded(node), kernel)
        thresholds = {op: forced or default for op, default in defaults.items()}
        piece, min_bytes = node.bcast((piece, thresholds))
        try:
            return SharedMemoryCommunicator(comm, timeout, node, piece, min_bytes, kernel)
        except OSError:  # every rank gets it (the segment checks with all of them)
            pass
    node.Free()
    return MPICommunicator(comm, timeout)


def _across_nodes(comm: Any, timeout: Optional[float], node: Any) -> MPICommunicator:
    """The communicator of a group that spans nodes: hierarchical all_reduce
    (:mod:`.hier`) when every node holds the same number, at least two, of its
    ranks and each can share memory; plain MPI otherwise. Collective over ``comm``."""
    local_size = node.Get_size()
    piece = _piece_bytes(settings.SHM_CHUNK.get(), local_size)
    need = 2 * SLOTS * piece * local_size * local_size
    fits = enabled() and shm_segment.available() and shm_segment.space_ok(need)
    sizes = comm.allgather((local_size, fits))
    if not (all(ok for _, ok in sizes) and min(n for n, _ in sizes) >= 2 and
            min(n for n, _ in sizes) == max(n for n, _ in sizes)):
        node.Free()
        return MPICommunicator(comm, timeout)
    kernel = node.allreduce(shm_pair.available(), op=MPI.LAND)
    forced = settings.SHM_MIN_BYTES.get()
    default = NEVER if placement.crowded(comm) else shm_hier.DEFAULT_MIN_BYTES
    piece, min_bytes = comm.bcast((piece, forced or default))
    cross = comm.Split(node.Get_rank(), comm.Get_rank())
    try:
        local = SharedMemoryCommunicator(node, timeout, node.Dup(), piece,
                                         dict.fromkeys(DEFAULT_MIN_BYTES, 1), kernel,
                                         small=False)
    except OSError:  # every rank of the node gets it; the others must not go on alone
        local = None
    if not comm.allreduce(local is not None, op=MPI.LAND):
        if local is not None:
            local.shutdown()
        for unused in (node, cross):
            unused.Free()
        return MPICommunicator(comm, timeout)
    return shm_hier.HierarchicalCommunicator(comm, timeout, local, cross, min_bytes)


def ring_thresholds(n: int, crowded: bool, kernel: bool, vendor: Optional[str] = None
                    ) -> Dict[str, int]:
    """The shared-memory ring's smallest size per operation for ``n`` ranks on a node
    with fewer CPUs than ranks (``crowded``) or not, with the two-rank C kernel
    (``kernel``) or not, beside the MPI library ``vendor`` (``MPI.get_vendor()[0]``;
    default: the one loaded), whose own speed sets the small channel's sizes and so
    whether all_reduce goes in pieces below the ring (:func:`.small.in_pieces`)."""
    found = dict(DEFAULT_MIN_BYTES)
    if n >= 3 and shm_small.available() and shm_small.in_pieces(
            n, shm_small.limits(n, vendor)[ALL_REDUCE]):
        found["all_reduce"] = PIECES_TO
    if crowded:
        found.update(CROWDED_MIN_BYTES)
    elif kernel and n == 2:
        found.update(KERNEL_MIN_BYTES)
    elif n >= 3:
        found.update(MANY_RANKS_MIN_BYTES)
    return found


def channel_caps(min_bytes: Dict[str, int], size: int) -> Dict[int, int]:
    """Operation code -> the largest size the small channel may take below the ring's
    thresholds ``min_bytes`` (sizes as the channel counts them), at ``size`` ranks."""
    def start(name: str) -> int:
        return max(1, min_bytes[name])
    return {ALL_REDUCE: start("all_reduce") - 1, BROADCAST: start("broadcast") - 1,
            ALL_GATHER: (start("all_gather") - 1) // size,
            REDUCE_SCATTER: (start("reduce_scatter") - 1) // size}


def _piece_bytes(chunk: int, size: int) -> int:
    """Bytes of one rank's piece of a ring slot: the slot split per rank, cache-line
    aligned; by default (``chunk`` 0) at least :data:`MIN_PIECE`."""
    if chunk <= 0:
        return max(MIN_PIECE, DEFAULT_CHUNK // size) // 64 * 64
    return max(64, chunk // size // 64 * 64)


class SharedMemoryCommunicator(MPICommunicator):
    """An MPI communicator whose large collectives run through shared memory."""

    def __init__(self, comm: Any, timeout: Optional[float], node: Any, piece_bytes: int,
                 min_bytes: Dict[str, int], kernel: bool = False, small: bool = True):
        super().__init__(comm, timeout)
        self.node = node
        self.min_reduce = max(1, min_bytes["all_reduce"])
        self.min_scatter = max(1, min_bytes["reduce_scatter"])
        self.min_gather = max(1, min_bytes["all_gather"])
        self.min_bcast = max(1, min_bytes["broadcast"])
        #: The small-collective channel (:mod:`.small`), else None: small operations go
        #: through MPI. It stops below the ring's thresholds (sizes as it counts them).
        self.small = (shm_small.channel(node, self.rank, _work.spin_yield_every(), timeout,
                                        channel_caps(min_bytes, self.size))
                      if small else None)
        self.small_run = self.small.run if self.small is not None else None
        self._small_sizes = self.small.sizes if self.small is not None else (0,) * 6
        #: An all_reduce above the channel's size and below this goes through the channel
        #: in pieces of its size (:meth:`_small_pieces`): from 3 ranks on, the ring's
        #: threshold where the channel takes all_reduce up to a whole slot, else 0.
        pieces = self.small is not None and shm_small.in_pieces(
            self.size, self._small_sizes[ALL_REDUCE])
        self.pieces_to = self.min_reduce if pieces else 0
        #: The same for reduce_scatter (:meth:`_small_scatter_pieces`), by its input.
        self.scatter_pieces_to = self.min_scatter if pieces else 0
        self.piece_bytes = piece_bytes
        self.slot_bytes = piece_bytes * self.size
        self.slots = SLOTS
        self.ring = Segment(node, self.slots * self.slot_bytes)
        self.words, self.regions = self.ring.words, self.ring.regions
        #: The C kernel of this two-rank communicator (:mod:`.pair`), else None.
        self.pair_kernel = (shm_pair.bind(self.rank, self.slots, self.slot_bytes,
                                          self.regions, self.words, KERNEL_LAYOUT)
                            if self.size == 2 and kernel else None)
        #: Held while the kernel runs an operation of this communicator (GIL released):
        #: threads waiting on one Work must not run its steps twice.
        self.kernel_lock = threading.Lock()
        #: Held while a thread advances this communicator's pending operations.
        self.advance_lock = threading.Lock()
        #: MPI datatype handle -> (dtype, kernel kind, reals per element): the dtypes of
        #: the direct form at or above ``min_reduce`` (:meth:`sum_in_place_at`).
        self.kernel_types: Dict[int, tuple] = {}
        #: Bytes from which MPI's own direct form stops (a gate starts, say).
        self.mpi_direct_below = self.direct_below
        if self.pair_kernel is not None:
            for dtype, handle in self.direct_types.items():
                kind = shm_pair.kind_of(np.dtype(dtype))
                if kind is not None:
                    self.kernel_types[handle] = (np.dtype(dtype),) + kind
        self.fenced = self.ring.fenced
        self.fence = self.ring.fence if self.fenced else _nothing
        self.user_segments: List[Optional[Segment]] = [None]  # index 0: none
        #: Every rank's pid when ranks can read each other's memory (cross-memory attach):
        #: private buffers are then read in place too, with no copy into shared memory.
        self.pids = shm_cma.probe(node)
        self._scratch: Dict[int, np.ndarray] = {}
        self.chunks = 0  # chunks numbered so far (every rank alike)
        self.ops = 0  # shared-memory operations started so far
        self.queue: "collections.deque[Collective]" = collections.deque()
        self.failed: Optional[BaseException] = None
        self._reducers: Dict[Any, Reducer] = {}
        self._direct_dtypes = {handle: np.dtype(dtype)
                               for dtype, handle in self.direct_types.items()}
        #: MPI datatype handle -> the small channel's element kind (direct form)
        self._small_kinds = {handle: shm_small.kind(dtype)
                             for handle, dtype in self._direct_dtypes.items()}
        if self.kernel_types:  # the direct form goes on through shared memory
            self.direct_below = max(self.direct_below, _INT_MAX) if self.direct_types else 0
        else:  # MPI's direct form, below the shared-memory threshold
            self.direct_below = min(self.direct_below, self.min_reduce)

    def set_timeout(self, seconds: Optional[float]) -> None:
        super().set_timeout(seconds)
        if self.small is not None:
            self.small.timeout = seconds

    # -- the engine -------------------------------------------------------------------
    def _start(self, op: Collective) -> Started:
        if self.failed is not None:
            if isinstance(self.failed, CallsDiffer):  # as the small channel says it
                raise CallsDiffer(f"an earlier operation stopped the group's shared-memory "
                                  f"operations ({self.failed}); the group is unusable: "
                                  f"destroy it")
            raise DistBackendError(f"an earlier shared-memory operation of this group "
                                   f"failed ({self.failed}); the group is unusable")
        self.queue.append(op)
        _progress.register(self)

        node = self.node
        waits_in_c = getattr(op, "kernel", None) is not None  # pair mode's C kernel

        def test() -> bool:
            if not op.done:
                _progress.advance_all()
                if op.error is not None:
                    raise op.error
                if (not op.done and waits_in_c and not _work.probing and
                        self.queue[0] is op and len(_progress.busy) == 1):  # in C
                    op.wait_pair(shm_pair.SLICE_S, _work.spin_yield_every())
                    _progress.advance_all()
                if not op.done:
                    op.idle += 1
                    if not op.idle & 15:  # let MPI progress other groups' requests that
                        node.Iprobe(MPI.ANY_SOURCE, _PROGRESS_TAG)  # peers may wait on
            return op.done
        return test, None, op

    def advance_pending(self) -> None:
        """Advance the operations in order, as far as each can go without waiting: the
        ring's, then the small channel's (whose peers may need this rank's reads while
        it waits for another group). One thread at a time: another thread's wait that
        finds it busy leaves it to that thread."""
        if not self.advance_lock.acquire(False):
            return
        try:
            queue = self.queue
            try:
                while queue and queue[0].step():
                    queue.popleft()
            except Exception as exc:  # raised by each pending operation's own test()
                self.failed = exc
                for pending in queue:
                    pending.error = exc
                queue.clear()
            small = 0
            if self.small is not None:
                try:
                    small = self.small.kernel.pending()
                except (ValueError, RuntimeError):  # the operation's own test raises it
                    small = 0
            if not queue and not small:
                _progress.release(self)
        finally:
            self.advance_lock.release()

    def _shared(self, arr: np.ndarray) -> Optional[tuple]:
        """Where peers read ``arr`` in place: ``(segment index, offset)`` when it lies in
        one of this group's segments, ``(0, address)`` when they can read this process's
        memory (cross-memory attach), ``None`` when it must be staged."""
        segments = self.user_segments
        for index in range(1, len(segments)):
            offset = segments[index].owns(arr)
            if offset is not None:
                return index, offset
        if self.pids is not None:
            return 0, arr.ctypes.data
        return None

    def in_segment(self, arr: np.ndarray) -> bool:
        """Whether ``arr`` lies in one of this group's segments (hpccomm.shm.empty)."""
        return any(segment.owns(arr) is not None for segment in self.user_segments[1:])

    def scratch(self, peer: int, nbytes: int) -> np.ndarray:
        """This rank's buffer for chunks read from ``peer`` (grown as needed)."""
        found = self._scratch.get(peer)
        if found is None or found.nbytes < nbytes:
            found = self._scratch[peer] = np.empty(max(nbytes, self.slot_bytes), np.uint8)
        return found[:nbytes]

    def _reducer(self, dtype: Any, kind: RedOpType, factor: Any) -> Reducer:
        if factor is not None:
            return Reducer(dtype, kind, factor, self.size, _HALF_NATIVE)
        key = (dtype, kind)
        found = self._reducers.get(key)
        if found is None:
            found = self._reducers[key] = Reducer(dtype, kind, None, self.size, _HALF_NATIVE)
        return found

    # -- collectives ------------------------------------------------------------------
    def _small_start(self, code: int, send: Any, recv: Any, redop: int = 0,
                     root: int = 0) -> Optional[Started]:
        """The operation on the small channel, or ``None`` where it does not apply."""
        if self._small_sizes[code] <= 0:
            return None
        return self._pending_small(self.small.start(code, send, recv, redop, root))

    def _small_pieces(self, flat: np.ndarray, kind: RedOpType) -> Optional[Started]:
        """An all_reduce of the 1-D ``flat``, too large for the channel, as consecutive
        channel operations of at most its size, or ``None`` where the channel does not
        take the dtype or operation (every piece alike: the ranks agree).

        The channel runs up to ``SLOTS`` of them at once, so one piece is copied in while
        the ranks reduce the one before; each is split among the ranks, so a rank reads
        about 3 S whatever n, where MPI's own algorithms move log2(n) or 2 (n-1)/n
        copies with a hand-off per step (16 ranks, 1 MiB: MPICH 950 us).
        """
        step = max(1, self._small_sizes[ALL_REDUCE] // flat.itemsize)
        # each piece names the whole call: the ranks compare it at the first piece
        return self._in_pieces(((ALL_REDUCE, flat[start:start + step],
                                 flat[start:start + step], kind, 0, flat.nbytes)
                                for start in range(0, flat.size, step)), flat)

    def _small_scatter_pieces(self, send: np.ndarray, recv: np.ndarray,
                              kind: RedOpType) -> Optional[Started]:
        """A reduce_scatter too large for the channel, as consecutive channel operations
        that each take the same strided piece of every rank's block of ``send`` (at most
        the channel's block size) and reduce it into that piece of ``recv``; ``None``
        where the channel does not take the dtype or operation.

        A rank copies its whole input into its slots once (S) and reduces its own block
        from every rank's slot (n blocks: S), so it reads about 2 S whatever n, with up
        to ``SLOTS`` pieces in flight, where the ring makes n - 1 hand-offs per slot.
        """
        out, src = recv.reshape(-1), send.reshape(-1)
        block, item = out.nbytes, out.itemsize
        step = max(1, self._small_sizes[REDUCE_SCATTER] // item)
        return self._in_pieces(((REDUCE_SCATTER, src, out[start:start + step], kind, 0,
                                 block, start * item, block)
                                for start in range(0, out.size, step)), (src, out))

    def _in_pieces(self, pieces: Iterable[tuple], keep: Any) -> Optional[Started]:
        """One call as the channel operations ``pieces`` (arguments of its ``start``),
        finished in order; ``None`` when the channel refuses the first (it would refuse
        them all alike)."""
        tests = []
        for args in pieces:
            started = self.small.start(*args)
            if started is None:  # only the first can be refused: the rest are alike
                return None
            tests.append(started[0])
        left = [0]

        def test() -> bool:
            i = left[0]
            while i < len(tests) and tests[i]():
                i += 1
            left[0] = i
            return i == len(tests)
        return self._pending_small((test, None, keep))

    def _pending_small(self, started: Optional[Started]) -> Optional[Started]:
        """``started``, an operation on the small channel, advanced by every wait of the
        process while it is pending (its peers may need this rank's reads while it waits
        for another group), as the ring's operations are; once it is over, this
        communicator leaves the busy list unless something else is pending."""
        if started is None or not self.small.kernel.pending():  # over at once
            return started
        _progress.register(self)
        test, finish, keep = started

        def test_then_settle() -> bool:
            if not test():
                return False
            self.advance_pending()
            return True
        return test_then_settle, finish, keep

    def all_reduce(self, buf: np.ndarray, kind: RedOpType, factor: Any) -> Started:
        if factor is None and buf.nbytes <= self._small_sizes[ALL_REDUCE]:
            started = self._small_start(ALL_REDUCE, buf, buf, kind)
            if started is not None:
                return started
        if buf.nbytes < self.min_reduce:
            if factor is None and buf.nbytes < self.pieces_to:
                started = self._small_pieces(buf.reshape(-1), kind)
                if started is not None:
                    return started
            return MPICommunicator.all_reduce(self, buf, kind, factor)
        flat = buf.reshape(-1)
        reducer = self._reducer(buf.dtype, kind, factor)
        kernel = None
        if self.pair_kernel is not None and kind is RedOpType.SUM and reducer.simple:
            found = shm_pair.kind_of(flat.dtype)
            if found is not None and chunks(flat.size, 2, AllReduce.kernel_chunk(
                    flat.itemsize, self.piece_bytes)) < shm_pair.MAX_CHUNKS:
                kernel = found[0], flat.size * found[1]
        return self._start(AllReduce(self, flat, reducer, self._shared(flat), kernel))

    def sum_in_place_at(self, address: int, count: int, datatype: int,
                        limit: Optional[float]) -> Optional[Started]:
        """The direct form of a synchronous in-place SUM all-reduce: MPI's below
        ``min_reduce``, the pair kernel's (:mod:`.shm_pair`) from there, which publishes
        the descriptor, runs the chunks and waits up to its slice in C. ``None`` once
        done, else the ``(test, finish, keep)`` of the operation handed back to the
        state machine (see :meth:`MPICommunicator.sum_in_place_at`)."""
        dtype = self._direct_dtypes[datatype]
        nbytes = count * dtype.itemsize
        if nbytes <= self._small_sizes[ALL_REDUCE]:  # the small channel, as all_reduce
            running = self.small.sum_at(address, nbytes, self._small_kinds[datatype])
            if running == 0:
                return None
            if running > 0:
                return self._pending_small(self.small.started(running))
            arr = _at(address, nbytes, dtype)  # operations pending: queued after them
            started = self._pending_small(self.small.start(ALL_REDUCE, arr, arr, 0, 0))
            if started is not None:
                return started
        if nbytes < self.min_reduce:
            if nbytes < self.pieces_to:  # as all_reduce takes it: the ranks must agree
                started = self._small_pieces(_at(address, nbytes, dtype), RedOpType.SUM)
                if started is not None:
                    return started
            if nbytes < self.mpi_direct_below:
                return MPICommunicator.sum_in_place_at(self, address, count, datatype, limit)
            return MPICommunicator.all_reduce(self, _at(address, nbytes, dtype),  # gated
                                              RedOpType.SUM, None)
        found = self.kernel_types.get(datatype)
        if found is None:  # a dtype the kernel does not sum: the state machine's steps
            return self.all_reduce(_at(address, nbytes, dtype), RedOpType.SUM, None)
        if self.failed is not None or self.queue:
            raise DistBackendError(f"an earlier shared-memory operation of this group "
                                   f"failed ({self.failed}); the group is unusable"
                                   if self.failed is not None else
                                   "shared-memory operations of this group are pending")
        dtype, code, reals = found
        nbytes = count * dtype.itemsize
        per_chunk = AllReduce.kernel_chunk(dtype.itemsize, self.piece_bytes)
        nch = chunks(count, 2, per_chunk)
        if nch >= shm_pair.MAX_CHUNKS:  # the state machine alone, as all_reduce does
            return self.all_reduce(_at(address, nbytes, dtype), RedOpType.SUM, None)
        k0, seq = self.chunks, self.ops + 1
        self.chunks, self.ops = k0 + nch, seq
        slice_s = shm_pair.SLICE_S if limit is None else min(shm_pair.SLICE_S, limit)
        result = self.pair_kernel.run(address, count * reals, code, per_chunk * reals,
                                      -(-count // 2) * reals, nch, k0,
                                      descriptor(seq, tag_of(AllReduce.code, nbytes, dtype,
                                                             int(RedOpType.SUM))),
                                      0, 0, 0, slice_s, _work.spin_yield_every())
        if result >= 0 and shm_pair.unpack(result)[2] == nch:
            return None
        # still running: the state machine takes it over where the kernel left it
        op = AllReduce(self, _at(address, nbytes, dtype),
                       self._reducer(dtype, RedOpType.SUM, None), None, (code, count * reals),
                       (k0, seq))
        op.begun = True
        if result >= 0:
            op.r, op.s, op.g = shm_pair.unpack(result)
        return self._start(op)

    def reduce_scatter(self, send: np.ndarray, recv: np.ndarray, kind: RedOpType,
                       factor: Any, counts: Optional[Sequence[int]]) -> Started:
        if (factor is None and counts is None and
                recv.nbytes <= self._small_sizes[REDUCE_SCATTER]):
            started = self._small_start(REDUCE_SCATTER, send, recv, kind)
            if started is not None:
                return started
        if send.nbytes < self.min_scatter:
            if factor is None and counts is None and send.nbytes < self.scatter_pieces_to:
                started = self._small_scatter_pieces(send, recv, kind)
                if started is not None:
                    return started
            return MPICommunicator.reduce_scatter(self, send, recv, kind, factor,
                                                             counts)
        flat = send.reshape(-1)
        return self._start(ReduceScatter(self, flat, recv.reshape(-1), counts,
                                         self._reducer(send.dtype, kind, factor),
                                         self._shared(flat)))

    def all_gather(self, send: Optional[np.ndarray], recv: np.ndarray,
                   counts: Optional[Sequence[int]]) -> Started:
        if counts is None and recv.nbytes // self.size <= self._small_sizes[ALL_GATHER]:
            block = recv.size // self.size
            mine = send if send is not None else recv.reshape(-1)[self.rank * block:
                                                                  (self.rank + 1) * block]
            started = self._small_start(ALL_GATHER, mine, recv)
            if started is not None:
                return started
        if recv.nbytes < self.min_gather:
            return MPICommunicator.all_gather(self, send, recv, counts)
        flat = recv.reshape(-1)
        mine = send.reshape(-1) if send is not None else None
        if mine is not None:
            where = self._shared(mine)
        else:
            where = self._shared(flat)
            if where is not None:  # in place: the descriptor points at this rank's block
                start = (sum(counts[:self.rank]) if counts is not None
                         else flat.size // self.size * self.rank)
                where = (where[0], where[1] + start * flat.itemsize)
        return self._start(AllGather(self, mine, flat, counts, where))

    def broadcast(self, buf: np.ndarray, root: int) -> Started:
        if buf.nbytes <= self._small_sizes[BROADCAST]:
            started = self._small_start(BROADCAST, buf, buf, 0, root)
            if started is not None:
                return started
        if buf.nbytes < self.min_bcast:
            return MPICommunicator.broadcast(self, buf, root)
        flat = buf.reshape(-1)
        return self._start(Broadcast(self, flat, root,
                                     self._shared(flat) if self.rank == root else None))

    def all_to_all(self, send: np.ndarray, recv: np.ndarray,
                   send_counts: Optional[Sequence[int]],
                   recv_counts: Optional[Sequence[int]]) -> Started:
        if (send_counts is None and recv_counts is None and
                recv.nbytes // self.size <= self._small_sizes[ALL_TO_ALL]):
            started = self._small_start(ALL_TO_ALL, send, recv)
            if started is not None:
                return started
        return MPICommunicator.all_to_all(self, send, recv, send_counts, recv_counts)

    def barrier(self) -> Started:
        return self._small_start(BARRIER, None, None) or MPICommunicator.barrier(self)

    # -- arrays in shared memory ---------------------------------------------------------
    def shared_empty(self, shape: Any, dtype: Any) -> np.ndarray:
        """A new array in shared memory of this group (collective; see hpccomm.shm)."""
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = int(math.prod(shape)) * dtype.itemsize
        rendezvous(self.node, self.timeout, "hpccomm.shm.empty")
        segment = Segment(self.node, nbytes, control=False)
        self.user_segments.append(segment)
        return segment.regions[self.rank][:nbytes].view(dtype).reshape(shape)

    # -- life cycle --------------------------------------------------------------------
    def shutdown(self) -> None:
        """Forget the segments (local: nothing waits for the other ranks). Their memory
        goes when the last rank drops its mapping, arrays from hpccomm.shm.empty included
        once the caller lets go of them."""
        _progress.release(self)
        if self.queue:  # their Works fail (and so count as over) instead of waiting forever
            destroyed = DistBackendError("the group was destroyed while this shared-memory "
                                         "operation was pending")
            for pending in self.queue:
                pending.error = destroyed
            self.failed = destroyed
        self.queue.clear()
        for segment in self.user_segments[1:] + [self.ring]:
            if segment is not None:
                segment.release()
        if self.small is not None:
            self.small.release()
            self.small_run = None
        self.user_segments, self.words, self.regions = [None], [], []
        _mpi_plumbing.free(self.node)
        MPICommunicator.shutdown(self)  # the gates' communicator


_INT_MAX = 2 ** 31 - 1  # bytes: the direct form's callers stay below MPI's int counts


def _at(address: int, nbytes: int, dtype: np.dtype) -> np.ndarray:
    """A NumPy view of ``nbytes`` bytes of memory at ``address`` that the caller keeps."""
    return np.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype)


def _nothing() -> None:
    """The memory barrier where the processor needs none (x86-64)."""
