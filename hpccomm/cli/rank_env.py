"""Per-rank bootstrap of ``hpccomm run``: torchrun's variables, abort hook, then the script.

``hpccomm run`` starts ``python -m hpccomm.cli.rank_env [-m] TARGET ARGS...`` under the
launcher. On each rank this module reads the launcher's own variables (hydra's
``PMI_RANK``/``MPI_LOCALRANKID``, Open MPI's ``OMPI_COMM_WORLD_*``, Slurm's
``SLURM_PROCID``/``SLURM_LOCALID``...: :mod:`hpccomm.launcher_env`), sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE`` as torchrun would, installs :mod:`hpccomm.excepthook`, and runs the
target with :mod:`runpy` exactly as ``python script.py`` / ``python -m module`` would.
It does not initialize MPI, so the script may still set ``mpi4py.rc`` options first.

With ``--torch`` (``hpccomm run --torch``) it also imports :mod:`hpccomm.torch` (backends
``"hpccomm"`` and ``"mpi"``, rendezvous ``mpi://``) and sets ``MASTER_ADDR`` and
``MASTER_PORT`` as torchrun would for ``env://``: rank 0's host (``127.0.0.1`` when all
ranks share one) and a port free there, agreed over MPI, which this initializes.
"""
from __future__ import annotations

import os
import runpy
import socket
import sys
from typing import Dict, List, Mapping, Optional

from ..launcher_env import launcher_local_rank, launcher_rank, master_address
from ..stores.ports import free_port


def torchrun_env(env: Mapping[str, str]) -> Dict[str, str]:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` for this rank.

    Outside any launcher this is a world of one. If the launcher states no local rank,
    all ranks are assumed on one node (and a warning says so).
    """
    rank, size = launcher_rank(env) or (0, 1)
    local = launcher_local_rank(env)
    if local is None:
        if size > 1:
            sys.stderr.write(f"hpccomm: rank {rank}: the launcher sets no local rank "
                             f"variable; assuming one node (LOCAL_RANK=RANK)\n")
        local = (rank, size)
    return {"RANK": str(rank), "WORLD_SIZE": str(size),
            "LOCAL_RANK": str(local[0]), "LOCAL_WORLD_SIZE": str(local[1])}


#: Bytes of a host name exchanged by :func:`torch_master` (DNS names are at most 253).
_HOST_BYTES = 256


def torch_master(env: Mapping[str, str]) -> Dict[str, str]:
    """``MASTER_ADDR`` and ``MASTER_PORT`` for torch's ``env://``, keeping any already set.

    Rank 0 picks a free port on its host; every rank learns rank 0's host name and that
    port through one all-gather over ``MPI_COMM_WORLD`` (under the default group
    timeout). Ranks all on one host get ``127.0.0.1``.
    """
    addr, port = master_address(env)
    if addr is not None and port is not None:
        return {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
    import numpy as np

    from ..backends.mpi import plumbing as mpi
    from ..types import default_pg_timeout

    world = mpi.world()
    mine = np.zeros(_HOST_BYTES + 8, dtype=np.uint8)
    name = socket.gethostname().encode()[:_HOST_BYTES]
    mine[:len(name)] = np.frombuffer(name, dtype=np.uint8)
    if world.Get_rank() == 0:
        mine[_HOST_BYTES:].view(np.int64)[0] = port if port is not None else free_port()
    every = mpi.allgather(world, mine, "hpccomm run --torch (agreeing on MASTER_ADDR/"
                          "MASTER_PORT)", default_pg_timeout.total_seconds())
    hosts = {bytes(row[:_HOST_BYTES]).rstrip(b"\0").decode() for row in every}
    first = bytes(every[0, :_HOST_BYTES]).rstrip(b"\0").decode()
    return {"MASTER_ADDR": addr or ("127.0.0.1" if len(hosts) == 1 else first),
            "MASTER_PORT": str(int(every[0, _HOST_BYTES:].view(np.int64)[0]))}


def run_target(argv: List[str]) -> None:
    """Run ``argv`` = ``[script, args...]`` or ``["-m", module, args...]`` as ``__main__``."""
    if argv and argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("hpccomm.cli.rank_env: -m needs a module name")
        sys.argv = [argv[1], *argv[2:]]  # sys.path[0] is already the cwd, as for -m
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    if not argv:
        raise SystemExit("usage: python -m hpccomm.cli.rank_env [-m module | script.py] [args...]")
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as ``python script.py``
    runpy.run_path(script, run_name="__main__")


def _user_traceback(exc: BaseException):
    """The traceback without this bootstrap's and runpy's own frames."""
    tb = exc.__traceback__
    skip = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
    while tb is not None and (tb.tb_frame.f_code.co_filename in skip or os.path.abspath(
            tb.tb_frame.f_code.co_filename) in skip):
        tb = tb.tb_next
    return tb or exc.__traceback__


def main(argv: Optional[List[str]] = None) -> None:
    """Set the variables, install the abort hook, run the target; errors go to the hook."""
    from ..diagnostics import excepthook

    args = list(sys.argv[1:] if argv is None else argv)
    with_torch = bool(args) and args[0] == "--torch"
    if with_torch:
        args = args[1:]
    os.environ.update(torchrun_env(os.environ))
    excepthook.install()
    try:
        if with_torch:
            _prepare_torch()
        run_target(args)
    except SystemExit:
        raise
    except BaseException as exc:
        trimmed = _user_traceback(exc)
        sys.excepthook(type(exc), exc.with_traceback(trimmed), trimmed)
        sys.exit(1)


def _prepare_torch() -> None:
    """``--torch``: register hpccomm's backends with torch and set env://'s variables."""
    try:
        import hpccomm.torch  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"hpccomm run --torch: {exc}") from None
    os.environ.update(torch_master(os.environ))


if __name__ == "__main__":
    main()
