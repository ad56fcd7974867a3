"""hpccomm as a PyTorch distributed backend: ``import hpccomm.torch``, then

    torch.distributed.init_process_group("hpccomm", init_method="mpi://")

under ``mpiexec``, ``srun`` or ``hpccomm run``. Importing this module registers the
backend ``"hpccomm"`` (CPU tensors, over MPI) and the rendezvous scheme ``mpi://`` (rank
and world size from MPI, the store served over MPI: no MASTER_ADDR, port or file). On a
torch built without MPI (every pip wheel) it also serves torch's own backend name
``"mpi"``: ``init_process_group("mpi")`` runs on hpccomm (:mod:`.mpi_backend`).
``"cpu:hpccomm,cuda:nccl"`` gives CUDA tensors to torch's NCCL. DDP, FSDP2, DeviceMesh,
DTensor, functional collectives, pipelining and DCP run on it unchanged; see
``docs/torch.md``.

This subpackage is the only part of hpccomm that imports torch (``import hpccomm`` does
not), and it needs ``pip install 'hpccomm[torch]'``.
"""
from __future__ import annotations

from typing import Any

try:
    import torch  # noqa: F401
    import torch.distributed as _dist
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("hpccomm.torch needs PyTorch: pip install 'hpccomm[torch]'") from exc

if not _dist.is_available():  # pragma: no cover - torch built without distributed
    raise ImportError("hpccomm.torch needs a PyTorch build with torch.distributed")

import importlib

_rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the module

from . import flight_recorder, versions
from .backend import BackendHPC
from .bootstrap import create_group, mpi_rendezvous
from .errors import DistBackendError, DistTimeoutError, ProcessFailedError
from .fault import (agree, failed_ranks, grow_group, hand_over, newcomers, revoke,
                    shrink_group)
from . import mpi_backend
from .process_group import ProcessGroupHPC
from .store import DistStoreError, MPITorchStore
from .work import DoneWork, PendingWork

#: The name to pass to ``init_process_group`` and ``new_group``.
BACKEND = "hpccomm"

__all__ = ["BACKEND", "ProcessGroupHPC", "BackendHPC", "MPITorchStore", "DoneWork", "PendingWork",
           "DistBackendError", "DistTimeoutError", "DistStoreError", "ProcessFailedError",
           "create_group", "mpi_rendezvous", "monitored_barrier", "register", "shrink_group",
           "grow_group", "newcomers", "hand_over", "failed_ranks",
           "agree", "revoke"]


def monitored_barrier(group: Any = None, timeout: Any = None,
                      wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier`` for hpccomm groups (torch's own accepts
    only gloo groups): a barrier that raises on every arrived rank, naming the ranks that
    did not arrive within ``timeout`` (default: the group's timeout)."""
    pg = _dist.distributed_c10d._get_default_group() if group is None else group
    if not isinstance(pg, ProcessGroupHPC):
        return _dist.monitored_barrier(group, timeout, wait_all_ranks)
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def register() -> None:
    """Register backend ``"hpccomm"`` and rendezvous ``mpi://`` with torch, and serve
    torch's ``"mpi"`` backend name where torch has no MPI of its own (idempotent;
    importing this module already did)."""
    if BACKEND.upper() not in _dist.Backend._plugins:
        _dist.Backend.register_backend(BACKEND, create_group, extended_api=True,
                                       devices=["cpu"])
    if "mpi" not in _rendezvous._rendezvous_handlers:
        _rendezvous.register_rendezvous_handler("mpi", mpi_rendezvous)
    mpi_backend.install()
    flight_recorder.install([BACKEND, "mpi"] if mpi_backend.installed() else [BACKEND])


register()
versions.warn_if_untested()
