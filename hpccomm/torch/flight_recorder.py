"""torch's flight recorder for hpccomm's groups: the last operations of every group,
dumped in torch's format for torch's analyzer (``torch.distributed.flight_recorder``).

torch's flight recorder keeps, per backend, a ring of the last ``TORCH_FR_BUFFER_SIZE``
operations (default 2000; 0 turns it off) with what the analyzer compares across ranks:
operation, input and output sizes and dtypes, the group's collective and point-to-point
sequence numbers, and state (``started`` while in flight, ``completed``). torch 2.15 fills
it for plugin backends through a hook that fires in its C++ dispatcher, which the calls
on hpccomm's Python groups never reach (and reaching it costs tens of µs a call). So an
hpccomm group records its own operations, as gloo does in C++: a :class:`GroupTrace`
per group holds the ring of its last calls, each entry a list of references made when
the call is issued (about 0.4 µs) and stamped when it completes; nothing is formatted
until a dump. A group records whatever way its operations come (torch's
Python wrappers, C++ callers through torch's trampoline, its c10d backend); CUDA
tensors of a ``"cpu:hpccomm,cuda:nccl"`` group are NCCL's, recorded (or not) by it.

Dumps hold what torch's do (``version``, ``pg_config``, ``pg_status``, ``entries``):

* :func:`dump` (pickled) and :func:`dump_json`, as torch's ``_dump_fr_trace`` and
  ``_dump_fr_trace_json``; on torch 2.15, which names the backend to dump, those two,
  ``_dump_fr_trace_file`` and ``_reset_fr_trace`` answer for ``backend="hpccomm"``
  (and ``"mpi"`` where hpccomm serves it) from here (:func:`install`);
* :func:`dump_file`: this rank's dump to ``$TORCH_FR_DUMP_TEMP_FILE<global rank>``, the
  file names torch's analyzer reads; with that variable set, each rank writes it once, at
  its groups' first timeout or failure (or ``abort()``).

The same recorder runs on every tested torch (2.13 and 2.14 have no hook for plugin
backends at all); torch's analyzer reads its dumps on each (:func:`comm_lib`).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import pickle
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

logger = logging.getLogger("hpccomm")

_time_ns = time.time_ns

#: Ring size when neither ``TORCH_FR_BUFFER_SIZE`` nor ``TORCH_NCCL_TRACE_BUFFER_SIZE``
#: is set (torch's default).
DEFAULT_SIZE = 2000

#: Where dumps go without ``TORCH_FR_DUMP_TEMP_FILE`` (torch 2.15's default prefix).
DEFAULT_PREFIX = os.path.join(os.path.expanduser("~"), ".cache", "torch",
                              "comm_lib_trace_rank_")

#: The analyzer's name of each of hpccomm's operations (the ``<op>`` of
#: ``profiling_name``, which it checks against its own list).
NAMES: Dict[str, str] = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "allreduce_coalesced",
    "broadcast": "broadcast", "reduce": "reduce", "all_gather": "all_gather",
    "all_gather_coalesced": "allgather_coalesced",
    "all_gather_into_tensor": "_all_gather_base",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "gather": "gather", "gather_single": "gather", "scatter": "scatter",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all_single",
    "barrier": "barrier", "send": "send", "recv": "recv"}

#: torch's ScalarType names, as its recorder writes dtypes.
_DTYPES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
    torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
    torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
    torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
    torch.complex32: "ComplexHalf"}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = "UInt" + _name[4:]

# An entry's slots. An entry is a list, made when the call is issued and stamped when it
# completes; an in-place call of one tensor (all_reduce, broadcast) has the first seven,
# any other call all nine. Its collective sequence number is its op number less the
# group's point-to-point calls before it; a point-to-point call's own number is P2P.
OP, NAME, P2P, IN_SIZES, IN_TYPES, CREATED, FINISHED, OUT_SIZES, OUT_TYPES = range(9)


def buffer_size() -> int:
    """The ring size torch's variables ask for: ``TORCH_FR_BUFFER_SIZE``, else
    ``TORCH_NCCL_TRACE_BUFFER_SIZE`` (the first set wins, as in torch), else
    :data:`DEFAULT_SIZE`; 0 turns recording off."""
    for name, value in (("TORCH_FR_BUFFER_SIZE", os.environ.get("TORCH_FR_BUFFER_SIZE")),
                        ("TORCH_NCCL_TRACE_BUFFER_SIZE",
                         os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE"))):
        if value:
            try:
                return max(0, int(value))
            except ValueError:
                logger.warning("hpccomm.torch: %s=%r is not a number; the flight recorder "
                               "keeps its default size %d", name, value, DEFAULT_SIZE)
                return DEFAULT_SIZE
    return DEFAULT_SIZE


def dump_prefix() -> str:
    """Where :func:`dump_file` writes: ``$TORCH_FR_DUMP_TEMP_FILE`` (torch's variable)
    followed by the global rank."""
    return os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or DEFAULT_PREFIX


class Recorder:
    """What the process's groups record into: their traces."""

    def __init__(self) -> None:
        self.groups: List["GroupTrace"] = []
        #: A dump was written after a failure (once per process, as torch's).
        self.dumped = False


class GroupTrace:
    """One group's last ``size`` calls (the ring: torch keeps the last ``size`` of a
    backend's) and its counts of calls.

    Recording is a few list and attribute operations with the GIL held and no lock: two
    threads issuing calls on one group at the same instant (which torch's own backends
    do not allow for collectives) may share an op number."""

    __slots__ = ("ring", "size", "pg_id", "host", "state", "ops", "p2p")

    def __init__(self, recorder: Recorder, host: Any, state: Any, size: int):
        self.size = size
        self.ring: List[Optional[list]] = [None] * size
        self.pg_id = len(recorder.groups)
        self.host = host
        self.state = state  # its backend_name is the profiling name's prefix
        self.ops = self.p2p = 0
        recorder.groups.append(self)

    def one(self, name: str, shape: Any, dtype: Any) -> list:
        """Record an in-place collective of one tensor (``shape``, ``dtype``). (The
        blocking all_reduce of :mod:`.operations` records its calls with these same
        lines, inline.)"""
        self.ops = n = self.ops + 1
        entry = [n, name, self.p2p, shape, dtype, _time_ns(), None]
        self.ring[n % self.size] = entry
        return entry

    def record(self, op: str, inputs: Sequence[Any], outputs: Sequence[Any],
               peer: Optional[int] = None, receive: bool = False) -> list:
        """Record operation ``op`` (hpccomm's name) of ``inputs`` into ``outputs``;
        point-to-point calls name their ``peer`` (a group rank; ``None``: any source)."""
        self.ops = n = self.ops + 1
        name = NAMES.get(op, op)
        if op in ("send", "recv"):
            self.p2p += 1
            me = self.host.rank()
            name = (f"recv {me}<-{'?' if peer is None else peer}" if receive
                    else f"send {me}->{peer}")
        entry = [n, name, self.p2p, tuple(t.shape for t in inputs),
                 tuple(t.dtype for t in inputs), _time_ns(), None,
                 tuple(t.shape for t in outputs), tuple(t.dtype for t in outputs)]
        self.ring[n % self.size] = entry
        return entry

    def drop(self, entry: list) -> None:
        """Forget ``entry``: its call was refused before anything was communicated (a
        mistake in the arguments), so no peer waits for it."""
        slot = entry[OP] % self.size
        if self.ring[slot] is entry:
            self.ring[slot] = None
        if entry[OP] == self.ops:  # the group's last call (a thread's may follow it)
            self.ops -= 1
            if _p2p(entry):
                self.p2p -= 1

    # -- at a dump ----------------------------------------------------------------------
    def entries(self) -> List[list]:
        """The recorded calls, oldest first."""
        return sorted((e for e in self.ring if e is not None), key=lambda e: e[OP])

    def config(self) -> Dict[str, str]:
        host = self.host
        return {"name": host.group_name, "desc": host.group_desc,
                "ranks": str([int(r) for r in host.ranks])}

    def status(self, entries: List[list]) -> Dict[str, int]:
        done = [e[OP] - e[P2P] for e in entries if e[FINISHED] is not None and not _p2p(e)]
        return {"last_enqueued_collective": self.ops - self.p2p,
                "last_started_collective": self.ops - self.p2p,
                "last_completed_collective": max(done, default=-1)}


def _p2p(e: list) -> bool:
    return e[NAME].startswith(("send ", "recv "))


_recorder: Optional[Recorder] = None


def trace_for(host: Any, state: Any) -> Optional[GroupTrace]:
    """The trace of a new group, or ``None`` while recording is off (torch's variables
    are read for each group, as torch reads them when it attaches its recorder)."""
    global _recorder
    size = buffer_size()
    if size <= 0:
        return None
    if _recorder is None:
        _recorder = Recorder()
    return GroupTrace(_recorder, host, state, size)


def forget(trace: Optional[GroupTrace]) -> None:
    """A group was destroyed: its calls leave the dumps (torch numbers the groups of a
    later world from 0 again, so two groups could share a name there)."""
    if trace is not None and _recorder is not None and trace in _recorder.groups:
        _recorder.groups.remove(trace)


def completed(entry: list) -> None:
    """Mark ``entry``'s call complete (at its return, or at its Work's end, on whatever
    thread saw it)."""
    entry[FINISHED] = True


# -- dumps -----------------------------------------------------------------------------
def _version() -> str:
    """The dump format version torch's own recorder writes (the analyzer checks it)."""
    try:
        return str(pickle.loads(torch._C._distributed_c10d._dump_fr_trace())["version"])
    except Exception:  # no recorder of torch's to ask: the version torch 2.15 writes
        return "2.10"


def _comm_lib_version() -> str:
    try:
        from mpi4py import MPI

        return MPI.Get_library_version().strip().splitlines()[0]
    except Exception:
        return ""


@functools.lru_cache(maxsize=None)
def comm_lib(backend: str) -> str:
    """The ``<comm_lib>`` of ``profiling_name``: the group's backend name (``hpccomm``,
    ``mpi``) where torch's analyzer takes any (2.15), ``gloo`` where it refuses names
    outside its own list (2.13, 2.14), so that it reads hpccomm's dumps there too."""
    quiet = logging.getLogger("Flight Recorder")  # the analyzer's: it warns of names
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        from torch.distributed.flight_recorder.components.types import Op

        Op({"profiling_name": f"{backend}:barrier", "state": "completed",
            "process_group": ("0", "probe"), "input_sizes": [], "output_sizes": [],
            "collective_seq_id": 1, "p2p_seq_id": 0, "input_dtypes": [],
            "output_dtypes": [], "time_created_ns": 0}, {"0": {0}}, "0")
    except AssertionError:
        return "gloo"
    except Exception:  # an analyzer of another shape: name the backend
        pass
    finally:
        quiet.setLevel(level)
    return backend


def _sizes(shapes: Optional[tuple]) -> List[List[int]]:
    return [list(shape) for shape in shapes]


def _entry(trace: GroupTrace, e: list, record: int, stacks: bool) -> Dict[str, Any]:
    host = trace.host
    p2p = _p2p(e)
    ins, in_types = (e[IN_SIZES],), (e[IN_TYPES],)
    if len(e) > OUT_SIZES:
        ins, in_types = e[IN_SIZES], e[IN_TYPES]
        outs, out_types = e[OUT_SIZES], e[OUT_TYPES]
    else:  # in place: the outputs are the inputs
        outs, out_types = ins, in_types
    done = e[FINISHED] is not None
    entry: Dict[str, Any] = {
        "record_id": record, "pg_id": trace.pg_id,
        "process_group": (host.group_name, host.group_desc),
        "thread_name": "", "thread_id": "",
        "collective_seq_id": 0 if p2p else e[OP] - e[P2P], "p2p_seq_id": e[P2P] if p2p else 0,
        "op_id": e[OP], "profiling_name": f"{comm_lib(trace.state.backend_name)}:{e[NAME]}",
        "time_created_ns": e[CREATED],
        "input_sizes": _sizes(ins), "input_dtypes": [_DTYPES.get(t, str(t)) for t in in_types],
        "output_sizes": _sizes(outs),
        "output_dtypes": [_DTYPES.get(t, str(t)) for t in out_types],
        "state": "completed" if done else "started",
        "time_discovered_started_ns": e[CREATED],
        "time_discovered_completed_ns": None,
        "retired": done,
        "timeout_ms": int(host.timeout * 1000) if host.timeout is not None else 0,
        "is_p2p": p2p,
    }
    if stacks:
        entry["frames"] = []  # hpccomm records no stacks (torch gathers one per call)
    return entry


def snapshot(backend: Optional[str] = None, include_collectives: bool = True,
             include_stack_traces: bool = True, only_active: bool = False) -> Dict[str, Any]:
    """What a dump holds, as torch's recorder lays it out: the groups (of backend name
    ``backend``, default every one) and their recorded calls, oldest first."""
    recorder = _recorder
    groups = [] if recorder is None else [
        g for g in recorder.groups if backend is None or g.state.backend_name == backend]
    recorded = {g.pg_id: g.entries() for g in groups}
    calls = sorted(((e[CREATED], g.pg_id, e[OP]), g, e) for g in groups
                   for e in recorded[g.pg_id])
    entries = [] if not include_collectives else [
        _entry(g, e, record, include_stack_traces)
        for record, (_, g, e) in enumerate(calls) if not only_active or e[FINISHED] is None]
    return {
        "version": _version(),
        "pg_config": {g.host.group_name: g.config() for g in groups},
        "comm_lib_version": _comm_lib_version(),
        "pg_status": {str(g.pg_id): g.status(recorded[g.pg_id]) for g in groups},
        "entries": entries,
    }


def dump(backend: Optional[str] = None, include_collectives: bool = True,
         include_stack_traces: bool = True, only_active: bool = False) -> bytes:
    """The recorded operations, pickled as torch's ``_dump_fr_trace`` pickles its own."""
    return pickle.dumps(snapshot(backend, include_collectives, include_stack_traces,
                                 only_active))


def dump_json(backend: Optional[str] = None, include_collectives: bool = True,
              only_active: bool = False) -> bytes:
    """The same as JSON, as torch's ``_dump_fr_trace_json``."""
    return json.dumps(snapshot(backend, include_collectives, False, only_active),
                      default=str).encode()


def _global_rank() -> int:
    """This process's rank in torch's default group (its global rank)."""
    if torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    groups = _recorder.groups if _recorder is not None else []
    return int(groups[0].host.ranks[groups[0].host.rank()]) if groups else 0


def dump_file(rank: Optional[int] = None, backend: Optional[str] = None,
              include_collectives: bool = True, include_stack_traces: bool = False,
              only_active: bool = False, prefix: Optional[str] = None) -> str:
    """Write this rank's dump to ``<prefix><rank>`` (default prefix
    ``$TORCH_FR_DUMP_TEMP_FILE``, default rank this process's global rank), the files
    torch's analyzer reads (``python -m torch.distributed.flight_recorder.fr_trace DIR
    -p PREFIX``); the path."""
    path = f"{prefix or dump_prefix()}{_global_rank() if rank is None else int(rank)}"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = dump(backend, include_collectives, include_stack_traces, only_active)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)
    return path


