"""The C helper ``_direct`` (``_direct.c``): the direct forms of a synchronous in-place SUM
all-reduce and of a blocking send or receive with a known peer, and a native spin on any
mpi4py request (:func:`spin_function`).

A group's hottest call, a blocking all-reduce of a contiguous CPU tensor, costs about
2 us of Python on the general path before MPI even starts, which a torch process group
pays on top of torch's own wrapper. The direct form takes a buffer address, an element
count and MPI handles resolved once, starts ``MPI_Iallreduce`` and spins ``MPI_Test``
in C with the GIL released.

A blocking send or receive pays the same kind of cost (peer and tag checks, views, the
buffer spec mpi4py parses, a Python loop of tests): the direct form takes the array
itself (its buffer read through the buffer protocol in C), the element count, the
datatype handle and the peer, starts ``MPI_Isend`` or ``MPI_Irecv`` and spins alike.

Each is a fast start, not a second wait: after :data:`SLICE_S` an operation still running
comes back as an mpi4py request, which the caller waits for the general way (deadline,
timeout errors, signals, the progress of other operations).

The same spin serves every wait on a plain mpi4py request (the MPI backend installs it
as :data:`hpccomm.work.spin_wait`): one release of the GIL per wait instead of one per
test, so other Python threads run meanwhile without slowing it. Both spins yield the
core where ranks outnumber cores (:func:`hpccomm.work.spin_yield_every`).

The C helper calls the MPI library mpi4py loaded, through addresses found with ctypes,
so one build serves every MPI. Without a compiled helper (no C compiler at install), or
with ``HPCCOMM_MPI_DIRECT=0``, :func:`available` is false, every call takes the general
path and waits loop over ``Request.Test`` in Python.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np
from mpi4py import MPI

from ... import settings

#: Longest spin in C before the general wait takes over (a deadline, signals and other
#: operations' progress are checked there).
SLICE_S = 0.05

_helper: Any = None
_ready: Optional[bool] = None


def available() -> bool:
    """Whether the direct form can be used in this process (helper built and bound)."""
    global _helper, _ready
    if _ready is None:
        _ready = False
        if not settings.MPI_DIRECT.get():
            return False
        try:
            from . import _direct as _mpi_direct  # type: ignore[attr-defined]
        except ImportError:  # built without a C compiler: the general path only
            return False
        _mpi_direct.bind(*_library_entry_points())
        _helper = _mpi_direct
        _ready = True
    return _ready


def _library_entry_points() -> tuple:
    """``(MPI_Iallreduce, MPI_Test, MPI_IN_PLACE, sizeof(MPI_Request), MPI_Isend,
    MPI_Irecv)`` of the MPI library mpi4py loaded (looked up through mpi4py's own
    extension, whatever the library's file is called)."""
    import ctypes

    library = ctypes.CDLL(MPI.__file__)

    def address(name: str) -> int:
        return ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0
    in_place = int(MPI.IN_PLACE) & _WORD  # mpi4py gives the constant's value as an int
    return (address("MPI_Iallreduce"), address("MPI_Test"), in_place,
            MPI._sizeof(MPI.Request), address("MPI_Isend"), address("MPI_Irecv"))


_WORD = 0xFFFFFFFFFFFFFFFF


def handle(obj: Any) -> int:
    """An MPI object's handle as the C helper takes it (an unsigned machine word)."""
    return MPI._handleof(obj) & _WORD


def sum_types(plans: Dict[np.dtype, Any]) -> Dict[np.dtype, int]:
    """dtype -> MPI datatype handle, for the dtypes whose SUM ``plans`` (dtype -> the MPI
    backend's ``(mpitype, op, stage)``) is one predefined MPI type summed by
    ``MPI_SUM`` with no staging copy: those the direct form computes exactly as the
    general path."""
    return {dtype: handle(mpitype) for dtype, (mpitype, op, stage) in plans.items()
            if stage is None and op == MPI.SUM}


def function() -> Any:
    """The C helper's ``sum_in_place(address, count, datatype, op, comm, slice,
    yield_every)``: returns
    ``None`` once the operation is done, else the running request's handle (an int);
    an MPI error raises ``RuntimeError(code)`` (see :func:`error`). ``None`` when the
    direct form is unavailable."""
    return _helper.sum_in_place if available() else None


def transfer_types(types: Dict[np.dtype, Any]) -> Dict[np.dtype, int]:
    """dtype -> MPI datatype handle, from ``types`` (dtype -> the MPI datatype the general
    path sends it as), for :func:`transfer_function`, which is told the buffer format of
    each (NumPy's one-letter types; every spelling of a dtype: ``l`` and ``q`` are both
    int64 on Linux)."""
    found = {dtype: handle(mpitype) for dtype, mpitype in types.items()}
    table = []
    for code in np.typecodes["All"]:
        try:
            dtype = np.dtype(code)
            datatype = found.get(dtype)
            if datatype is not None:
                table.append((memoryview(np.empty(1, dtype)).format, dtype.itemsize,
                              datatype))
        except (TypeError, ValueError):  # no such dtype here, or no buffer format
            continue
    _helper.set_transfer_types(table)
    return found


def transfer_function() -> Any:
    """The C helper's ``transfer(comm, yield_every, receive, array, peer, tag, slice)``
    (the buffer's format names its MPI datatype, see :func:`transfer_types`): ``None`` once the send (``receive`` false) or receive is done, else
    the running request's handle (an int), or ``False``, with nothing started, where the
    array exports no C-contiguous buffer (a writable one, to receive into); an MPI error
    raises ``RuntimeError(code)``. ``None`` when the helper is unavailable."""
    return _helper.transfer if available() else None


def spin_function() -> Any:
    """The C helper's ``spin_test(address, slice, yield_every)``: tests the request at
    ``address`` (``MPI._addressof`` of an mpi4py Request) with the GIL released until it
    completes (``True``) or ``slice`` seconds pass (``False``); an MPI error raises
    ``RuntimeError(code)``. ``None`` when the helper is unavailable."""
    return _helper.spin_test if available() else None


def error(exc: RuntimeError) -> Exception:
    """The mpi4py exception for the helper's ``RuntimeError(code)``."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else MPI.ERR_OTHER
    return MPI.Exception(code)
