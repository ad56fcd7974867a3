"""Turn an uncaught exception on one rank into a clean abort of the whole MPI job.

Without this, a rank that dies of an exception leaves the others blocked in their next
collective until a timeout (or forever). :func:`install` wraps ``sys.excepthook`` so
that the failing rank first prints its own traceback, tagged with its rank, and then
calls ``MPI_Abort``, which the launcher (mpiexec, srun) turns into the end of every
rank. ``hpccomm run`` installs it on every rank; programs started otherwise may call
``hpccomm.excepthook.install()`` themselves. Setting ``HPCCOMM_NO_ABORT_ON_EXCEPTION=1``
opts out (the traceback is printed and the rank exits as Python normally does).

This module never initializes MPI. If MPI was not initialized yet on the failing rank
(the exception came before ``init_process_group``), the rank kills itself with SIGTERM
under a launcher instead: mpiexec (hydra) and ``srun --kill-on-bad-exit`` end the job
when a rank dies of a signal, whereas an exit status alone leaves the others waiting.
"""
from __future__ import annotations

import os
import signal
import sys
import traceback
from types import TracebackType
from typing import Any, Callable, Optional, Type

from .._launcher_env import RANK_VARS

#: Set to 1/true/yes to keep Python's default behaviour (no abort).
OPT_OUT_ENV = "HPCCOMM_NO_ABORT_ON_EXCEPTION"

#: torch's RANK first, then the launchers' own variables, innermost first.
_RANK_VARS = ("RANK",) + tuple(rank for rank, _ in RANK_VARS)

_previous: Optional[Callable[..., Any]] = None


def opted_out() -> bool:
    """Whether ``HPCCOMM_NO_ABORT_ON_EXCEPTION`` asks for no abort."""
    return os.environ.get(OPT_OUT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _mpi_if_running() -> Any:
    """The ``mpi4py.MPI`` module if MPI is initialized and not finalized, else ``None``."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return None
    try:
        return mpi if mpi.Is_initialized() and not mpi.Is_finalized() else None
    except Exception:  # a broken MPI state must not hide the user's traceback
        return None


def rank_label() -> str:
    """``"rank R of N"`` from MPI if it runs, else from the launcher's environment."""
    mpi = _mpi_if_running()
    if mpi is not None:
        return f"rank {mpi.COMM_WORLD.Get_rank()} of {mpi.COMM_WORLD.Get_size()}"
    for name in _RANK_VARS:
        if os.environ.get(name, "").strip():
            return f"rank {os.environ[name].strip()}"
    return "rank ?"


def abort(code: int = 1, message: str = "") -> None:
    """End the whole job now: print ``message``, flush, then ``MPI_Abort`` (or exit).

    Reusable by anything that must stop every rank (a watchdog, a timeout handler).
    """
    if message:
        sys.stderr.write(message if message.endswith("\n") else message + "\n")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    mpi = _mpi_if_running()
    if mpi is not None:
        mpi.COMM_WORLD.Abort(code)
    if _under_launcher():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    os._exit(code)


def _under_launcher() -> bool:
    """Whether a launcher started this process as one of several ranks."""
    from .._launcher_env import launcher_rank

    stated = launcher_rank(os.environ)
    return stated is not None and stated[1] > 1


def _hook(exc_type: Type[BaseException], exc: BaseException,
          tb: Optional[TracebackType]) -> None:
    """Print this rank's traceback, then abort the job (unless opted out)."""
    label = rank_label()
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    if opted_out():
        sys.stderr.write(f"hpccomm: uncaught exception on {label}:\n{text}")
        sys.stderr.flush()
        return
    abort(1, f"hpccomm: uncaught exception on {label}:\n{text}"
             f"hpccomm: {label} aborts the whole job; set {OPT_OUT_ENV}=1 "
             f"to let the other ranks continue")


def install() -> bool:
    """Install the abort-on-exception hook; returns whether it is active.

    Idempotent; does nothing (returns ``False``) when ``HPCCOMM_NO_ABORT_ON_EXCEPTION``
    is set. The previous hook is kept for :func:`uninstall`.
    """
    global _previous
    if opted_out():
        return False
    if sys.excepthook is not _hook:
        _previous = sys.excepthook
        sys.excepthook = _hook
    return True


def uninstall() -> None:
    """Restore the hook that was active before :func:`install`."""
    global _previous
    if sys.excepthook is _hook:
        sys.excepthook = _previous or sys.__excepthook__
    _previous = None


def installed() -> bool:
    """Whether the abort-on-exception hook is the current ``sys.excepthook``."""
    return sys.excepthook is _hook
