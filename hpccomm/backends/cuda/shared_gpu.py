"""Two ranks of one NCCL communicator on one GPU: named before NCCL is asked.

NCCL refuses a communicator in which two ranks use the same device, with only
``NCCL_ERROR_INVALID_USAGE`` to say so. Before a communicator is created, its ranks
exchange where they run (host name, world rank, device index and the device's UUID) over
MPI, under the group's timeout: :func:`check_group` with one allgather on the group's
MPI communicator, :func:`check_pair` with one exchange between the two ranks of a pair
communicator. If two ranks share a device, every one of them raises the same
:class:`~hpccomm.errors.DistBackendError`, which names the ranks, the host, the device
and the ways out.

A rank whose device UUID cannot be read (an old CuPy or driver) still takes part in the
exchange, so nobody waits for it, but is left out of the comparison: then the check
can only be silent, never wrong.
"""
from __future__ import annotations

import socket
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import DistBackendError
from ...types import Tag
from ...work import Work

#: Bytes of one rank's record in the exchange (``world\tdevice\thost\tuuid``, NUL-padded).
RECORD_BYTES = 512
#: The MPI tag of the exchange between the two ranks of a pair communicator.
PAIR_TAG = Tag.NCCL_DEVICE_CHECK

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


def check_group(comm: Any, cp: Any, device: int, timeout: Optional[float]) -> None:
    """Collective over ``comm`` (the group's MPI communicator): raise on every rank if
    two of its ranks are on one GPU. One allgather, bounded by ``timeout``."""
    from ..mpi.plumbing import allgather

    rows = allgather(comm, encode(identity(cp, device)),
                     "NCCL communicator creation (ranks comparing their GPUs)", timeout)
    _raise_if_shared([decode(row) for row in rows], None)


def check_pair(comm: Any, cp: Any, device: int, rank: int, peer: int,
               timeout: Optional[float]) -> None:
    """For a pair communicator of ``rank`` and ``peer`` (ranks of ``comm``): both
    exchange their records and both raise if they share a GPU (bounded by ``timeout``)."""
    mine = encode(identity(cp, device))
    theirs = np.empty_like(mine)
    requests = [comm.Irecv(theirs, source=peer, tag=PAIR_TAG),
                comm.Isend(mine, dest=peer, tag=PAIR_TAG)]
    work = Work(lambda: all(request.Test() for request in requests), None, (mine, theirs))
    work.op, work.timeout = "NCCL pair communicator creation (comparing GPUs)", timeout
    work.wait()
    low, high = sorted((rank, peer))
    records = {rank: decode(mine), peer: decode(theirs)}
    _raise_if_shared([records[low], records[high]], [low, high])
