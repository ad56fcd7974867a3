"""What the launcher says about this process: the one reader of the launchers' variables.

``HPCCOMM_*`` variables are read by :mod:`hpccomm.settings`; every other variable that
something else sets for hpccomm to read is read here and nowhere else (checked by
``tests/test_architecture.py``): the MPI launchers' rank, size and local-rank variables
(MPICH's and Intel MPI's hydra, Open MPI's mpirun, PMIx, HPE/Cray PALS, MVAPICH2, Slurm's
srun), torchrun's (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``TORCHELASTIC_*``, ``MASTER_ADDR``/``MASTER_PORT``), the batch system's job id and the
MPI libraries' own switches that hpccomm consults. Nothing here initializes MPI: the
``hpccomm run`` bootstrap and the excepthook read it before (or without) MPI.

**Precedence**, innermost starter first, since the process that started this one last
knows it best:

1. torchrun (``RANK``/``WORLD_SIZE``, ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``): it starts
   its workers itself, inside whatever started its agent;
2. the MPI launchers, in :data:`RANK_VARS` / :data:`LOCAL_VARS` order: PMI (hydra,
   ``srun --mpi=pmi2``), Open MPI, PMIx, PALS (MVAPICH2 for local ranks);
3. Slurm last: under ``mpiexec`` inside an allocation, ``SLURM_PROCID`` is the rank of
   the launcher's daemon, not of this process.

:func:`stated_rank` applies the whole order; :func:`launcher_rank` and
:func:`launcher_local_rank` apply 2 and 3 only, for the callers that write torchrun's
variables (``hpccomm run``) or check them on their own (``init_process_group``).
Within a launcher, a pair counts only when it states both the rank and the size.

**Values.** Unset or blank: ``None``. An integer is a whole number of at least 0
(:func:`hpccomm.settings.parse_count`); anything else raises :class:`DistValueError`
naming the variable, its value and who sets it (a rank the launcher got wrong must not
be guessed around). A flag is parsed by :func:`hpccomm.settings.parse_flag`; a
malformed one warns once and counts as unset, as a malformed ``HPCCOMM_*`` flag does
(the MPI library that owns it may read it its own way).
"""
from __future__ import annotations

import os
import re
import warnings
from typing import List, Mapping, Optional, Set, Tuple

from . import settings
from .errors import DistValueError

Env = Optional[Mapping[str, str]]

# (rank variable, size variable): the innermost launcher first.
RANK_VARS: List[Tuple[str, str]] = [
    ("PMI_RANK", "PMI_SIZE"),                            # MPICH hydra, srun --mpi=pmi2
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),    # Open MPI mpirun
    ("PMIX_RANK", "PMIX_SIZE"),                          # PMIx launchers
    ("PALS_RANKID", "PALS_SIZE"),                        # HPE/Cray PALS
    ("SLURM_PROCID", "SLURM_NTASKS"),                    # srun
]
# (local rank variable, local size variable), in the same order.
LOCAL_VARS: List[Tuple[str, str]] = [
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),              # MPICH/Intel MPI hydra
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"),
    ("SLURM_LOCALID", ""),                               # size: SLURM_STEP_TASKS_PER_NODE
]
#: torchrun's variables (also written by ``hpccomm run`` from the launcher's).
TORCHRUN_RANK = ("RANK", "WORLD_SIZE")
TORCHRUN_LOCAL = ("LOCAL_RANK", "LOCAL_WORLD_SIZE")
#: The job's id, the batch system's first (a name for the whole job), then the launcher's.
JOB_ID_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "JOB_ID",
               "PMIX_NAMESPACE", "PMI_JOBID")
#: This process's node within the job, from the launchers that state it.
NODE_ID_VARS = ("SLURM_NODEID", "PALS_NODEID")

