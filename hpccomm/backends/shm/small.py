"""Small collectives through shared memory: the C channel ``_small.c``, where it applies.

Below some tens of kilobytes an operation's cost is its fixed part: MPI's nonblocking
collectives spend microseconds in the progress engine (and MPICH's fast shared-memory
algorithms serve only its blocking calls, below ``MPI_THREAD_MULTIPLE``). Here every
rank of a group on one node copies its contribution into a slot of its own region, raises
a counter, waits for the counters of the ranks it reads and reads their slots: an
8-byte all_reduce is a few cache-line transfers and one C call.

Which operations take it is decided by what every rank knows alike (the operation, its
size, dtype and reduction), never by one rank's state, so ranks never split between
this path and MPI. A synchronous call runs whole in C (:meth:`Channel.run`); an
asynchronous one, an observed one, or one that meets pending operations is started
(:meth:`Channel.start`) and waited for the general way, and speaks the same protocol.
Every rank checks the peers' headers, so ranks that call different operations, sizes
or reductions get an error naming both calls, where MPI would hang or mix data.

Sizes (bytes of the operation as :mod:`._small` counts them: the buffer for all_reduce
and broadcast, one rank's block for the others) come from
:data:`DEFAULT_LIMITS`, or from ``HPCCOMM_SHM_SMALL`` for all of them (0: off).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ... import settings
from ...errors import CallsDiffer
from ...types import Tag
from ...work import Started
from ..base import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BARRIER, BROADCAST, REDUCE_SCATTER

try:
    from . import _small  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: MPI for small messages
    _small = None
else:
    _small.accept(np.ndarray)  # what it takes from Python; the rest goes the general way
    _small.set_mismatch(CallsDiffer)  # what it raises when the ranks' calls differ

#: Slots per rank: operations of one rank that may be in flight at once.
SLOTS = 4
#: MPI library family (:func:`hpccomm.backends.mpi.gate.family`) -> largest operation
#: per code, in bytes as the channel counts them (the buffer for all_reduce and
#: broadcast, one rank's block for the others). Chosen against hpccomm's path through
#: that library's MPI (2 ranks, interleaved, docs/performance.md): MPICH's nonblocking
#: collectives are slow at every small size, so the channel is ahead up to 256 KiB for
#: the reductions and all_gather and up to 32 KiB for broadcast and all_to_all (where
#: MPICH's single-copy transfers take over); Open MPI's are slow for the reductions;
#: Intel MPI's are fast from a few KiB (all_reduce of 16 KiB: 4 us, the channel 10 us),
#: so it keeps to the latency-bound sizes there, as does an unknown library.
DEFAULT_LIMITS = {
    "mpich": {ALL_REDUCE: 256 * 1024, BROADCAST: 32 * 1024, ALL_GATHER: 128 * 1024,
              REDUCE_SCATTER: 128 * 1024, ALL_TO_ALL: 16 * 1024},
    "openmpi": {ALL_REDUCE: 256 * 1024, BROADCAST: 16 * 1024, ALL_GATHER: 16 * 1024,
                REDUCE_SCATTER: 128 * 1024, ALL_TO_ALL: 8 * 1024},
    "intel": {ALL_REDUCE: 4 * 1024, BROADCAST: 16 * 1024, ALL_GATHER: 8 * 1024,
              REDUCE_SCATTER: 8 * 1024, ALL_TO_ALL: 8 * 1024},
}
DEFAULT_LIMITS["other"] = DEFAULT_LIMITS["intel"]
#: Bytes of one rank's slots together at most, whatever the group's size.
BUDGET = 1 << 20
#: The limits that differ from 3 ranks on. The channel's broadcast costs every rank two
#: copies of the buffer (the root's in, each reader's out) whatever the group's size,
#: while MPI's takes at least log2(n) copies one after another (a tree, or a scatter
#: then an all-gather): at 2 ranks MPICH's single-copy transfer wins from 32 KiB, from 3
#: ranks on the channel is ahead up to its slot (16 ranks, MPICH, 128 KiB: MPI 109 us).
MANY_RANKS_LIMITS = {"mpich": {BROADCAST: BUDGET // SLOTS},
                     "openmpi": {BROADCAST: BUDGET // SLOTS}}
#: Longest spin of a synchronous call in C before it joins the general wait.
SLICE_S = 0.002
#: A tag nothing is sent with: probing it only runs MPI's progress engine.
_PROGRESS_TAG = int(Tag.SHM_PROGRESS)


def kind(dtype: Any) -> int:
    """The channel's element kind for a sum of ``dtype`` (``-1``: not summed here)."""
    if _small is None:
        return -1
    found = _small.kind(np.empty(0, dtype))
    return found if found > _small.BYTES else -1


def available() -> bool:
    """Whether the channel is built and ``HPCCOMM_SHM_SMALL`` is not 0."""
    return _small is not None and settings.SHM_SMALL.get() != 0


