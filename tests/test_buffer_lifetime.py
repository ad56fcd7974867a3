"""Buffers handed to MPI live until their operation completes, whatever the caller keeps.

MPI may read a send buffer or write a receive buffer at any time until the request is
complete; some MPI libraries (Open MPI's nonblocking collectives) read the send buffer
while the operation progresses, long after the call returned. These tests start
operations on temporary inputs, drop the only reference, let the garbage collector run
and fill the freed memory with other data before waiting: a backend that does not keep
its buffers alive sends that other data.
"""
import gc
import time
import weakref

import numpy as np
import pytest

from hpccomm import work as work_module
from hpccomm.errors import DistTimeoutError

N = 4096  # elements per rank: 32 KiB of float64, served by malloc and reused at once


def _reuse_freed_memory(*nbytes):
    """Allocate and fill arrays the size of the freed inputs (the allocator hands the
    freed blocks back)."""
    gc.collect()
    return [np.full(n // 8, -7.0) for n in nbytes for _ in range(8)]


def _late_start(rank):
    """Rank 1 starts late, so that the others' operations are still in progress (and
    still reading their inputs) after their inputs were freed."""
    if rank == 1:
        time.sleep(0.2)


def _reduce_scatter(dist, rank, size):
    out = np.empty(N)
    work = dist.reduce_scatter_tensor(out, np.full(N * size, rank + 1.0), async_op=True)
    return work, out, np.full(N, size * (size + 1) / 2)


def _all_gather(dist, rank, size):
    out = np.empty(N * size)
    work = dist.all_gather_into_tensor(out, np.full(N, rank + 1.0), async_op=True)
    return work, out, np.repeat(np.arange(1.0, size + 1), N)


def _all_to_all(dist, rank, size):
    out = np.empty(N * size)
    work = dist.all_to_all_single(out, np.full(N * size, rank + 1.0), async_op=True)
    return work, out, np.repeat(np.arange(1.0, size + 1), N)


def _all_reduce_bfloat16(dist, rank, size):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    out = np.full(N, rank + 1.0).astype(ml_dtypes.bfloat16)  # reduced in a float32 copy
    work = dist.all_reduce(out, async_op=True)
    return work, out, np.full(N, size * (size + 1) / 2)


def _send_recv(dist, rank, size):
    out = np.full(N, float(rank))
    if rank == 0:
        work = dist.isend(np.full(N, 42.0), dst=1)
        return work, out, np.full(N, 0.0)
    if rank == 1:
        return dist.irecv(out, src=0), out, np.full(N, 42.0)
    return None, out, out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("start", [_reduce_scatter, _all_gather, _all_to_all,
                                   _all_reduce_bfloat16, _send_recv],
                         ids=["reduce_scatter", "all_gather", "all_to_all",
                              "all_reduce_bfloat16", "send_recv"])
def test_freed_temporary_input_is_still_sent(dist, rank, size, start):
    _late_start(rank)
    work, out, expected = start(dist, rank, size)
    junk = _reuse_freed_memory(8 * N * size, 8 * N, 4 * N * size)
    if work is not None:
        work.wait()
    assert np.array_equal(np.asarray(out, dtype=np.float64), expected), (
        f"rank {rank}: got {np.unique(np.asarray(out, dtype=np.float64))[:8]}")
    assert all((j == -7.0).all() for j in junk)  # MPI wrote nothing into freed memory
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_staged_device_arrays_keep_their_host_copies(dist, rank, size):
    """The host staging copies of (simulated) device arrays live until completion."""
    from gpu_cases import install_sim, uninstall_sim

    cupy = install_sim()
    try:
        group = dist.new_group(backend="mpi")
        _late_start(rank)
        out = cupy.zeros(N, dtype=np.float32)
        send = cupy.asarray(np.full(N * size, rank + 1.0, dtype=np.float32))
        work = dist.reduce_scatter_tensor(out, send, group=group, async_op=True)
        del send  # the device array and its host copy now belong to the operation
        _reuse_freed_memory(4 * N * size, 4 * N)
        work.wait()
        assert (cupy.asnumpy(out) == size * (size + 1) / 2).all()
        dist.destroy_process_group(group)
    finally:
        uninstall_sim()


# -- operations left unfinished keep their buffers -------------------------------------------
class _Pending:
    """A test that reports completion only when told to."""

    def __init__(self):
        self.done = False

    def __call__(self):
        return self.done


def _held(buffers):
    return [weakref.ref(b) for b in buffers]


def test_a_work_dropped_unfinished_keeps_its_buffers():
    test, buffer = _Pending(), np.ones(4)
    refs = _held([buffer])
    work = work_module.Work(test, None, (buffer,))
    del work, buffer
    gc.collect()
    assert refs[0]() is not None  # MPI may still write into it
    test.done = True
    for _ in range(work_module._REAP_AT):  # enough abandoned operations to reap
        work_module.abandon(lambda: True, (np.zeros(1),))
    gc.collect()
    assert refs[0]() is None  # released once its operation is over


def test_a_timed_out_work_keeps_its_buffers():
    test, buffer = _Pending(), np.ones(4)
    refs = _held([buffer])
    work = work_module.Work(test, None, (buffer,))
    work.timeout = 0.01
    with pytest.raises(DistTimeoutError):
        work.wait()
    del work, buffer
    gc.collect()
    assert refs[0]() is not None
    test.done = True


def test_a_completed_work_releases_its_buffers():
    buffer = np.ones(4)
    refs = _held([buffer])
    work = work_module.Work(lambda: True, None, (buffer,))
    work.wait()
    del work, buffer
    gc.collect()
    assert refs[0]() is None