#: Who sets the variables of each prefix (or name), for messages.
_SETTERS: Tuple[Tuple[str, str], ...] = (
    ("PMI_", "the PMI launcher (mpiexec/hydra, srun --mpi=pmi2)"),
    ("MPI_LOCAL", "MPICH's or Intel MPI's hydra"),
    ("OMPI_MCA_", "the user (an Open MPI MCA parameter)"),
    ("OMPI_", "Open MPI's mpirun"),
    ("PMIX_", "the PMIx launcher"),
    ("PALS_", "HPE/Cray PALS"),
    ("MV2_", "MVAPICH2's launcher"),
    ("SLURM_", "Slurm"),
    ("TORCHELASTIC_", "torchrun"),
    ("MASTER_", "torchrun or the user"),
    ("MPICH_", "the user (an MPICH setting)"),
)


def set_by(name: str) -> str:
    """Who sets the variable ``name``, in words (``"Slurm"``, ``"Open MPI's mpirun"``)."""
    if name in TORCHRUN_RANK + TORCHRUN_LOCAL:
        return "torchrun or hpccomm run"
    for prefix, who in _SETTERS:
        if name.startswith(prefix):
            return who
    return "the batch system"


# -- the parsers: one per kind ---------------------------------------------------------------
def text(name: str, env: Env = None) -> Optional[str]:
    """The value of ``name``, stripped; ``None`` when unset or blank."""
    value = (os.environ if env is None else env).get(name)
    return value.strip() if value is not None and value.strip() else None


def integer(name: str, env: Env = None) -> Optional[int]:
    """The whole number ``name`` holds; ``None`` when unset or blank.

    Raises :class:`DistValueError` naming the variable, its value and who sets it when
    the value is anything but a whole number of at least 0."""
    value = text(name, env)
    if value is None:
        return None
    try:
        return settings.parse_count(value)
    except ValueError:
        raise DistValueError(f"environment variable {name}={value!r} is not a whole number "
                             f"of at least 0 (set by {set_by(name)}): fix or unset it"
                             ) from None


_warned: Set[Tuple[str, str]] = set()


def flag(name: str, env: Env = None) -> Optional[bool]:
    """``name`` as a flag (``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/
    ``off``, any case); ``None`` when unset or blank, and when malformed (after a
    ``RuntimeWarning`` naming it, once per variable and value)."""
    value = text(name, env)
    if value is None:
        return None
    try:
        return settings.parse_flag(value)
    except ValueError as exc:
        if (name, value) not in _warned:
            _warned.add((name, value))
            warnings.warn(f"hpccomm: {name}={value!r} is malformed: {exc}; hpccomm takes "
                          f"it as unset", RuntimeWarning, stacklevel=3)
        return None


# -- what the launchers state ----------------------------------------------------------------
def launcher_pair(env: Env = None) -> Optional[Tuple[str, str, Optional[int], Optional[int]]]:
    """``(rank variable, size variable, rank, size)`` of the innermost MPI launcher that
    states either, or ``None``: what :func:`launcher_rank` would read, with its names."""
    for rank_var, size_var in RANK_VARS:
        rank, size = integer(rank_var, env), integer(size_var, env)
        if rank is not None or size is not None:
            return rank_var, size_var, rank, size
    return None


def launcher_rank(env: Env = None) -> Optional[Tuple[int, int]]:
    """(rank, world size) as the innermost MPI launcher states them, or ``None``
    outside one. torchrun's ``RANK``/``WORLD_SIZE`` do not count (:func:`stated_rank`)."""
    for rank_var, size_var in RANK_VARS:
        rank, size = integer(rank_var, env), integer(size_var, env)
        if rank is not None and size is not None:
            return rank, size
    return None


