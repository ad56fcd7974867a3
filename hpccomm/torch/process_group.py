"""``ProcessGroupHPC``: a torch ``ProcessGroup`` whose CPU operations run on hpccomm.

torch's Python wrappers (``dist.all_reduce``...) call the group's methods directly, and
C++ callers (DDP's reducer, functional collectives) reach the same methods through
torch's ``ProcessGroup`` trampoline: the operations themselves are in
:class:`~hpccomm.torch.operations.TensorOperations`. A Python call on the group goes
straight to them, which keeps an 8-byte all_reduce through torch at a few µs (torch's
C++ dispatcher and a Python backend behind it would add about 12 µs per call, measured).

What torch asks a group for its backend gets a real one: :class:`~.backend.BackendHPC`
for the CPU (on torch 2.14 registered with torch itself, so C++ code that asks the group
sees it too) and torch's NCCL for CUDA tensors when the group was created with
``"cpu:hpccomm,cuda:nccl"`` (created on first use). The group also answers torch 2.14's
hooks (pre/post collective hooks, abort hooks) and ``set_timeout``.
"""
from __future__ import annotations

import datetime
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from .. import rendezvous as _meet
from ..errors import DistBackendError, DistValueError
from ..group import ProcessGroup as HostGroup, mpi_backend
from ..types import timeout_seconds
from . import _tensors, flight_recorder, reconfigure, versions
from .backend import BackendHPC
from .errors import for_torch
from .hooks import GroupState
from .operations import TensorOperations

_CPU = torch.device("cpu")
_CUDA = torch.device("cuda")
#: The backend names a group of this class answers to (its CPU backend's).
_OWN_NAMES = ("hpccomm", "mpi")


