"""The meeting before an NCCL communicator is made: every rank comes, no two share a GPU.

``ncclCommInitRank`` blocks until every rank of the new communicator calls it, with no
deadline, and NCCL refuses a communicator in which two ranks use the same device with
only ``NCCL_ERROR_INVALID_USAGE`` to say so. So before a communicator is created, its
ranks meet over MPI under the group's timeout (:func:`meet`, a
:mod:`~hpccomm.backends.mpi.meeting` on the group's channel), each bringing which
communicator it came to make and where it runs (world rank, device index, host name and
the device's UUID). The leader, the communicator's first rank, then answers every rank
at once:

* the NCCL unique id, when all came, to make the same communicator, on distinct GPUs;
* :class:`~hpccomm.errors.NeverCame` naming the ranks that did not come within the
  timeout (the dispatch layer adds the operation and the group);
* a :class:`~hpccomm.errors.DistBackendError`, the same on every rank, naming the ranks
  that share a device (host, device, UUID and the ways out);
* a :class:`~hpccomm.errors.DistDesyncError`, the same on every rank, naming the ranks
  that came to make another communicator (a call on another group or pair), or to make
  a group of the same communicator (a meeting of ``new_group``, ``split_group``...).

Once every rank holds the id, NCCL's creation has no rank left to wait for, only its own
bootstrap (bounded by :mod:`.deadline`). A rank whose
device UUID cannot be read (an old CuPy or driver) still comes, but is left out of the
comparison: then the check can only be silent, never wrong.
"""
from __future__ import annotations

import socket
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import DistBackendError, DistDesyncError, NeverCame
from ..mpi import meeting
from .nccl4py_binding import root_index

#: Bytes of one rank's record in the exchange (``world\tdevice\thost\tuuid``, NUL-padded).
RECORD_BYTES = 512
#: Bytes of an NCCL unique id (``NCCL_UNIQUE_ID_BYTES``).
UID_BYTES = 128
#: The leader's answer starts with the form its CuPy gave the id in, which every rank's
#: CuPy (the same release) takes back: ``bytes`` (CuPy 13 and later) or a tuple of 128
#: signed chars (earlier releases).
_AS_BYTES, _AS_CHARS = b"b", b"t"

#: One rank's facts: (world rank, device index, host name, device UUID or "").
Identity = Tuple[int, int, str, str]


def format_uuid(raw: Any) -> str:
    """A device UUID as ``nvidia-smi`` prints it (``GPU-xxxxxxxx-xxxx-...``), from the
    16 bytes CuPy's ``getDeviceProperties(dev)["uuid"]`` gives; other forms as text;
    ``""`` when there is none."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw.strip()
    try:
        data = bytes(raw)
    except (TypeError, ValueError):
        return str(raw)
    if not data.strip(b"\0"):
        return ""
    text = data.hex()
    if len(data) == 16:
        return (f"GPU-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}")
    return text


def device_uuid(cp: Any, device: int) -> str:
    """``device``'s UUID through CuPy, or ``""`` if it cannot be read."""
    try:
        return format_uuid(cp.cuda.runtime.getDeviceProperties(device).get("uuid"))
    except Exception:  # no such property in this CuPy or driver: the check is skipped
        return ""


def identity(cp: Any, device: int) -> Identity:
    """This rank's facts for the exchange."""
    from ..mpi.plumbing import world

    return (world().Get_rank(), device, socket.gethostname(), device_uuid(cp, device))


def encode(me: Identity) -> np.ndarray:
    text = "\t".join(str(part).replace("\t", " ") for part in me).encode()[:RECORD_BYTES]
    record = np.zeros(RECORD_BYTES, np.uint8)
    record[:len(text)] = np.frombuffer(text, np.uint8)
    return record


def decode(record: np.ndarray) -> Identity:
    world, device, host, uuid = (bytes(record).rstrip(b"\0").decode(errors="replace")
                                 .split("\t") + ["", "", "", ""])[:4]
    return int(world or -1), int(device or -1), host, uuid


def conflicts(table: Sequence[Identity]) -> List[List[int]]:
    """The sets of positions (ranks of the communicator) that share one device UUID,
    each in rank order, ordered by their first rank; ranks without a UUID share nothing."""
    by_uuid: Dict[str, List[int]] = {}
    for rank, (_, _, _, uuid) in enumerate(table):
        if uuid:
            by_uuid.setdefault(uuid, []).append(rank)
    return sorted((ranks for ranks in by_uuid.values() if len(ranks) > 1),
                  key=lambda ranks: ranks[0])


