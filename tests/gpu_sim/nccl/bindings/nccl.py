"""Simulated ``nccl.bindings.nccl`` (NVIDIA's nccl4py, low level), over the simulated
``cupy.cuda.nccl``: the calls hpccomm's nccl4py binding makes, with NCCL's nonblocking
behaviour. A nonblocking creation or split returns at once and its communicator reports
``ncclInProgress`` (``comm_get_async_error``) until every rank has come to it; then the
query connects it. ``cupy.cuda.nccl.STALL`` (``"init:R"`` or ``"split:R"``, read at each
call) keeps world rank R from ever coming, as when NCCL's bootstrap cannot connect.
``made`` counts creations by kind (``"nonblocking"``, ``"scalable"``: how many ids), for
tests (``SIM_NCCL4PY_REPORT=1``: printed at exit)."""
import atexit
import os

import numpy as np
from mpi4py import MPI

from cupy.cuda import nccl as sim

SUCCESS, IN_PROGRESS = 0, 7
made = {"nonblocking": 0, "blocking": 0, "scalable_ids": [], "split": 0, "shrink": []}
if os.environ.get("SIM_NCCL4PY_REPORT"):  # for a test that runs others as a job
    atexit.register(lambda: print(f"simulated nccl4py: {made['nonblocking']} nonblocking, "
                                  f"{len(made['scalable_ids'])} from several roots",
                                  flush=True))
unique_id_dtype = np.dtype([("internal", "i1", (128,))])


class Result:
    Success, InProgress = SUCCESS, IN_PROGRESS


class NCCLError(RuntimeError):
    pass


class Config:
    def __init__(self):
        self.blocking = -2 ** 31  # NCCL_CONFIG_UNDEF_INT


class UniqueId(bytearray):
    """128 bytes, readable as a buffer (as the real one)."""

    @classmethod
    def from_buffer(cls, buffer):
        return cls(bytes(buffer))


class Comm:
    """A communicator: the simulated CuPy one once connected, ``pending`` until then."""

    def __init__(self, name=""):
        self.sim, self.name, self.splits = None, name, 0
        self.pending = None  # () -> True once connected
        self.aborted = False
        self.came = None  # (rendezvous, rank there) until connected

    def __bool__(self):
        return self.sim is not None or self.pending is not None


def _stalls(step):
    return sim.STALL == f"{step}:{MPI.COMM_WORLD.Get_rank()}"


def get_version():
    return sim.VERSION


def get_unique_id():
    return UniqueId(sim.get_unique_id())


def get_error_string(result):
    return f"simulated NCCL result {result}"


def get_last_error(comm):
    return ""


def _blocking(comm, config, counted=True):
    """A blocking creation or split: poll here until it is done. ``counted``: a
    creation from unique ids, counted in ``made`` by kind."""
    if config.blocking != 0:
        deadline = sim.time.monotonic() + sim.TIMEOUT_S
        while comm_get_async_error(comm) == IN_PROGRESS:
            if sim.time.monotonic() > deadline:
                raise NCCLError("simulated NCCL creation: peers did not arrive")
            sim.time.sleep(0.001)
        made["blocking"] += counted
    else:
        made["nonblocking"] += counted
    return comm


def _created(ndev, key, rank, step="init"):
    comm = Comm(key)
    if _stalls(step):
        comm.pending = lambda: False
        return comm
    where = sim.arrive(key, rank)
    comm.came = where, rank

    def connect():
        if not sim.arrived(where, ndev):
            return False
        comm.came = None
        comm.sim = sim.NcclCommunicator.__new__(sim.NcclCommunicator)
        comm.sim._connect(where, ndev, bytes.fromhex(key).ljust(128, b"\0"), rank)
        return True
    comm.pending = connect
    return comm


def comm_init_rank_config(nranks, comm_id, rank, config):
    return _blocking(_created(nranks, bytes(memoryview(comm_id))[:12].hex(), rank), config)


def comm_init_rank_scalable(nranks, myrank, n_id, comm_ids, config):
    ids = np.asarray(comm_ids).view(np.uint8).reshape(n_id, 128)
    made["scalable_ids"].append([bytes(i[:12]).hex() for i in ids])
    return _blocking(_created(nranks, bytes(ids[0][:12]).hex(), myrank), config)


def comm_get_async_error(comm):
    if comm.aborted:
        return 5  # ncclInvalidUsage
    if comm.pending is not None:
        if not comm.pending():
            return IN_PROGRESS
        comm.pending = None
    return SUCCESS


