"""Gated blocking calls: which operations use them, per MPI library and size, and how.

The MPI backend starts every operation as one nonblocking call (``MPI_Iallreduce``...)
and polls it under the group's deadline. Where an MPI library runs its nonblocking
collectives much slower than its blocking ones (Open MPI: ``libnbc`` progresses only
inside MPI calls and picks other algorithms, e.g. a binomial reduce + broadcast for
any in-place all-reduce), a *synchronous* call from a size threshold on is **gated**
instead:

1. every rank posts a nonblocking all-gather of the call's signature (operation, bytes,
   root) on a communicator kept for this, and polls it under the deadline like any
   operation: an absent rank still gives a timeout error, never a hang;
2. once all signatures are in and equal, every rank is inside the same call, so the
   library's own blocking call (``MPI_Allreduce``...) runs: it cannot wait for an
   absent rank. Different signatures raise an error naming both calls at once.

A rank that calls with ``async_op=True`` (or whose call becomes a Work) cannot promise
to wait at once, and ``async_op`` is each rank's own choice, as in torch: so it posts
its signature too, marked "not waiting", and starts the nonblocking call at once. Every
rank learns from the signatures whether all of them wait at once; if any does not, the
waiting ones start the nonblocking call as well, so the ranks never split between a
blocking call and its nonblocking twin, which MPI does not match.

The thresholds below come from ``benchmarks/studies/mpi_patterns.py`` (docs/cluster.md
lists the numbers); they are looked up once, from the library found by
``MPI.get_vendor()``.
``HPCCOMM_MPI_GATED`` overrides the table: ``off`` (never gate), ``all=256K`` (every
gateable operation from 256 KiB), or ``all_reduce=64K,all_gather=1M``.
"""
from __future__ import annotations

import struct
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from mpi4py import MPI

from ... import settings
from ...errors import CallsDiffer, DistTimeoutError
from ...work import Deferred, Started, poll

KiB, MiB = 1024, 1024 * 1024
NEVER = float("inf")

#: hpccomm operation -> the nonblocking MPI call whose blocking twin a gate may use.
#: The ``v`` variants (uneven counts) are never gated: their per-rank byte counts
#: differ legitimately, so a signature could not tell a mismatch from a valid call.
#: (``gather`` and ``scatter`` take per-rank lists, which may be uneven: always ``v``.)
CALLS: Dict[str, str] = {
    "all_reduce": "Iallreduce", "broadcast": "Ibcast", "reduce": "Ireduce",
    "all_gather": "Iallgather", "reduce_scatter": "Ireduce_scatter_block",
    "all_to_all": "Ialltoall",
}

#: MPI library family -> {operation: bytes from which a synchronous call is gated}.
#: Operations not listed stay nonblocking at every size.
GATED_FROM: Dict[str, Dict[str, float]] = {
    # MPICH (and derivatives): nonblocking collectives mostly run the blocking algorithms;
    # reduce_scatter does not from 1 MiB: at 8 and 16 ranks on one node, MPICH 5.0.2's
    # Ireduce_scatter_block took 547 and 600 us at 1 MiB, Reduce_scatter_block 393 and 442.
    "mpich": {"reduce_scatter": 1 * MiB},
    # Intel MPI 2021: its nonblocking all_reduce, broadcast and reduce_scatter keep pace;
    # reduce and all_gather fall to 0.66-0.89x of the blocking calls from 4 MiB, and
    # all_to_all to 0.59x at 16 MiB (two interleaved runs, 2 ranks).
    "intel": {"reduce": 4 * MiB, "all_gather": 4 * MiB, "all_to_all": 16 * MiB},
    # Open MPI 5: libnbc is 1.5-6x slower than the tuned blocking collectives from tens
    # of KiB for all_reduce, reduce and all_gather; broadcast, reduce_scatter and
    # all_to_all keep pace, so a gate would only add its latency there.
    "openmpi": {"all_reduce": 16 * KiB, "reduce": 64 * KiB, "all_gather": 64 * KiB},
    "other": {},
}

_VENDORS = {"MPICH": "mpich", "MVAPICH": "mpich", "MVAPICH2": "mpich", "Intel MPI": "intel",
            "Open MPI": "openmpi"}