def reset(backend: Optional[str] = None) -> None:
    """Forget every recorded call (of groups of ``backend``, default all)."""
    recorder = _recorder
    for group in recorder.groups if recorder is not None else ():
        if backend is None or group.state.backend_name == backend:
            group.ring[:] = [None] * group.size


def dump_on_failure() -> Optional[str]:
    """A group's first timeout or failure (or ``abort()``): with
    ``TORCH_FR_DUMP_TEMP_FILE`` set, write this rank's dump, once per process."""
    recorder = _recorder
    if recorder is None or recorder.dumped or not os.environ.get("TORCH_FR_DUMP_TEMP_FILE"):
        return None
    recorder.dumped = True
    try:
        path = dump_file()
    except OSError as exc:
        logger.error("hpccomm.torch: the flight recorder's dump could not be written: %s", exc)
        return None
    logger.error("hpccomm.torch: flight recorder dump written to %s", path)
    return path


# -- torch 2.15's recorder API ------------------------------------------------------------
#: What of torch this module changes on a torch whose recorder is per backend (2.15), and
#: why; each is checked before it is changed (an older torch has none of them).
INTERNALS: Dict[str, str] = {
    "distributed_c10d._FR_SELF_RECORDING_BACKENDS":
        "the backends that record themselves, to whose groups torch attaches no hook (a "
        "hook on an hpccomm group never fires: its calls bypass torch's dispatcher)",
    "_C._distributed_c10d._dump_fr_trace, _dump_fr_trace_json, _dump_fr_trace_file, "
    "_reset_fr_trace": "each takes backend=; for hpccomm's names they answer from here",
}

