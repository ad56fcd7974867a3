"""Process groups: an MPI communicator plus one backend communicator per device type.

A :class:`ProcessGroup` owns its MPI communicator (the world's is a ``Dup`` of
``COMM_WORLD``, so user code on ``COMM_WORLD`` never mixes with ours), and a channel for
hpccomm's own messages among its ranks (:attr:`ProcessGroup.hidden`, a duplicate of that
communicator: no user message can match them). Group creation is members-only
(``MPI_Comm_create_group``), so ranks outside a new group need not take part. The
registry of live groups is one explicit object, :data:`registry`.
"""
from __future__ import annotations

import importlib
import warnings
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import rendezvous, work as _work
from .errors import DistBackendError, DistError, DistValueError, Undescribed, described
from .types import NON_GROUP_MEMBER, Backend, timeout_seconds


def mpi_backend() -> Any:
    """The MPI family's communicator plumbing (:mod:`.backends.mpi.plumbing`), imported
    on first use: importing it initializes MPI, which ``import hpccomm`` must not do."""
    from .backends.mpi import plumbing as mpi

    return mpi


class ProcessGroup:
    """A set of processes that communicate together, as torch's ``ProcessGroup``.

    ``rank()``/``size()`` are this process's position and the group's size;
    ``ranks`` are the members' global ranks in group-rank order.
    """

    def __init__(self, comm: Any, *, name: str, world_ranks: Sequence[int],
                 timeout: Optional[float], backends: Dict[str, str], desc: str = "",
                 own_channel: bool = True):
        self.comm = comm
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self.ranks: Tuple[int, ...] = tuple(world_ranks)
        #: Global rank -> group rank, for every member.
        self.rank_of: Dict[int, int] = {g: i for i, g in enumerate(self.ranks)}
        self.group_name = name
        self.group_desc = desc or name
        self.timeout = timeout
        self.backend_names = dict(backends)
        self.seq = 0
        #: Async operations started on this group and maybe not finished (see :meth:`track`).
        self.pending: List[Any] = []
        self._prune_at = 64
        self.live = True
        self._communicators: Dict[str, Any] = {}
        #: The CUDA backend's ``stream_run`` once that backend exists (``_call.stream``).
        self.stream_run: Any = None
        self.cpu = self.communicator("cpu")
        self.bound_device_id: Optional[int] = None
        #: hpccomm's own messages among the group's ranks (meetings, roll calls,
        #: monitored barriers, objects): on a duplicate of ``comm``, made now, as every
        #: rank makes the group (collective), unless ``own_channel`` is false (a group
        #: that only some of its ranks make: its channel is ``comm`` itself).
        self.hidden = self._channel(comm, own_channel)

    def _channel(self, comm: Any, own: bool) -> Any:
        from .backends.mpi import hidden

        if not own:
            return hidden.of(comm)
        return hidden.attach(comm, self.timeout, f"making the channel of group "
                                                 f"'{self.group_name}'")

    # -- torch's ProcessGroup surface ---------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def name(self) -> str:
        """The backend name, as ``ProcessGroup.name()`` in torch."""
        return self.backend_string()

    def backend_string(self) -> str:
        names = self.backend_names
        if len(set(names.values())) == 1:
            return next(iter(names.values()))
        return ",".join(f"{device}:{backend}" for device, backend in names.items())

    def __repr__(self) -> str:
        return (f"<ProcessGroup '{self.group_name}' rank {self._rank}/{self._size} "
                f"ranks={list(self.ranks)} backend={self.backend_string()}>")

    # -- backends -------------------------------------------------------------------------
    def communicator(self, device: str) -> Any:
        """This group's backend communicator for arrays on ``device`` (created once)."""
        found = self._communicators.get(device)
        if found is not None:
            return found
        if not self.live:
            raise DistValueError(f"group '{self.group_name}' was destroyed")
        name = self.backend_names.get(device)
        if name is None:
            raise DistValueError(
                f"rank {self._rank} of group '{self.group_name}': no backend for {device} "
                f"arrays (backends: {self.backend_string()})")
        creator = Backend.creator_of(name, device)
        if isinstance(creator, str):
            module, _, attr = creator.partition(":")
            creator = getattr(importlib.import_module(module), attr)
        try:
            made = creator(self.comm, self.timeout)
        except DistError:
            raise
        except Exception as exc:
            raise DistBackendError(f"rank {self._rank} of group '{self.group_name}': "
                                   f"cannot start backend '{name}' for {device}: {exc}") from exc
        return self.keep_device(device, made)

    def keep_device(self, device: str, made: Any) -> Any:
        """Keep ``made`` as this group's communicator for ``device`` arrays."""
        self._communicators[device] = made
        if device == "cuda":
            self.stream_run = getattr(made, "stream_run", None)
        return made

    def split_devices(self, child: Optional["ProcessGroup"], backends: Dict[str, str],
                      timeout: Optional[float], op: str, advice: str = "") -> None:
        """Give ``child`` (made by splitting this group's MPI communicator; ``None`` on a
        rank in no part) device communicators split from this group's, where a backend
        splits its own (NCCL's ``ncclCommSplit``: no new bootstrap); the others are made
        on first use, as always. ``backends`` are the child's (the same on every rank).

        Collective over this group: every rank calls it right after the MPI split. Only
        a device communicator this group already made and can split takes part (the
        NCCL one exists on every rank once any GPU collective of the group ran). A rank
        that does not come is named in the error of every rank that did, then ``advice``."""
        for device, source in list(self._communicators.items()):
            if (backends.get(device) != self.backend_names.get(device)
                    or not getattr(source, "splittable", lambda: False)()):
                continue
            try:
                made = source.split(child.comm if child is not None else None,
                                    child.timeout if child is not None else timeout)
            except Undescribed as exc:
                raise described(self.at(op), exc, advice) from None
            if child is not None and made is not None:
                child.keep_device(device, made)

    def shrink_devices(self, comm: Any, failed: bool) -> Dict[str, Any]:
        """Device communicators for the group of ``comm`` (this group's ranks but some,
        in order: ``shrink_group``'s), by device, made by shrinking this group's where a
        backend shrinks its own (NCCL's ``ncclCommShrink``, through nccl4py: no new
        bootstrap); the others are made on first use. After a failure (``failed``) every
        device communicator of this group is then aborted (:meth:`abort_devices`).
        Called by the ranks of ``comm`` only, once they have met."""
        made: Dict[str, Any] = {}
        shrinkable = {device: source for device, source in self._communicators.items()
                      if getattr(source, "shrinkable", lambda: False)()}
        try:
            if shrinkable:
                kept = set(mpi_backend().ranks_in(comm, self.comm))
                exclude = [r for r in range(self.size()) if r not in kept]
                for device, source in shrinkable.items():
                    made[device] = source.shrink(comm, exclude, failed, self.timeout)
        finally:  # a shrink that failed or timed out leaves them holding the dead too
            if failed:
                self.abort_devices()
        return made

    def abort_devices(self) -> None:
        """Abort the device communicators whose abort is local (NCCL's ``ncclCommAbort``
        waits for nobody), as after a member failed, when destroying them could wait for
        the dead. The group's next device call finds them aborted; a group made anew
        (``shrink_group``) makes its own."""
        for communicator in list(self._communicators.values()):
            if getattr(communicator, "aborts_locally", False):
                communicator.abort()

    def set_timeout(self, seconds: Optional[float]) -> None:
        """The timeout of the group's operations from now on, in its backends too."""
        self.timeout = seconds
        for communicator in self._communicators.values():
            communicator.set_timeout(seconds)

    # -- async operations ---------------------------------------------------------------
    #: Operations a barrier does not wait for: a peer may post its side after the barrier.
    _P2P_OPS = frozenset(("isend", "irecv"))

    def track(self, work: Any) -> None:
        """Keep an async operation (and so its buffers) until it is known to be finished,
        so that :meth:`finish_pending` can complete it. Finished ones are dropped when
        the list doubles (at least 64), so tracking costs O(1) per operation."""
        pending = self.pending
        if len(pending) >= self._prune_at:
            pending[:] = [w for w in pending if not w.is_completed()]
            self._prune_at = max(64, 2 * len(pending))
        pending.append(work)

    def finish_pending(self) -> None:
        """Wait for every async collective started on this group, as torch's barrier
        does ("barrier implies wait"); point-to-point operations stay pending."""
        pending, self.pending = self.pending, []
        for work in pending:
            if work.op in self._P2P_OPS:
                if not work.is_completed():
                    self.pending.append(work)
            else:
                work.wait()

    # -- rank translation -------------------------------------------------------------
    def group_rank(self, global_rank: int, op: str = "get_group_rank", what: str = "rank") -> int:
        """The group rank of ``global_rank``; a clear error if it is not a member."""
        found = self.rank_of.get(global_rank)
        if found is None:
            raise self.error(op, f"{what} {global_rank} is not part of group "
                                 f"'{self.group_name}' (members: global ranks "
                                 f"{list(self.ranks)})")
        return found

    def global_rank(self, group_rank: int, op: str = "get_global_rank", what: str = "rank") -> int:
        if not isinstance(group_rank, int) or not 0 <= group_rank < self._size:
            raise self.error(op, f"{what} {group_rank!r} is not part of group "
                                 f"'{self.group_name}' (out of range for its size {self._size})")
        return self.ranks[group_rank]

    def failed_ranks(self, exc: BaseException) -> Optional[List[int]]:
        """``None`` unless ``exc`` reports a failed process (MPI with ULFM); then this
        group's communicator is revoked on every rank and the global ranks known to
        have failed are returned."""
        if self.comm is None:
            return None
        from .backends.mpi import ft as mpi_ft

        found = mpi_ft.failed_peers(self.comm, exc)
        return None if found is None else [self.ranks[r] for r in found]

    def at(self, op: str) -> str:
        """How an error names operation ``op`` on this rank of this group."""
        return f"hpccomm.{op} on rank {self._rank}/{self._size} of group '{self.group_name}'"

    def error(self, op: str, message: str) -> DistValueError:
        """An argument error naming the operation, this rank and this group."""
        return DistValueError(f"{self.at(op)}: {message}")

    def renew(self, comm: Any) -> None:
        """Go on with ``comm``, a fresh communicator of the same ranks in the same order,
        in place of this group's own, which may still hold operations given up after an
        error (a timeout, an interrupted wait): they stay on the old communicator, where
        no later operation can pair with them. Every member calls it at the same point
        (the backend communicators are made again, collectively); the sequence numbers
        restart from 0, as the members' counts may differ after the error."""
        if comm.Get_rank() != self._rank or comm.Get_size() != self._size:
            raise self.error("renew", f"the new communicator has rank {comm.Get_rank()} "
                                      f"of {comm.Get_size()}, not this group's rank "
                                      f"{self._rank} of {self._size}")
        self._release(self.comm, abort=False)
        self.comm, self.seq, self.live = comm, 0, True
        self.hidden = self._channel(comm, True)
        self.cpu = self.communicator("cpu")

    # -- teardown -------------------------------------------------------------------------
    def shutdown(self, abort: bool = False) -> None:
        """Release backend communicators, then the MPI communicator."""
        if not self.live:
            return
        self.live = False
        self._release(self.comm, abort)
        self.comm = None

    def _release(self, comm: Any, abort: bool) -> None:
        """Shut the backend communicators down and free ``comm``. The MPI communicators
        outlive the group's unfinished operations (:func:`hpccomm.work.running`): their
        buffers stay alive until MPI is done with them, and so do their communicators."""
        _work.abandon_pending(self.pending)
        self.pending = []
        communicators = list(self._communicators.values())
        self._communicators.clear()
        self.stream_run = None
        mpi = mpi_backend()
        with mpi.frees_after(_work.running(self)):
            for communicator in communicators:
                try:
                    communicator.abort() if abort else communicator.shutdown()
                except Exception:
                    pass
            self.hidden.free()
            mpi.free(comm)


