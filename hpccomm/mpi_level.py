"""The MPI thread level hpccomm asks for, applied in one place before MPI starts.

mpi4py initializes MPI when ``mpi4py.MPI`` is first imported, at the level of
``mpi4py.rc.thread_level`` (``"multiple"`` unless a program changes it). Every module
of hpccomm that imports ``mpi4py.MPI`` calls :func:`prepare` first, so the level that
``HPCCOMM_MPI_THREAD_LEVEL`` names (when set) is the one MPI starts at. When the program
imported ``mpi4py.MPI`` before hpccomm needed it, MPI runs at the level the program
chose and hpccomm works with it. This module itself never imports ``mpi4py.MPI``.

Below ``MPI_THREAD_MULTIPLE`` only one thread may be inside MPI at a time, and MPICH
then picks faster shared-memory algorithms for small collectives (see
``docs/results/thread-levels.md``). hpccomm's own threads adapt: the default store is
served over TCP instead of by an MPI thread (:func:`hpccomm.stores.mpi.job_store`), and
the PyTorch backend's asynchronous operations progress while waited for.
"""
from __future__ import annotations

import sys

from . import settings

#: The levels, lowest first, by mpi4py's names.
LEVELS = ("single", "funneled", "serialized", "multiple")


def prepare() -> None:
    """Before hpccomm's first import of ``mpi4py.MPI``: set ``mpi4py.rc.thread_level``
    to ``HPCCOMM_MPI_THREAD_LEVEL`` if it is set and MPI is not imported yet. Cheap
    once MPI is imported (a dict lookup)."""
    if "mpi4py.MPI" in sys.modules:
        return
    level = settings.MPI_THREAD_LEVEL.get()
    if level is not None:
        import mpi4py

        mpi4py.rc.thread_level = level

