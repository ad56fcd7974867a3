"""Starting groups for torch: the ``mpi://`` rendezvous and the backend's group creator.

``mpi://`` answers torch's rendezvous with MPI's rank and size and an
:class:`~hpccomm.torch.store.MPITorchStore`: no address, port or file. Any other
rendezvous (``env://``, ``tcp://``, a store) works too, provided the processes are one
MPI job: the backend's communication always runs over MPI.

:func:`create_group` is what ``Backend.register_backend`` calls (with torch's extended
options) for every group whose CPU backend is ``"hpccomm"``:

* the default group gets a duplicate of ``MPI_COMM_WORLD``, renumbered (``MPI_Comm_split``)
  if torch's ranks differ from MPI's, plus a second duplicate, the control communicator,
  on which later groups meet;
* ``new_group`` (and ``new_subgroups``, DeviceMesh...) is called on members only, so a
  subgroup is made with ``MPI_Comm_create_group``, members-only, after the members met
  under the group's timeout (:func:`hpccomm.rendezvous.meet_members`), so a missing
  member is a timeout error, not a hang.
"""
from __future__ import annotations

import datetime
import os
import urllib.parse
import warnings
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np

from .. import init as _init
from .. import rendezvous as _meet
from ..errors import DistValueError
from ..group import ProcessGroup as HostGroup, mpi_backend
from ..types import default_pg_timeout
from . import progress as _progress
from . import reconfigure
from .process_group import CPU_ONLY, ProcessGroupHPC
from .store import MPITorchStore



def job_world() -> Any:
    """The communicator of the job's processes: ``MPI_COMM_WORLD``, or its survivors
    once :func:`hpccomm.torch.shrink_group` dropped failed ranks."""
    return _state.survivors if _state.survivors is not None else mpi_backend().world()


def continue_with(survivors: Any, failed: bool, places: Optional[List[int]] = None,
                  newcomers: Optional[List[int]] = None) -> None:
    """From now on the job is ``survivors`` (an MPI communicator: the survivors of a
    shrink, or the grown world), whose ranks hold ``places`` (their ranks when the job
    had all of them): the next ``mpi://`` rendezvous and default group are made over it,
    with a new store over it. The old store is given up if ranks ``failed``; otherwise
    it stays open until exit, where the ranks that hold it close it together."""
    if places is None:  # a shrink: the ranks kept keep their places
        kept = mpi_backend().ranks_in(survivors, job_world())
        places = [_state.places[r] if _state.places else r for r in kept]
    _state.places = list(places)
    _state.full_size = max([_state.full_size, len(places)] + [p + 1 for p in places])
    _state.newcomers = list(newcomers or [])
    if _state.store is not None:
        if failed:
            _state.store.abandon()  # served over the old world, where a rank is dead
        else:
            _state.retired.append(_state.store)
    _state.store = None
    _state.torch_stores = []
    if _state.survivors is not None:
        mpi_backend().free(_state.survivors)
    _state.survivors = survivors


class _State:
    """This process's MPI side of torch's default group (reset when it is destroyed)."""

    def __init__(self) -> None:
        #: Communicator numbered as torch's global ranks, on which subgroups meet, and
        #: whether it is ours to free (not when it is MPI_COMM_WORLD itself).
        self.control: Optional[HostGroup] = None
        self.control_owned = False
        #: The one job store (an MPIStore, or JobTCPStore below MPI_THREAD_MULTIPLE) behind every ``mpi://`` rendezvous, and the torch stores made
        #: over it (kept alive here: torch refers to them only from C++).
        self.store: Any = None
        self.torch_stores: List[MPITorchStore] = []
        #: The processes of the job when some died: the survivors' communicator, set by
        #: :func:`hpccomm.torch.shrink_group`; ``None``: ``MPI_COMM_WORLD``.
        self.survivors: Any = None
        #: Stores of earlier worlds, closed at exit with the ranks excluded from them.
        self.retired: List[Any] = []
        #: Each rank's place (its rank when the job had every rank; empty: its rank),
        #: how many places there are, and the ranks that joined at the last grow.
        self.places: List[int] = []
        self.full_size = 0
        self.newcomers: List[int] = []
        #: A number the processes of the job's default group share and no other job's
        #: does, drawn by MPI's rank 0 when the default group was made.
        self.token = 0