class Registry:
    """The process's distributed state: the default group and every live group."""

    def __init__(self) -> None:
        self.world: Optional[ProcessGroup] = None
        self.groups: Dict[str, ProcessGroup] = {}
        self.name_counts: Dict[Tuple[int, ...], int] = {}
        self.store: Any = None
        self.backend_spec: Dict[str, str] = {}
        self.timeout: Optional[float] = None
        #: Groups made since the default group, it included (``get_pg_count``).
        self.created = 0
        #: Each default-group rank's place: its rank when the job had every rank
        #: (``shrink_group`` keeps the survivors' places, ``grow_group`` fills the vacant
        #: ones), and the number of places.
        self.places: List[int] = []
        self.full_size = 0
        #: The default-group ranks that joined at the last ``grow_group``.
        self.newcomers: List[int] = []

    def vacant(self) -> List[int]:
        """The places no rank of the default group holds (those of dead ranks)."""
        return sorted(set(range(self.full_size)) - set(self.places))

    def add(self, pg: ProcessGroup) -> ProcessGroup:
        self.groups[pg.group_name] = pg
        self.created += 1
        return pg

    def unique_name(self, ranks: Sequence[int], prefix: str = "ranks") -> str:
        """A name that every member derives alike: ranks plus how often they were grouped
        (counted by :meth:`took_name`; :meth:`next_name` and :meth:`took_name` without
        this one's count when a creation may fail between the two)."""
        name = self.next_name(ranks, prefix)
        self.took_name(ranks)
        return name

    def next_name(self, ranks: Sequence[int], prefix: str = "ranks") -> str:
        """The name :meth:`unique_name` would give now, without counting it: a creation
        names the group it makes before its meeting, and counts the name only once the
        group is made, so that every rank retrying a failed creation names it alike."""
        key = tuple(ranks)
        count = self.name_counts.get(key, 0)
        shown = ",".join(map(str, key)) if len(key) <= 8 else f"{key[0]},...,{key[-1]}"
        return f"{prefix}[{shown}]" + (f"#{count}" if count else "")

    def took_name(self, ranks: Sequence[int]) -> None:
        """Count a name of ``ranks`` as given (:meth:`next_name`)."""
        key = tuple(ranks)
        self.name_counts[key] = self.name_counts.get(key, 0) + 1

    def clear(self) -> None:
        self.__init__()