def _names(numbers: Sequence[int]) -> str:
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def message(table: Sequence[Identity], shared: Sequence[Sequence[int]],
            ranks: Optional[Sequence[int]] = None) -> str:
    """The error, the same on every rank (built from the table every rank holds).

    ``ranks`` are the positions' ranks as the user knows them (the group's); the
    communicator's own positions when not given.
    """
    ranks = list(range(len(table))) if ranks is None else list(ranks)
    lines = []
    for positions in shared:
        _, _, host, uuid = table[positions[0]]
        hosts = sorted({table[p][2] for p in positions})
        devices = sorted({table[p][1] for p in positions})
        worlds = [table[p][0] for p in positions]
        who = f"ranks {_names([ranks[p] for p in positions])} of the group"
        if worlds != [ranks[p] for p in positions]:
            who += f" (world ranks {_names(worlds)})"
        if len(devices) == 1:
            where = f"cuda:{devices[0]}"
        else:
            where = ", ".join(f"cuda:{table[p][1]} on rank {ranks[p]}" for p in positions)
        place = f"host {hosts[0]}" if len(hosts) == 1 else f"hosts {', '.join(hosts)}"
        lines.append(f"{who} share one GPU: {place}, {where}, UUID {uuid}")
    return ("hpccomm NCCL backend: NCCL needs one GPU per rank, but " + "; ".join(lines) +
            ". NCCL would refuse this communicator (NCCL_ERROR_INVALID_USAGE). Ways out: "
            "start at most as many ranks per node as it has GPUs; give each rank a GPU of "
            "its own (CUDA_VISIBLE_DEVICES per rank, or device_id= to "
            "init_process_group); or move CuPy arrays over MPI instead of NCCL, which "
            "lets ranks share a GPU: backend=\"mpi\" (or \"cpu:mpi,cuda:mpi\") for "
            "init_process_group or new_group.")


def _raise_if_shared(table: Sequence[Identity], ranks: Optional[Sequence[int]]) -> None:
    shared = conflicts(table)
    if shared:
        raise DistBackendError(message(table, shared, ranks))


class _CreationWords(meeting.Words):
    """An NCCL creation's failures, in the group's ranks (the dispatch layer adds the
    operation and the group to :class:`~hpccomm.errors.NeverCame`)."""

    def __init__(self, comm: Any, members: List[int], key: str, timeout: Optional[float]):
        super().__init__(creation(key, members))
        self.comm, self.members, self.key, self.timeout = comm, members, key, timeout

    def missing(self, named: List[int], count: int, leader: Optional[int]) -> BaseException:
        return NeverCame(_never_came(self.comm, self.members, self.what, named, count,
                                     leader, self.timeout))

    def unanswered(self, leader: int, limit: Optional[float]) -> BaseException:
        return NeverCame(_never_answered(self.comm, self.members, self.what, self.timeout))

    def differ(self, calls: List[Tuple[int, str]], absent: List[int]) -> str:
        return _different([call for _, call in calls], [rank for rank, _ in calls], absent)

    def desync(self, text: str) -> BaseException:
        return DistDesyncError(text)


def meet(comm: Any, members: Sequence[int], key: str, cp: Any, device: int,
         timeout: Optional[float], unique_id: Optional[Callable[[], Any]]) -> Any:
    """The meeting of ``members`` (positions in ``comm``, the group's MPI communicator,
    in the new communicator's rank order; this rank among them) before they make the
    NCCL communicator ``key`` names (``"group"``, ``"pair 0-2"``, ``"split 3"``):
    returns the unique id that ``unique_id()`` made on the first member, in the form it
    gave it (CuPy's: ``bytes``, or a tuple of chars), or ``None`` without ``unique_id``
    (a split needs none); raises on every member if some never came within ``timeout``
    seconds, if two share a GPU, or if they came to make different communicators."""
    members = [int(m) for m in members]

    def judge(records: List[np.ndarray]) -> bytes:
        _raise_if_shared([decode(r) for r in records], members)
        if unique_id is None:
            return b""
        made = unique_id()
        uid = made if isinstance(made, bytes) else bytes(b & 0xFF for b in made)
        if len(uid) != UID_BYTES:
            raise DistBackendError(f"NCCL made a unique id of {len(uid)} bytes, not "
                                   f"{UID_BYTES}")
        return (_AS_BYTES if isinstance(made, bytes) else _AS_CHARS) + uid

    answer = meeting.meet(comm, members, _CALL + key, timeout,
                          _CreationWords(comm, members, key, timeout),
                          record=encode(identity(cp, device)), judge=judge)
    if not answer:
        return None
    form, uid = answer[:1], answer[1:]
    return uid if form == _AS_BYTES else tuple(int(b) for b in np.frombuffer(uid, np.int8))


#: How an NCCL creation's call begins in its meeting (the key follows): the calls of the
#: other meetings on the group's channel (a group's creation) do not.
_CALL = "NCCL communicator "


