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
    """Ranks of one group called different collectives: found before anything started
    at debug level DETAIL (the group stays usable), or by a shared-memory path while the
    operation ran (the group is unusable afterwards: destroy it)."""


class Undescribed(DistError):
    """An error a backend raised that names neither the operation nor the group (a
    backend knows neither): the dispatch layer re-raises it as its public class, the
    first base of its own, with both named (:func:`described`)."""


class CallsDiffer(DistDesyncError, Undescribed):
    """What a backend found as an operation ran: the ranks of its group called different
    operations. Its message names the calls; the dispatch layer re-raises it as a
    :class:`DistDesyncError` that names the operation and the group."""


class NeverCame(DistTimeoutError, Undescribed):
    """A backend's meeting under the group's timeout (before a call that cannot time out,
    such as NCCL communicator creation) that some ranks never came to. Its message names
    those ranks; the dispatch layer re-raises it as a :class:`DistTimeoutError` that
    names the operation and the group."""


def described(where: str, exc: Undescribed, advice: str = "") -> DistError:
    """``exc`` as the user sees it, after ``where`` (``hpccomm.all_reduce on rank 0/4 of
    group 'WORLD'``) and before ``advice`` (a sentence, or nothing), as its public class
    (:class:`DistDesyncError` for :class:`CallsDiffer`, :class:`DistTimeoutError` for
    :class:`NeverCame`)."""
    public = type(exc).__bases__[0]
    error = public(f"{where}: {exc}" + (f". {advice}" if advice else ""))
    error.__cause__ = None
    return error


class ProcessFailedError(DistBackendError):
    """A process of the group died while this rank communicated with the group.

    Raised only where the MPI library reports process failures (ULFM: Open MPI's
    ``mpirun --with-ft ulfm``); elsewhere the launcher ends the job. ``failed_ranks`` are
    the global ranks known to have failed (empty if not known yet on this rank). The
    group is revoked on every rank: go on with ``hpccomm.shrink_group()``.
    """

    def __init__(self, message: str, failed_ranks: "list[int] | tuple[int, ...]" = ()):
        super().__init__(message)
        self.failed_ranks = list(failed_ranks)

    def __reduce__(self):  # picklable with its ranks (errors cross processes in tests)
        return type(self), (str(self), self.failed_ranks)


def process_failed(what: str, failed: "list[int]", cause: BaseException) -> ProcessFailedError:
    """The error of operation ``what`` (``"all_reduce (seq 3) on rank 0/4 of group ..."``)
    whose group lost the global ranks ``failed`` (empty: not known yet on this rank)."""
    if failed:
        who = (f"global rank {failed[0]} has" if len(failed) == 1
               else f"global ranks {', '.join(map(str, failed))} have")
        dead = f"{who} failed"
    else:
        dead = "a rank of the group has failed (another rank revoked the group)"
    error = ProcessFailedError(
        f"{what} failed: {dead} ({cause}). The group is revoked on every rank; go on "
        f"with the survivors: hpccomm.shrink_group() returns the group without the failed "
        f"ranks.", failed)
    error.__cause__ = cause
    return error