registry = Registry()


class _WorldAccess(type):
    """Makes ``group.WORLD``/``GroupMember.WORLD`` read the live default group."""

    @property
    def WORLD(cls) -> Optional[ProcessGroup]:
        return registry.world


class group(metaclass=_WorldAccess):
    """``group.WORLD`` is the default group (``None`` before ``init_process_group``)."""


class GroupMember(metaclass=_WorldAccess):
    """``GroupMember.WORLD`` and ``GroupMember.NON_GROUP_MEMBER``, as in torch."""

    NON_GROUP_MEMBER = NON_GROUP_MEMBER


GroupLike = Optional[Union[ProcessGroup, Any]]


def not_initialized(op: str) -> DistValueError:
    return DistValueError(f"hpccomm.{op}: the default process group is not initialized; "
                          f"call hpccomm.init_process_group() first")


def member_group(group: GroupLike, op: str) -> Optional[ProcessGroup]:
    """The live ``ProcessGroup`` meant by ``group`` (``None`` = default), or ``None`` when
    ``group`` says this rank is not a member (``GroupMember.NON_GROUP_MEMBER``).

    The two common cases (``None`` and a ``ProcessGroup``) are tested first, so the
    non-member test costs only the unusual cases.
    """
    if group is None:
        world = registry.world
        if world is None:
            raise not_initialized(op)
        return world
    if type(group) is ProcessGroup:
        if not group.live:
            raise DistValueError(f"hpccomm.{op}: group '{group.group_name}' was destroyed")
        if registry.world is None:
            raise not_initialized(op)
        return group
    if is_non_member(group):
        if registry.world is None:
            raise not_initialized(op)
        return None
    as_group = getattr(group, "as_process_group", None)  # e.g. a 1-D DeviceMesh
    if as_group is not None:
        return member_group(as_group(), op)
    raise TypeError(f"hpccomm.{op}: group must be a ProcessGroup or None, got "
                    f"{type(group).__name__}")


