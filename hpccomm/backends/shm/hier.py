"""All-reduce for a group that spans nodes: shared memory within each node, MPI between.

A group whose ranks sit on several nodes, the same number ``P >= 2`` of them on each,
reduces a large array in three steps (:class:`HierarchicalCommunicator`):

1. **reduce-scatter within the node**, through shared memory: each of the node's ``P``
   ranks ends up with the node's sum of one ``1/P`` shard of the array;
2. **all-reduce of each shard across the nodes**, through MPI, among the ranks with the
   same index on their node (one rank per node: ``P`` independent all-reduces of
   ``1/P`` of the data, all nodes' network links busy at once);
3. **all-gather within the node**, through shared memory: every rank gets every shard.

Flat MPI sends the whole array through the network from one rank per node, or every
rank's through it (depending on the library's algorithm); here each rank sends only its
``1/P`` shard across nodes, and the node-local steps run at memory speed (see
docs/performance.md for a model and measurements). Integer results are bit-identical to
the flat path's; floating-point sums differ by reassociation (the node's ranks are
added first, then the nodes), as between any two MPI algorithms. Small messages, and
operations or dtypes the steps do not cover, take the flat MPI path.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Deque, List, Optional, Sequence

import numpy as np

from ...errors import DistBackendError
from ...types import RedOpType
from ...work import Deferred, Started
from ..mpi.communicator import MPICommunicator
from . import progress as _progress

#: The smallest all_reduce (bytes) that takes the three steps; below, flat MPI. The
#: steps add two passes through the node's memory and a handshake per chunk to what the
#: network carries, so they pay where the bytes they take off the network outweigh
#: those: on 2 simulated nodes of 8 ranks, one per core (the "network" there is the
#: same memory, the least they can gain), they ran at 0.71x hpccomm's flat MPI path at
#: 1 MiB, 0.94x at 4 MiB and 1.59x at 64 MiB, so they start at 16 MiB; a real network
#: makes them pay earlier, which ``HPCCOMM_SHM_MIN_BYTES`` sets after a run of
#: benchmarks/multinode.py there. Where the machine runs more ranks than it has CPUs,
#: the steps are off unless that setting asks for them: each handshake may wait for a
#: context switch (2 simulated nodes of 2 ranks on 2 cores: 1.0-2.3x slower than the
#: flat path up to 16 MiB; docs/performance.md).
DEFAULT_MIN_BYTES = 16 << 20

#: The reductions the steps compute: the node's and the nodes' partial results combine
#: with the same operation (AVG sums, then divides once).
_STEP_KIND = {RedOpType.SUM: RedOpType.SUM, RedOpType.AVG: RedOpType.SUM,
              RedOpType.MIN: RedOpType.MIN, RedOpType.MAX: RedOpType.MAX,
              RedOpType.PRODUCT: RedOpType.PRODUCT}


class Chain:
    """Steps run one after another as one operation: each step is a function that starts
    it and returns its ``(test, finish, keep)``; a step starts once the one before it has
    finished, and no further than ``limit`` steps started (the chain of an operation
    started earlier, whose own step must start first on every rank). A step's deferred
    test starts in its nonblocking form, since the chain may be polled rarely
    (``async_op``)."""

    __slots__ = ("steps", "test", "finish", "keep", "started", "error")

    def __init__(self, steps: Sequence[Callable[[], Started]]):
        self.steps = list(reversed(steps))
        self.keep: List[Any] = []
        self.test: Optional[Callable[[], bool]] = None
        self.finish: Optional[Callable[[], Any]] = None
        self.started = 0  # steps started so far
        self.error: Optional[BaseException] = None  # what a step raised
        self._next()

    def _next(self) -> bool:
        if not self.steps:
            self.test = None
            return False
        test, self.finish, keep = self.steps.pop()()
        if isinstance(test, Deferred):
            test.start_async()
        self.test = test
        self.keep.append(keep)
        self.started += 1
        return True

    def advance(self, limit: float = float("inf")) -> bool:
        """Run the steps as far as they go without waiting, starting none past ``limit``
        steps; whether the whole chain is done."""
        while self.test is not None:
            if not self.test():
                return False
            if self.finish is not None:
                self.finish()
                self.finish = None
            if self.started >= limit and self.steps:
                return False
            if not self._next():
                return True
        return True


class HierarchicalCommunicator(MPICommunicator):
    """A group's MPI communicator whose large all_reduce runs in three steps (module
    docstring): ``local`` is a shared-memory communicator of this node's ranks of the
    group, ``cross`` an MPI communicator of the ranks with this rank's index on every
    node. Everything else, and small messages, go through the group's own MPI
    communicator."""

    def __init__(self, comm: Any, timeout: Optional[float], local: Any, cross: Any,
                 min_bytes: int):
        super().__init__(comm, timeout)
        self.local = local
        self.cross = MPICommunicator(cross, timeout)
        self.min_hier = max(1, min_bytes)
        self.nodes = self.cross.size
        # the direct form of synchronous sums stays below the three steps
        self.direct_below = min(self.direct_below, self.min_hier)
        #: The chains under way, in the order they started; every wait advances them
        #: (:mod:`.progress`), one thread at a time.
        self.chains: Deque[Chain] = collections.deque()
        self.advance_lock = threading.Lock()

    def set_timeout(self, seconds: Optional[float]) -> None:
        super().set_timeout(seconds)
        self.local.set_timeout(seconds)
        self.cross.set_timeout(seconds)

    def advance_pending(self) -> None:
        """Advance the chains in order: a chain starts a step only once every chain
        before it has started that step, so that every rank starts the steps' MPI and
        shared-memory operations in one order, whichever operation it waits for."""
        if not self.advance_lock.acquire(False):
            return
        try:
            chains = self.chains
            limit = float("inf")
            for chain in tuple(chains):
                try:
                    done = chain.advance(limit)
                except Exception as exc:  # raised by its own test
                    chain.error, done = exc, True
                if done and chain is chains[0]:
                    chains.popleft()
                    continue
                if done:
                    chains.remove(chain)
                    continue
                limit = chain.started
            if not chains:
                _progress.release(self)
        finally:
            self.advance_lock.release()

    def all_reduce(self, buf: np.ndarray, kind: RedOpType, factor: Any) -> Started:
        step_kind = _STEP_KIND.get(kind)
        if (buf.nbytes < self.min_hier or step_kind is None or factor is not None
                or buf.dtype.kind == "b"):
            return MPICommunicator.all_reduce(self, buf, kind, factor)
        local, cross = self.local, self.cross
        flat = buf.reshape(-1)
        counts = [len(part) for part in np.array_split(np.empty(flat.size, np.uint8),
                                                       local.size)]
        shard = np.empty(counts[local.rank], flat.dtype)
        chain = Chain([
            lambda: local.reduce_scatter(flat, shard, step_kind, None, counts),
            lambda: cross.all_reduce(shard, step_kind, None),
            lambda: local.all_gather(shard, flat, counts),
        ])
        self.chains.append(chain)
        _progress.register(self)

        def test() -> bool:
            if chain.test is not None and chain.error is None:
                self.advance_pending()  # (another thread's wait may be advancing it now)
            if chain.error is not None:
                raise chain.error
            return chain.test is None
        finish = None
        if kind is RedOpType.AVG:
            size = self.size

            def finish() -> None:
                np.true_divide(flat, size, out=flat, casting="unsafe")
        return test, finish, (flat, shard, chain)

    def shutdown(self) -> None:
        """Free the node's and the cross-node communicators (the group frees its own)."""
        from ..mpi.plumbing import free

        local, cross = self.local, self.cross
        for chain in self.chains:  # their waits fail at once instead of timing out
            chain.error = DistBackendError("the group was destroyed while this "
                                           "hierarchical all_reduce was pending")
        self.chains.clear()
        _progress.release(self)
        local.shutdown()
        free(local.comm)
        cross.shutdown()
        free(cross.comm)
        super().shutdown()