def root_ids(comm: Any, roots: int, unique_id: Callable[[], bytes],
             timeout: Optional[float], what: str) -> List[bytes]:
    """The ``roots`` unique ids of a creation of the whole group of ``comm`` from several
    roots (``ncclCommInitRankScalable``), after the meeting: the first rank of each of
    NCCL's blocks of ranks makes one (``unique_id()``, 128 bytes), and every rank gathers
    them, in block order (one ``MPI_Iallgatherv`` of ``roots`` x 128 bytes, under
    ``timeout``)."""
    from mpi4py import MPI

    from ...work import Work

    size = comm.Get_size()
    mine = np.frombuffer(unique_id() if root_index(comm.Get_rank(), size, roots) >= 0
                         else b"", np.uint8)
    counts = [UID_BYTES if root_index(r, size, roots) >= 0 else 0 for r in range(size)]
    shifts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(int).tolist()
    every = np.empty(roots * UID_BYTES, np.uint8)
    work = Work(comm.Iallgatherv(mine, [every, counts, shifts, MPI.BYTE]).Test, None,
                (mine, every))  # both kept alive until it completes
    work.op, work.timeout = f"{what}: sharing its {roots} roots' unique ids", timeout
    work.wait()
    return [every[i:i + UID_BYTES].tobytes() for i in range(0, every.size, UID_BYTES)]


def creation(key: str, members: Sequence[int]) -> str:
    """``"NCCL communicator creation (the group's communicator)"``: the creation of the
    communicator ``key`` of ``members`` (positions in the group), in words."""
    return f"NCCL communicator creation ({_described(key, [int(m) for m in members])})"


def _described(key: str, members: Sequence[int]) -> str:
    if key == "group":
        return "the group's communicator"
    if key.startswith("split"):
        return (f"a communicator split from the group's, its {_ordinal(key)} "
                f"(ncclCommSplit)")
    return f"the pair communicator of ranks {_names(members)}"


def _ordinal(key: str) -> str:
    """``"split 3"`` -> ``"3rd"``."""
    number = key.split(" ", 1)[-1]
    if not number.isdigit():
        return number
    n = int(number)
    ending = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{ending}"


def _different(calls: Sequence[str], ranks: Sequence[int], absent: Sequence[int]) -> str:
    """The account, the same on every rank, of ranks (of the group) that came to make
    different communicators: ``calls`` are their meetings' calls (an NCCL creation's
    key after :data:`_CALL`, or a group creation's words), ``absent`` the ranks expected
    that never came."""
    by_call: Dict[str, List[int]] = {}
    for rank, call in zip(ranks, calls):
        by_call.setdefault(call, []).append(rank)
    parts = []
    for call, who in by_call.items():
        many = len(who) > 1
        if call.startswith(_CALL):
            key = call[len(_CALL):]
            made = _described(key, _pair(key, sorted(who)))
        else:
            made = f"a group ({call})"
        parts.append(f"rank{'s' if many else ''} {_names(who)} of the group "
                     f"{'come' if many else 'comes'} to make {made}")
    if absent:
        parts.append(f"rank{'s' if len(absent) > 1 else ''} {_names(list(absent))} of "
                     f"the group never came")
    return ("hpccomm NCCL backend: the ranks called for different NCCL communicators (a "
            "GPU call on another group or pair, or a call one rank skipped): " +
            "; ".join(parts) + ". Nothing was created.")


def _pair(key: str, members: Sequence[int]) -> List[int]:
    try:
        return [int(r) for r in key.split(" ", 1)[1].split("-")]
    except (IndexError, ValueError):
        return list(members)


def _never_answered(comm: Any, members: Sequence[int], what: str,
                    timeout: Optional[float]) -> str:
    from ..mpi.plumbing import ranks_in, world

    first = members[0]
    return (f"{what}: rank {first} of the group (global rank "
            f"{ranks_in(comm, world())[first]}), the communicator's first, did not answer "
            f"within {timeout} s (it never came, or gave up before this rank came). No "
            f"NCCL communicator was made; the group stays usable for CPU arrays")


def _never_came(comm: Any, members: Sequence[int], what: str, named: List[int], count: int,
                leader: Optional[int], timeout: Optional[float]) -> str:
    """A meeting's absent ranks in words: group ranks, with their global ranks."""
    from ..mpi.plumbing import ranks_in, world

    worlds = ranks_in(comm, world())
    more = f" (and {count - len(named)} more)" if count > len(named) else ""
    who = (f"rank {named[0]} of the group (global rank {worlds[named[0]]})" if count == 1
           else f"ranks {_names(named)}{more} of the group (global ranks "
                f"{_names([worlds[r] for r in named])})")
    told = (f", as rank {leader}, the communicator's first, found" if leader is not None
            else "")
    return (f"{what}: {who} never came within {timeout} s{told}. No NCCL communicator "
            f"was made; the group stays usable for CPU arrays")