def is_non_member(group: Any) -> bool:
    """Whether ``group`` is ``NON_GROUP_MEMBER`` (or torch's plain ``-100``)."""
    return group is NON_GROUP_MEMBER or (type(group) is int and group == NON_GROUP_MEMBER)


def resolve(group: GroupLike, op: str) -> ProcessGroup:
    """The live ``ProcessGroup`` meant by ``group`` (``None`` = default), or a clear error,
    also when this rank is not a member (for queries that need the group itself)."""
    pg = member_group(group, op)
    if pg is None:
        raise DistValueError(f"hpccomm.{op} on global rank {registry.world.rank()}: this "
                             f"rank is not a member of the group it passed (new_group "
                             f"returned GroupMember.NON_GROUP_MEMBER here)")
    return pg


def skip(op: str, rank: Optional[int] = None, group_rank: Optional[int] = None,
         name: Optional[str] = None, required: bool = False, result: Any = None,
         stacklevel: int = 3) -> Any:
    """What an operation does on a rank outside its group, as torch does: check the
    arguments that need no group (``src``/``group_src`` not both; given if ``required``),
    warn, communicate nothing, and return ``result`` (``None``; ``-1`` for receives).
    ``stacklevel`` points the warning at the user's call (3: the caller's caller)."""
    if name is not None:
        if rank is not None and group_rank is not None:
            raise DistValueError(f"hpccomm.{op}: give {name} or group_{name}, not both")
        if required and rank is None and group_rank is None:
            raise DistValueError(f"hpccomm.{op}: {name} (a global rank) or group_{name} "
                                 f"(a group rank) is required")
    warnings.warn(f"Running {op} on global rank {registry.world.rank()} which does not "
                  f"belong to the given group.", UserWarning, stacklevel=stacklevel)
    return result