def places() -> List[int]:
    """Each rank's place in the job (see :class:`_State`)."""
    world = job_world()
    return list(_state.places) if _state.places else list(range(world.Get_size()))


def full_size() -> int:
    return max(_state.full_size, job_world().Get_size())


def newcomers() -> List[int]:
    return list(_state.newcomers)


def join_if_newcomer(seconds: Optional[float]) -> None:
    """A process spawned by a job's ``grow_group`` (or started with ``HPCCOMM_JOIN``)
    joins that job here, before its first rendezvous: its world is the grown one."""
    if _state.survivors is not None:
        return
    joined = _init.join_running_job(seconds)
    if joined is not None:
        record = joined.record
        _state.survivors = joined.comm
        _state.places, _state.full_size = list(record["places"]), record["full_size"]
        _state.newcomers = list(record["newcomers"])


_state = _State()


# -- mpi:// ------------------------------------------------------------------------------
def mpi_rendezvous(url: str, timeout: datetime.timedelta = default_pg_timeout,
                   **kwargs: Any) -> Iterator[Tuple[Any, int, int]]:
    """torch's rendezvous handler for ``mpi://``: ``(store, rank, world_size)`` from MPI.

    A rank or world size given to ``init_process_group`` (torch adds them to the URL) or
    set in ``RANK``/``WORLD_SIZE`` must agree with MPI's. Collective over
    ``MPI_COMM_WORLD``: every rank calls it, and a rank that never does is a timeout
    error on the others.
    """
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(url).query))
    join_if_newcomer(timeout.total_seconds())
    world = job_world()
    rank, size = world.Get_rank(), world.Get_size()
    seconds = timeout.total_seconds()
    problem: Optional[Exception] = None
    try:
        if _state.survivors is None:  # the launcher's numbers describe MPI_COMM_WORLD only
            _init.check_launch(rank, size, int(query.get("rank", -1)),
                               int(query.get("world_size", -1)))
    except (DistValueError, ValueError) as exc:
        problem = exc
    failing = [r for r, bad in enumerate(mpi_backend().allgather_flags(world, problem is not None,
                                                               seconds)) if bad]
    if problem is not None:
        raise DistValueError(f"init_process_group(init_method='mpi://'): {problem}")
    if failing:
        raise DistValueError(f"init_process_group(init_method='mpi://'): rank(s) {failing} "
                             f"rejected the launch settings (see their errors); rank {rank} "
                             f"stops too")
    if _state.store is None:
        from ..stores.mpi import job_store  # collective: a duplicate of COMM_WORLD

        _state.store = job_store(world, timeout=timeout)
    store = MPITorchStore(_state.store, f"mpi-rendezvous-{len(_state.torch_stores)}/", timeout)
    _state.torch_stores.append(store)
    yield store, rank, size
    raise RuntimeError("mpi:// cannot rendezvous again: the MPI job's processes are fixed")


# -- the backend's creator -----------------------------------------------------------------
def create_group(options: Any, backend_options: Any = None) -> ProcessGroupHPC:
    """Make the torch group described by torch's ``_DistributedBackendOptions``."""
    ranks: List[int] = list(options.global_ranks_in_group)
    seconds = options.timeout.total_seconds()
    name = str(options.group_id)
    if not ranks:
        host, on_shutdown = _world_group(options.group_rank, options.group_size, seconds,
                                         name), _forget_world
    else:
        host, on_shutdown = _subgroup(ranks, options.group_rank, seconds, name), None
    return ProcessGroupHPC(options.store, host, on_shutdown)


