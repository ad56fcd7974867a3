"""Going on after a rank dies: ``revoke``, ``agree`` and ``shrink_group``.

With an MPI library that reports process failures (ULFM: Open MPI's ``mpirun --with-ft
ulfm``), an operation whose group lost a rank raises
:class:`~hpccomm.errors.ProcessFailedError` on every surviving member (the first rank to
notice revokes the group, so nobody waits for the dead one). The survivors then call
:func:`shrink_group` and carry on with the group it returns; :func:`agree` lets them
decide together (a fault-tolerant AND) whether, say, a step completed everywhere.

``shrink_group`` has torch 2.13's signature. With ``ranks_to_exclude=None`` it drops the
failed ranks (ULFM's ``MPI_Comm_shrink``); with a list of group ranks it is a planned
exclusion without any failure (``MPI_Comm_create_group`` over the remaining members,
any MPI library), which the excluded ranks do not call. Shrinking the default group makes
the result the new default group: its ranks are renumbered (``get_rank()`` is this
process's place among the survivors) and every other group is destroyed, as torch does.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

from . import rendezvous
from .errors import DistValueError
from .group import ProcessGroup, destroy, from_communicator, mpi_backend, registry, resolve
from .types import timeout_seconds

#: torch's ``shrink_flags`` values; hpccomm revokes the group in both cases, which is
#: what ``SHRINK_ABORT`` asks of NCCL.
SHRINK_DEFAULT, SHRINK_ABORT = 0, 1


def ulfm(op: str, pg: ProcessGroup) -> Any:
    """The ULFM helpers, or a clear error naming ``op`` where the job has no ULFM."""
    from .backends.mpi import ft as mpi_ft

    if not mpi_ft.enabled():
        raise mpi_ft.unavailable(f"hpccomm.{op} on rank {pg.rank()}/{pg.size()} of group "
                                 f"'{pg.group_name}'")
    return mpi_ft


def is_fault_tolerant() -> bool:
    """Whether this job's ranks survive the death of one of them: the MPI library
    reports process failures (ULFM turned on), so :func:`shrink_group` with ``None``,
    :func:`revoke` and :func:`agree` work. Initializes MPI if needed."""
    from .backends.mpi import ft as mpi_ft

    return mpi_ft.enabled()


def _where(op: str, pg: ProcessGroup) -> str:
    return f"hpccomm.{op} on rank {pg.rank()}/{pg.size()} of group '{pg.group_name}'"


def revoke(group: Any = None) -> None:
    """Revoke ``group`` on every rank: each member's pending and later operations on it
    fail with :class:`~hpccomm.errors.ProcessFailedError`. Needs ULFM. hpccomm revokes a
    group itself when one of its operations meets a failed rank; call this to stop the
    others for a reason of your own (a rank that found its state corrupt, say)."""
    pg = resolve(group, "revoke")
    ulfm("revoke", pg).revoke(pg.comm)


def agree(flag: Union[bool, int], group: Any = None,
          timeout: Any = None) -> Union[bool, int]:
    """A fault-tolerant AND of ``flag`` over the live members of ``group``.

    Every live member must call it; failed ranks are left out, even those that fail
    during the call, and a revoked group still agrees. A ``bool`` gives the logical AND,
    an ``int`` (32-bit) the bitwise AND. Needs ULFM.
    """
    pg = resolve(group, "agree")
    ft = ulfm("agree", pg)
    if not isinstance(flag, (bool, int)) or not -2 ** 31 <= int(flag) < 2 ** 31:
        raise pg.error("agree", f"flag must be a bool or a 32-bit int, got {flag!r}")
    seconds = timeout_seconds(timeout, pg.timeout)
    value = ft.agree(pg.comm, int(flag), seconds, _where("agree", pg))
    return bool(value & 1) if isinstance(flag, bool) else value


def shrink_group(ranks_to_exclude: Optional[List[int]] = None, group: Any = None,
                 shrink_flags: int = SHRINK_DEFAULT, pg_options: Any = None) -> ProcessGroup:
    """A new group of ``group``'s members without ``ranks_to_exclude`` (group ranks), or
    without its failed ranks when ``ranks_to_exclude`` is ``None`` (needs ULFM).

    Members keep their order. Excluded ranks must not call it. Shrinking the default
    group makes the result the new default (ranks renumbered; every other group is
    destroyed); any other group is destroyed and replaced by the result.
    """
    pg = resolve(group, "shrink_group")
    return _replace(pg, survivors(pg, ranks_to_exclude, shrink_flags),
                    failed=ranks_to_exclude is None)


def survivors(pg: ProcessGroup, ranks_to_exclude: Optional[List[int]] = None,
              shrink_flags: int = SHRINK_DEFAULT) -> Any:
    """The MPI communicator of :func:`shrink_group`'s result, for any ``ProcessGroup``
    (the torch adapter's groups too); ``pg`` itself is left as it is."""
    if shrink_flags not in (SHRINK_DEFAULT, SHRINK_ABORT):
        raise pg.error("shrink_group", f"shrink_flags must be SHRINK_DEFAULT (0) or "
                                       f"SHRINK_ABORT (1), got {shrink_flags!r}")
    if ranks_to_exclude is None:
        ft = ulfm("shrink_group", pg)
        return ft.shrink(pg.comm, pg.timeout, _where("shrink_group", pg))
    return _without(pg, _excluded(pg, ranks_to_exclude))


def _excluded(pg: ProcessGroup, ranks: Any) -> List[int]:
    """``ranks`` checked as torch checks them (a non-empty list of distinct group ranks,
    not all of them, not this rank)."""
    op = "shrink_group"
    if not isinstance(ranks, list):
        raise TypeError(f"hpccomm.{op}: ranks_to_exclude must be a list of group ranks or "
                        f"None, got {type(ranks).__name__}")
    if not ranks:
        raise pg.error(op, "ranks_to_exclude cannot be empty (None excludes the failed ranks)")
    for rank in ranks:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < pg.size():
            raise pg.error(op, f"rank {rank!r} in ranks_to_exclude is not a group rank "
                               f"(group size {pg.size()})")
    if len(set(ranks)) != len(ranks):
        raise pg.error(op, f"ranks_to_exclude {ranks} contains duplicates")
    if len(ranks) >= pg.size():
        raise pg.error(op, "cannot exclude every rank of the group")
    if pg.rank() in ranks:
        raise DistValueError(f"{_where(op, pg)}: this rank is in ranks_to_exclude; excluded "
                             f"ranks must not call shrink_group")
    return sorted(ranks)


def _without(pg: ProcessGroup, excluded: List[int]) -> Any:
    """The communicator of ``pg``'s members but ``excluded``; only they take part."""
    if pg.comm is not None and _revoked(pg.comm):
        raise pg.error("shrink_group", "the group was revoked after a rank failed: call "
                                       "shrink_group(None) to drop the failed ranks, then "
                                       "exclude more ranks from the group it returns")
    members = [r for r in range(pg.size()) if r not in excluded]
    rendezvous.meet_members(pg, members, "shrink_group", None,
                            f"shrink_group(ranks_to_exclude={excluded}) of group "
                            f"'{pg.group_name}'")
    tag = (hash(tuple(members)) & 0x3FFF) + 1
    return mpi_backend().create_subcomm(pg.comm, members, tag)


def _revoked(comm: Any) -> bool:
    is_revoked = getattr(comm, "Is_revoked", None)
    if is_revoked is None:
        return False
    try:
        return bool(is_revoked())
    except Exception:  # an MPI without ULFM's query
        return False


def _replace(pg: ProcessGroup, comm: Any, failed: bool) -> ProcessGroup:
    """The group of ``comm`` in place of ``pg`` (the default group if ``pg`` is it)."""
    backend, desc = pg.backend_string(), f"{pg.group_desc}:shrunk"
    # NCCL shrinks its own where it can (no bootstrap); after a failure the old device
    # communicators hold the dead: aborted, never waited for
    shrunk = pg.shrink_devices(comm, failed)
    if pg is registry.world:
        from .init import replace_default_group

        kept = mpi_backend().ranks_in(comm, pg.comm)
        places = [registry.places[r] for r in kept] if registry.places else None
        new = replace_default_group(comm, desc, failed, places)
    else:
        name, timeout = f"{pg.group_name}:shrunk", pg.timeout  # the same on every member
        destroy(pg)
        new = from_communicator(comm, name, timeout, backend, desc)
    for device, made in shrunk.items():
        new.keep_device(device, made)
    return new


# -- growing back ---------------------------------------------------------------------
def grow_group(spawn: Optional[Sequence[str]] = None, *, join: Optional[str] = None,
               count: Optional[int] = None, group: Any = None,
               timeout: Any = None) -> ProcessGroup:
    """Take ``count`` new processes into the default group, which becomes the grown
    group (returned): after :func:`shrink_group`, the newcomers take the places of the
    ranks that died, so every survivor gets back the rank it had before the failure.

    The newcomers are either spawned here, ``spawn=[command, arg...]`` run by every
    survivor together (``MPI_Comm_spawn``; e.g. ``[sys.executable, "train.py"]``), or
    a job started apart with ``HPCCOMM_JOIN=DIRECTORY`` (an ``srun`` step, a second
    ``mpiexec``) that waits in ``join=DIRECTORY`` (MPI's ports; MPICH and Intel MPI).
    Either way their ``init_process_group()`` returns in the grown group.

    ``count``: how many processes join (default: as many as places are vacant). Every
    rank of the default group calls it. Within ``timeout`` (default: the group's) the
    newcomers come, or a :class:`~hpccomm.errors.DistTimeoutError` names who never
    came, and the group is left as it was, to go on at its size. As with
    ``shrink_group``, every other group is destroyed, and the job's store is made again
    over the new group: make the groups and DeviceMeshes again with the same calls as
    at the start, on every rank, the newcomers included. :data:`newcomers` says
    which ranks joined; :func:`hpccomm.checkpoint.hand_over` gives them the state.
    """
    pg = resolve(group, "grow_group")
    if pg is not registry.world:
        raise pg.error("grow_group", "only the default group grows (every other group is "
                                     "made again after it, with the same calls)")
    job_store = type(registry.store).__name__ in ("MPIStore", "JobTCPStore")
    comm, places, joined = grown_world(pg, spawn, join, count, timeout, registry.places,
                                       registry.full_size, job_store)
    from .init import replace_default_group

    new = replace_default_group(comm, f"{pg.group_desc}:grown", False, places)
    registry.newcomers = joined
    return new


def newcomers() -> List[int]:
    """The ranks of the default group that joined it at the last :func:`grow_group`
    (on the newcomers too); empty before any."""
    resolve(None, "newcomers")
    return list(registry.newcomers)


def grown_world(pg: ProcessGroup, spawn: Optional[Sequence[str]], join: Optional[str],
                count: Optional[int], timeout: Any, places: Optional[List[int]] = None,
                full_size: int = 0, job_store: bool = True
                ) -> Tuple[Any, List[int], List[int]]:
    """The MPI communicator of :func:`grow_group`'s result, each of its ranks' place,
    and the newcomers' ranks, for a ``ProcessGroup`` ``pg`` (the torch adapter's default
    group too) whose ranks hold ``places`` (default: their ranks) out of ``full_size``;
    ``pg`` itself is left as it is. ``job_store``: the newcomers make the job's store
    over MPI (else they make the one their ``init_process_group`` names)."""
    from .backends.mpi import join as mpi_join

    op = "grow_group"
    if (spawn is None) == (join is None):
        raise pg.error(op, "give spawn=[command, args...] (processes started here) or "
                           "join=DIRECTORY (a job started with HPCCOMM_JOIN=DIRECTORY)")
    if spawn is not None and (isinstance(spawn, str) or not spawn
                              or not all(isinstance(a, str) for a in spawn)):
        raise pg.error(op, f"spawn must be a list of strings, the command and its "
                           f"arguments, got {spawn!r}")
    current = list(places) if places else list(range(pg.size()))
    vacant = sorted(set(range(full_size)) - set(current))
    if count is None:
        count = len(vacant)
        if not count:
            raise pg.error(op, "no place is vacant (no rank died): say how many processes "
                               "join with count=")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise pg.error(op, f"count must be a positive int, got {count!r}")
    if pg.comm is not None and _revoked(pg.comm):
        raise pg.error(op, "the group was revoked after a rank failed: call "
                           "shrink_group() first, then grow the group it returns")
    seconds = timeout_seconds(timeout, pg.timeout)
    what = _where(op, pg)
    new_places, _ = mpi_join.places(current, vacant, count)
    order = sorted(current + new_places)
    rank_of = {place: rank for rank, place in enumerate(order)}
    base = {"timeout": pg.timeout, "backends": dict(pg.backend_names),
            "full_size": max(full_size, len(order)), "desc": f"{pg.group_desc}:grown",
            "places": order, "newcomers": [rank_of[p] for p in new_places],
            "job_store": job_store}
    records = [dict(base, place=p) for p in new_places]
    rendezvous.meet_all(pg, op, seconds)
    if spawn is not None:
        inter = mpi_join.spawn(pg.comm, list(spawn), count, seconds, what)
        comm = mpi_join.admit(inter, records)
    else:
        jobs = mpi_join.shared_handles(pg.comm, join, count, seconds, what)
        per_job, start = [], 0
        for _, size in jobs:
            per_job.append(records[start:start + size])
            start += size
        for i, job_records in enumerate(per_job):
            for record in job_records:
                record["then"] = [port for port, _ in jobs[i + 1:]]
                record["records_then"] = per_job[i + 1:]
        comm = mpi_join.grow_by_ports(pg.comm, [port for port, _ in jobs], per_job, what,
                                      free=False)
    comm = mpi_join.ordered(comm, current[pg.rank()])
    return comm, order, base["newcomers"]