# -- queries ------------------------------------------------------------------------------
def get_rank(group: GroupLike = None) -> int:
    """This process's rank in ``group`` (default group if ``None``); -1 if not a member."""
    pg = member_group(group, "get_rank")
    return -1 if pg is None else pg.rank()


def get_world_size(group: GroupLike = None) -> int:
    """Number of processes in ``group``; -1 if this rank is not a member."""
    pg = member_group(group, "get_world_size")
    return -1 if pg is None else pg.size()


def get_backend(group: GroupLike = None) -> Backend:
    """The backend of ``group``, e.g. ``"mpi"`` or ``"cpu:mpi,cuda:nccl"``."""
    return Backend(resolve(group, "get_backend").backend_string())


def get_group_rank(group: Any, global_rank: int) -> int:
    """Translate a global rank into a rank of ``group``."""
    return resolve(group, "get_group_rank").group_rank(global_rank)


def get_global_rank(group: Any, group_rank: int) -> int:
    """Translate a rank of ``group`` into a global rank."""
    return resolve(group, "get_global_rank").global_rank(group_rank)


def get_process_group_ranks(group: GroupLike) -> List[int]:
    """The global ranks of ``group``'s members, in group-rank order."""
    return list(resolve(group, "get_process_group_ranks").ranks)