def family(vendor: str) -> str:
    """The table row for ``MPI.get_vendor()[0]`` (``"Open MPI"`` -> ``"openmpi"``)."""
    return _VENDORS.get(vendor, "other")


def parse_gates(text: str) -> Dict[str, float]:
    """``HPCCOMM_MPI_GATED``'s grammar: ``"off"`` -> ``{}``; ``"all=256K"``,
    ``"all_reduce=64K,all_gather=1M"`` -> {operation: bytes}; ``ValueError`` otherwise."""
    if text.strip().lower() in ("off", "0", "no", "none", "never"):
        return {}
    table: Dict[str, float] = {}
    for item in text.split(","):
        name, _, size = item.partition("=")
        name = name.strip()
        if name == "all":
            table.update(dict.fromkeys(CALLS, settings.parse_size(size)))
        elif name in CALLS:
            table[name] = settings.parse_size(size)
        else:
            raise ValueError(f"unknown operation {name!r} (choose from all, "
                             f"{', '.join(CALLS)})")
    return table


def gated_from(vendor: str, environ: Optional[Mapping[str, str]] = None) -> Dict[str, float]:
    """For each nonblocking MPI call name (:data:`CALLS`), the bytes from which a
    synchronous call is gated (``inf``: never), for this library and environment
    (a malformed ``HPCCOMM_MPI_GATED`` warns and keeps the library's table)."""
    table = dict(GATED_FROM[family(vendor)])
    override = settings.MPI_GATED.get(environ)
    if override is not None:
        try:
            table = parse_gates(override)
        except ValueError as exc:
            settings.MPI_GATED.reject(override, str(exc), using=f"the table for {vendor}")
    return {CALLS[op]: table.get(op, NEVER) for op in CALLS}


#: Code of each gateable call in a signature (the order is part of the wire format).
_CODES = {name: code for code, name in enumerate(CALLS.values(), start=1)}
_NAMES = {code: name for name, code in _CODES.items()}
#: Nonblocking call name -> its blocking twin (``Iallreduce`` -> ``Allreduce``).
_BLOCKING = {name: name[1].upper() + name[2:] for name in CALLS.values()}
_SIGNATURE = struct.Struct("<qqqq")  # call code, bytes, root (-1: none), waits at once
_WAITS_AT = 24  # offset of the last field, which may differ between ranks
_ROOTED = {"Ibcast", "Ireduce"}  # calls whose last argument is the root


def dup_within(comm: Any, timeout: Optional[float],
               what: str = "creating the MPI backend of a group") -> Any:
    """``comm`` duplicated (``MPI_Comm_idup`` polled under ``timeout``); ``what`` names
    the creation in the error if some rank never comes."""
    new, request = comm.Idup()
    if poll(request.Test, timeout):
        raise DistTimeoutError(f"{what} of {comm.Get_size()} ranks: not every rank "
                               f"arrived within {timeout} s")
    new.Set_errhandler(MPI.ERRORS_RETURN)
    return new


class Gate:
    """The gates of one communicator: a duplicate of it that carries the signature
    exchanges (so they never match a data collective), and per (call, bytes, root) the
    signature, what every rank must send, and the blocking twin of the call."""

    #: Distinct (call, bytes, root) signatures kept; more clears the cache.
    CACHE = 1024

    def __init__(self, comm: Any, timeout: Optional[float]):
        self.comm = dup_within(comm, timeout)
        self.size = self.comm.Get_size()
        self._signatures: Dict[Tuple[str, int, int], Tuple[bytes, bytes, Any]] = {}

    def start(self, nbytes: int, finish: Optional[Callable[[], Any]],
              call: Callable[..., Any], args: Tuple[Any, ...]) -> Started:
        """The triple of ``call(*args)`` gated: ``(Gated, its finish, args)``."""
        name = call.__name__
        key = (name, nbytes, args[-1] if name in _ROOTED else -1)
        found = self._signatures.get(key)
        if found is None:
            if len(self._signatures) >= self.CACHE:
                self._signatures.clear()
            waiting = _SIGNATURE.pack(_CODES[name], nbytes, key[2], 1)
            later = _SIGNATURE.pack(_CODES[name], nbytes, key[2], 0)
            blocking = getattr(call.__self__, _BLOCKING[name])
            found = self._signatures[key] = (waiting, later, self.size, blocking)
        gated = Gated(self.comm, call, args, finish, *found)
        return gated, gated.finish, args

    def free(self) -> None:
        from .plumbing import free

        comm, self.comm = self.comm, None
        free(comm)


