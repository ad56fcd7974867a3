"""The MPI thread level hpccomm starts MPI at, decided in one place.

mpi4py initializes MPI when ``mpi4py.MPI`` is first imported, at the level of
``mpi4py.rc.thread_level`` (``"multiple"`` unless a program changes it). Every module
of hpccomm that imports ``mpi4py.MPI`` calls :func:`prepare` first, so when hpccomm is
the one to start MPI, it starts it at:

1. the level ``HPCCOMM_MPI_THREAD_LEVEL`` names, when set;
2. else ``multiple`` if a feature in use needs other threads to call MPI
   (:func:`need_multiple`: ``hpccomm.torch``'s progress thread, the pytest plugin's
   lockstep watchdog), or if the program set ``mpi4py.rc`` itself;
3. else the level measured fastest for the MPI library (:data:`FASTEST`): ``serialized``
   for MPICH, whose small collectives take 2.4-3.8 times as long at ``multiple``
   (``docs/results/thread-levels.md``); ``multiple`` for the others, where the level
   changes little.

To ask the library its name before it starts, step 3 imports ``mpi4py.MPI`` with
``mpi4py.rc.initialize`` off (``MPI_Get_library_version`` is allowed before
``MPI_Init``) and calls ``MPI_Init_thread`` itself; mpi4py still finalizes MPI at exit.
When the program imported ``mpi4py.MPI`` before hpccomm needed it, MPI runs at the
level the program chose, and hpccomm works at any level: below ``multiple`` the job's
store is served over TCP (:func:`hpccomm.stores.mpi.job_store`), and ``hpccomm.torch``'s
asynchronous operations progress while waited for.
"""
from __future__ import annotations

import sys
from typing import Any, List

from . import settings

#: The levels, lowest first, by mpi4py's names.
LEVELS = ("single", "funneled", "serialized", "multiple")
#: The level at which each library's small collectives are fastest, by the vendor name
#: mpi4py reports (``MPI.get_vendor()``); a library not listed starts at ``multiple``.
FASTEST = {"MPICH": "serialized"}
#: Why ``multiple`` is needed, one entry per feature that said so.
_needed_by: List[str] = []


def need_multiple(why: str) -> None:
    """Say that ``why`` (a feature) has a thread of its own that calls MPI: if hpccomm
    starts MPI and no setting names a level, it starts it at ``multiple``."""
    if why not in _needed_by:
        _needed_by.append(why)


def choose(vendor: str) -> str:
    """The level hpccomm starts MPI at for library ``vendor`` (mpi4py's name of it), when
    the program left ``mpi4py.rc`` alone: steps 1-3 above."""
    return (settings.MPI_THREAD_LEVEL.get() or ("multiple" if _needed_by else None)
            or FASTEST.get(vendor, "multiple"))


def prepare() -> None:
    """Before hpccomm's first import of ``mpi4py.MPI``: start MPI at the level above,
    or leave it to mpi4py. Cheap once MPI is imported (a dict lookup)."""
    if "mpi4py.MPI" in sys.modules:
        return
    import mpi4py

    level = settings.MPI_THREAD_LEVEL.get()
    if level is not None:
        mpi4py.rc.thread_level = level
        return
    rc = mpi4py.rc
    if _needed_by or rc.thread_level != "multiple" or rc.initialize is not True:
        return  # mpi4py's own start, at its level
    MPI = start_later()
    start(MPI, choose(MPI.get_vendor()[0]))


def start_later() -> Any:
    """``mpi4py.MPI``, imported without starting MPI (its library is known then), for
    :func:`start`; mpi4py still finalizes MPI at exit, as if it had started it."""
    import mpi4py

    rc = mpi4py.rc
    rc.initialize = False
    if rc.finalize is None:
        rc.finalize = True
    try:
        from mpi4py import MPI
    finally:
        rc.initialize = True
    return MPI


def start(MPI: Any, level: str) -> None:  # noqa: N803 (mpi4py's module name)
    """Start MPI at ``level`` (one of :data:`LEVELS`), after :func:`start_later`."""
    import mpi4py

    mpi4py.rc.thread_level = level
    MPI.Init_thread(getattr(MPI, f"THREAD_{level.upper()}"))