def get_pg_count() -> int:
    """How many process groups this process has made since ``init_process_group``, the
    default group included (torch counts them the same way)."""
    return registry.created


def set_timeout(timeout: Any, group: GroupLike = None) -> None:
    """The timeout of every later operation of ``group`` (default: the default group),
    in its backends too, overriding the one it was made with (a ``timedelta`` or
    seconds)."""
    pg = member_group(group, "set_timeout")
    if pg is None:
        raise DistValueError(f"hpccomm.set_timeout on rank {registry.world.rank()}: this "
                             f"rank is not a member of the group (Invalid process group "
                             f"specified)")
    seconds = timeout_seconds(timeout)
    if seconds is None:
        raise DistValueError(f"hpccomm.set_timeout on rank {pg.rank()}/{pg.size()} of "
                             f"group '{pg.group_name}': timeout must be a timedelta or "
                             f"seconds, got {timeout!r}")
    pg.set_timeout(seconds)


# -- creation -----------------------------------------------------------------------------
def backend_map(backend: Any, op: str) -> Dict[str, str]:
    """``{"cpu": "mpi", "cuda": "nccl"}`` from any accepted backend spelling."""
    if backend is None:
        return dict(registry.backend_spec or Backend.default_device_backend_map)
    spec = str(backend).lower()
    if ":" in spec:
        mapping: Dict[str, str] = {}
        for part in spec.split(","):
            device, _, name = part.strip().partition(":")
            mapping[device.strip()] = _known_backend(name.strip(), op)
        return mapping
    name = _known_backend(spec, op)
    return {device: name for device in Backend.devices_of(name)}


def _known_backend(name: str, op: str) -> str:
    canonical = Backend.canonical(name)
    if not Backend.is_registered(canonical):
        names, aliases = Backend.registered()
        raise DistValueError(f"hpccomm.{op}: unknown backend '{name}'; registered: "
                             f"{names} (and aliases {aliases})")
    return canonical


def _make_group(comm: Any, name: str, timeout: Any, backend: Any, desc: Optional[str],
                op: str) -> ProcessGroup:
    world = registry.world
    world_ranks = mpi_backend().ranks_in(comm, world.comm)
    seconds = timeout_seconds(timeout, registry.timeout)
    pg = ProcessGroup(comm, name=name, world_ranks=world_ranks, timeout=seconds,
                      backends=backend_map(backend, op), desc=desc or name)
    return registry.add(pg)


def _check_ranks(ranks: Iterable[int], op: str) -> List[int]:
    world = resolve(None, op)
    checked = []
    for rank in ranks:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world.size():
            raise world.error(op, f"rank {rank!r} is not a valid global rank "
                                  f"(world size {world.size()})")
        checked.append(rank)
    if len(set(checked)) != len(checked):
        raise world.error(op, f"ranks {checked} contain duplicates")
    return checked


