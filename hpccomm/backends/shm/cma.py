"""Reading a peer's private memory directly: Linux cross-memory attach (CMA).

``process_vm_readv(pid, local, remote)`` copies bytes from another process's address
space into ours in one kernel copy. With it, a rank reads a peer's ordinary NumPy array
where it lies, so a private buffer needs no copy into shared memory first: one copy per
byte instead of two (the single-copy path MPI libraries use for large messages, here
without their rendezvous protocol).

It is called through ``ctypes`` from the C library, so nothing is compiled. The kernel
allows it between processes of one user unless a security policy forbids it (Yama's
``ptrace_scope`` >= 1 restricts it to descendants, containers may drop it), so a group
*probes* it when it is created: every rank reads every peer's probe word, and the group
uses CMA only if all reads succeed on all ranks; otherwise it stages through shared
memory (the measured fallback). ``HPCCOMM_SHM_CMA=0`` skips the probe.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Any, List, Optional

import numpy as np

from ... import settings


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _load() -> Optional[Any]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                     ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong]
    call.restype = ctypes.c_ssize_t
    return call


_readv = _load()


def read(dst: np.ndarray, pid: int, address: int) -> None:
    """Fill the contiguous array ``dst`` with ``dst.nbytes`` bytes at ``address`` in
    process ``pid``; raises ``OSError`` if the kernel refuses or the process is gone."""
    done, total, base = 0, dst.nbytes, dst.ctypes.data
    while done < total:
        local = _IOVec(base + done, total - done)
        remote = _IOVec(address + done, total - done)
        got = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"reading {total - done} bytes of process {pid} "
                                 f"(cross-memory attach): {os.strerror(errno)}")
        done += got


def probe(node: Any) -> Optional[List[int]]:
    """Every rank's pid if every rank of ``node`` can read every other's memory, else
    ``None`` (collective over ``node``)."""
    wanted = settings.SHM_CMA.get()
    word = np.array([0x5EED0000 + node.Get_rank()], dtype=np.int64)
    peers = node.allgather((os.getpid(), word.ctypes.data, wanted and _readv is not None))
    works = all(ok for _, _, ok in peers)
    if works:
        got = np.zeros(1, dtype=np.int64)
        for rank, (pid, address, _) in enumerate(peers):
            if rank == node.Get_rank():
                continue
            try:
                read(got, pid, address)
            except OSError:
                works = False
                break
            if got[0] != 0x5EED0000 + rank:
                works = False
                break
    works = node.allreduce(works, op=_land())
    del word  # kept alive until every rank has read it (the allreduce above)
    return [pid for pid, _, _ in peers] if works else None


def _land() -> Any:
    from mpi4py import MPI

    return MPI.LAND
