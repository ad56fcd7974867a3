"""Exception types, named and nested as torch.distributed names them.

Every error hpccomm raises on purpose is a :class:`DistError` (a ``RuntimeError``),
so ``except RuntimeError`` written for torch keeps working. Backends convert their
library errors (``MPI.Exception``, NCCL errors) into these at their boundary.
"""
from __future__ import annotations


class DistError(RuntimeError):
    """Something went wrong in the distributed library."""


class DistBackendError(DistError):
    """A communication backend (MPI, NCCL) reported an error."""


class DistNetworkError(DistError):
    """A network connection failed (TCP store, rendezvous)."""


class DistStoreError(DistError):
    """A key-value store operation failed or timed out."""


class DistValueError(DistError, ValueError):
    """A bad argument: unknown rank, wrong dtype, mismatched sizes, use before init.

    Also a ``ValueError``, the type torch raises for most of these.
    """


class DistTimeoutError(DistBackendError, TimeoutError):
    """A collective, point-to-point call or ``Work.wait`` outlived its timeout.

    After this error the group's communicator may still hold the unfinished operation:
    treat the group as unusable and call ``destroy_process_group`` (or abort the job).
    """


class DistDesyncError(DistError):
    """Ranks of one group called different collectives (debug level DETAIL)."""
