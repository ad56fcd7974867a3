"""Starting and stopping the distributed world: ``init_process_group`` and friends.

Under ``mpiexec``/``srun`` the world is ``MPI.COMM_WORLD``: no address, port or
rendezvous file. Ranks and sizes that the environment states (``rank=``/``world_size=``
arguments, ``RANK``/``WORLD_SIZE``, and the launcher's ``PMI_*``, ``OMPI_COMM_WORLD_*``,
``SLURM_*``) are compared with MPI's; a disagreement is an error for the first two and a
logged warning for launcher variables (a job step can legitimately differ from its
allocation). A process started without a launcher is a world of one.

MPI is initialized on first use (importing ``mpi4py.MPI``), or reused if the program
initialized it already; ``destroy_process_group`` never finalizes it, so a later
``init_process_group`` works.
"""
from __future__ import annotations

import datetime
import importlib.util
import logging
import platform
import warnings
from typing import Any, List, Optional, Tuple

from . import launcher_env, observe
from .errors import DistValueError, Undescribed, described
from .group import (ProcessGroup, backend_map, destroy, is_non_member, mpi_backend, registry,
                    resolve)
from .types import Backend, default_pg_timeout, timeout_seconds
from .work import POLLS_SHARED, set_oversubscribed

logger = logging.getLogger("hpccomm")


def is_available() -> bool:
    """Whether hpccomm can be used here: mpi4py is installed."""
    return importlib.util.find_spec("mpi4py") is not None


def is_mpi_available() -> bool:
    """Whether the MPI backend is available (mpi4py is installed)."""
    return is_available()


def is_nccl_available() -> bool:
    """Whether the NCCL backend is usable: CuPy imports, a GPU is visible, NCCL loads."""
    try:
        from .backends.cuda import nccl
    except ImportError:
        return False
    return nccl.available()


def is_gloo_available() -> bool:
    """``"gloo"`` is an alias of the MPI backend here, so as available as MPI."""
    return is_available()


def is_backend_available(backend: str) -> bool:
    """Whether ``backend`` (a name, or ``"cpu:mpi,cuda:nccl"``) can be used here: every
    backend it names is registered and its library loads."""
    text = str(backend).lower()
    names = [part.partition(":")[2].strip() for part in text.split(",")] if ":" in text \
        else [text.strip()]
    for name in names:
        canonical = Backend.canonical(name)
        if not Backend.is_registered(canonical):
            return False
        if canonical == "nccl" and not is_nccl_available():
            return False
        if canonical in ("mpi", "gloo") and not is_available():
            return False
    return True


def get_node_local_rank(fallback_rank: Optional[int] = None) -> int:
    """This process's rank among the job's processes on its node: ``LOCAL_RANK`` (what
    torchrun sets, read first as torch does), else what the MPI launcher or Slurm says,
    else ``fallback_rank``."""
    torchrun, _ = launcher_env.torchrun_local_rank()
    if torchrun is not None:
        return torchrun
    launcher = launcher_env.launcher_local_rank()
    if launcher is not None:
        return launcher[0]
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("hpccomm.get_node_local_rank: neither LOCAL_RANK nor an MPI "
                       "launcher's or Slurm's local rank is set; pass fallback_rank to run "
                       "outside a launcher")


def is_torchelastic_launched() -> bool:
    """Whether torchrun started this process (it sets ``TORCHELASTIC_RUN_ID``)."""
    return launcher_env.torchelastic_launched()


def is_initialized() -> bool:
    """Whether the default process group exists."""
    return registry.world is not None


def get_default_backend_for_device(device: Any) -> str:
    """The backend used for arrays on ``device`` (``"cpu"`` -> mpi, ``"cuda"`` -> nccl)."""
    name = str(getattr(device, "type", device)).split(":")[0].lower()
    try:
        return Backend.default_device_backend_map[name]
    except KeyError:
        raise ValueError(f"no default backend for device type '{name}'") from None