def slurm_tasks_on_node(env: Env = None) -> Optional[int]:
    """Tasks of this job step on this node, from ``SLURM_STEP_TASKS_PER_NODE`` ("2(x3),1")."""
    name = "SLURM_STEP_TASKS_PER_NODE" if text("SLURM_STEP_TASKS_PER_NODE", env) \
        else "SLURM_TASKS_PER_NODE"
    spec = text(name, env)
    node = integer("SLURM_NODEID", env)
    if spec is None or node is None:
        return None
    counts: List[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise DistValueError(f"environment variable {name}={spec!r} is not a list of "
                                 f"task counts like '2(x3),1' (set by Slurm)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node] if node < len(counts) else None


def launcher_local_rank(env: Env = None) -> Optional[Tuple[int, int]]:
    """(local rank, ranks on this node) as the innermost MPI launcher that states both
    says, or ``None``. torchrun's ``LOCAL_RANK`` does not count (:func:`torchrun_local_rank`)."""
    for rank_var, size_var in LOCAL_VARS:
        rank = integer(rank_var, env)
        if rank is None:
            continue
        size = integer(size_var, env) if size_var else slurm_tasks_on_node(env)
        if size is not None:
            return rank, size
    return None


def torchrun_rank(env: Env = None) -> Tuple[Optional[int], Optional[int]]:
    """``(RANK, WORLD_SIZE)``, each ``None`` when unset."""
    return integer("RANK", env), integer("WORLD_SIZE", env)


def torchrun_local_rank(env: Env = None) -> Tuple[Optional[int], Optional[int]]:
    """``(LOCAL_RANK, LOCAL_WORLD_SIZE)``, each ``None`` when unset."""
    return integer("LOCAL_RANK", env), integer("LOCAL_WORLD_SIZE", env)


def stated_rank(env: Env = None) -> Optional[int]:
    """This process's rank as the innermost starter states it (the module's precedence:
    torchrun's ``RANK``, then the MPI launchers'), or ``None``."""
    rank = integer("RANK", env)
    if rank is not None:
        return rank
    for rank_var, _ in RANK_VARS:
        rank = integer(rank_var, env)
        if rank is not None:
            return rank
    return None


def node_id(env: Env = None) -> Optional[int]:
    """This process's node within the job as the launcher numbers it, or ``None``."""
    for name in NODE_ID_VARS:
        value = integer(name, env)
        if value is not None:
            return value
    return None


def job_id(env: Env = None) -> Optional[str]:
    """The job's id as the batch system or launcher names it (:data:`JOB_ID_VARS`
    order), or ``None``."""
    for name in JOB_ID_VARS:
        value = text(name, env)
        if value is not None:
            return value
    return None


def slurm_job_id(env: Env = None) -> Optional[str]:
    """``SLURM_JOB_ID``: set inside a Slurm allocation."""
    return text("SLURM_JOB_ID", env)


def slurm_mpi_type(env: Env = None) -> Optional[str]:
    """``SLURM_MPI_TYPE``: the ``srun --mpi`` plugin the user chose, if any."""
    return text("SLURM_MPI_TYPE", env)


# -- torchrun --------------------------------------------------------------------------------
def torchelastic_launched(env: Env = None) -> bool:
    """Whether torchrun started this process (``TORCHELASTIC_RUN_ID`` set, even blank,
    as torch checks it)."""
    return "TORCHELASTIC_RUN_ID" in (os.environ if env is None else env)


def torchelastic_agent_store(env: Env = None) -> bool:
    """Whether torchelastic's agent serves the store (``TORCHELASTIC_USE_AGENT_STORE``)."""
    return bool(flag("TORCHELASTIC_USE_AGENT_STORE", env))


def master_address(env: Env = None) -> Tuple[Optional[str], Optional[int]]:
    """``(MASTER_ADDR, MASTER_PORT)`` for ``env://``, each ``None`` when unset."""
    return text("MASTER_ADDR", env), integer("MASTER_PORT", env)


# -- the MPI libraries' own switches ---------------------------------------------------------
def mpich_gpu_support(env: Env = None) -> bool:
    """Whether ``MPICH_GPU_SUPPORT_ENABLED`` turns on Cray MPICH's GPU support."""
    return bool(flag("MPICH_GPU_SUPPORT_ENABLED", env))


def ompi_ft_enabled(env: Env = None) -> bool:
    """Whether ``OMPI_MCA_mpi_ft_enable`` asks Open MPI for ULFM (``mpirun --with-ft``)."""
    return bool(flag("OMPI_MCA_mpi_ft_enable", env))


def intel_mpi_spawn(env: Env = None) -> bool:
    """Whether ``I_MPI_SPAWN`` turns on Intel MPI's dynamic processes (spawn, ports),
    without which its ``MPI_Comm_spawn`` and ``MPI_Comm_connect`` crash."""
    return bool(flag("I_MPI_SPAWN", env))