def comm_split(comm, color, key, config):
    """Every rank of ``comm`` comes to a rendezvous of its own (by the parent's name and
    the split's number), then splits the parent's MPI communicator."""
    comm.splits += 1
    name = f"{comm.name}s{comm.splits}"
    child = Comm(f"{name}c{color}")
    if _stalls("split"):
        comm.pending = child.pending = lambda: False
        return child if color >= 0 else Comm()
    where = sim.arrive(name, comm.sim.rank)
    comm.came = where, comm.sim.rank

    def connect():
        if child.sim is not None or child.name == "done":
            return True
        if not sim.arrived(where, comm.sim.ndev):
            return False
        comm.came = None
        part = comm.sim.comm.Split(MPI.UNDEFINED if color < 0 else color, key)
        sim.leave(where, comm.sim.rank)
        if part != MPI.COMM_NULL:
            child.sim = sim.NcclCommunicator._from_split(part, part.Get_rank(),
                                                         part.Get_size())
            made["split"] += 1
        else:
            child.name = "done"
        return True
    comm.pending = child.pending = connect
    _blocking(child if color >= 0 else comm, config, counted=False)
    return child if color >= 0 else Comm()


def comm_shrink(comm, exclude_ranks_list, exclude_ranks_count, config, shrink_flags):
    """The ranks of ``comm`` but the excluded come to a rendezvous of their own, then make
    their MPI communicator from their group alone (a dead rank among the excluded takes
    no part). ``made["shrink"]`` records the flags of each."""
    excluded = sorted(int(r) for r in exclude_ranks_list[:exclude_ranks_count])
    parent = comm.sim
    kept = [r for r in range(parent.ndev) if r not in excluded]
    name = f"{comm.name}x{'-'.join(map(str, excluded))}"
    child = Comm(name)
    where = sim.arrive(name, kept.index(parent.rank))
    child.came = where, kept.index(parent.rank)
    world_ranks = parent.comm.Get_group().Translate_ranks(
        kept, MPI.COMM_WORLD.Get_group())

    def connect():
        if not sim.arrived(where, len(kept)):
            return False
        child.came = None
        group = MPI.COMM_WORLD.Get_group().Incl(list(world_ranks))
        from hpccomm.mpi_level import helper_lock

        with helper_lock:
            mpi = MPI.Intracomm.Create_from_group(group, "sim-nccl-" + name[-40:])
        group.Free()
        sim.leave(where, kept.index(parent.rank))
        child.sim = sim.NcclCommunicator._from_split(mpi, mpi.Get_rank(), mpi.Get_size())
        return True
    child.pending = connect
    made["shrink"].append(shrink_flags)
    return _blocking(child, config, counted=False)


def comm_abort(comm):
    comm.aborted, comm.pending = True, None
    if comm.came is not None:  # an unfinished rendezvous: leave it
        where, rank = comm.came
        for path, clear in ((os.path.join(where, str(rank)), os.remove), (where, os.rmdir)):
            try:
                clear(path)
            except OSError:  # another rank's file is still there
                pass
    if comm.sim is not None:
        comm.sim.abort()


def comm_finalize(comm):
    pass


def comm_destroy(comm):
    if comm.sim is not None:
        comm.sim.destroy()


def comm_user_rank(comm):
    return comm.sim.rank


def comm_count(comm):
    return comm.sim.ndev


def _ready(comm):
    if comm_get_async_error(comm) != SUCCESS:
        raise NCCLError("simulated NCCL: a call on a communicator that is not ready "
                        "(NCCL's rule: nothing while ncclInProgress)")
    return comm.sim


def group_start():
    sim.groupStart()


def group_end():
    sim.groupEnd()


def all_reduce(send, recv, count, datatype, op, comm, stream):
    _ready(comm).allReduce(send, recv, count, datatype, op, stream)


def reduce(send, recv, count, datatype, op, root, comm, stream):
    _ready(comm).reduce(send, recv, count, datatype, op, root, stream)


def broadcast(send, recv, count, datatype, root, comm, stream):
    _ready(comm).broadcast(send, recv, count, datatype, root, stream)


def reduce_scatter(send, recv, count, datatype, op, comm, stream):
    _ready(comm).reduceScatter(send, recv, count, datatype, op, stream)


def all_gather(send, recv, count, datatype, comm, stream):
    _ready(comm).allGather(send, recv, count, datatype, stream)


def send(buf, count, datatype, peer, comm, stream):
    _ready(comm).send(buf, count, datatype, peer, stream)


def recv(buf, count, datatype, peer, comm, stream):
    _ready(comm).recv(buf, count, datatype, peer, stream)