class ProcessGroupHPC(TensorOperations, dist.ProcessGroup):
    """A torch process group over one MPI communicator (registered as ``"hpccomm"``)."""

    def __init__(self, store: Any, host: HostGroup,
                 on_shutdown: Optional[Callable[[], None]] = None):
        # torch 2.13's (store, rank, size) constructor builds no Python trampoline, so a
        # subclass must use (rank, size); get_group_store() below returns the store.
        super().__init__(host.rank(), host.size())
        self._host = host
        self._on_shutdown = on_shutdown
        self._store = store
        self._name = host.group_name
        self._desc = host.group_desc
        self._cuda_backend: Any = None
        self._state = GroupState()
        self._state.trace = flight_recorder.trace_for(host, self._state)
        #: torch dtype -> (MPI datatype, itemsize): what all_reduce's direct form takes.
        self._direct = _tensors.direct_types(host.cpu.direct_types)
        #: The CPU backend torch's code finds on this group.
        self._backend = BackendHPC(host, self._state, self._direct)
        if versions.python_backends():
            kind = dist.ProcessGroup.BackendType.CUSTOM
            self._register_backend(_CPU, kind, self._backend)
            self._set_default_backend(kind)

    # -- identity --------------------------------------------------------------------------
    def rank(self) -> int:  # torch's own goes through C++ and back: ~3 µs a call
        return self._host.rank()

    def size(self) -> int:
        return self._host.size()

    @property
    def backend_name(self) -> str:
        """What ``name()`` and ``getBackendName()`` say: ``"mpi"`` when the group was
        asked for under torch's name for the MPI backend."""
        return self._state.backend_name

    @backend_name.setter
    def backend_name(self, name: str) -> None:
        self._state.backend_name = name

    def getBackendName(self) -> str:
        return self._state.backend_name

    def setGroupName(self, name: str) -> None:
        self._name = self._host.group_name = name

    def getGroupName(self) -> str:
        return self._name

    def setGroupDesc(self, desc: str) -> None:
        self._desc = self._host.group_desc = desc

    def getGroupDesc(self) -> str:
        return self._desc

    @property
    def _device_types(self) -> List[torch.device]:
        """The devices this group serves; torch reads it to place object collectives and
        state-dict loading."""
        return [_CPU, _CUDA] if self._nccl_configured() else [_CPU]

    def get_group_store(self) -> Any:
        """The store torch gave this group (a PrefixStore of the default store)."""
        return self._store

    @property
    def host_group(self) -> HostGroup:
        """The hpccomm group underneath (its MPI communicator is ``host_group.comm``)."""
        return self._host

    def __repr__(self) -> str:
        return (f"<ProcessGroupHPC '{self._name}' rank {self.rank()}/{self.size()} "
                f"global ranks {list(self._host.ranks)}>")

    # -- the backends torch asks for -------------------------------------------------------
    def _get_backend(self, device: Any) -> Any:
        """The backend of ``device``'s tensors: :class:`BackendHPC` for the CPU, torch's
        NCCL for CUDA where the group was created with ``cuda:nccl``."""
        device = torch.device(device)
        if device.type == "cpu":
            return self._backend
        if device.type == "cuda" and self._nccl_configured():
            return self._nccl()
        raise RuntimeError(f"No backend type associated with device type {device.type} "
                           f"(group '{self._name}' of backend '{self.backend_name}' serves "
                           f"{', '.join(d.type for d in self._device_types)})")

    def get_backend(self, device: Any) -> Any:
        return self._get_backend(device)

    def _cuda(self, op: str, tensor: torch.Tensor) -> Any:
        """torch's NCCL backend for this group's CUDA tensors (created on first use)."""
        if tensor.device.type != "cuda" or not self._nccl_configured():
            raise self._host.error(op, f"tensors on {tensor.device} are not served by "
                                       f"backend 'hpccomm' (CPU only); create the group "
                                       f"with backend 'cpu:hpccomm,cuda:nccl' for CUDA")
        return self._nccl()

    def _nccl(self) -> Any:
        if self._cuda_backend is None:
            timeout = (datetime.timedelta(seconds=self._host.timeout)
                       if self._host.timeout is not None else None)
            store = dist.PrefixStore("nccl/", self._store)
            creator = cuda_creator(self._cuda_backend_name())
            if creator is not None:  # what torch's own helper would make for the name
                options = dist.distributed_c10d._DistributedBackendOptions()
                options.store, options.group_id = store, self._name
                options.group_rank, options.group_size = self.rank(), self.size()
                options.global_ranks_in_group = list(self._host.ranks)
                if timeout is not None:
                    options.timeout = timeout
                if self.bound_device_id is not None:  # else it picks the device itself
                    options.process_group = self
                backend, kind = creator(options, None), creator.kind
            else:  # torch 2.13: "nccl" is ProcessGroupNCCL
                options = dist.ProcessGroupNCCL.Options()
                options.group_name = self._name
                options.global_ranks_in_group = list(self._host.ranks)
                if timeout is not None:
                    options._timeout = timeout
                backend = dist.ProcessGroupNCCL(store, self.rank(), self.size(), options)
                kind = dist.ProcessGroup.BackendType.NCCL
            self._register_backend(_CUDA, kind, backend)
            self._cuda_backend = backend
        return self._cuda_backend

    def _nccl_configured(self) -> bool:
        return self._cuda_backend_name() is not None

    def _cuda_backend_name(self) -> Optional[str]:
        """The CUDA backend the group was created with (``"nccl"`` for
        ``"cpu:hpccomm,cuda:nccl"``; torch 2.15 also has ``"nccl-legacy"``,
        ``"nccl-lazy"``...), ``None`` for a CPU-only group."""
        config = dist.distributed_c10d._world.pg_backend_config.get(self, "")
        for item in str(config).split(","):
            device, _, name = item.partition(":")
            name = name.strip()
            # torch expands a bare "mpi" to "cpu:mpi,cuda:mpi": CUDA tensors are not ours
            if device.strip() == "cuda" and name and name not in _OWN_NAMES:
                return name
        return None

    # -- settings and hooks ------------------------------------------------------------------
    def set_timeout(self, timeout: Any) -> None:
        """The timeout of the group's operations from now on (``dist.set_timeout``)."""
        self._backend.set_timeout(timeout)
        if self._cuda_backend is not None:
            self._cuda_backend.set_timeout(timeout)

    if versions.collective_hooks():  # torch 2.14's hooks (2.13 has none to offer)
        def register_pre_hook(self, hook_id: int, hook: Callable[[Any], None]) -> None:
            """Run ``hook(PreHookArgs)`` before each operation the group issues."""
            self._state.register("pre", hook_id, hook)

        def unregister_pre_hook(self, hook_id: int) -> None:
            self._state.unregister("pre", hook_id)

        def register_post_hook(self, hook_id: int, hook: Callable[[Any], None]) -> None:
            """Run ``hook(PostHookArgs)`` after each operation the group issues."""
            self._state.register("post", hook_id, hook)

        def unregister_post_hook(self, hook_id: int) -> None:
            self._state.unregister("post", hook_id)

        def register_abort_hook(self, hook_id: int, hook: Callable[[], None]) -> None:
            """Run ``hook()`` before the group gives up: its first timed-out or failed
            operation, or ``abort()``."""
            self._backend.registerAbortHook(hook_id, hook)

        def unregister_abort_hook(self, hook_id: int) -> None:
            self._backend.unregisterAbortHook(hook_id)

    # -- torch 2.14's reconfigure (fault tolerance): hpccomm/torch/reconfigure.py -----------
    supports_reconfigure = True

    def get_reconfigure_handle(self) -> str:
        return reconfigure.handle(self)

    def reconfigure(self, opts: Any) -> Any:
        return reconfigure.reconfigure(self, opts)

    def use_host(self, host: HostGroup) -> None:
        """The group's operations, and its CPU backend's, run on ``host`` from now on."""
        super().use_host(host)
        self._backend.use_host(host)

    # torch 2.15 asks a group before registering hooks on it (its C++ reads the backend's
    # answer, which a Python backend cannot give it; torch's Python code reads these).
    supports_abort_hooks = BackendHPC.supports_abort_hooks
    supports_completion_hooks = BackendHPC.supports_completion_hooks

    # -- splitting ----------------------------------------------------------------------------
    def split_group(self, ranks: Sequence[int], timeout: Any = None, opts: Any = None,
                    group_name: Optional[str] = None, group_desc: Optional[str] = None,
                    device_types: Any = None) -> Optional["ProcessGroupHPC"]:
        """torch's ``split_group`` on this group (``dist.split_group``, which every rank of
        the group calls): the group ranks ``ranks``, in that order, become a new group
        through one ``MPI_Comm_split`` of this group's communicator, after every rank met
        under the timeout (a rank that never comes is a timeout error naming it, not a
        hang). A rank not in ``ranks`` (torch passes it the first split) takes part in the
        split and gets ``None``."""
        seconds = timeout_seconds(timeout) or self._host.timeout
        name = group_name or f"{self._name}:split"
        try:
            host = split_host(self._host, [int(r) for r in ranks], seconds, name,
                              group_desc or "undefined")
        except DistBackendError as exc:  # a rank never came: torch's error class too
            raise for_torch(exc) from None
        if host is None:
            return None
        child = ProcessGroupHPC(dist.PrefixStore(f"{name}/", self._store), host)
        child.backend_name = self.backend_name
        return child

    splitGroup = split_group  # the name C++ callers reach through torch's trampoline

    # -- life cycle -------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Free the group's communicator (torch calls it from destroy_process_group); the
        flight recorder forgets the group (torch may give its name to a later group)."""
        flight_recorder.forget(self._state.trace)
        if self._cuda_backend is not None:
            self._cuda_backend.shutdown()
        self._host.shutdown()
        if self._on_shutdown is not None:
            self._on_shutdown()

    def abort(self) -> None:
        """Run the abort hooks, then abort the job (MPI offers no local abort of one
        communicator)."""
        self._backend.abort()


#: What a torch group's hpccomm group serves: CPU arrays, over MPI.
CPU_ONLY = {"cpu": "mpi"}


def split_host(parent: HostGroup, ranks: List[int], seconds: Optional[float], name: str,
               desc: str) -> Optional[HostGroup]:
    """This rank's group of a split of ``parent``: ``ranks`` (group ranks of the parent,
    in the new group's order) if this rank is among them, else ``None``; collective
    over ``parent``."""
    op = f"split_group({ranks})"
    mine = parent.rank()
    if len(set(ranks)) != len(ranks) or any(not 0 <= r < parent.size() for r in ranks):
        raise parent.error(op, f"the split {ranks} must hold distinct ranks of the group "
                               f"(0..{parent.size() - 1})")
    # torch hands each rank only its own split, so what the ranks can agree on is the
    # constructor and the parent (differing splits are found after MPI_Comm_split, below)
    _meet.meet_all(parent, op, seconds, f"split_group of group '{parent.group_name}'")
    member = mine in ranks
    # splits are disjoint, so the smallest rank names one; the position is the new rank
    comm = mpi_backend().split(parent.comm, min(ranks) if member else None,
                               ranks.index(mine) if member else 0)
    if comm is None:
        return None
    if comm.Get_size() != len(ranks) or comm.Get_rank() != ranks.index(mine):
        size = comm.Get_size()
        mpi_backend().free(comm)
        raise DistValueError(
            f"hpccomm.{op} on rank {mine}/{parent.size()} of group '{parent.group_name}': "
            f"{size} ranks joined this rank's split, not the {len(ranks)} listed: the "
            f"ranks passed different or overlapping splits")
    return HostGroup(comm, name=name, world_ranks=[parent.ranks[r] for r in ranks],
                     timeout=seconds, backends=CPU_ONLY, desc=desc)


class _Creator:
    """torch's creator of a registered backend, with the backend type to register it as."""

    def __init__(self, function: Callable[..., Any], kind: Any):
        self.function, self.kind = function, kind

    def __call__(self, options: Any, backend_options: Any) -> Any:
        return self.function(options, backend_options)


def cuda_creator(name: Optional[str]) -> Optional[_Creator]:
    """torch's own creator for the CUDA backend ``name`` where torch registers its NCCL
    backends by name (2.15: ``"nccl"`` is ``ProcessGroupNCCL2`` unless
    ``TORCH_DIST_USE_NCCL2=0``, also ``"nccl-legacy"``, ``"nccl-lazy"``; 2.14:
    ``ProcessGroupNCCL`` unless ``TORCH_DIST_USE_NCCL2=1``); ``None`` on a torch that
    does not (2.13: ``"nccl"`` is ``ProcessGroupNCCL``)."""
    ensure = getattr(dist.Backend, "_ensure_backend_registered", None)
    if name is None or ensure is None:
        return None
    ensure(name)
    plugin = dist.Backend._plugins.get(name.upper())
    if plugin is None or not plugin.extended_api:
        return None
    kind = dist.Backend.backend_type_map.get(name, dist.ProcessGroup.BackendType.CUSTOM)
    return _Creator(plugin.creator_fn, kind)
