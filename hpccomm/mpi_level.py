"""The MPI thread level hpccomm starts MPI at, applied in one place.

mpi4py initializes MPI when ``mpi4py.MPI`` is first imported, at the level of
``mpi4py.rc.thread_level`` (``"multiple"`` unless a program changes it). Every module
of hpccomm that imports ``mpi4py.MPI`` calls :func:`prepare` first, so when hpccomm is
the one to start MPI, it starts it at the level ``HPCCOMM_MPI_THREAD_LEVEL`` names, or
at mpi4py's when the setting is unset. When the program imported ``mpi4py.MPI`` before
hpccomm needed it, MPI runs at the level the program chose. This module itself never
imports ``mpi4py.MPI``.

hpccomm works at every level, including a lower one than asked that the library
provides. Below ``multiple`` only one thread may be inside MPI at a time, and MPICH
picks faster shared-memory algorithms for small *blocking* collectives
(``docs/results/thread-levels.md``; hpccomm's own operations are nonblocking and gain
nothing); hpccomm's own threads adapt: the job's store is
served over TCP instead of by an MPI thread (:func:`hpccomm.stores.mpi.job_store`), and
``hpccomm.torch``'s asynchronous operations progress while waited for.

At ``multiple``, hpccomm's own helper threads that call MPI (the MPI store's server,
``hpccomm.torch``'s progress thread, the NCCL watchdog, the pytest plugin's lockstep
watchdog) take :data:`helper_lock` around each of their rounds, the roll calls of the
timeouts they enforce included, and a fault-tolerant agreement takes it around each of
its MPI calls, so that no helper thread is inside MPI while an agreement progresses
(see :data:`helper_lock`). No user code runs while a helper holds it: the progress
thread completes futures and runs abort hooks after letting it go.
"""
from __future__ import annotations

import sys
import threading

from . import settings

#: Held by each of hpccomm's helper threads around each round of its MPI calls, and by
#: a fault-tolerant agreement (ULFM's ``MPI_Comm_iagree``, which ``hpccomm.agree`` and
#: ``shrink_group`` run) around each of its own. Open MPI 5's agreement defers a message
#: that reaches one thread's progress while another thread is inside the agreement, and
#: handles it out of order: the agreement may then return the value of the agreement
#: before or after it, on every rank alike (measured: 31 wrong values in 2000 rounds of
#: three agreements with one thread polling MPI beside them, none without it). With
#: this lock the helper threads still run between two polls of the agreement, never
#: during one. Reentrant: a helper's round may finish work whose callbacks call MPI.
helper_lock = threading.RLock()

#: The levels, lowest first, by mpi4py's names.
LEVELS = ("single", "funneled", "serialized", "multiple")


def chosen() -> str:
    """The level hpccomm starts MPI at: ``HPCCOMM_MPI_THREAD_LEVEL``, else mpi4py's."""
    level = settings.MPI_THREAD_LEVEL.get()
    if level is None:
        import mpi4py

        level = mpi4py.rc.thread_level
    return level


def prepare() -> None:
    """Before hpccomm's first import of ``mpi4py.MPI``: the level of
    ``HPCCOMM_MPI_THREAD_LEVEL`` into ``mpi4py.rc``, if set and MPI is not imported yet.
    Cheap once MPI is imported (a dict lookup)."""
    if "mpi4py.MPI" in sys.modules:
        return
    level = settings.MPI_THREAD_LEVEL.get()
    if level is not None:
        import mpi4py

        mpi4py.rc.thread_level = level
