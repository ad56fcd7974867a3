"""torch's reconfigure contract on hpccomm groups: ``dist._supports_reconfigure()``,
``dist._get_reconfigure_handle()``, ``dist._reconfigure(uuid, handles)`` (torch 2.14+).

gloo's handles name a TCP store; hpccomm's name an MPI process: the token of the MPI
job it belongs to (drawn by the job's first rank when the job's default group was
made), its rank in that job's control communicator (numbered as torch's global ranks),
and, where the MPI library connects separately started jobs (MPICH, Intel MPI), the name
of a port it opened (``MPI_Open_port``). No store, no address.

``_reconfigure(uuid, handles)`` makes the group's new communicator over exactly the
processes of ``handles``, in their order (a set: in the order of their jobs, then of
their ranks), as gloo does: each process whose handle is listed calls it, the others do
not. Processes of one job meet and make their part members-only
(``MPI_Comm_create_group``, after a meeting under the timeout); the parts of different
jobs are joined one by one: the first part connects to the port of the next part's first
process, which accepts (``MPI_Comm_connect``/``MPI_Comm_accept``), and the two merge. A
process waiting to be accepted into a part that never connects ends itself after the
timeout, saying so, since no MPI call can take it out of the accept. The group object
stays the same: its rank and size are the new ones (``dist.get_rank()``,
``dist.get_world_size()``); wrap models in DDP again afterwards, as after gloo's.
"""
from __future__ import annotations

import base64
import datetime
import json
import threading
from typing import Any, Dict, List, Optional

import torch.distributed as dist

from .. import rendezvous as _meet
from ..errors import DistBackendError, DistValueError
from ..group import ProcessGroup as HostGroup, mpi_backend
from .errors import for_torch
from .work import DONE

PREFIX = "hpccomm:"


class _Ports:
    """This process's port for other jobs to connect to (opened on first use)."""

    def __init__(self) -> None:
        self.name: Optional[str] = None
        self.lock = threading.Lock()

    def get(self) -> str:
        from ..backends.mpi import join

        with self.lock:
            if self.name is None:
                self.name = join.open_port() if join.connects_jobs() else ""
            return self.name


_port = _Ports()
#: The job's control communicator (numbered as torch's global ranks) and its token,
#: given by the default group's creation (:func:`set_job`).
_job: Dict[str, Any] = {"control": None, "token": 0}


def set_job(control: Optional[HostGroup], token: int) -> None:
    """The default group of backend 'hpccomm' was made (``control``: its control
    communicator; ``token``: a number its processes share and no other job's do), or
    destroyed (``None``)."""
    _job["control"], _job["token"] = control, token


def handle(pg: Any) -> str:
    """This process's reconfigure handle (see the module's docstring)."""
    control = _job["control"]
    if control is None:
        raise DistValueError("hpccomm.torch: no reconfigure handle before the default "
                             "group of backend 'hpccomm' exists")
    fields = {"job": _job["token"], "rank": control.rank(), "port": _port.get()}
    text = base64.urlsafe_b64encode(json.dumps(fields).encode()).decode()
    return f"{PREFIX}{fields['job']:x}:{fields['rank']}:{text}"


def _parse(text: str) -> Dict[str, Any]:
    try:
        if not text.startswith(PREFIX):
            raise ValueError("not an hpccomm handle")
        fields = json.loads(base64.urlsafe_b64decode(text.rsplit(":", 1)[1]))
        return {"job": int(fields["job"]), "rank": int(fields["rank"]),
                "port": str(fields["port"])}
    except (ValueError, KeyError, TypeError) as exc:
        raise DistValueError(f"hpccomm.torch reconfigure: {text!r:.120} is not a reconfigure "
                             f"handle of backend 'hpccomm' ({exc})") from None


def reconfigure(pg: Any, opts: Any) -> Any:
    """``pg`` over the processes of ``opts.handles`` (see the module's docstring);
    returns a completed ``Work`` (the reconfiguration is over when it returns)."""
    host = pg.host_group
    timeout = opts.timeout if isinstance(opts.timeout, datetime.timedelta) else None
    seconds = timeout.total_seconds() if timeout is not None else host.timeout
    try:
        comm = _new_communicator(list(opts.handles) if not isinstance(opts.handles, set)
                                 else _ordered(opts.handles), seconds,
                                 f"hpccomm.torch reconfigure (uuid {opts.uuid}) of group "
                                 f"'{host.group_name}'")
    except Exception as exc:
        raise for_torch(exc) from None
    new = HostGroup(comm, name=host.group_name, world_ranks=range(comm.Get_size()),
                    timeout=host.timeout, backends=dict(host.backend_names),
                    desc=host.group_desc)
    pg.use_host(new)
    host.shutdown()
    if pg is dist.distributed_c10d._world.default_pg:
        dist.distributed_c10d._world.pg_group_ranks[pg] = {r: r for r in range(new.size())}
    return DONE


def _ordered(handles: Any) -> List[str]:
    """A set of handles in the order gloo leaves to the backend: by job, then rank."""
    parsed = [(_parse(h), h) for h in handles]
    return [h for fields, h in sorted(parsed, key=lambda p: (p[0]["job"], p[0]["rank"]))]


def _new_communicator(handles: List[str], seconds: Optional[float], what: str) -> Any:
    parsed = [_parse(h) for h in handles]
    control = _job["control"]
    me = {"job": _job["token"], "rank": control.rank()}
    mine = [i for i, p in enumerate(parsed) if (p["job"], p["rank"]) == (me["job"], me["rank"])]
    if not mine:
        raise DistValueError(f"{what}: this process's handle is not among the {len(handles)} "
                             f"given (each process whose handle is listed calls it, and "
                             f"only those)")
    if len(set((p["job"], p["rank"]) for p in parsed)) != len(parsed):
        raise DistValueError(f"{what}: a handle is listed twice")
    jobs: List[int] = []
    for p in parsed:
        if p["job"] not in jobs:
            jobs.append(p["job"])
    parts = {job: [i for i, p in enumerate(parsed) if p["job"] == job] for job in jobs}
    from ..backends.mpi import join

    if len(jobs) > 1 and not join.connects_jobs():
        raise DistBackendError(
            f"{what}: the handles name processes of {len(jobs)} MPI jobs, and "
            f"{join.library()} cannot connect separately started jobs; start them as one "
            f"job, or let the job spawn newcomers (hpccomm.torch.grow_group)")
    if len(jobs) > 1 and any(not parsed[part[0]]["port"] for part in parts.values()):
        raise DistBackendError(f"{what}: a handle of another MPI job carries no port")
    my_job = me["job"]
    members = [parsed[i]["rank"] for i in parts[my_job]]
    _meet.meet_members(control, members, what, seconds)
    comm = mpi_backend().create_subcomm(control.comm, members,
                                        (hash(tuple(members)) & 0x3FFF) + 1)
    joined = jobs.index(my_job)
    if joined > 0:  # a later part: accepted by the parts before it, then as they do
        comm = join.accepted(comm, parsed[parts[my_job][0]]["port"], seconds, what)
    for later in jobs[max(joined, 0) + 1:]:
        comm = join.connected(comm, parsed[parts[later][0]]["port"], what)
    position = mine[0]
    return join.ordered(comm, position)