#: torch's functions that read or reset one backend's recorder: name -> our answer.
_API = {"_dump_fr_trace": "dump", "_dump_fr_trace_json": "dump_json",
        "_dump_fr_trace_file": "dump_file", "_reset_fr_trace": "reset"}


def install(names: Sequence[str]) -> bool:
    """On a torch with per-backend recorders (2.15), make ``names`` (the backend names
    hpccomm serves) self-recording backends and have torch's dump functions answer for
    them from here (idempotent); ``False``, changing nothing, on a torch without them."""
    import torch.distributed.distributed_c10d as c10d

    c = torch._C._distributed_c10d
    own = getattr(c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    originals = {name: getattr(c, name, None) for name in _API}
    if not isinstance(own, set) or any(
            f is None or "backend" not in str(getattr(f, "__doc__", "")) for f in
            originals.values()):
        return False
    own.update(names)
    for name, original in originals.items():
        served = getattr(original, "hpccomm_served", None)
        if served is not None:
            served.update(names)
            continue
        wrapper = _answer_for(name, original, set(names))
        setattr(c, name, wrapper)
    return True


def _answer_for(name: str, original: Any, served: set) -> Any:
    """torch's ``name`` answering for the backends in ``served`` from this recorder."""
    if name == "_dump_fr_trace":
        def answer(includeCollectives: Optional[bool] = None,
                   includeStackTraces: Optional[bool] = None,
                   onlyActive: Optional[bool] = None, backend: str = "gloo") -> bytes:
            if backend not in served:
                return original(includeCollectives, includeStackTraces, onlyActive,
                                backend=backend)
            return dump(backend, includeCollectives is not False,
                        includeStackTraces is not False, bool(onlyActive))
    elif name == "_dump_fr_trace_json":
        def answer(includeCollectives: Optional[bool] = None,  # type: ignore[misc]
                   onlyActive: Optional[bool] = None, backend: str = "gloo") -> bytes:
            if backend not in served:
                return original(includeCollectives, onlyActive, backend=backend)
            return dump_json(backend, includeCollectives is not False, bool(onlyActive))
    elif name == "_dump_fr_trace_file":
        def answer(rank: int, includeCollectives: Optional[bool] = None,  # type: ignore[misc]
                   includeStackTraces: Optional[bool] = None,
                   onlyActive: Optional[bool] = None, backend: str = "gloo") -> None:
            if backend not in served:
                return original(rank, includeCollectives, includeStackTraces, onlyActive,
                                backend=backend)
            dump_file(rank, backend, includeCollectives is not False,
                      bool(includeStackTraces), bool(onlyActive))
            return None
    else:
        def answer(backend: str = "gloo") -> None:  # type: ignore[misc]
            if backend not in served:
                return original(backend=backend)
            reset(backend)
            return None
    answer.__name__ = answer.__qualname__ = name
    answer.__doc__ = (f"torch's {name}, answering for backend(s) {sorted(served)} from "
                      f"hpccomm's recorder (hpccomm.torch.flight_recorder).\n\n"
                      f"{original.__doc__ or ''}")
    answer.hpccomm_served = served  # type: ignore[attr-defined]
    answer.__wrapped__ = original  # type: ignore[attr-defined]
    return answer
