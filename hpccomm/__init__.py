"""hpccomm: torch.distributed's programming model on MPI launchers, Slurm and NCCL.

``import hpccomm as dist`` gives the names of ``torch.distributed`` for NumPy (CPU) and
CuPy (CUDA) arrays. Importing is light: MPI starts in ``init_process_group``.
This module only re-exports.
"""
import sys as _sys

from ._version import __version__
from .collectives import (all_gather, all_gather_into_tensor, all_gather_single, all_reduce,
                          all_to_all, all_to_all_single, barrier, broadcast, gather,
                          gather_into_tensor, gather_single, reduce, reduce_scatter,
                          reduce_scatter_single, reduce_scatter_tensor, scatter)
from .device_mesh import DeviceMesh, init_device_mesh
from .errors import (DistBackendError, DistDesyncError, DistError, DistNetworkError,
                     DistStoreError, DistTimeoutError, DistValueError, ProcessFailedError)
from .fault import (SHRINK_ABORT, SHRINK_DEFAULT, agree, grow_group, is_fault_tolerant, newcomers,
                    revoke, shrink_group)
from .group import (GroupMember, ProcessGroup, get_backend, get_global_rank, get_group_rank,
                    get_pg_count, get_process_group_ranks, get_rank, get_world_size, group,
                    new_group, new_subgroups, new_subgroups_by_enumeration, set_timeout,
                    split_group)
from .init import (abort_process_group, destroy_process_group, get_default_backend_for_device,
                   get_default_store, _get_default_store, get_node_local_rank,
                   init_process_group, is_available, is_backend_available, is_gloo_available,
                   is_initialized, is_mpi_available, is_nccl_available,
                   is_torchelastic_launched)
from .objects import (all_gather_object, broadcast_object_list, gather_object,
                      recv_object_list, scatter_object_list, send_object_list)
from .p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from .types import (Backend, DebugLevel, ReduceOp, RedOpType, _make_nccl_premul_sum,
                    default_pg_timeout, reduce_op, supports_complex)
from .work import Future, Work
from .diagnostics import (breakpoint, excepthook, flight_recorder, get_debug_level,
                          monitored_barrier, set_debug_level, set_debug_level_from_env)
from .stores import (FileStore, HashStore, PrefixStore, QueueEmptyError, Store, TCPStore)

# The documented module paths ``hpccomm.excepthook`` and ``hpccomm.flight_recorder``, also
# for ``import hpccomm.excepthook``: the modules of the diagnostics package themselves.
_sys.modules[__name__ + ".excepthook"] = excepthook
_sys.modules[__name__ + ".flight_recorder"] = flight_recorder


def __getattr__(name: str):
    """``MPIStore`` and ``device_mesh`` load on first use (they import mpi4py.MPI/NumPy work)."""
    if name == "MPIStore":
        from .stores import MPIStore
        return MPIStore
    if name == "device_mesh":
        import importlib
        return importlib.import_module(".device_mesh", __name__)
    raise AttributeError(f"module 'hpccomm' has no attribute '{name}'")