def _world_group(rank: int, size: int, seconds: float, name: str) -> HostGroup:
    """The default group: MPI's world renumbered as torch's ranks, and the control
    communicator; collective over ``MPI_COMM_WORLD``."""
    join_if_newcomer(seconds)  # torch's "mpi" takes no rendezvous: a newcomer joins here
    world = job_world()
    mpi_size = world.Get_size()
    if size != mpi_size:
        single = (" This process is an MPI world of one: start the job with mpiexec -n N, "
                  "srun or hpccomm run." if mpi_size == 1 else "")
        raise DistValueError(
            f"backend 'hpccomm' on rank {rank}: torch's world has {size} processes but "
            f"MPI's has {mpi_size}; the backend communicates over MPI, so every torch rank "
            f"must be one process of the MPI job.{single}")
    torch_ranks = _allgather_ranks(world, rank, seconds)
    if sorted(torch_ranks) != list(range(size)):
        raise DistValueError(f"backend 'hpccomm': the torch ranks of MPI's processes are "
                             f"{torch_ranks}, not each of 0..{size - 1} once")
    renumbered = None
    base = world
    if torch_ranks != list(range(size)):  # e.g. env:// with RANK set another way
        base = renumbered = mpi_backend().split(world, 0, rank)
    try:
        cores = _init.poll_policy(base)  # how waits yield when ranks outnumber cores
        control = HostGroup(mpi_backend().dup(base), name="hpccomm-torch-control",
                            world_ranks=range(size), timeout=seconds, backends=CPU_ONLY)
        host = HostGroup(mpi_backend().dup(base), name=name, world_ranks=range(size),
                         timeout=seconds, backends=CPU_ONLY)
    finally:
        mpi_backend().free(renumbered)
    _forget_world()
    _state.control, _state.control_owned = control, True
    reconfigure.set_job(control, _state.token)
    _init.report_initialized(host, seconds, cores, "torch store over MPI")
    if not _progress.available():
        warnings.warn(
            "hpccomm.torch: MPI was initialized below MPI_THREAD_MULTIPLE, so asynchronous "
            "operations progress only while waited for, and Work.get_future() waits for "
            "the operation before returning (DDP still works, without overlap). For "
            "overlap, leave mpi4py.rc.thread_level at its default, 'multiple', and "
            "HPCCOMM_MPI_THREAD_LEVEL unset (or 'multiple').", RuntimeWarning,
            stacklevel=2)
    return host


def _forget_world() -> None:
    """The default group was destroyed: free the control communicator."""
    if _state.control is not None and _state.control_owned:
        _state.control.shutdown()
    _state.control, _state.control_owned = None, False
    reconfigure.set_job(None, 0)


def _allgather_ranks(world: Any, rank: int, seconds: float) -> List[int]:
    """Every MPI rank's torch rank, gathered without blocking past ``seconds``; the job's
    token (:func:`job_token`) comes with them, drawn by MPI's rank 0."""
    mine = np.array([rank, int.from_bytes(os.urandom(7), "little")], dtype=np.int64)
    gathered = mpi_backend().allgather(world, mine, "init_process_group (ranks agreeing on "
                                       "torch's numbering)", seconds)
    _state.token = int(gathered[0, 1])
    return [int(r) for r in gathered[:, 0]]


def _subgroup(ranks: List[int], group_rank: int, seconds: float, name: str) -> HostGroup:
    """A group of torch global ``ranks`` (this rank among them), members only."""
    control = _control_for_subgroups(seconds)
    _meet.meet_members(control, ranks, f"new_group({ranks})", seconds,
                       f"new_group(ranks={ranks})")
    tag = (hash(tuple(ranks)) & 0x3FFF) + 1
    comm = mpi_backend().create_subcomm(control.comm, ranks, tag)
    host = HostGroup(comm, name=name, world_ranks=ranks, timeout=seconds, backends=CPU_ONLY)
    if host.rank() != group_rank:  # torch and MPI number members alike (sorted order)
        host.shutdown()
        raise DistValueError(f"backend 'hpccomm': group {name} has this process at rank "
                             f"{group_rank} for torch but {host.rank()} for MPI")
    return host


def _control_for_subgroups(seconds: float) -> HostGroup:
    """Where members meet: the default group's control communicator; without an hpccomm
    default group (e.g. default "gloo"), ``MPI_COMM_WORLD`` itself, whose ranks must then
    be torch's."""
    if _state.control is not None:
        return _state.control
    import torch.distributed as dist

    world = job_world()
    if (world.Get_size(), world.Get_rank()) != (dist.get_world_size(), dist.get_rank()):
        raise DistValueError(
            f"backend 'hpccomm' for a new group: torch's rank {dist.get_rank()} of "
            f"{dist.get_world_size()} is MPI's rank {world.Get_rank()} of "
            f"{world.Get_size()}; without an hpccomm default group the two numberings must "
            f"agree (launch one MPI job and use init_method='mpi://')")
    # made by the members of this subgroup only: no channel of its own (its meetings go
    # on MPI_COMM_WORLD itself, on hpccomm's reserved tags)
    _state.control = HostGroup(world, name="MPI_COMM_WORLD", world_ranks=range(world.Get_size()),
                               timeout=seconds, backends=CPU_ONLY, own_channel=False)
    return _state.control

