"""Backends behind the narrow interface of :mod:`hpccomm.backends.base`, one sub-package
per family: :mod:`.mpi` (MPI's own collectives and the communicator plumbing),
:mod:`.shm` (shared memory on one node, over the MPI family) and :mod:`.cuda` (NCCL and
CUDA-aware MPI). ``_spin.h`` is the clock and bounded spin both C helpers share.

Backends are found by name through ``hpccomm.Backend._plugins``; the built-in ones
(``mpi``, ``nccl``) are imported only when a group first needs them.
"""
from .. import mpi_level as _mpi_level

_mpi_level.prepare()  # before any backend imports mpi4py.MPI
