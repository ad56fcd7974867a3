"""The environment for a job that a test starts itself (``mpiexec``, ``hpccomm run``...),
and which mpiexec starts it.

A test may run under a launcher; a job it starts must not inherit that launcher's
per-process variables (this process's rank, its PMI/PMIx connection), or the new job's
ranks would take themselves for part of this one. The MPI library's *settings* stay:
Open MPI's permission to run as root and to oversubscribe (``OMPI_ALLOW_RUN_AS_ROOT*``,
``PRTE_MCA_*``), MCA parameters, Intel MPI's ``I_MPI_*`` options.
"""
import os

# The mpiexec of a test's job is the one ``hpccomm run`` uses: the setting
# HPCCOMM_MPIEXEC, else the mpiexec (or mpirun) next to this Python, else PATH's. Tests
# import the product's launcher module here and nowhere else.
from hpccomm.cli.launch import find_mpiexec  # noqa: F401  (tests/helpers.py starts jobs with it)

#: Variables a launcher sets for each process it starts (by prefix).
PER_PROCESS = ("PMI_", "PMIX_", "HYDRA_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
               "OMPI_COMM_WORLD_", "OMPI_WORLD_", "OMPI_UNIVERSE_SIZE", "OMPI_FILE_LOCATION",
               "OMPI_COMMAND", "OMPI_ARGV", "OMPI_NUM_APP_CTX", "OMPI_FIRST_RANKS",
               "OMPI_APP_CTX_", "OMPI_MCA_num_procs", "OMPI_MCA_initial_wdir",
               "OMPI_MCA_cpu_type", "OMPI_TOOL_NAME", "PRTE_LAUNCHED", "I_MPI_INFO_",
               "I_MPI_PIN_INFO", "I_MPI_PIN_MAPPING", "I_MPI_HYDRA_UUID")
#: ... except these settings, which share a prefix with them.
SETTINGS = ("PMIX_MCA_",)


def without_launcher(extra_prefixes=(), env=None, **extra):
    """A copy of ``env`` (default ``os.environ``) without launcher per-process variables
    nor names starting with ``extra_prefixes``, updated with ``extra``."""
    env = os.environ if env is None else env
    drop = PER_PROCESS + tuple(extra_prefixes)
    clean = {k: v for k, v in env.items() if not k.startswith(drop) or k.startswith(SETTINGS)}
    clean.update(extra)
    return clean


_VENDOR = []


def mpi_vendor():
    """``"MPICH"``, ``"Open MPI"``, ``"Intel MPI"``...: the library mpi4py loads here,
    asked in a child process so that the test process itself stays without MPI."""
    if not _VENDOR:
        import subprocess
        import sys

        done = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; "
                               "print(MPI.get_vendor()[0])"], capture_output=True, text=True,
                              timeout=60, env=without_launcher())
        _VENDOR.append(done.stdout.strip())
    return _VENDOR[0]
