"""Turn an uncaught exception on one rank into a clean abort of the whole MPI job.

Without this, a rank that dies of an exception leaves the others blocked in their next
collective until a timeout (or forever). :func:`install` wraps ``sys.excepthook`` and
``threading.excepthook`` so that the failing rank first prints its own traceback, tagged
with its rank, and then calls ``MPI_Abort``, which the launcher (mpiexec, srun) turns
into the end of every rank. ``init_process_group`` installs it in jobs of more than one
rank and ``hpccomm run`` on every rank; programs started otherwise may call
``hpccomm.excepthook.install()`` themselves. Setting ``HPCCOMM_NO_ABORT_ON_EXCEPTION=1``
opts out (the traceback is printed and the rank exits as Python normally does).

The traceback must survive the abort, so it is written to the process's real standard
error, file descriptor 2, whatever ``sys.stderr`` points at (torch's own excepthook
points it at a buffer that it prints only after this hook returns, which an abort never
does). When that descriptor is a pipe or a socket, as it is under every launcher, the
hook then waits, for at most :data:`hpccomm.ending.DRAIN_S` seconds, until the launcher
has read what was written: an abort that overtakes the launcher's read loses the output
with the job (:func:`hpccomm.ending.end_job`).

This module never initializes MPI. If MPI was not initialized yet on the failing rank
(the exception came before ``init_process_group``), the rank kills itself with SIGTERM
under a launcher instead: mpiexec (hydra) and ``srun --kill-on-bad-exit`` end the job
when a rank dies of a signal, whereas an exit status alone leaves the others waiting.
"""
from __future__ import annotations

import sys
import threading
import traceback
from types import TracebackType
from typing import Any, Callable, Optional, Type

from .. import launcher_env, settings
from ..ending import end_job, flush_python_streams, mpi_if_running, write_stderr
from ..errors import DistValueError

#: Set to 1/true/yes to keep Python's default behaviour (no abort).
OPT_OUT_ENV = settings.NO_ABORT_ON_EXCEPTION.name

_previous: Optional[Callable[..., Any]] = None
_previous_thread: Optional[Callable[..., Any]] = None


def opted_out() -> bool:
    """Whether ``HPCCOMM_NO_ABORT_ON_EXCEPTION`` asks for no abort."""
    return settings.NO_ABORT_ON_EXCEPTION.get()


def rank_label() -> str:
    """``"rank R of N"`` from MPI if it runs, else from the launcher's environment."""
    mpi = mpi_if_running()
    if mpi is not None:
        return f"rank {mpi.COMM_WORLD.Get_rank()} of {mpi.COMM_WORLD.Get_size()}"
    return f"rank {_stated_rank()}"


def _stated_rank() -> str:
    """The rank the environment states (torch's ``RANK`` first, then the launchers'), or
    ``"?"``: never an error, since it labels the report of one."""
    try:
        rank = launcher_env.stated_rank()
    except DistValueError:
        return "?"
    return "?" if rank is None else str(rank)


def _report(where: str, exc_type: Type[BaseException], exc: Optional[BaseException],
            tb: Optional[TracebackType]) -> None:
    """Print the traceback (and abort the job unless opted out)."""
    text = f"hpccomm: uncaught exception {where}:\n" + "".join(
        traceback.format_exception(exc_type, exc, tb))
    if opted_out():
        flush_python_streams()
        write_stderr(_torch_prefixed(text))
        return
    label = rank_label()
    end_job(1, _torch_prefixed(text + f"hpccomm: {label} aborts the whole job; set "
                                    f"{OPT_OUT_ENV}=1 to let the other ranks continue\n"))


def _torch_prefixed(text: str) -> str:
    """The lines of ``text`` prefixed ``[rankN]: `` when torch's excepthook wraps this one,
    as torch prints them for its own backends."""
    hook = sys.excepthook
    if hook is _hook or getattr(hook, "__name__", "") != "_distributed_excepthook":
        return text
    mpi = mpi_if_running()
    rank = mpi.COMM_WORLD.Get_rank() if mpi is not None else _stated_rank()
    return "".join(f"[rank{rank}]: {line}" if line.strip() else line
                   for line in text.splitlines(keepends=True))


def _hook(exc_type: Type[BaseException], exc: BaseException,
          tb: Optional[TracebackType]) -> None:
    """``sys.excepthook``: this rank's traceback, then the end of the job."""
    _report(f"on {rank_label()}", exc_type, exc, tb)


def _thread_hook(args: Any) -> None:
    """``threading.excepthook``: the same for an exception that ends a thread."""
    if args.exc_type is SystemExit:  # Python ignores a thread's SystemExit: so do we
        return
    name = args.thread.name if args.thread is not None else "?"
    _report(f"in thread {name!r} on {rank_label()}", args.exc_type, args.exc_value,
            args.exc_traceback)


def install() -> bool:
    """Install the abort-on-exception hooks; returns whether they are active.

    Idempotent; does nothing (returns ``False``) when ``HPCCOMM_NO_ABORT_ON_EXCEPTION``
    is set. The previous hooks are kept for :func:`uninstall`.
    """
    global _previous, _previous_thread
    if opted_out():
        return False
    if not installed():
        _previous = sys.excepthook
        sys.excepthook = _hook
    if threading.excepthook is not _thread_hook:
        _previous_thread = threading.excepthook
        threading.excepthook = _thread_hook
    return True


def uninstall() -> None:
    """Restore the hooks that were active before :func:`install`."""
    global _previous, _previous_thread
    if sys.excepthook is _hook:
        sys.excepthook = _previous or sys.__excepthook__
    if threading.excepthook is _thread_hook:
        threading.excepthook = _previous_thread or threading.__excepthook__
    _previous = _previous_thread = None


def installed() -> bool:
    """Whether the abort-on-exception hook runs for an uncaught exception: it is
    ``sys.excepthook``, or the hook that torch's own excepthook calls."""
    hook = sys.excepthook
    return hook is _hook or (getattr(hook, "__name__", "") == "_distributed_excepthook"
                             and _previous is not None and _wrapped_by(hook))


def _wrapped_by(hook: Any) -> bool:
    """Whether ``hook`` (torch's excepthook) calls this module's hook."""
    for cell in getattr(hook, "__closure__", None) or ():
        try:
            if cell.cell_contents is _hook:
                return True
        except ValueError:
            continue
    return False
