"""MPI communicator plumbing for the group layer and DeviceMesh: the world, duplicates,
members-only sub-communicators, splits, rank translation, Cartesian topologies, and the
conversion of MPI's errors at the boundary.

Importing this module initializes MPI (through ``mpi4py.MPI``), which is why the group
layer imports it on first use (:func:`hpccomm.group.mpi_backend`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ...errors import DistBackendError
from ... import work as _work
from ...work import Work
from . import placement

_work.can_test = lambda: not MPI.Is_finalized()  # abandoned requests: test while MPI lives


# -- communicator plumbing for the group layer ------------------------------------------
def world() -> Any:
    """``MPI.COMM_WORLD`` (MPI is initialized by importing mpi4py.MPI if needed)."""
    return MPI.COMM_WORLD


def thread_level() -> int:
    return MPI.Query_thread()


def library_version() -> str:
    """The first line of the MPI library's version, without the NUL Open MPI ends it with."""
    return MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]


def tag_upper_bound(comm: Any) -> int:
    return int(comm.Get_attr(MPI.TAG_UB))


def allgather(comm: Any, mine: np.ndarray, op: str, timeout: Optional[float]) -> np.ndarray:
    """Every rank's ``mine`` (same shape and dtype on all ranks), stacked in rank order,
    gathered without blocking past ``timeout``; ``op`` names the step in a timeout's
    message. For start-up agreements, before any group exists."""
    every = np.empty((comm.Get_size(),) + mine.shape, dtype=mine.dtype)
    work = Work(comm.Iallgather(mine, every).Test, None, (mine, every))  # both kept alive
    work.op, work.timeout = op, timeout
    work.wait()
    return every


def allgather_flags(comm: Any, flag: bool, timeout: Optional[float]) -> List[bool]:
    """Every rank's ``flag``, gathered without blocking past ``timeout`` (start-up)."""
    flags = allgather(comm, np.array([flag], dtype=np.int8),
                      "init_process_group (ranks agreeing on the launch)", timeout)
    return [bool(f) for f in flags[:, 0]]


def dup(comm: Any) -> Any:
    new = comm.Dup()
    new.Set_errhandler(MPI.ERRORS_RETURN)
    return new


def create_subcomm(parent: Any, ranks: Sequence[int], tag: int) -> Any:
    """A communicator of ``ranks`` (parent numbering, in that order); members only call it."""
    group = parent.Get_group().Incl(list(ranks))
    try:
        new = parent.Create_group(group, tag)
    finally:
        group.Free()
    new.Set_errhandler(MPI.ERRORS_RETURN)
    return new


def split(parent: Any, color: Optional[int], key: int) -> Optional[Any]:
    """``MPI_Comm_split``: ``None`` color means this rank joins no new communicator."""
    new = parent.Split(MPI.UNDEFINED if color is None else color, key)
    if new == MPI.COMM_NULL:
        return None
    new.Set_errhandler(MPI.ERRORS_RETURN)
    return new


def node_local(comm: Any) -> Tuple[int, int]:
    """This rank's index and the count of ``comm``'s ranks on its node (shared memory,
    or the nodes ``HPCCOMM_NODES`` simulates); collective over ``comm``."""
    local = placement.node_comm(comm)
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def ranks_in(comm: Any, other: Any) -> List[int]:
    """For each rank of ``comm``, its rank in ``other``."""
    mine, theirs = comm.Get_group(), other.Get_group()
    try:
        return list(MPI.Group.Translate_ranks(mine, list(range(mine.Get_size())), theirs))
    finally:
        mine.Free()
        theirs.Free()


#: Tests of the operations that communicators freed now must outlive (:func:`frees_after`).
_outlive: Sequence[Any] = ()


def free(comm: Any) -> None:
    """Release a communicator; safe on ``None`` and after ``MPI_Finalize``. Inside
    :func:`frees_after` it is released once those operations are over."""
    if comm is not None and not MPI.Is_finalized() and comm != MPI.COMM_NULL:
        _work.after(_outlive, lambda: _free_now(comm))


def _free_now(comm: Any) -> None:
    if not MPI.Is_finalized():
        try:
            comm.Free()
        except MPI.Exception:
            pass


@contextlib.contextmanager
def frees_after(tests: Sequence[Any]) -> Iterator[None]:
    """Within this block, :func:`free` keeps each communicator until every one of
    ``tests`` (of operations abandoned on it, :func:`hpccomm.work.running`) is true:
    MPI may still progress those operations, and Open MPI crashes in a later call when
    a nonblocking collective's communicator was freed under it."""
    global _outlive
    _outlive = tests
    try:
        yield
    finally:
        _outlive = ()


def is_mpi_error(exc: BaseException) -> bool:
    return isinstance(exc, MPI.Exception)


def error_text(exc: BaseException) -> str:
    if isinstance(exc, MPI.Exception):
        return exc.Get_error_string().strip()
    return str(exc)


def backend_error(context: str, exc: BaseException) -> DistBackendError:
    """An MPI error converted at the boundary: context plus MPI's own text."""
    error = DistBackendError(f"{context}: MPI error: {error_text(exc)}")
    error.__cause__ = exc
    return error


# -- Cartesian topologies for DeviceMesh ---------------------------------------------------
def cart_create(comm: Any, dims: Sequence[int]) -> Optional[Any]:
    """A Cartesian communicator over ``comm``'s first ``prod(dims)`` ranks, row-major.

    ``reorder=False`` keeps rank ``i`` of ``comm`` at row-major position ``i``; ranks
    beyond the product get ``None``. Collective over ``comm``.
    """
    cart = comm.Create_cart(list(dims), periods=[False] * len(dims), reorder=False)
    if cart == MPI.COMM_NULL:
        return None
    cart.Set_errhandler(MPI.ERRORS_RETURN)
    return cart


def cart_sub(cart: Any, remain_dims: Sequence[bool]) -> Any:
    """``MPI_Cart_sub``: this rank's slice keeping the ``remain_dims`` dimensions.

    Collective over the whole Cartesian communicator; each rank gets its own slice.
    Keeping no dimension gives each rank a communicator of itself alone, made locally:
    the standard asks ``MPI_Cart_sub`` for that, but Intel MPI returns
    ``MPI_COMM_NULL`` on every rank but 0. (Every rank passes the same mask, so all of
    them skip the collective alike.)
    """
    remain = [bool(keep) for keep in remain_dims]
    if not any(remain):
        sub = MPI.COMM_SELF.Dup()
    else:
        sub = cart.Sub(remain)
        if sub == MPI.COMM_NULL:
            raise DistBackendError(f"MPI_Cart_sub({remain}) returned MPI_COMM_NULL on "
                                   f"rank {cart.Get_rank()} of a Cartesian communicator")
    sub.Set_errhandler(MPI.ERRORS_RETURN)
    return sub


def cart_coords(cart: Any) -> Tuple[int, ...]:
    """This rank's coordinates in a Cartesian communicator (local, no communication)."""
    return tuple(cart.Get_coords(cart.Get_rank()))


def cart_dims(cart: Any) -> Tuple[int, ...]:
    """The dimension sizes of a Cartesian communicator (local)."""
    return tuple(cart.Get_topo()[0])
