"""The ``hpccomm`` command (also ``python -m hpccomm``): ``run``, ``info`` and ``bench``.

``hpccomm run -n 4 train.py --epochs 3`` starts ``train.py`` on 4 ranks with srun inside
a Slurm allocation, else with mpiexec; each rank gets torchrun's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, and an uncaught exception on any
rank aborts the whole job; with ``--torch`` each rank also imports ``hpccomm.torch``
and gets ``MASTER_ADDR``/``MASTER_PORT``, so torchrun scripts and scripts for torch's
``"mpi"`` backend run unchanged. A script that does not exist, or a module that cannot be
found, is refused before any rank starts (one line, status 2, as ``python`` does). The
launcher process replaces itself with the launcher (``exec``), so signals and the exit
status are the launcher's own; it never initializes MPI. ``hpccomm info`` prints the
environment for bug reports. ``hpccomm bench -n 2`` measures hpccomm against raw mpi4py
on this machine's MPI (:mod:`hpccomm.cli.bench`) in jobs started the way ``run`` starts a
script: it alternates jobs at mpi4py's default thread level with jobs of raw mpi4py at
MPI_THREAD_SERIALIZED (waiting for each, never initializing MPI itself) and prints the
merged table.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import List, Optional

from .. import settings

from . import launch


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpccomm", description="torch.distributed's model on MPI: start jobs, report "
                                    "the environment.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run", help="start a script on N ranks (srun in Slurm, else mpiexec)",
        description="Start SCRIPT (or -m MODULE) on N ranks with RANK, WORLD_SIZE, "
                    "LOCAL_RANK, LOCAL_WORLD_SIZE set; an uncaught exception on any rank "
                    "aborts the job (HPCCOMM_NO_ABORT_ON_EXCEPTION=1 to opt out).")
    run.add_argument("-n", "--nproc", "-np", dest="nproc", type=int, default=None,
                     help="number of ranks (under srun: default the allocation's tasks)")
    run.add_argument("--launcher", choices=launch.LAUNCHERS, default="auto",
                     help="auto (default): srun inside a Slurm allocation, else mpiexec")
    run.add_argument("--launcher-args", action="append", default=[], metavar="'ARGS'",
                     help="extra arguments for the launcher, shell-quoted, e.g. "
                          "--launcher-args='--cpu-bind=cores' (repeatable)")
    run.add_argument("-m", dest="module", action="store_true",
                     help="TARGET is a module name, run as python -m TARGET")
    run.add_argument("--torch", action="store_true",
                     help="for PyTorch scripts: import hpccomm.torch first (backends 'mpi' "
                          "and 'hpccomm', init_method mpi://) and set MASTER_ADDR and "
                          "MASTER_PORT too, so a script written for torchrun or for torch's "
                          "MPI backend runs unchanged")
    run.add_argument("--no-abort-on-exception", action="store_true",
                     help="let the other ranks continue when one raises")
    run.add_argument("--dry-run", action="store_true",
                     help="print the launcher command instead of running it")
    run.add_argument("target", metavar="TARGET", help="script.py, or a module with -m")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for TARGET")
    from . import bench  # light: NumPy only; MPI starts on the ranks

    timing = commands.add_parser(
        "bench", parents=[bench.parser()], add_help=False, conflict_handler="resolve",
        help="time hpccomm against raw mpi4py (and torch gloo) on N ranks",
        description="Time hpccomm against raw mpi4py on the same buffers, interleaved in "
                    "one job started like 'hpccomm run' (srun in Slurm, else mpiexec).")
    timing.add_argument("-h", "--help", action="help", help="show this help and exit")
    timing.add_argument("-n", "--nproc", "-np", dest="nproc", type=int, default=2,
                        help="number of ranks (default 2)")
    timing.add_argument("--launcher", choices=launch.LAUNCHERS, default="auto",
                        help="auto (default): srun inside a Slurm allocation, else mpiexec")
    timing.add_argument("--dry-run", action="store_true",
                        help="print the launcher command instead of running it")
    info = commands.add_parser("info", help="print versions and environment for a bug report")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.add_argument("--no-mpi", action="store_true",
                      help="do not initialize MPI (skip the MPI library probe)")
    return parser


def run_command(args: argparse.Namespace) -> List[str]:
    """The launcher command line for ``hpccomm run`` (or ``hpccomm bench``) arguments."""
    if args.command == "bench":
        target = ["-m", "hpccomm.cli.bench", "--ops", args.ops, "--sizes", args.sizes,
                  "--budget", str(args.budget)] + (["--gloo"] if args.gloo else [])
        return launch.build_command(target, nprocs=args.nproc, launcher=args.launcher)
    target = (["-m"] if args.module else []) + [args.target, *args.args]
    return launch.build_command(target, nprocs=args.nproc, launcher=args.launcher,
                                launcher_args=_launcher_words(args), torch=args.torch)


def _launcher_words(args: argparse.Namespace) -> List[str]:
    """``hpccomm run --launcher-args``, split into words."""
    return [word for text in args.launcher_args for word in shlex.split(text)]


def _bench(args: argparse.Namespace) -> int:
    """``hpccomm bench``: jobs at two MPI thread levels, alternated from here (a process
    has one level, so the second needs a job of its own); this process stays without MPI.
    ``--dry-run`` prints the first pair of job commands."""
    from . import bench

    def launch_command(target: List[str]) -> List[str]:
        return launch.build_command(target, nprocs=args.nproc, launcher=args.launcher)
    if args.dry_run:
        first, second = bench.job_words(args), bench.job_words(args, raw_only=True)
        for _, command, _ in bench.job_commands(bench.pairs(first, second, 1), "JOBDIR",
                                                launch_command):
            print(shlex.join(command))
        return 0
    return bench.drive(args, launch_command)


def _explain(args: argparse.Namespace) -> int:
    """``hpccomm bench --explain``: the path of every operation and size at ``-n`` ranks
    on one node; no job, and no MPI started in this process."""
    import mpi4py

    mpi4py.rc.initialize = mpi4py.rc.finalize = False  # only the library's name is needed
    from ..backends.mpi import placement
    from . import bench

    forced = placement.forced_crowding()  # HPCCOMM_OVERSUBSCRIBED, as in a job
    crowded = forced if forced is not None else args.nproc > (os.cpu_count() or 1)
    print(bench.explain(args, args.nproc, crowded))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``hpccomm`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "info":
        from . import info

        return info.main(as_json=args.json, mpi=not args.no_mpi)

    def refuse(problem: str) -> int:  # one line and status 2, as argparse's errors
        print(f"hpccomm {args.command}: {problem}", file=sys.stderr)
        return 2
    if args.nproc is not None and args.nproc < 1:
        return refuse(f"-n must be at least 1, got {args.nproc}")
    if args.command == "bench":
        from . import bench

        try:
            bench.options(args)  # a bad --ops/--sizes fails here, not on every rank
        except Exception as exc:
            return refuse(str(exc))
        if args.explain:
            return _explain(args)
        if args.nproc < 2:
            return refuse(f"measuring needs at least 2 ranks, got -n {args.nproc} "
                          f"(--explain takes any -n)")
    try:
        command = run_command(args)
    except launch.LaunchError as exc:
        return refuse(str(exc))
    if args.command == "run" and not args.dry_run:  # before any rank starts
        problem = launch.target_problem(args.target, args.module, _launcher_words(args))
        if problem:
            return refuse(problem)
    if args.command == "bench" and not args.no_serialized:
        return _bench(args)
    if args.dry_run:
        print(shlex.join(command))
        return 0
    if getattr(args, "no_abort_on_exception", False):
        os.environ[settings.NO_ABORT_ON_EXCEPTION.name] = "1"  # for the ranks
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(command[0], command)
    except OSError as exc:
        print(f"hpccomm {args.command}: cannot start {command[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached: execv replaced this process


if __name__ == "__main__":
    sys.exit(main())
