"""What the launcher says about this process: its rank and size, and its local ones.

mpiexec (hydra), Open MPI's mpirun, PMIx launchers, HPE/Cray PALS and srun each set
their own variables; these functions read them without initializing MPI. Used by the
``hpccomm run`` bootstrap and by the excepthook (which must know whether it runs under
a launcher even when MPI never started).
"""
from __future__ import annotations

import re
from typing import Dict, List, Mapping, Optional, Tuple

# (rank variable, size variable): the innermost launcher first.
RANK_VARS: List[Tuple[str, str]] = [
    ("PMI_RANK", "PMI_SIZE"),                            # MPICH hydra, srun --mpi=pmi2
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),    # Open MPI mpirun
    ("PMIX_RANK", "PMIX_SIZE"),                          # PMIx launchers
    ("PALS_RANKID", "PALS_SIZE"),                        # HPE/Cray PALS
    ("SLURM_PROCID", "SLURM_NTASKS"),                    # srun
]
#: Who sets each rank variable, for messages.
SET_BY: Dict[str, str] = {
    "PMI_RANK": "the PMI launcher (mpiexec/hydra, srun --mpi=pmi2)",
    "OMPI_COMM_WORLD_RANK": "Open MPI's mpirun",
    "PMIX_RANK": "the PMIx launcher",
    "PALS_RANKID": "HPE/Cray PALS",
    "SLURM_PROCID": "Slurm",
}
# (local rank variable, local size variable)
LOCAL_VARS: List[Tuple[str, str]] = [
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),              # MPICH hydra
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"),
    ("SLURM_LOCALID", ""),                               # size: SLURM_STEP_TASKS_PER_NODE
]


def _int(env: Mapping[str, str], name: str) -> Optional[int]:
    value = env.get(name, "").strip() if name else ""
    return int(value) if value.isdigit() else None


def slurm_tasks_on_node(env: Mapping[str, str]) -> Optional[int]:
    """Tasks of this job step on this node, from ``SLURM_STEP_TASKS_PER_NODE`` ("2(x3),1")."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node = _int(env, "SLURM_NODEID")
    if not spec or node is None:
        return None
    counts: List[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node] if node < len(counts) else None


def launcher_rank(env: Mapping[str, str]) -> Optional[Tuple[int, int]]:
    """(rank, world size) as the launcher states them, or ``None`` outside a launcher."""
    for rank_var, size_var in RANK_VARS:
        rank, size = _int(env, rank_var), _int(env, size_var)
        if rank is not None and size is not None:
            return rank, size
    return None


def launcher_local_rank(env: Mapping[str, str]) -> Optional[Tuple[int, int]]:
    """(local rank, ranks on this node) as the launcher states them, or ``None``."""
    for rank_var, size_var in LOCAL_VARS:
        rank = _int(env, rank_var)
        if rank is None:
            continue
        size = _int(env, size_var) if size_var else slurm_tasks_on_node(env)
        if size is not None:
            return rank, size
    return None