def check_launch(mpi_rank: int, mpi_size: int, rank: int = -1, world_size: int = -1) -> None:
    """Compare the rank and size stated by arguments and environment with MPI's."""
    singleton = ("" if mpi_size > 1 else " This process is an MPI world of one: start the job "
                 "with mpiexec -n N or srun so that MPI knows all its processes.")
    stated = [("rank=", rank, "world_size=", world_size)]
    env_rank, env_size = launcher_env.torchrun_rank()
    stated.append(("RANK", env_rank, "WORLD_SIZE", env_size))
    for rank_name, value, size_name, size_value in stated:
        if size_value not in (None, -1) and size_value != mpi_size:
            raise DistValueError(f"init_process_group: {size_name}{'' if size_name.endswith('=') else '='}"
                                 f"{size_value} but MPI's world has {mpi_size} processes."
                                 f"{singleton}")
        if value not in (None, -1) and value != mpi_rank:
            raise DistValueError(f"init_process_group: {rank_name}{'' if rank_name.endswith('=') else '='}"
                                 f"{value} but this process is MPI rank {mpi_rank} of {mpi_size}")
    launcher = launcher_env.launcher_pair()  # the innermost launcher speaks for the job
    if launcher is not None:
        rank_var, size_var, env_rank, env_size = launcher
        if (env_size is not None and env_size != mpi_size) or (
                env_rank is not None and env_rank != mpi_rank):
            message = (f"hpccomm: {rank_var}={env_rank}, {size_var}={env_size} "
                       f"(set by {launcher_env.set_by(rank_var)}) "
                       f"disagree with MPI: rank {mpi_rank} of {mpi_size}. hpccomm uses MPI's "
                       f"values; check that the launcher matches the MPI library.")
            logger.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def _make_store(init_method: Optional[str], store: Any, rank: int, size: int,
                timeout: float, world_comm: Any) -> Any:
    """The default store: ``store=``, the one ``init_method`` names, or the job's store
    over MPI (:func:`hpccomm.stores.mpi.job_store`)."""
    if store is not None:
        return store
    from . import stores

    if init_method is None or init_method.startswith("mpi://"):
        from .stores.mpi import job_store

        return job_store(world_comm, timeout=timeout)
    if init_method.startswith("env://"):
        host, port = launcher_env.master_address()
        if host is None or port is None:
            raise DistValueError("init_method='env://' needs MASTER_ADDR and MASTER_PORT "
                                 "(under mpiexec/srun, leave init_method unset instead)")
        return stores.TCPStore(host, port, size, is_master=rank == 0, timeout=timeout)
    if init_method.startswith("tcp://"):
        address = init_method[len("tcp://"):].split("?")[0]
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise DistValueError(f"init_method {init_method!r} must look like tcp://host:port")
        return stores.TCPStore(host.strip("[]"), int(port), size, is_master=rank == 0,
                               timeout=timeout)
    if init_method.startswith("file://"):
        made = stores.FileStore(init_method[len("file://"):], size)
        made.set_timeout(datetime.timedelta(seconds=timeout))  # as torch: the group's
        return made
    raise DistValueError(f"init_method {init_method!r} is not supported; use env://, "
                         f"tcp://host:port, file://path, or leave it unset under a launcher")


def init_process_group(backend: Optional[str] = None, init_method: Optional[str] = None,
                       timeout: Any = None, world_size: int = -1, rank: int = -1,
                       store: Any = None, group_name: str = "", pg_options: Any = None,
                       device_id: Any = None, _ranks: Optional[List[int]] = None) -> None:
    """Create the default process group over all processes of the MPI job.

    ``backend``: ``None`` (``"cpu:mpi,cuda:nccl"``), ``"mpi"``, ``"nccl"``, ``"gloo"``
    (alias of mpi) or a per-device spec. ``timeout`` bounds every operation (default 30
    minutes). ``init_method``/``store`` choose the default store; rank and world size
    always come from MPI and are only checked against what is stated. Observers of
    initialization (:mod:`.observe`) run last: they get the default group and the facts
    of the start-up (MPI library, thread level, backends, store, timeout, cores).
    """
    if registry.world is not None:
        raise DistValueError("init_process_group: the default process group is already "
                             "initialized (call destroy_process_group() first)")
    if isinstance(backend, str) and backend.lower() == "mpi" and (world_size != -1 or rank != -1):
        warnings.warn(f"For MPI backend, world_size ({world_size}) and rank ({rank}) are "
                      f"ignored since they are assigned by the MPI runtime.", stacklevel=2)
        world_size = rank = -1  # as torch: the MPI backend takes them from MPI
    mpi = mpi_backend()
    seconds = timeout_seconds(timeout, default_pg_timeout.total_seconds())
    joined = join_running_job(seconds)
    if joined is not None:  # a newcomer: the running job's world, not its own
        _start_joined(joined, init_method, store)
        return
    world_comm = mpi.world()
    mpi_rank, mpi_size = world_comm.Get_rank(), world_comm.Get_size()
    problem: Optional[DistValueError] = None
    try:
        check_launch(mpi_rank, mpi_size, rank, world_size)
    except DistValueError as exc:
        problem = exc
    # Every rank learns whether any rank failed, so all raise together and none waits in
    # the Dup below; the agreement itself is polled under the timeout (a rank that never
    # calls init_process_group becomes a DistTimeoutError, not a hang).
    flags = mpi.allgather_flags(world_comm, problem is not None, seconds)
    failing = [r for r, bad in enumerate(flags) if bad]
    if problem is not None:
        raise problem
    if failing:
        raise DistValueError(f"init_process_group: rank(s) {failing} rejected the launch "
                             f"settings (see their errors); rank {mpi_rank} stops too")
    backends = backend_map(backend, "init_process_group")
    shared = poll_policy(world_comm)  # before any group: native spins take it at creation
    comm = mpi.dup(world_comm)
    pg = ProcessGroup(comm, name=group_name or "WORLD", world_ranks=range(mpi_size),
                      timeout=seconds, backends=backends)
    registry.world = pg
    registry.backend_spec = backends
    registry.timeout = seconds
    registry.places, registry.full_size = list(range(mpi_size)), mpi_size
    registry.add(pg)
    if device_id is not None:
        pg.bound_device_id = getattr(device_id, "index", device_id)
    try:
        if "cuda" in backends:  # fix this rank's GPU now (no-op without CuPy or device_id)
            from .backends.cuda import device as _cuda
            _cuda.bind_at_init(world_comm, device_id)
        registry.store = _make_store(init_method, store, mpi_rank, mpi_size, seconds, comm)
        if device_id is not None and backends.get("cuda") == "nccl":
            _connect_nccl(pg)
    except BaseException:
        destroy_process_group()
        raise
    report_initialized(pg, seconds, shared, type(registry.store).__name__)