def limits(size: int, vendor: Optional[str] = None) -> Tuple[int, ...]:
    """Largest operation per code for a group of ``size`` ranks on one node, with the
    MPI library ``vendor`` (``MPI.get_vendor()[0]``; default: the one loaded)."""
    from ..mpi import gate

    forced = settings.SHM_SMALL.get()
    family = gate.family(vendor or MPI.get_vendor()[0])
    table = dict(DEFAULT_LIMITS[family])
    if size >= 3:
        table.update(MANY_RANKS_LIMITS.get(family, {}))
    chosen = {code: forced or table.get(code, 1) for code in range(6)}
    per_rank = BUDGET // SLOTS  # what one slot may hold
    out = []
    for code in range(6):
        limit = chosen[code]
        if code in (REDUCE_SCATTER, ALL_TO_ALL):  # a rank posts a block per rank
            limit = min(limit, per_rank // size)
        out.append(max(0, min(limit, per_rank)) // 8 * 8 if code != BARRIER else 1)
    return tuple(out)


#: The split all_reduce's cost model (see ``_small.c``). Whole, a rank reads ``n * S``
#: bytes; split, about ``2 * S``, for one more hand-off of counters among the ranks. It
#: splits when the bytes it saves, ``(n - 2) * S``, take longer to read and combine than
#: that hand-off: ``S >= HANDOFF_S * COMBINE_BYTES_PER_S / (n - 2)``, with every part at
#: least a 64-byte line. The constants are estimates for one node's cores (a hand-off
#: of a cache line through the node, a core reducing from its peers' slots).
HANDOFF_S = 1e-6
COMBINE_BYTES_PER_S = 8e9
#: The hand-off where the node runs more ranks than it has CPUs: a rank may wait for a
#: peer to be scheduled. Measured at 4 ranks on 2 cores (docs/performance.md): split
#: against whole, 1.3x slower at 4 KiB, even at 16 KiB, 1.3x faster at 64 KiB.
CROWDED_HANDOFF_S = 8e-6


def in_pieces(size: int, limit: int) -> bool:
    """Whether an all_reduce above the channel's ``limit`` (its all_reduce size for
    ``size`` ranks) goes through it in pieces of that size: from 3 ranks on, where the
    channel takes all_reduce up to a whole slot, i.e. where the library's own all_reduce
    did not overtake it below (Intel MPI's does from a few KiB)."""
    return size >= 3 and limit >= BUDGET // SLOTS


def split_from(size: int, crowded: bool = False) -> int:
    """Bytes from which an all_reduce of ``size`` ranks is split (0: never), as the
    model says for a node with a CPU per rank (or fewer: ``crowded``) or as
    ``HPCCOMM_SHM_SPLIT`` forces."""
    forced = settings.SHM_SPLIT.get()
    if size <= 2:
        return 0
    if forced is not None:
        return forced
    handoff = CROWDED_HANDOFF_S if crowded else HANDOFF_S
    even = handoff * COMBINE_BYTES_PER_S / (size - 2)  # the size where both cost alike
    return max(64 * size, int(even) // 64 * 64)


#: Ranks of one node from which the hand-off is a combining tree (``_handoff.h``). Flat,
#: each waiting rank reads one counter line per rank, n - 1 of them, so a node moves
#: about 3 n^2 lines per operation between its cores (16 ranks: 768; 64: 12288); the
#: tree moves O(n), for an atomic add per rank and a chain of log_k n adds behind the
#: last arrival. The node measured so far (16 ranks, flat) is left as it was: the tree
#: starts above it, where the flat form's traffic grows past the tree's chain.
TREE_FROM = 32


def tree_radix(size: int) -> int:
    """The radix of the hand-off's tree for a group of ``size`` ranks on one node, or 0
    for the flat form (``HPCCOMM_SHM_TREE``, ``HPCCOMM_SHM_TREE_RADIX``)."""
    start = settings.SHM_TREE.get()
    start = TREE_FROM if start is None else start
    if not start or size < max(start, 3):
        return 0
    return max(2, settings.SHM_TREE_RADIX.get())


def capped(size: int, below: Mapping[int, int], vendor: Optional[str] = None
           ) -> Tuple[int, ...]:
    """:func:`limits`, each at most ``below[code]`` (where the shared-memory ring starts)."""
    return tuple(min(limit, below.get(code, limit))
                 for code, limit in enumerate(limits(size, vendor)))


def slot_bytes(size: int, sizes: Sequence[int]) -> int:
    """Bytes of one slot for the operation ``sizes`` of :func:`limits`."""
    posted = max(sizes[ALL_REDUCE], sizes[BROADCAST], sizes[ALL_GATHER],
                 size * sizes[REDUCE_SCATTER], size * sizes[ALL_TO_ALL], 64)
    return -(-posted // 64) * 64


class Channel:
    """The small-collective channel of one group on one node (collective to make)."""

    def __init__(self, node: Any, rank: int, sizes: Sequence[int], split: int,
                 yield_every: int, timeout: Optional[float], radix: int = 0):
        from .segment import Segment

        size = node.Get_size()
        self.sizes = tuple(sizes)
        self.slot_bytes = slot_bytes(size, sizes)
        head = _small.head_bytes(SLOTS)
        self.segment = Segment(node, head + SLOTS * self.slot_bytes, control=False)
        self.node = node
        self.timeout = timeout
        #: Bytes from which an all_reduce is split among the ranks (0: never).
        self.split_from = split
        self.kernel = _small.Small(rank, size, SLOTS, self.slot_bytes,
                                   [region.ctypes.data for region in self.segment.regions],
                                   self.sizes, SLICE_S, yield_every, self.split_from,
                                   radix)
        #: Levels of the hand-off's combining tree (:func:`tree_radix`); 0: flat.
        self.levels = self.kernel.levels
        #: ``run(code, send, recv, redop, root)``: the whole synchronous operation.
        self.run = self.kernel.run
        #: ``sum_at(address, nbytes, kind)``: the same, for an in-place sum of memory
        #: the caller keeps (kinds from :func:`kind`).
        self.sum_at = self.kernel.sum_at

    @property
    def handoff(self) -> Tuple[int, int]:
        """``(lines polled, lines written)`` by this rank's hand-offs on the channel so
        far: the counters it waited on and the ones it raised, each counted once per
        operation (the data and headers are :attr:`traffic`)."""
        return self.kernel.handoff

    @property
    def traffic(self) -> Tuple[int, int]:
        """``(bytes read, bytes written)`` by this rank's operations on the channel so
        far: its own slot and buffers included, the peers' slots read in place."""
        return self.kernel.traffic

    def start(self, code: int, send: Any, recv: Any, redop: int = 0, root: int = 0,
              total: int = 0, offset: int = 0, stride: int = 0) -> Optional[Started]:
        """The operation started on the channel, as ``(test, finish, keep)``, or ``None``
        when the channel does not take it (the caller uses MPI). ``total``: the bytes
        of the whole call this operation is a piece of, which the ranks compare too.
        ``stride`` (a reduce_scatter's piece): ``send`` holds one block per rank,
        ``stride`` bytes apart, and the piece is ``recv.nbytes`` at ``offset`` of each."""
        kernel = self.kernel
        seq = kernel.start(code, send, recv, redop, root, total, offset, stride)
        while seq < 0:  # the queue is full: wait for its oldest operation, then retry
            self._wait_oldest()
            seq = kernel.start(code, send, recv, redop, root, total, offset, stride)
        if not seq:
            return None
        return self.started(seq)

    def started(self, seq: int) -> Started:
        """``(test, finish, keep)`` of operation ``seq``, already on the channel."""
        test_seq = self.kernel.test
        node = self.node
        idle = [0]

        def test() -> bool:
            if test_seq(seq):
                return True
            idle[0] += 1
            if not idle[0] & 15:  # let MPI progress requests that peers may wait on
                node.Iprobe(MPI.ANY_SOURCE, _PROGRESS_TAG)
            return False
        return test, None, None

    def _wait_oldest(self) -> None:
        from ...errors import DistTimeoutError
        from ...work import poll

        pending = self.kernel.pending
        waited = poll(lambda: pending() < _small.QUEUE, self.timeout)
        if waited:
            raise DistTimeoutError(
                f"{_small.QUEUE} small shared-memory operations of this group were still "
                f"pending after {waited:.3f} s (timeout {self.timeout} s): some rank of "
                f"the group did not call them")

    def release(self) -> None:
        """Close the channel (a later call on it raises) and drop the mapping (local).
        While another thread still spins in it the mapping stays, and goes with the
        channel object."""
        try:
            self.kernel.close()
        except RuntimeError:
            return
        self.segment.release()


def channel(node: Any, rank: int, yield_every: int, timeout: Optional[float],
            below: Mapping[int, int]) -> Optional[Channel]:
    """The channel of a group whose ranks are ``node`` (collective over it), or ``None``
    on every rank unless every rank has the C helper and the setting allows it; the ranks
    take rank 0's sizes. ``below``: operation code -> the largest size the channel may
    take (where the shared-memory ring starts)."""
    ok = node.allreduce(available(), op=MPI.LAND)
    if not ok:
        return None
    from ..mpi import placement

    crowded = placement.crowded(node)  # collective
    sizes, split, radix = node.bcast((capped(node.Get_size(), below),
                                      split_from(node.Get_size(), crowded),
                                      tree_radix(node.Get_size()))
                                     if node.Get_rank() == 0 else None)
    if not any(sizes[1:]):
        return None
    try:
        return Channel(node, rank, sizes, split, yield_every, timeout, radix)
    except OSError:  # every rank gets it (the segment checks with all of them)
        return None

