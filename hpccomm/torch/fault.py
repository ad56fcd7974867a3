"""Going on after a rank dies, for torch programs on backend ``"hpccomm"`` (MPI with ULFM).

torch 2.13's ``torch.distributed.shrink_group`` drives only NCCL's C++ backend, so
hpccomm offers its own: :func:`shrink_group` makes the survivors' communicator, then
destroys torch's default group and starts a new one over the survivors (``mpi://``,
ranks renumbered, a new store), which it returns. Models wrapped in DDP or FSDP must be
wrapped again, since their groups were destroyed. :func:`agree` and :func:`revoke` act
on the torch group's MPI communicator as :mod:`hpccomm.fault` does.
"""
from __future__ import annotations

import datetime
from typing import Any, List, Optional, Union

import torch.distributed as dist

from .. import fault as _fault
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