def _connect_nccl(pg: ProcessGroup) -> None:
    """With a bound device, the default group's NCCL communicator is made at once, as
    torch does: the groups split from it later (``split_group``, ``new_subgroups``, a
    DeviceMesh) then need no NCCL bootstrap of their own. Without CuPy, a GPU or NCCL
    nothing is made here; the first GPU call says what is missing."""
    from .backends.cuda import nccl

    if not nccl.available():
        return
    try:
        pg.communicator("cuda").connect()
    except Undescribed as exc:
        raise described(pg.at("init_process_group"), exc) from None


def report_initialized(pg: ProcessGroup, seconds: float, cores: str, store: str) -> None:
    """Tell the observers (the diagnostics, when loaded) that ``pg`` is the job's world
    group, with the start-up facts they log. The torch adapter calls it for its world."""
    mpi = mpi_backend()
    observe.initialized(pg, {
        "host": platform.node(),
        "MPI library": " ".join(mpi.library_version().split()),
        "thread level": _THREAD_LEVELS.get(mpi.thread_level(), str(mpi.thread_level())),
        "backends": pg.backend_string(), "store": store,
        "timeout": f"{seconds:.0f} s", "cores": cores})


_THREAD_LEVELS = {0: "MPI_THREAD_SINGLE", 1: "MPI_THREAD_FUNNELED",
                  2: "MPI_THREAD_SERIALIZED", 3: "MPI_THREAD_MULTIPLE"}


def poll_policy(world_comm: Any) -> str:
    """Set how waits poll from where the world's ranks run: yield often when this node
    runs more ranks than they have CPUs together (:mod:`.backends.mpi.placement`, which
    ``HPCCOMM_OVERSUBSCRIBED=1``/``0`` overrides). Collective over ``world_comm``;
    returns a phrase for the start-up facts."""
    from .backends.mpi import placement

    where = placement.world = placement.placement(world_comm)
    crowded = where.crowded
    set_oversubscribed(crowded)
    return (f"oversubscribed: waits yield every {POLLS_SHARED} polls ({where.describe()})"
            if crowded else f"one core per rank ({where.describe()})")


def get_default_store() -> Any:
    """The store made (or given) by ``init_process_group``."""
    resolve(None, "get_default_store")
    return registry.store


_get_default_store = get_default_store


def destroy_process_group(group: Any = None) -> None:
    """Destroy ``group``, or with ``None`` every group and the default store.

    MPI itself stays initialized, so ``init_process_group`` may be called again.
    """
    if group is not None:
        if is_non_member(group):
            return  # as torch: nothing to destroy on a rank outside the group
        destroy(resolve(group, "destroy_process_group"))
        return
    if registry.world is None:
        return
    for pg in reversed(list(registry.groups.values())):
        if pg is not registry.world:
            destroy(pg)
    store, world = registry.store, registry.world
    if store is not None and hasattr(store, "close"):
        try:
            store.close()
        except Exception as exc:  # a store failing to close must not block teardown
            logger.warning("hpccomm: closing the default store failed: %s", exc)
    destroy(world)
    registry.clear()


