"""What ``hpccomm bench`` measures: for each operation, one call per variant on shared buffers.

:data:`CASES` is the table of the collectives: for each, the hpccomm function and its
arguments, mpi4py's blocking and nonblocking calls and their arguments, and whether it
has a shared-memory window form. :func:`make_case` builds every variant of one
(operation, size) from its row, on the same NumPy buffers; send/recv is a ping-pong
(:func:`_ping_pong`) and :func:`ceiling` the memory-traffic bound. The measuring, the
jobs and the table printed are :mod:`.bench`'s.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import numpy as np

from ..stores.ports import free_port

KiB, MiB = 1024, 1024 * 1024
DEFAULT_SIZES = [8, 64, 512, 4 * KiB, 32 * KiB, 256 * KiB, 1 * MiB, 2 * MiB, 4 * MiB,
                 16 * MiB, 64 * MiB]
OPS = ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
       "all_to_all_single", "send_recv"]
VARIANTS = ["hpccomm", "hpccomm_async", "mpi4py", "mpi4py_nb", "gloo"]
SHM_VARIANTS = ["hpccomm_noshm", "hpccomm_window", "ceiling"]
#: Operations that hpccomm runs through shared memory on one node.
SHM_OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor")
#: nccl-tests' bus-bandwidth factors, by group size ``n``.
BUS_FACTOR: Dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "all_to_all_single": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
}


def init_gloo(comm: Any) -> Any:
    """``torch.distributed`` on gloo over loopback TCP, port chosen by rank 0."""
    import torch
    import torch.distributed as td

    torch.set_num_threads(1)
    port = None
    if comm.rank == 0:
        port = free_port("127.0.0.1")
    port = comm.bcast(port, root=0)
    td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                          rank=comm.rank, world_size=comm.size)
    return td


class Case(NamedTuple):
    """One collective's row: how its buffers look and how each library calls it.

    ``buffers``: ``"one"`` (one array, in place), ``"gather"`` (output ``n`` times the
    input), ``"scatter"`` (input ``n`` times the output) or ``"exchange"`` (two arrays of
    one size). hpccomm takes ``(output, input)``, MPI ``(input, output)``; a rooted call
    adds root 0 last; ``in_place``: MPI's call takes ``MPI.IN_PLACE`` first.
    """

    hpccomm: str              # the function of hpccomm.collectives (and of torch.distributed)
    mpi: str                  # mpi4py's blocking method of the communicator
    mpi_nb: str               # its nonblocking form
    buffers: str = "one"
    rooted: bool = False
    in_place: bool = False
    window: bool = True       # has the hpccomm_window variant (arrays from hpccomm.shm)


CASES: Dict[str, Case] = {
    "all_reduce": Case("all_reduce", "Allreduce", "Iallreduce", in_place=True),
    "broadcast": Case("broadcast", "Bcast", "Ibcast", rooted=True),
    "all_gather_into_tensor": Case("all_gather_into_tensor", "Allgather", "Iallgather",
                                   buffers="gather"),
    "reduce_scatter_tensor": Case("reduce_scatter_tensor", "Reduce_scatter_block",
                                  "Ireduce_scatter_block", buffers="scatter"),
    "all_to_all_single": Case("all_to_all_single", "Alltoall", "Ialltoall",
                              buffers="exchange", window=False),
}


def _buffers(kind: str, count: int, n: int) -> Tuple[np.ndarray, ...]:
    """hpccomm's array arguments: ``(a,)`` or ``(output, input)``, float32, zeros."""
    if kind == "one":
        return (np.zeros(count, np.float32),)
    big, small = np.zeros(count, np.float32), np.zeros(count // n, np.float32)
    return {"gather": (big, small), "scatter": (small, big),
            "exchange": (big, np.zeros(count, np.float32))}[kind]


def _variants(case: Case, arrays: Tuple[Any, ...], tensors: Tuple[Any, ...], comm: Any,
              td: Any, plain: Any) -> Dict[str, Callable[[], Any]]:
    """One call per variant of ``case`` on ``arrays`` (``tensors``: gloo's views)."""
    from mpi4py import MPI

    from .. import collectives

    hp = getattr(collectives, case.hpccomm)
    root = (0,) if case.rooted else ()
    args = arrays + root
    mpi_args = ((MPI.IN_PLACE,) if case.in_place else ()) + arrays[::-1] + root
    blocking, nonblocking = getattr(comm, case.mpi), getattr(comm, case.mpi_nb)
    gloo_args = tensors + root
    return {
        "hpccomm": partial(hp, *args),
        "hpccomm_async": lambda: hp(*args, async_op=True).wait(),
        "mpi4py": partial(blocking, *mpi_args),
        "mpi4py_nb": lambda: nonblocking(*mpi_args).Wait(),
        "gloo": lambda: getattr(td, case.hpccomm)(*gloo_args),
        "hpccomm_noshm": partial(hp, *args, group=plain),
    }


def case_count(op: str, nbytes: int, n: int) -> int:
    """float32 elements of ``op`` at ``nbytes`` on ``n`` ranks: a multiple of ``n`` where
    each rank has a block (nccl-tests' rounding)."""
    count = max(1, nbytes // 4)
    case = CASES.get(op)
    if case is not None and case.buffers != "one":
        count = -(-count // n) * n
    return count


def make_case(op: str, nbytes: int, comm: Any, td: Any = None, plain: Any = None,
              arena: Optional[np.ndarray] = None
              ) -> Tuple[int, Dict[str, Callable[[], Any]], Any]:
    """``(bytes, {variant: one operation}, buffers to keep)`` for ``op`` at ``nbytes``.

    Every variant works on the same NumPy buffers; gloo on ``torch.from_numpy`` views.
    ``plain`` (a group made with ``HPCCOMM_SHM=0``) adds ``hpccomm_noshm``; ``arena`` (a
    float32 array from ``hpccomm.shm.empty``, at least twice the size) adds
    ``hpccomm_window`` and ``ceiling`` for the shared-memory operations.
    """
    from .. import collectives, p2p

    n, rank = comm.size, comm.rank
    count = case_count(op, nbytes, n)
    case = CASES.get(op)
    view = _torch_view if td is not None else (lambda a: None)
    if case is not None:
        arrays = _buffers(case.buffers, count, n)
        tensors = tuple(view(a) for a in arrays)
        fns = _variants(case, arrays, tensors, comm, td, plain)
        if arena is not None and case.window:
            window, start = [], 0
            for a in arrays:  # the same shapes, one after the other in the arena
                window.append(arena[start:start + a.size])
                window[-1][...] = 0
                start += a.size
            fns["hpccomm_window"] = partial(getattr(collectives, case.hpccomm), *window,
                                            *((0,) if case.rooted else ()))
        keep: Any = (arrays, tensors)
    elif op == "send_recv":
        a = np.zeros(count, np.float32)
        t = view(a)
        fns = _ping_pong(p2p, comm, td, a, t, rank, n, plain)
        keep = (a, t)
    else:
        raise ValueError(f"unknown operation {op!r}; choose from {', '.join(OPS)}")
    if plain is None:
        fns.pop("hpccomm_noshm", None)
    if op in SHM_OPS and arena is not None:
        fns["ceiling"], bound = ceiling(op, count, n, rank)
        keep = (keep, bound)
    return count * 4, fns, keep


def ceiling(op: str, count: int, n: int, rank: int) -> Tuple[Callable[[], Any], Any]:
    """``(one operation, buffers)``: the memory traffic of ``op`` on ``count`` float32
    elements that reading the peers' arrays in place cannot avoid, done by NumPy on this
    rank's private arrays (stand-ins for the ``n - 1`` peers' ones) with no
    synchronization. Every rank runs it at once, so it is the bound of a shared-memory
    algorithm on this machine:

    * all_reduce: reduce my part from ``n`` inputs, copy the ``n - 1`` other parts in;
    * reduce_scatter_tensor: reduce my part from ``n`` inputs into the output;
    * all_gather_into_tensor: copy the ``n - 1`` other blocks in;
    * broadcast: copy the whole buffer in (the root does nothing; the slowest rank counts).
    """
    part = count // n
    mine = slice(rank * part, (rank + 1) * part)
    others = [slice(q * part, (q + 1) * part) for q in range(n) if q != rank]
    own = np.zeros(count, np.float32)
    peers = [np.zeros(count, np.float32) for _ in range(n - 1)]
    if op == "all_reduce":
        def run() -> None:
            target = own[mine]
            for peer in peers:
                np.add(target, peer[mine], out=target)
            for peer, where in zip(peers, others):
                np.copyto(own[where], peer[where])
    elif op == "reduce_scatter_tensor":
        out = np.zeros(part, np.float32)

        def run() -> None:
            np.add(own[mine], peers[0][mine], out=out)
            for peer in peers[1:]:
                np.add(out, peer[mine], out=out)
        return run, (own, peers, out)
    elif op == "all_gather_into_tensor":
        def run() -> None:
            for peer, where in zip(peers, others):
                np.copyto(own[where], peer[where])
    else:  # broadcast
        def run() -> None:
            if rank != 0:
                np.copyto(own, peers[0])
    return run, (own, peers)


def _torch_view(a: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(a)


def _ping_pong(p2p: Any, comm: Any, td: Any, a: np.ndarray, t: Any, rank: int,
               n: int, plain: Any = None) -> Dict[str, Callable[[], Any]]:
    """Send then receive (even ranks) or receive then send (odd), with rank ^ 1."""
    peer = rank ^ 1
    if peer >= n:  # an odd last rank idles
        return {v: (lambda: None) for v in VARIANTS + SHM_VARIANTS}
    pairs = {
        "hpccomm": (lambda: p2p.send(a, peer), lambda: p2p.recv(a, peer)),
        "hpccomm_async": (lambda: p2p.isend(a, peer).wait(),
                          lambda: p2p.irecv(a, peer).wait()),
        "mpi4py": (lambda: comm.Send(a, peer), lambda: comm.Recv(a, peer)),
        "mpi4py_nb": (lambda: comm.Isend(a, peer).Wait(), lambda: comm.Irecv(a, peer).Wait()),
        "gloo": (lambda: td.send(t, peer), lambda: td.recv(t, peer)),
        "hpccomm_noshm": (lambda: p2p.send(a, peer, group=plain),
                          lambda: p2p.recv(a, peer, group=plain)),
    }

    def round_trip(send: Callable[[], Any], recv: Callable[[], Any]) -> Callable[[], Any]:
        if rank % 2 == 0:
            return lambda: (send(), recv())
        return lambda: (recv(), send())
    return {v: round_trip(*pair) for v, pair in pairs.items()}