class Gated(Deferred):
    """One collective started as a gate, then the blocking call if every rank waits at
    once, else the nonblocking call (see the module doc).

    As a ``test`` (a caller that waits at once) it posts the signature all-gather on its
    first call; once every rank's signature is in (raising if the calls differ), it is
    true if they all wait at once, and :meth:`finish` makes the blocking call and runs
    ``after``; otherwise it starts the nonblocking call and is true once that is done.
    :meth:`start_async` (``async_op``, or a Work made of it) posts the signature marked
    "not waiting" and starts the nonblocking call at once; the test is then true once
    both are done. Every buffer, the signatures' included, lives on this object until
    then.
    """

    __slots__ = ("gate", "call", "args", "after", "waiting", "later", "size", "blocking",
                 "seen", "signature_done", "call_test", "block")

    def __init__(self, gate: Any, call: Callable[..., Any], args: Tuple[Any, ...],
                 after: Optional[Callable[[], Any]], waiting: bytes, later: bytes,
                 size: int, blocking: Callable[..., Any]):
        self.gate, self.call, self.args, self.after = gate, call, args, after
        self.waiting, self.later, self.size, self.blocking = waiting, later, size, blocking
        self.seen: Optional[bytearray] = None
        #: the signature all-gather's Test, until it is done (then None)
        self.signature_done: Optional[Callable[[], bool]] = None
        #: the nonblocking call's Test, once started
        self.call_test: Optional[Callable[[], bool]] = None
        self.block = False  # every rank waits at once: finish() makes the blocking call

    def _post(self, signature: bytes) -> None:
        self.seen = bytearray(len(signature) * self.size)
        self.signature_done = self.gate.Iallgather(signature, self.seen).Test

    def __call__(self) -> bool:
        if self.seen is None:  # first poll: a caller that waits at once
            self._post(self.waiting)
        if self.signature_done is not None:
            if not self.signature_done():
                return False
            self.signature_done = None
            everyone_waits = self._check()
            if self.call_test is None:
                if everyone_waits:
                    self.block = True
                    return True
                self.call_test = self.call(*self.args).Test
        return self.block or self.call_test()

    def start_async(self) -> None:
        if self.seen is None:
            self._post(self.later)
            self.call_test = self.call(*self.args).Test

    def finish(self) -> Any:
        if self.block:  # every rank is inside this very call, waiting
            self.blocking(*self.args)
        return None if self.after is None else self.after()

    def _check(self) -> bool:
        """Whether every rank waits at once, after checking they all make this call."""
        assert self.seen is not None
        width = _SIGNATURE.size
        theirs = [bytes(self.seen[i:i + width]) for i in range(0, len(self.seen), width)]
        call = self.waiting[:_WAITS_AT]
        if any(sig[:_WAITS_AT] != call for sig in theirs):
            raise CallsDiffer(self._mismatch(theirs))
        return all(sig == self.waiting for sig in theirs)

    def _mismatch(self, theirs: List[bytes]) -> str:
        """Which rank is in which collective, for the error."""
        call = self.waiting[:_WAITS_AT]
        others = [f"rank {rank}: {_describe(sig)}" for rank, sig in enumerate(theirs)
                  if sig[:_WAITS_AT] != call]
        return (f"ranks called different collectives (this rank: "
                f"{_describe(self.waiting)}; {'; '.join(others)}); the group is now "
                f"unusable: destroy it")


def _describe(signature: bytes) -> str:
    code, nbytes, root, _ = _SIGNATURE.unpack(signature)
    name = _BLOCKING.get(_NAMES.get(code, ""), f"call {code}")
    return f"MPI_{name} of {nbytes} bytes" + (f", root {root}" if root >= 0 else "")