def replace_default_group(comm: Any, desc: str, failed: bool,
                          places: Optional[List[int]] = None) -> ProcessGroup:
    """Make the MPI communicator ``comm`` (the remaining members of the default group,
    from ``shrink_group``, or the grown world, from ``grow_group``) the new default
    group: every other group is destroyed, ranks are renumbered in ``comm``'s order
    (each rank's place in ``places``, one per rank of ``comm``), and an MPI default
    store moves to ``comm`` (:func:`start_world`, which a newcomer runs too).

    The old MPI store is given up at once if ranks ``failed`` (its server may be dead);
    otherwise it stays open, to be closed at exit together with the ranks that still
    hold it (excluded ranks, after a planned exclusion).
    """
    old = registry.world
    for pg in reversed(list(registry.groups.values())):
        if pg is not old:
            if failed:  # its GPU communicators may hold the dead: never wait for them
                pg.abort_devices()
            destroy(pg)
    store = registry.store
    job_store = type(store).__name__ in ("MPIStore", "JobTCPStore")  # over the old world
    if job_store and failed:
        store.abandon()  # never wait for the dead again
    backends, timeout, bound = old.backend_names, old.timeout, old.bound_device_id
    full_size, created = registry.full_size, registry.created
    destroy(old)
    registry.clear()
    registry.created = created
    registry.backend_spec, registry.timeout = backends, timeout
    registry.full_size = full_size
    pg = start_world(comm, desc, None if job_store else store,
                     places if places is not None else list(range(comm.Get_size())))
    pg.bound_device_id = bound
    return pg


def start_world(comm: Any, desc: str, store: Any, places: List[int]) -> ProcessGroup:
    """The default group over ``comm`` with the registry's backends and timeout, and its
    store: ``store``, or with ``None`` the job's store over ``comm``. Collective over
    ``comm``, in the same order on every rank: the survivors of ``shrink_group`` and
    ``grow_group`` run it from :func:`replace_default_group`, a newcomer from
    ``init_process_group``. How waits poll is decided again for the new world's
    placement."""
    poll_policy(comm)
    pg = ProcessGroup(comm, name="WORLD", world_ranks=range(comm.Get_size()),
                      timeout=registry.timeout, backends=registry.backend_spec, desc=desc)
    registry.world = pg
    registry.places = list(places)
    registry.full_size = max([registry.full_size, comm.Get_size()] + [p + 1 for p in places])
    registry.add(pg)
    registry.store = store if store is not None else _make_store(
        None, None, comm.Get_rank(), comm.Get_size(), registry.timeout, comm)
    return pg


def join_running_job(seconds: Optional[float]) -> Any:
    """This process's join of a running job (spawned by its ``grow_group``, or started
    with ``HPCCOMM_JOIN``): the grown world and the record it came with
    (:class:`hpccomm.backends.mpi.join.Joined`), or ``None`` when this process starts a
    world of its own. Waits up to ``seconds``; once per process."""
    from . import settings

    directory = settings.JOIN.get()
    if directory is not None and directory.strip().lower() in ("0", "off", "no", "false"):
        return None
    from .backends.mpi import join

    if directory is None and not join.is_spawned():
        return None
    return join.join(directory, seconds)


def _start_joined(joined: Any, init_method: Optional[str], store: Any) -> None:
    """A newcomer's default group: the grown world its record describes, made as the
    running job's ranks make it (:func:`start_world`)."""
    record = joined.record
    registry.backend_spec = dict(record["backends"])
    registry.timeout = record["timeout"]
    registry.full_size = record["full_size"]
    comm = joined.comm
    made_store = None
    if not record["job_store"]:  # the running job kept a store of its own: the same here
        made_store = _make_store(init_method, store, comm.Get_rank(), comm.Get_size(),
                                 registry.timeout, comm)
    pg = start_world(comm, record["desc"], made_store, record["places"])
    registry.newcomers = list(record["newcomers"])
    report_initialized(pg, registry.timeout or 0.0, f"joined ({joined.how})",
                       type(registry.store).__name__)


def abort_process_group(group: Any = None) -> None:
    """Abort the whole job from this rank (MPI offers no way to abort one group only)."""
    pg = resolve(group, "abort_process_group")
    mpi_backend().world().Abort(1) if pg is None else pg.cpu.abort()


def local_rank_and_size(pg: Optional[ProcessGroup] = None) -> Tuple[int, int]:
    """This rank's index among the job's ranks on its node, and their number."""
    local_rank, local_size = launcher_env.torchrun_local_rank()
    if local_rank is not None and local_size is not None:
        return local_rank, local_size
    return mpi_backend().node_local((pg or resolve(None, "local_rank")).comm)