def new_group(ranks: Optional[Sequence[int]] = None, timeout: Any = None, backend: Any = None,
              pg_options: Any = None, use_local_synchronization: bool = False,
              group_desc: Optional[str] = None, device_id: Any = None,
              sort_ranks: bool = True) -> Union[ProcessGroup, Any]:
    """Create a group of the given global ranks; non-members get ``NON_GROUP_MEMBER``
    (``None`` with ``use_local_synchronization=True``, as torch returns there).

    Only members make the MPI communicator (``MPI_Comm_create_group``). When the
    default group is bound to a device (``init_process_group(device_id=...)``) and
    ``use_local_synchronization`` is False, the new group's device communicators are
    split from the default group's (NCCL's ``ncclCommSplit``) as torch splits them, so
    every rank of the job must call it, non-members too (they join the split with no
    color), as torch requires; a rank that does not come is named on the others within
    the timeout. Otherwise non-members may call it or not.
    ``sort_ranks=False`` keeps the given order as the group-rank order.
    """
    world = resolve(None, "new_group")
    members = list(range(world.size())) if ranks is None else _check_ranks(ranks, "new_group")
    if sort_ranks:
        members.sort()
    # torch splits from the default group when it is bound to a device (every rank of
    # the job calls new_group then); with local synchronization non-members may not come
    source = world if world.bound_device_id is not None and not use_local_synchronization \
        else None
    backends = backend_map(backend, "new_group")
    if world.rank() not in members:
        registry.unique_name(members)  # keep name counts aligned with members' view
        if source is not None:
            source.split_devices(None, backends, timeout_seconds(timeout, registry.timeout),
                                 "new_group", _SPLIT_ADVICE)
        return None if use_local_synchronization else NON_GROUP_MEMBER
    name = registry.next_name(members)
    tag = (hash(tuple(members)) & 0x3FFF) + 1
    rendezvous.meet_members(world, members, "new_group", timeout_seconds(timeout),
                            f"new_group(ranks={members}), making group '{name}'")
    try:
        comm = mpi_backend().create_subcomm(world.comm, members, tag)
    except Exception as exc:
        raise world.error("new_group", f"creating a group of ranks {members} failed: {exc}")
    registry.took_name(members)
    pg = _make_group(comm, name, timeout, backend, group_desc, "new_group")
    if device_id is not None:
        pg.bound_device_id = device_id
    if source is not None:
        source.split_devices(pg, backends, pg.timeout, "new_group", _SPLIT_ADVICE)
    return pg


#: What a rank that waited for others in ``new_group``'s split is told to check.
_SPLIT_ADVICE = ("The default group is bound to a device, so new_group splits its NCCL "
                 "communicator, as torch does: every rank of the job calls new_group, "
                 "members or not, in the same order (use_local_synchronization=True "
                 "makes a group that only its members call, without a split)")


def split_group(parent_pg: GroupLike = None, split_ranks: Optional[List[List[int]]] = None,
                timeout: Any = None, pg_options: Any = None, group_desc: Optional[str] = None,
                backend: Any = None) -> Optional[ProcessGroup]:
    """Split ``parent_pg`` into disjoint groups in one ``MPI_Comm_split``.

    As in torch, ``split_ranks`` holds *group ranks of the parent*; each split is sorted.
    Every rank of the parent calls it; a rank in no split gets ``None``.
    """
    if not split_ranks:
        raise DistValueError("hpccomm.split_group: split_ranks cannot be None or empty")
    parent = resolve(parent_pg, "split_group")
    splits = _check_splits(parent, split_ranks, "split_group")
    mine = parent.rank()
    color, key = None, 0
    for index, ranks in enumerate(splits):
        if mine in ranks:
            color, key = index, ranks.index(mine)
    members = [[parent.ranks[r] for r in ranks] for ranks in splits]
    names = [registry.next_name(ranks) for ranks in members]
    # (the names of the parts a rank is not in may differ between ranks: not compared)
    rendezvous.meet_all(parent, "split_group", timeout_seconds(timeout),
                        f"split_group(split_ranks={splits}) of group '{parent.group_name}'")
    try:
        comm = mpi_backend().split(parent.comm, color, key)
    except Exception as exc:
        raise parent.error("split_group", f"MPI_Comm_split failed: {exc}")
    for ranks in members:
        registry.took_name(ranks)
    timeout = parent.timeout if timeout is None else timeout
    backend = parent.backend_string() if backend is None else backend
    child = None
    if comm is not None:
        child = _make_group(comm, names[color], timeout, backend, group_desc, "split_group")
    parent.split_devices(child, backend_map(backend, "split_group"),
                         timeout_seconds(timeout), "split_group")
    return child


