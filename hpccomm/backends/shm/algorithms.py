"""The shared-memory collectives as small state machines, advanced by ``step()``.

Each operation is cut into *chunks* that stay in cache. Chunks are numbered by one
counter per communicator that every rank advances alike, so chunk ``g`` of any
operation uses ring slot ``g % slots`` of its writer's region, and a counter value
``g + 1`` means "done with chunk ``g``" whatever operation it belonged to. Per rank and
chunk, three single-writer counters (see :mod:`.segment`):

* ``STAGED``: this rank has copied its inputs for chunk ``g`` into its ring slot;
* ``REDUCED``: this rank has put the result of its own part of chunk ``g`` where the
  others read it;
* ``CONSUMED``: this rank has read everything of chunk ``g`` it needs from the others,
  so their ring slot may be reused (a writer waits for every reader ``slots`` chunks back).

all_reduce at ``P`` ranks is a reduce-scatter then an all-gather, pipelined per chunk:
rank ``r`` stages only the pieces of the parts other ranks own (copy in what peers
need), reduces its own part of the chunk from every rank's piece in one pass, publishes
it, and copies the other parts' results into its buffer. reduce_scatter stops after the
reduction; all_gather and broadcast stage whole chunks and copy them out.

**Zero copy.** A buffer allocated in a shared segment (:func:`hpccomm.shm.empty`) is
read by the peers where it lies: its owner stages nothing. At the start of every
operation each rank publishes a descriptor (``ENTER``: operation number, whether its
buffer is shared, and a tag of the operation's kind and size; ``WINDOW``/``OFFSET``:
where the buffer lies). A rank whose buffer is read in place waits, before it returns,
until every peer has finished reading it. A peer whose ``ENTER`` is already past the
operation was staging, since a zero-copy rank cannot have moved on.

``step()`` never waits: it does every piece of work whose inputs are ready and returns
whether the operation is complete. The poll loop of the caller spins and yields.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from ...errors import CallsDiffer
from . import cma
from . import pair as shm_pair
from .reduce import Reducer
from .segment import CONSUMED, ENTER, OFFSET, REDUCED, SEGMENT, STAGED

#: Chunks a rank may stage ahead of the ones it has finished (keeps them in cache).
LOOKAHEAD = 2
_TAG_BITS = 20
_TAG_MASK = (1 << _TAG_BITS) - 1
_WORD = (1 << 64) - 1
_ZC_BIT = 1 << _TAG_BITS
_SEQ_SHIFT = _TAG_BITS + 1
#: What the C kernel of pair mode (:mod:`.pair`) must know of the control block.
KERNEL_LAYOUT = dict(staged=STAGED, reduced=REDUCED, consumed=CONSUMED, enter=ENTER,
                     seq_shift=_SEQ_SHIFT, tag_mask=_TAG_MASK, lookahead=LOOKAHEAD)


def tag_of(code: int, total_bytes: int, dtype: Any, variant: int = 0) -> int:
    """The descriptor's tag of an operation: its kind, size and dtype, and ``variant``
    (a reduction's kind, a broadcast's root), which every rank must agree on.

    The size goes through a 64-bit mix (splitmix64's finalizer) before the tag keeps
    ``_TAG_BITS`` bits: its low bits alone would give sizes that differ by a multiple
    of 1 MiB (16 against 32 MiB) the same tag, and such calls would pass for one."""
    mixed = (total_bytes * 0x9E3779B97F4A7C15) & _WORD
    mixed = ((mixed ^ (mixed >> 30)) * 0xBF58476D1CE4E5B9) & _WORD
    mixed = ((mixed ^ (mixed >> 27)) * 0x94D049BB133111EB) & _WORD
    mixed ^= mixed >> 31
    return (code * 0x9E37 ^ mixed ^ dtype.num ^ variant * 0x3C6EF) & _TAG_MASK


def descriptor(seq: int, tag: int) -> int:
    """The ``ENTER`` word of a rank that stages its buffer for operation ``seq``."""
    return (seq << _SEQ_SHIFT) | tag


def split(total: int, parts: int) -> List[int]:
    """Bounds of ``parts`` near-equal consecutive parts of ``total`` elements."""
    base, extra = divmod(total, parts)
    bounds = [0]
    for part in range(parts):
        bounds.append(bounds[-1] + base + (1 if part < extra else 0))
    return bounds


def chunks(total: int, parts: int, per_chunk: int) -> int:
    """Chunks of an operation on ``total`` elements split in ``parts`` near-equal parts,
    ``per_chunk`` elements of a part per chunk (the widest part decides)."""
    widest = -(-total // parts)
    return -(-widest // per_chunk)


def bounds_of(counts: Sequence[int]) -> List[int]:
    bounds = [0]
    for count in counts:
        bounds.append(bounds[-1] + count)
    return bounds


class Collective:
    """What every shared-memory operation shares: chunk numbering, the descriptor
    handshake, the ring's flow control and the final wait of a zero-copy rank."""

    #: Code of the operation kind in the descriptor tag.
    code = 0

    def __init__(self, ctx: Any, name: str, dtype: Any, total_bytes: int, nch: int,
                 shared: Optional[tuple], numbered: Optional[tuple] = None,
                 variant: int = 0):
        self.ctx = ctx
        self.name = name
        self.dtype = dtype
        self.item = dtype.itemsize
        self.me = ctx.rank
        self.peers = [p for p in range(ctx.size) if p != ctx.rank]
        self.nch = nch
        if numbered is None:  # number it: its first chunk and its sequence number
            numbered = ctx.chunks, ctx.ops + 1
            ctx.chunks += nch
            ctx.ops += 1
        self.k0, self.seq = numbered  # else numbered (and maybe begun) by a direct form
        self.tag = tag_of(self.code, total_bytes, dtype, variant)
        self.total_bytes = total_bytes
        self.shared = shared  # (segment index, byte offset) of my buffer, or None
        self.sources: Optional[List[Any]] = None  # per rank: None (staged) or a byte view
        self.fenced = ctx.fenced
        self.begun = False
        self.done = False
        self.error: Optional[BaseException] = None  # set when the group's engine failed
        self.idle = 0  # tests that found nothing to do

    # -- handshake ------------------------------------------------------------------
    def begin(self) -> None:
        """Publish this rank's descriptor (the previous operation is complete)."""
        ctx = self.ctx
        mine = ctx.words[self.me]
        value = descriptor(self.seq, self.tag)
        if self.shared is not None:
            mine[SEGMENT], mine[OFFSET] = self.shared
            value |= _ZC_BIT
        ctx.fence()
        mine[ENTER] = value
        self.begun = True

    def resolve(self) -> bool:
        """Find where each peer's data is (its ring or its shared buffer), once all have
        entered; ``False`` while some peer has not."""
        ctx, seq = self.ctx, self.seq
        words = ctx.words
        sources: List[Any] = [None] * ctx.size
        for peer in self.peers:
            value = words[peer][ENTER]
            entered = value >> _SEQ_SHIFT
            if entered < seq:
                return False
            if entered == seq:
                if value & _TAG_MASK != self.tag:
                    raise CallsDiffer(
                        f"ranks called different collectives: group rank {peer} called "
                        f"another operation, dtype or size than this rank (group rank "
                        f"{self.me}: {self.name} of {self.total_bytes} bytes, {self.dtype}); "
                        f"the group is now unusable (its shared-memory operations "
                        f"stopped at this one): destroy it")
                if value & _ZC_BIT:
                    index, offset = words[peer][SEGMENT], words[peer][OFFSET]
                    if index == 0:  # a private array, read by cross-memory attach
                        sources[peer] = (ctx.pids[peer], offset)
                    else:
                        sources[peer] = ctx.user_segments[index].regions[peer][offset:]
        ctx.fence()
        self.sources = sources
        return True

    # -- ring -----------------------------------------------------------------------
    def ring_free(self, k: int) -> bool:
        """Whether this rank may overwrite the ring slot of its chunk ``k``."""
        need = self.k0 + k + 1 - self.ctx.slots
        if need <= 0:
            return True
        words = self.ctx.words
        for peer in self.peers:
            if words[peer][CONSUMED] < need:
                return False
        self.ctx.fence()
        return True

    def slot(self, owner: int, k: int, piece: int, count: int) -> np.ndarray:
        """Piece ``piece`` of ``owner``'s ring slot for chunk ``k``, as ``count`` elements."""
        ctx = self.ctx
        start = ((self.k0 + k) % ctx.slots) * ctx.slot_bytes + piece * ctx.piece_bytes
        return ctx.regions[owner][start:start + count * self.item].view(self.dtype)

    def fetch(self, owner: int, lo: int, hi: int) -> np.ndarray:
        """Elements ``lo:hi`` of ``owner``'s buffer, read in place: a view of its shared
        segment, or a copy into this rank's scratch (cross-memory attach)."""
        item, source = self.item, self.sources[owner]
        if type(source) is tuple:
            scratch = self.ctx.scratch(owner, (hi - lo) * item).view(self.dtype)
            cma.read(scratch, source[0], source[1] + lo * item)
            return scratch
        return source[lo * item:hi * item].view(self.dtype)

    def copy_from(self, dst: np.ndarray, owner: int, lo: int, hi: int) -> None:
        """Copy elements ``lo:hi`` of ``owner``'s buffer, read in place, into ``dst``."""
        item, source = self.item, self.sources[owner]
        if type(source) is tuple:
            cma.read(dst, source[0], source[1] + lo * item)
        else:
            np.copyto(dst, source[lo * item:hi * item].view(self.dtype))

    def all_at_least(self, word: int, value: int, staged_only: bool = False) -> bool:
        """Whether every peer's counter ``word`` has reached ``value`` (only peers that
        stage, when ``staged_only``)."""
        words, sources = self.ctx.words, self.sources
        for peer in self.peers:
            if staged_only and sources[peer] is not None:
                continue
            if words[peer][word] < value:
                return False
        self.ctx.fence()
        return True

    def publish(self, word: int, value: int) -> None:
        ctx = self.ctx
        ctx.fence()
        ctx.words[self.me][word] = value

    def released(self) -> bool:
        """A zero-copy rank returns once every peer has read all it needs of its buffer."""
        return self.shared is None or self.all_at_least(CONSUMED, self.k0 + self.nch)

    def step(self) -> bool:
        if not self.begun:
            self.begin()
        if self.advance() and self.released():
            self.done = True
        return self.done

    def advance(self) -> bool:
        """Do what can be done now; ``True`` once this rank's own work is finished."""
        raise NotImplementedError


class AllReduce(Collective):
    """all_reduce of ``flat`` in place, in one of three ways chosen once every rank has
    published its descriptor (so all ranks choose alike):

    * reduce-scatter + all-gather per chunk (any group size, and always when every
      rank's buffer is shared: then nothing is staged);
    * at two ranks with a private buffer somewhere, for the sums the C kernel takes
      (``kernel``, agreed by every rank of the communicator): the kernel's staged
      reduce-scatter + all-gather (:mod:`.shm_pair`), run by one call per test;
    * otherwise at two ranks, *pair*: each rank stages its whole
      chunk and adds the peer's copy into its own, so a chunk waits on one counter
      instead of two and takes two NumPy calls instead of four. Both ranks combine in
      rank order, so both get the same bits. Measured faster here than reading the
      peer's private array by cross-memory attach (1.2x MPI against 0.5x at 256 KiB,
      1.1x against 1.0x at 4 MiB, even at 16 MiB), whose system calls and extra
      handshakes cost more than the copy they save.

    All use the same chunk numbering (``nch`` is fixed before the choice; operations
    the kernel may run count chunks of its own size).
    """

    code = 1

    def __init__(self, ctx: Any, flat: np.ndarray, reducer: Reducer,
                 shared: Optional[tuple], kernel: Optional[tuple] = None,
                 numbered: Optional[tuple] = None):
        size = ctx.size
        self.flat = flat
        self.reducer = reducer
        #: (kind, reals) for the C kernel at two ranks (:mod:`.pair`), else None.
        self.kernel = kernel if ctx.pair_kernel is not None else None
        self.kernel_args: Optional[tuple] = None
        self.bounds = split(flat.size, size)
        self.ce = (self.kernel_chunk(flat.itemsize, ctx.piece_bytes) if self.kernel
                   else max(1, ctx.piece_bytes // flat.itemsize))
        super().__init__(ctx, "all_reduce", flat.dtype, flat.nbytes,
                         chunks(flat.size, size, self.ce), shared, numbered, reducer.kind)
        self.pair = False
        self.s = 0  # chunks staged
        self.r = 0  # chunks of my part reduced
        self.g = 0  # chunks gathered

    @staticmethod
    def kernel_chunk(itemsize: int, piece_bytes: int) -> int:
        """Elements of a half per chunk when the C kernel runs the operation."""
        return max(1, min(piece_bytes, shm_pair.PIECE_BYTES) // itemsize)

    def span(self, part: int, k: int) -> "tuple[int, int]":
        lo = self.bounds[part] + k * self.ce
        return lo, max(lo, min(self.bounds[part + 1], lo + self.ce))

    def choose(self) -> bool:
        """Resolve the peers, then pick the way (``False`` while some peer is missing)."""
        if not self.resolve():
            return False
        sources = self.sources
        if self.ctx.size == 2:  # in place only when both arrays lie in shared segments
            everyone_shared = (self.shared is not None and self.shared[0] != 0 and
                               type(sources[self.peers[0]]) is np.ndarray)
        else:
            everyone_shared = self.shared is not None and all(
                sources[p] is not None for p in self.peers)
        if everyone_shared:
            self.s = self.nch
        elif self.ctx.size == 2:
            self.pair = True
            self.shared = None  # staged like the peer's: nobody reads this buffer in place
            self.sources = [None, None]
            if self.kernel is not None:
                code, count = self.kernel
                reals = count // self.flat.size  # complex: two reals per element
                self.kernel_args = (self.flat.ctypes.data, count, code, self.ce * reals,
                                    self.bounds[1] * reals, self.nch, self.k0, 0)
            else:
                self.ce = -(-self.flat.size // self.nch) if self.nch else 1
        elif self.shared is not None:
            self.s = self.nch
        return True

    def advance(self) -> bool:
        if self.sources is None and not self.choose():
            return False
        if self.pair:
            return self.advance_pair()
        nch, k0 = self.nch, self.k0
        while True:
            moved = False
            g, r, s = self.g, self.r, self.s
            if g < r and self.all_at_least(REDUCED, k0 + g + 1):
                self.gather(g)
                self.g = g + 1
                self.publish(CONSUMED, k0 + g + 1)
                moved = True
            if r < s and self.all_at_least(STAGED, k0 + r + 1, staged_only=True):
                self.reduce(r)
                self.r = r + 1
                self.publish(REDUCED, k0 + r + 1)
                moved = True
            if s < nch and s < self.g + LOOKAHEAD and self.ring_free(s):
                self.stage(s)
                self.s = s + 1
                self.publish(STAGED, k0 + s + 1)
                moved = True
            if not moved:
                return self.g == nch

    def stage(self, k: int) -> None:
        flat = self.flat
        for peer in self.peers:
            lo, hi = self.span(peer, k)
            if hi > lo:
                np.copyto(self.slot(self.me, k, peer, hi - lo), flat[lo:hi])

    def reduce(self, k: int) -> None:
        me, sources = self.me, self.sources
        lo, hi = self.span(me, k)
        if hi == lo:
            return
        own = self.flat[lo:hi]
        inputs = [self.slot(p, k, me, hi - lo) if sources[p] is None
                  else self.fetch(p, lo, hi) for p in self.peers]
        if self.shared is not None:
            self.reducer.combine(own, own, inputs)
        else:
            result = self.slot(me, k, me, hi - lo)
            self.reducer.combine(result, own, inputs)
            np.copyto(own, result)

    def gather(self, k: int) -> None:
        flat, sources = self.flat, self.sources
        for peer in self.peers:
            lo, hi = self.span(peer, k)
            if hi > lo:
                if sources[peer] is None:
                    np.copyto(flat[lo:hi], self.slot(peer, k, peer, hi - lo))
                else:
                    self.copy_from(flat[lo:hi], peer, lo, hi)

    def wait_pair(self, slice_s: float, yield_every: int) -> None:
        """Wait in C, up to ``slice_s`` seconds, for the kernel's remaining steps (the
        caller's next ``step()`` completes the operation)."""
        args, lock = self.kernel_args, self.ctx.kernel_lock
        if args is not None and self.g < self.nch and lock.acquire(False):
            try:  # one thread at a time: the kernel runs without the GIL
                self.r, self.s, self.g = shm_pair.unpack(self.ctx.pair_kernel.run(
                    *args, self.r, self.s, self.g, slice_s, yield_every))
            finally:
                lock.release()

    def advance_pair(self) -> bool:
        args = self.kernel_args
        if args is not None:
            lock = self.ctx.kernel_lock
            if lock.acquire(False):  # else another thread runs the kernel on it now
                try:
                    self.r, self.s, self.g = shm_pair.unpack(self.ctx.pair_kernel.run(
                        *args, self.r, self.s, self.g, 0.0, 0))
                finally:
                    lock.release()
            return self.g == self.nch
        ctx = self.ctx
        nch, k0, ce, flat = self.nch, self.k0, self.ce, self.flat
        size = flat.size
        peer = self.peers[0]
        theirs, mine = ctx.words[peer], ctx.words[self.me]
        fenced = ctx.fence if self.fenced else None
        combine = self.reducer.combine
        first = self.me == 0
        r, s = self.r, self.s
        while True:
            moved = False
            if r < s and theirs[STAGED] > k0 + r:
                if fenced:
                    fenced()
                lo = r * ce
                hi = min(size, lo + ce)
                if hi > lo:
                    other = self.slot(peer, r, 0, hi - lo)
                    own = flat[lo:hi]
                    if first:
                        combine(own, own, (other,))
                    else:
                        combine(own, other, (own,))
                r += 1
                if fenced:
                    fenced()
                mine[CONSUMED] = k0 + r
                moved = True
            if s < nch and s < r + LOOKAHEAD and theirs[CONSUMED] > k0 + s - ctx.slots:
                if fenced:
                    fenced()
                lo = s * ce
                hi = min(size, lo + ce)
                if hi > lo:
                    np.copyto(self.slot(self.me, s, 0, hi - lo), flat[lo:hi])
                s += 1
                if fenced:
                    fenced()
                mine[STAGED] = k0 + s
                moved = True
            if not moved:
                self.r, self.s = r, s
                return r == nch


class ReduceScatter(Collective):
    """Reduce ``send`` over ranks; block ``me`` (``counts`` elements each) into ``recv``."""

    code = 2

    def __init__(self, ctx: Any, send: np.ndarray, recv: np.ndarray,
                 counts: Optional[Sequence[int]], reducer: Reducer, shared: Optional[tuple]):
        size = ctx.size
        self.send, self.recv, self.reducer = send, recv, reducer
        self.bounds = (bounds_of(counts) if counts is not None
                       else [recv.size * p for p in range(size + 1)])
        self.ce = max(1, ctx.piece_bytes // send.itemsize)
        widest = max(self.bounds[p + 1] - self.bounds[p] for p in range(size))
        super().__init__(ctx, "reduce_scatter", send.dtype, send.nbytes,
                         -(-widest // self.ce), shared, variant=reducer.kind)
        self.s = self.nch if shared is not None else 0
        self.r = 0

    span = AllReduce.span
    stage = AllReduce.stage

    def advance(self) -> bool:
        nch, k0 = self.nch, self.k0
        while True:
            moved = False
            r, s = self.r, self.s
            if r < s and (self.sources is not None or self.resolve()) and \
                    self.all_at_least(STAGED, k0 + r + 1, staged_only=True):
                self.reduce(r)
                self.r = r + 1
                self.publish(CONSUMED, k0 + r + 1)
                moved = True
            if s < nch and s < self.r + LOOKAHEAD and self.ring_free(s):
                self.stage(s)
                self.s = s + 1
                self.publish(STAGED, k0 + s + 1)
                moved = True
            if not moved:
                return self.r == nch

    @property
    def flat(self) -> np.ndarray:  # what ``stage`` copies from
        return self.send

    def reduce(self, k: int) -> None:
        me, sources = self.me, self.sources
        lo, hi = self.span(me, k)
        if hi == lo:
            return
        base = self.bounds[me]
        inputs = [self.slot(p, k, me, hi - lo) if sources[p] is None
                  else self.fetch(p, lo, hi) for p in self.peers]
        self.reducer.combine(self.recv[lo - base:hi - base], self.send[lo:hi], inputs)


class AllGather(Collective):
    """Every rank's block into ``recv`` (block ``p`` at ``bounds[p]``); ``send`` is this
    rank's block, or ``None`` when it already sits in ``recv``."""

    code = 3

    def __init__(self, ctx: Any, send: Optional[np.ndarray], recv: np.ndarray,
                 counts: Optional[Sequence[int]], shared: Optional[tuple]):
        size = ctx.size
        self.recv = recv
        self.bounds = (bounds_of(counts) if counts is not None
                       else split(recv.size, size))
        me = ctx.rank
        self.send = send if send is not None else recv[self.bounds[me]:self.bounds[me + 1]]
        self.copy_own = send is not None
        self.ce = max(1, ctx.slot_bytes // recv.itemsize)
        widest = max(self.bounds[p + 1] - self.bounds[p] for p in range(size))
        super().__init__(ctx, "all_gather", recv.dtype, recv.nbytes, -(-widest // self.ce),
                         shared)
        self.s = self.nch if shared is not None else 0
        self.g = 0
        if shared is not None and self.copy_own:
            recv[self.bounds[me]:self.bounds[me + 1]] = self.send

    def block(self, part: int, k: int) -> "tuple[int, int]":
        """Element range of chunk ``k`` inside block ``part`` (relative to the block)."""
        lo = k * self.ce
        return lo, max(lo, min(self.bounds[part + 1] - self.bounds[part], lo + self.ce))

    def advance(self) -> bool:
        nch, k0 = self.nch, self.k0
        while True:
            moved = False
            g, s = self.g, self.s
            if g < nch and (self.sources is not None or self.resolve()) and \
                    self.all_at_least(STAGED, k0 + g + 1, staged_only=True):
                self.gather(g)
                self.g = g + 1
                self.publish(CONSUMED, k0 + g + 1)
                moved = True
            if s < nch and s < self.g + LOOKAHEAD and self.ring_free(s):
                lo, hi = self.block(self.me, s)
                if hi > lo:
                    np.copyto(self.slot(self.me, s, 0, hi - lo), self.send[lo:hi])
                    if self.copy_own:
                        base = self.bounds[self.me]
                        np.copyto(self.recv[base + lo:base + hi], self.send[lo:hi])
                self.s = s + 1
                self.publish(STAGED, k0 + s + 1)
                moved = True
            if not moved:
                return self.g == nch and self.s == nch

    def gather(self, k: int) -> None:
        recv, sources = self.recv, self.sources
        for peer in self.peers:
            lo, hi = self.block(peer, k)
            if hi > lo:
                base = self.bounds[peer]
                if sources[peer] is None:
                    np.copyto(recv[base + lo:base + hi], self.slot(peer, k, 0, hi - lo))
                else:
                    self.copy_from(recv[base + lo:base + hi], peer, lo, hi)


class Broadcast(Collective):
    """``buf`` of ``root`` into ``buf`` of every rank."""

    code = 4

    def __init__(self, ctx: Any, buf: np.ndarray, root: int, shared: Optional[tuple]):
        self.buf, self.root = buf, root
        self.ce = max(1, ctx.slot_bytes // buf.itemsize)
        super().__init__(ctx, "broadcast", buf.dtype, buf.nbytes, -(-buf.size // self.ce),
                         shared if ctx.rank == root else None, variant=root + 1)
        if ctx.rank != root:
            self.peers = [root]  # a non-root reads the root only; the root waits for all
        self.k = self.nch if ctx.rank == root and self.shared is not None else 0

    def span(self, k: int) -> "tuple[int, int]":
        lo = k * self.ce
        return lo, min(self.buf.size, lo + self.ce)

    def resolve(self) -> bool:
        if self.me == self.root:  # the root reads nobody
            self.sources = [None] * self.ctx.size
            return True
        return super().resolve()

    def advance(self) -> bool:
        nch, k0 = self.nch, self.k0
        if self.me == self.root:
            while self.k < nch and self.ring_free(self.k):
                lo, hi = self.span(self.k)
                np.copyto(self.slot(self.me, self.k, 0, hi - lo), self.buf[lo:hi])
                self.k += 1
                self.publish(STAGED, k0 + self.k)
            if self.k == nch:
                self.publish(CONSUMED, k0 + nch)
                return True
            return False
        while self.k < nch and (self.sources is not None or self.resolve()) and \
                self.all_at_least(STAGED, k0 + self.k + 1, staged_only=True):
            lo, hi = self.span(self.k)
            if self.sources[self.root] is None:
                np.copyto(self.buf[lo:hi], self.slot(self.root, self.k, 0, hi - lo))
            else:
                self.copy_from(self.buf[lo:hi], self.root, lo, hi)
            self.k += 1
            self.publish(CONSUMED, k0 + self.k)
        return self.k == nch

