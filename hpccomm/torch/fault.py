"""Going on after a rank dies, for torch programs on backend ``"hpccomm"`` (MPI with ULFM).

torch 2.13's ``torch.distributed.shrink_group`` drives only NCCL's C++ backend, so
hpccomm offers its own: :func:`shrink_group` makes the survivors' communicator, then
destroys torch's default group and starts a new one over the survivors (``mpi://``,
ranks renumbered, a new store), which it returns. Models wrapped in DDP or FSDP must be
wrapped again, since their groups were destroyed. :func:`agree` and :func:`revoke` act
on the torch group's MPI communicator as :mod:`hpccomm.fault` does. :func:`grow_group`
takes new processes in (the dead ranks' replacements) and :func:`hand_over` gives them
a survivor's state.
"""
from __future__ import annotations

import datetime
from typing import Any, List, Optional, Sequence, Union

import torch.distributed as dist

from .. import fault as _fault
from ..checkpoint import handover
from ..errors import DistValueError
from . import bootstrap
from .errors import for_torch
from .process_group import ProcessGroupHPC


def _host(group: Any, op: str) -> Any:
    """The hpccomm group behind the torch group ``group`` (``None``: the default)."""
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if not isinstance(pg, ProcessGroupHPC):
        raise DistValueError(f"hpccomm.torch.{op}: the group's backend is not 'hpccomm' "
                             f"(it is {dist.get_backend(pg)!r})")
    return pg.host_group


def shrink_group(ranks_to_exclude: Optional[List[int]] = None, group: Any = None,
                 shrink_flags: int = _fault.SHRINK_DEFAULT, pg_options: Any = None) -> Any:
    """A new default torch group without the failed ranks (``None``, needs ULFM) or
    without ``ranks_to_exclude`` (ranks of the default group, a planned exclusion).

    Only the default group can be shrunk: every other group is destroyed with it (as
    torch's ``shrink_group`` does), so create sub-groups and DeviceMeshes again from the
    returned group. Excluded ranks must not call it.
    """
    default = dist.distributed_c10d._get_default_group()
    if group is not None and group is not default:
        raise DistValueError("hpccomm.torch.shrink_group: only the default group can be "
                             "shrunk; shrink it and create the sub-groups again")
    host = _host(None, "shrink_group")
    backend = dist.get_backend(default)
    timeout = datetime.timedelta(seconds=host.timeout) if host.timeout else None
    try:
        survivors = _fault.survivors(host, ranks_to_exclude, shrink_flags)
    except Exception as exc:
        raise for_torch(exc) from None
    bootstrap.continue_with(survivors, failed=ranks_to_exclude is None)
    dist.destroy_process_group()
    kwargs = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend, init_method="mpi://", **kwargs)
    return dist.distributed_c10d._get_default_group()


def grow_group(spawn: Optional[Sequence[str]] = None, *, join: Optional[str] = None,
               count: Optional[int] = None, timeout: Any = None) -> Any:
    """A new default torch group with ``count`` more processes (default: one per rank
    that died), which take the dead ranks' places: :func:`hpccomm.grow_group` for torch
    programs. ``spawn=[command, args...]`` starts them here (``MPI_Comm_spawn``);
    ``join=DIRECTORY`` takes a job started apart with ``HPCCOMM_JOIN=DIRECTORY``. Their
    ``init_process_group("hpccomm", init_method="mpi://")`` returns in the new group.

    Every rank of the default group calls it. As with :func:`shrink_group`, every other
    group is destroyed: wrap the model in DDP again and make sub-groups and DeviceMeshes
    again with the same calls as at the start; :func:`newcomers` says which ranks joined
    and :func:`hand_over` gives them the state.
    """
    default = dist.distributed_c10d._get_default_group()
    host = _host(None, "grow_group")
    backend = dist.get_backend(default)
    timeout_kw = datetime.timedelta(seconds=host.timeout) if host.timeout else None
    try:
        grown, places, joined = _fault.grown_world(
            host, spawn, join, count, timeout, bootstrap.places(), bootstrap.full_size())
    except Exception as exc:
        raise for_torch(exc) from None
    bootstrap.continue_with(grown, failed=False, places=places, newcomers=joined)
    dist.destroy_process_group()
    kwargs = {} if timeout_kw is None else {"timeout": timeout_kw}
    dist.init_process_group(backend, init_method="mpi://", **kwargs)
    return dist.distributed_c10d._get_default_group()


def newcomers() -> List[int]:
    """The ranks of the default torch group that joined at the last :func:`grow_group`
    (on the newcomers too); empty before any."""
    return bootstrap.newcomers()


def hand_over(state: Any, *, src: int = 0, to: Optional[Sequence[int]] = None) -> Any:
    """Rank ``src``'s ``state`` (a ``state_dict``, or nested dicts and lists of tensors,
    arrays and picklable values) on the ranks ``to`` (default: :func:`newcomers`),
    returned there; the others get their own ``state`` back. Every rank of the default
    group calls it; only ``src`` and the receivers communicate, the arrays' bytes as
    broadcasts of their own (:func:`hpccomm.checkpoint.hand_over` for torch groups)."""
    import numpy as np
    import torch

    receivers = sorted(set(bootstrap.newcomers() if to is None else to))
    me = dist.get_rank()
    if not receivers or (me != src and me not in receivers):
        return state
    if src in receivers:
        raise DistValueError(f"hpccomm.torch.hand_over: src {src} is also among the "
                             f"receivers {receivers}")
    sub = dist.new_group(sorted([src] + receivers), use_local_synchronization=True)
    try:
        if me == src:
            buffers: List[Any] = []
            skeleton = handover.pack(state, buffers)
            dist.broadcast_object_list([skeleton], src=src, group=sub)
            for buffer in buffers:
                dist.broadcast(torch.from_numpy(buffer.reshape(-1).view(np.uint8)), src=src,
                               group=sub)
            return state
        holder: List[Any] = [None]
        dist.broadcast_object_list(holder, src=src, group=sub)
        arrays = []
        for buffer in handover.buffers_for(holder[0]):
            dist.broadcast(torch.from_numpy(buffer.reshape(-1).view(np.uint8)), src=src,
                           group=sub)
            arrays.append(buffer)
        return handover.unpack(holder[0], arrays)
    finally:
        dist.destroy_process_group(sub)


def failed_ranks(group: Any = None) -> List[int]:
    """The global ranks of the torch group ``group`` known to have failed (ULFM), e.g.
    after DDP's backward raised: torch's autograd engine hands the error on as a plain
    ``RuntimeError``, whose text names the ``ProcessFailedError``. Empty without ULFM
    or while no member failed."""
    host = _host(group, "failed_ranks")
    if host.comm is None or not _fault.is_fault_tolerant():
        return []
    from ..backends.mpi import ft as mpi_ft

    return [host.ranks[r] for r in mpi_ft.failed_ranks(host.comm)]


def revoke(group: Any = None) -> None:
    """Revoke the torch group ``group`` on every rank (needs ULFM)."""
    host = _host(group, "revoke")
    _fault.ulfm("revoke", host).revoke(host.comm)


def agree(flag: Union[bool, int], group: Any = None) -> Union[bool, int]:
    """A fault-tolerant AND of ``flag`` over the live ranks of the torch group ``group``
    (a ``bool``: logical, an ``int``: bitwise; needs ULFM)."""
    host = _host(group, "agree")
    value = _fault.ulfm("agree", host).agree(host.comm, int(flag), host.timeout,
                                            f"hpccomm.torch.agree on rank {host.rank()}")
    return bool(value & 1) if isinstance(flag, bool) else value
