"""Ending the whole job from one rank, so that what it said last is read first.

``MPI_Abort`` makes the launcher (mpiexec, srun) kill every rank, and output that the
launcher has not yet read from the failing rank's pipe dies with it. :func:`end_job`
writes its message to the process's real standard error (file descriptor 2, whatever
``sys.stderr`` points at), waits until the launcher has read it (:func:`drain`, at most
:data:`DRAIN_S` seconds), and only then aborts. Used by the uncaught-exception hook
(``diagnostics/excepthook.py``) and by anything else that must stop every rank (the
deadline on NCCL's blocking creation).

Without MPI running, under a launcher the process kills itself with SIGTERM (the
launcher turns a rank's death by a signal into the end of the job); else it exits.
"""
from __future__ import annotations

import array
import os
import signal
import stat
import sys
import time
from typing import Any

from . import launcher_env
from .errors import DistValueError

#: The longest wait for the launcher to read this rank's last output before the abort.
DRAIN_S = 3.0

# ioctl requests that tell how many written bytes nobody has read yet (Linux numbers;
# FIONREAD on a pipe counts the pipe's whole content, from either end).
_FIONREAD = 0x541B
_SIOCOUTQ = 0x5411


def mpi_if_running() -> Any:
    """The ``mpi4py.MPI`` module if MPI is initialized and not finalized, else ``None``."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return None
    try:
        return mpi if mpi.Is_initialized() and not mpi.Is_finalized() else None
    except Exception:  # a broken MPI state must not hide the user's traceback
        return None


def _unread(fd: int) -> int:
    """Bytes written to ``fd`` that its reader has not taken yet (0 when unknowable)."""
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode):
            request = _FIONREAD
        elif stat.S_ISSOCK(mode):
            request = _SIOCOUTQ
        else:  # a file or a terminal keeps what was written
            return 0
        import fcntl

        count = array.array("i", [0])
        fcntl.ioctl(fd, request, count, True)
        return count[0]
    except (OSError, ImportError, ValueError):
        return 0


def drain(fds: tuple = (1, 2), limit: float = DRAIN_S) -> bool:
    """Wait until whoever reads ``fds`` (the launcher) has read everything written to them.

    Returns ``False`` if output was still unread after ``limit`` seconds. Polls every
    5 ms: this runs once, on the way out of a failing process.
    """
    deadline = time.monotonic() + limit
    for fd in fds:
        while _unread(fd) > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
    return True


def write_stderr(text: str) -> None:
    """Write ``text`` to the real standard error (fd 2), bypassing any ``sys.stderr`` swap.

    A ``sys.stderr`` that a program pointed at a file of its own gets the text too.
    """
    data = text.encode("utf-8", "replace")
    while data:
        try:
            written = os.write(2, data)
        except InterruptedError:
            continue
        except OSError:
            break
        data = data[written:]
    stream = sys.stderr
    try:
        own_file = stream is not None and stream.fileno() != 2
    except Exception:  # a StringIO (torch's excepthook buffer), a closed stream...
        own_file = False
    if own_file:
        try:
            stream.write(text)
            stream.flush()
        except Exception:
            pass


def flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass


def end_job(code: int = 1, message: str = "") -> None:
    """End the whole job now: print ``message``, let the launcher read it, ``MPI_Abort``.

    Without MPI running, under a launcher the process kills itself with SIGTERM (which
    the launcher turns into the end of the job), else it exits with ``code``.
    Reusable by anything that must stop every rank (a watchdog, a timeout handler).
    """
    flush_python_streams()
    if message:
        write_stderr(message if message.endswith("\n") else message + "\n")
    drain()
    mpi = mpi_if_running()
    if mpi is not None:
        mpi.COMM_WORLD.Abort(code)
    if _under_launcher():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    os._exit(code)


def _under_launcher() -> bool:
    """Whether a launcher started this process as one of several ranks."""
    try:
        stated = launcher_env.launcher_rank()
    except DistValueError:  # a malformed rank variable: no launcher that can be trusted
        return False
    return stated is not None and stated[1] > 1
