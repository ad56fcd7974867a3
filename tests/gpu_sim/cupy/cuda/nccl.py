"""Simulated ``cupy.cuda.nccl``: each NCCL call done with MPI on host memory."""
import ctypes
import os
import tempfile
import time

import numpy as np
from mpi4py import MPI

from . import enqueued

available = True
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
(NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16,
 NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16) = range(10)
try:
    import ml_dtypes
    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    _BF16 = np.dtype(np.uint16)
_DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16,
           np.float32, np.float64, _BF16]
_queue = []
_depth = [0]
calls = []  # names of the NCCL calls made, for tests
#: Communicators made, by how: "bootstrap" (ncclCommInitRank from a unique id) or
#: "split" (ncclCommSplit of a parent), for tests that count bootstraps.
made = {"bootstrap": 0, "split": 0}
#: The NCCL version this simulation reports, at build and at run time; set below 21800
#: (SIM_NCCL_VERSION=21705) to be an NCCL without ncclCommSplit (before 2.18).
VERSION = int(os.environ.get("SIM_NCCL_VERSION", "22105"))
#: Seconds a simulated NCCL call may wait for its peers before it raises (a real NCCL
#: call would stall its stream; hpccomm's watchdog then aborts). Never forever: one
#: broken test must not hang the tests after it.
TIMEOUT_S = float(os.environ.get("SIM_NCCL_TIMEOUT", "60"))


def _wait(request, what):
    """Poll ``request`` until done, or raise after :data:`TIMEOUT_S` seconds."""
    deadline = time.monotonic() + TIMEOUT_S
    while not request.Test():
        if time.monotonic() > deadline:
            raise RuntimeError(f"simulated NCCL {what}: peers did not join within "
                               f"{TIMEOUT_S:g} s")
        os.sched_yield()


#: ``"init:R"`` or ``"split:R"``: world rank R never returns from that creation (as when
#: NCCL's bootstrap cannot connect), for the tests of hpccomm's deadline on it.
STALL = os.environ.get("SIM_NCCL_STALL", "")


def _stall(step):
    """Block for good here if :data:`STALL` names ``step`` on this rank."""
    if STALL == f"{step}:{MPI.COMM_WORLD.Get_rank()}":
        while True:
            time.sleep(1)


def get_version():
    return VERSION


def get_build_version():
    return VERSION


def get_unique_id():
    # as CuPy 13 and later: the 128 bytes of ncclUniqueId (older CuPy: a tuple of chars)
    return os.urandom(128)


def groupStart():
    _depth[0] += 1


def groupEnd():
    _depth[0] -= 1
    if _depth[0] == 0:
        ops, _queue[:] = list(_queue), []
        for op in sorted(ops, key=lambda o: not o[0]):  # sends first (they never block)
            op[1]()


def _view(ptr, count, dtype):
    dtype = np.dtype(_DTYPES[dtype])
    if count == 0:
        return np.empty(0, dtype)
    raw = (ctypes.c_ubyte * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype)


def _bytes(arr):
    """``arr`` as an MPI byte buffer (bfloat16 has no MPI type)."""
    return [arr, arr.nbytes, MPI.BYTE]


def _reduce(parts, op, dtype):
    stack = np.stack(parts)
    if op == NCCL_SUM:
        return stack.sum(axis=0, dtype=dtype)
    if op == NCCL_AVG:
        return (stack.astype(np.float64).sum(axis=0) / len(parts)).astype(dtype)
    if op == NCCL_PROD:
        return np.prod(stack, axis=0, dtype=dtype)
    return (stack.max if op == NCCL_MAX else stack.min)(axis=0)


def arrive(key, rank):
    """Say at the rendezvous ``key`` (a directory) that ``rank`` has come."""
    where = os.path.join(tempfile.gettempdir(), "sim-nccl-" + key)
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, f"{rank}.tmp"), "w") as handle:
        handle.write(str(MPI.COMM_WORLD.Get_rank()))
    os.replace(os.path.join(where, f"{rank}.tmp"), os.path.join(where, str(rank)))
    return where


def arrived(where, ndev):
    """Whether all ``ndev`` ranks have come to the rendezvous ``where``."""
    try:
        return sum(1 for n in os.listdir(where) if n.isdigit()) >= ndev
    except FileNotFoundError:  # the first rank has already cleared it: all came
        return True


def leave(where, rank):
    """Clear the rendezvous ``where`` (its first rank, once all have connected)."""
    if rank == 0:
        for name in os.listdir(where):
            os.remove(os.path.join(where, name))
        os.rmdir(where)


