"""Errors raised through torch: hpccomm's, made catchable as torch's as well.

Code written for torch catches ``torch.distributed.DistBackendError`` (what NCCL raises
on a timeout or a failed collective); code written for hpccomm catches
``hpccomm.DistTimeoutError``. A backend error crossing into torch is re-raised as a class
that is both, with the same message (which names the rank, group and operation).
"""
from __future__ import annotations

import torch.distributed as dist

from .. import errors


class DistBackendError(errors.DistBackendError, dist.DistBackendError):
    """A failed MPI operation: hpccomm's and torch's ``DistBackendError`` at once."""


class DistTimeoutError(errors.DistTimeoutError, dist.DistBackendError):
    """An operation outlived its timeout: hpccomm's ``DistTimeoutError`` and torch's
    ``DistBackendError`` at once. The group is unusable afterwards."""


class ProcessFailedError(errors.ProcessFailedError, dist.DistBackendError):
    """A rank of the group died (MPI with ULFM): hpccomm's ``ProcessFailedError`` and
    torch's ``DistBackendError`` at once. ``failed_ranks`` are global ranks; go on with
    :func:`hpccomm.torch.shrink_group`."""


def for_torch(exc: BaseException) -> BaseException:
    """``exc`` as one of the classes above when it is an hpccomm backend error (its cause
    and traceback kept), else ``exc`` itself."""
    if isinstance(exc, dist.DistBackendError) or not isinstance(exc, errors.DistBackendError):
        return exc
    if isinstance(exc, errors.ProcessFailedError):
        converted: BaseException = ProcessFailedError(str(exc), exc.failed_ranks)
    else:
        kind = DistTimeoutError if isinstance(exc, errors.DistTimeoutError) else DistBackendError
        converted = kind(*exc.args)
    converted.__cause__ = exc.__cause__
    converted.__suppress_context__ = True
    return converted.with_traceback(exc.__traceback__)