def _check_splits(parent: ProcessGroup, split_ranks: Any, op: str) -> List[List[int]]:
    """The splits as sorted lists of parent group ranks, after torch's checks (each split
    non-empty, no duplicates) and hpccomm's (ranks in range, no rank in two splits)."""
    splits: List[List[int]] = []
    seen: Dict[int, int] = {}
    for index, ranks in enumerate(split_ranks):
        ranks = list(ranks)
        if not ranks:
            raise parent.error(op, "a split cannot be empty")
        if len(set(ranks)) != len(ranks):
            raise parent.error(op, f"split {ranks} has duplicate ranks")
        for rank in ranks:
            parent.global_rank(rank, op, "split rank (a group rank of the parent)")
            if rank in seen:
                raise parent.error(op, f"rank {rank} appears in splits {seen[rank]} and {index}")
            seen[rank] = index
        splits.append(sorted(ranks))
    return splits


def new_subgroups_by_enumeration(ranks_per_subgroup_list: List[List[int]], timeout: Any = None,
                                 backend: Any = None, pg_options: Any = None,
                                 group_desc: Optional[str] = None
                                 ) -> Tuple[Optional[ProcessGroup], List[Any]]:
    """Create the listed disjoint subgroups of the world (global ranks) in one split.

    Returns ``(this rank's subgroup or None, [subgroup per entry])``; entries this rank
    is not part of are ``NON_GROUP_MEMBER``.
    """
    world = resolve(None, "new_subgroups_by_enumeration")
    if not ranks_per_subgroup_list:
        raise world.error("new_subgroups_by_enumeration",
                          "the arg 'ranks_per_subgroup_list' cannot be empty")
    for ranks in ranks_per_subgroup_list:
        _check_ranks(ranks, "new_subgroups_by_enumeration")
    return _subgroups(world, [list(r) for r in ranks_per_subgroup_list], timeout, backend,
                      group_desc)


def new_subgroups(group_size: Optional[int] = None, group: GroupLike = None, timeout: Any = None,
                  backend: Any = None, pg_options: Any = None, group_desc: Optional[str] = None
                  ) -> Tuple[Optional[ProcessGroup], List[Any]]:
    """Split ``group`` (default: world) into consecutive subgroups of ``group_size`` ranks.

    Without ``group_size`` a subgroup is the group's ranks on one node (torch uses the
    number of CUDA devices per node and needs CUDA for it).
    """
    parent = resolve(group, "new_subgroups")
    size = parent.size()
    if group_size is None:  # torch: one subgroup per machine
        group_size = mpi_backend().node_local(parent.comm)[1]
    if not isinstance(group_size, int) or group_size <= 0 or size % group_size:
        raise parent.error("new_subgroups", f"group_size {group_size!r} must be positive and "
                                            f"divide the group size {size}")
    chunks = [list(range(i, i + group_size)) for i in range(0, size, group_size)]
    return _subgroups(parent, chunks, timeout, backend, group_desc)


def _subgroups(parent: ProcessGroup, splits: List[List[int]], timeout: Any, backend: Any,
               group_desc: Optional[str]) -> Tuple[Optional[ProcessGroup], List[Any]]:
    """``(mine, [mine or NON_GROUP_MEMBER per split])`` for splits of parent group ranks."""
    mine = split_group(parent, splits, timeout=timeout, group_desc=group_desc, backend=backend)
    position = next((i for i, ranks in enumerate(splits) if parent.rank() in ranks), None)
    return mine, [mine if i == position else NON_GROUP_MEMBER for i in range(len(splits))]


def from_communicator(comm: Any, name: str, timeout: Any = None, backend: Any = None,
                      desc: Optional[str] = None) -> ProcessGroup:
    """Wrap an MPI communicator this module did not create (a Cartesian sub-communicator)."""
    resolve(None, "from_communicator")
    return _make_group(comm, name, timeout, backend, desc, "from_communicator")


def destroy(pg: ProcessGroup, abort: bool = False) -> None:
    """Shut one group down and forget it."""
    registry.groups.pop(pg.group_name, None)
    pg.shutdown(abort=abort)