class NcclCommunicator:
    def __init__(self, ndev, commId, rank):
        if not isinstance(commId, bytes) or len(commId) != 128:  # as CuPy's typed argument
            raise TypeError(f"commId must be 128 bytes, got {type(commId).__name__}")
        _stall("init")
        where = arrive(commId[:12].hex(), rank)
        deadline = time.monotonic() + 60
        while not arrived(where, ndev):
            if time.monotonic() > deadline:
                raise RuntimeError("simulated ncclCommInitRank: peers did not arrive")
            time.sleep(0.001)
        self._connect(where, ndev, commId, rank)
        made["bootstrap"] += 1

    def _connect(self, where, ndev, commId, rank):
        """Once every rank has come to ``where``: the communicator, from their group."""
        world = MPI.COMM_WORLD
        ranks = [int(open(os.path.join(where, str(r))).read()) for r in range(ndev)]
        group = world.Get_group().Incl(ranks)
        # from the group alone (MPI 4), as NCCL bootstraps without MPI: a failed rank
        # outside the group (ULFM) does not stop the survivors' communicator. NCCL makes
        # no MPI call here; this stand-in does, so it keeps hpccomm's helper threads (the
        # MPI store's server) out of MPI meanwhile, as hpccomm does around ULFM's calls:
        # under Open MPI, after a failure and beside that thread, it hung in 1 of 6 jobs
        # on a loaded machine, and in none of 20 with the lock.
        from hpccomm.mpi_level import helper_lock

        try:
            with helper_lock:
                self.comm = MPI.Intracomm.Create_from_group(
                    group, "sim-nccl-" + commId[:12].hex())
        except (NotImplementedError, MPI.Exception):  # an MPI before 4: from the world
            self.comm = world.Create_group(group, tag=int.from_bytes(commId[:2], "little")
                                           & 0x3FFF)
        group.Free()
        _wait(self.comm.Ibarrier(), "ncclCommInitRank")
        leave(where, rank)
        self.rank, self.ndev, self.pending = rank, ndev, []
        self.aborted = False

    @classmethod
    def _from_split(cls, comm, rank, ndev):
        self = cls.__new__(cls)
        self.comm, self.rank, self.ndev, self.pending = comm, rank, ndev, []
        self.aborted = False
        made["split"] += 1
        return self

    def commSplit(self, color, key, config=None):
        """As CuPy 14's: collective over this communicator; ``None`` for color -1."""
        calls.append("commSplit")
        if VERSION < 21800:
            raise RuntimeError("ncclCommSplit is not available in this version")
        if self.aborted:
            raise RuntimeError("NCCL error: communicator aborted")
        _stall("split")
        request = self.comm.Ibarrier()  # every rank of the parent calls it, as in NCCL
        _wait(request, "ncclCommSplit")
        sub = self.comm.Split(MPI.UNDEFINED if color < 0 else color, key)
        if sub == MPI.COMM_NULL:
            return None
        return NcclCommunicator._from_split(sub, sub.Get_rank(), sub.Get_size())

    def _run(self, name, fn, stream, is_send=False):
        calls.append(name)
        enqueued(stream, name)
        if self.aborted:
            raise RuntimeError("NCCL error: communicator aborted")
        if _depth[0]:
            _queue.append((is_send, fn))
        else:
            fn()

    def _allgather(self, mine, what):
        """Every rank's ``mine`` (same shape everywhere), in rank order."""
        parts = np.empty((self.ndev,) + mine.shape, mine.dtype)
        _wait(self.comm.Iallgather(_bytes(mine), [parts, mine.nbytes, MPI.BYTE]), what)
        return list(parts)

    def allReduce(self, send, recv, count, dtype, op, stream):
        def run():
            mine = _view(send, count, dtype).copy()
            parts = self._allgather(mine, "allReduce")
            _view(recv, count, dtype)[...] = _reduce(parts, op, mine.dtype)
        self._run("allReduce", run, stream)

    def reduce(self, send, recv, count, dtype, op, root, stream):
        def run():
            mine = _view(send, count, dtype).copy()
            parts = self._allgather(mine, "reduce")
            if self.rank == root:
                _view(recv, count, dtype)[...] = _reduce(parts, op, mine.dtype)
        self._run("reduce", run, stream)

    def broadcast(self, send, recv, count, dtype, root, stream):
        def run():
            data = (_view(send, count, dtype).copy() if self.rank == root else
                    np.empty(count, _DTYPES[dtype]))
            _wait(self.comm.Ibcast(_bytes(data), root=root), "broadcast")
            _view(recv, count, dtype)[...] = data
        self._run("broadcast", run, stream)

    def reduceScatter(self, send, recv, count, dtype, op, stream):
        def run():
            mine = _view(send, count * self.ndev, dtype).copy()
            full = _reduce(self._allgather(mine, "reduceScatter"), op, mine.dtype)
            _view(recv, count, dtype)[...] = full[self.rank * count:(self.rank + 1) * count]
        self._run("reduceScatter", run, stream)

    def allGather(self, send, recv, count, dtype, stream):
        def run():
            parts = self._allgather(_view(send, count, dtype).copy(), "allGather")
            _view(recv, count * self.ndev, dtype)[...] = np.concatenate(parts)
        self._run("allGather", run, stream)

    def send(self, buf, count, dtype, peer, stream):
        def run():
            data = _view(buf, count, dtype).copy()
            self.pending.append((self.comm.Isend(_bytes(data), dest=peer), data))
        self._run("send", run, stream, is_send=True)

    def recv(self, buf, count, dtype, peer, stream):
        def run():
            _wait(self.comm.Irecv(_bytes(_view(buf, count, dtype)), source=peer), "recv")
        self._run("recv", run, stream)

    def check_async_error(self):
        pass

    def abort(self):
        self.aborted = True

    def rank_id(self):
        return self.rank

    def size(self):
        return self.ndev

    def destroy(self):
        for request, _ in self.pending:
            _wait(request, "destroy (pending sends)")
        if self.comm is not None:
            self.comm.Free()
            self.comm = None
