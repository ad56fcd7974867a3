"""The C kernel of two-rank shared-memory sums (hpccomm.backends.shm.pair).

Each test makes a group of world ranks 0 and 1 that sends every all-reduce through shared
memory with small ring slots (many chunks, the ring wrapping around), so it runs at any
world size of two or more. Checked: exact integer sums (wrapping), both forms of an
operation (the direct form a synchronous torch sum takes, the state machine of every
other call) mixed across ranks, an operation handed from the direct form back to the
state machine when the peer is late, a mismatch between the ranks raising instead of
hanging, and ranks that do not all have the kernel agreeing to do without it.
"""
import os
import sys
import time

import numpy as np
import pytest

from helpers import run_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASE = os.path.join(ROOT, "tests", "scripts", "shm_kernel_case.py")


def _kernel():
    from hpccomm.backends.shm import pair

    if not pair.available():
        pytest.skip("hpccomm's C helper backends/shm/_pair.c is not built "
                    "(or HPCCOMM_SHM_KERNEL=0)")


@pytest.fixture(scope="module")
def pair(world):
    """The two-rank shared-memory group of world ranks 0 and 1 (None on other ranks)."""
    import hpccomm as dist

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HPCCOMM_SHM_MIN_BYTES", "1")
        patch.setenv("HPCCOMM_SHM_CHUNK", "1024")
        group = dist.new_group([0, 1], timeout=20)
    yield group if dist.get_rank() < 2 else None
    dist.destroy_process_group(group)


def _datatype(group, dtype):
    from hpccomm.backends.shm.communicator import SharedMemoryCommunicator

    cpu = group.cpu
    if not isinstance(cpu, SharedMemoryCommunicator) or cpu.pair_kernel is None:
        pytest.skip("ranks 0 and 1 do not share a node with shared memory here")
    if np.dtype(dtype) not in cpu.direct_types:
        pytest.skip(f"{np.dtype(dtype)} has no direct form with this MPI library (its own "
                    f"8- and 16-bit sums saturate, so hpccomm sums them in int64)")
    return cpu.direct_types[np.dtype(dtype)]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [1, 7, 1001, 4099, 100003])
def test_integer_sums_wrap_exactly_at_odd_sizes(dist, pair, rank, count):
    _kernel()
    if pair is None:
        return
    _datatype(pair, np.int32)
    rng = np.random.default_rng(count)
    inputs = rng.integers(-2**31, 2**31, (2, count), dtype=np.int64)
    for dtype in (np.int32, np.uint8):
        mine = inputs[rank].astype(dtype)
        expect = inputs[0].astype(dtype) + inputs[1].astype(dtype)  # wraps, as MPI's sum
        before = pair.cpu.ops
        dist.all_reduce(mine, group=pair)
        assert pair.cpu.ops == before + 1  # through shared memory
        assert np.array_equal(mine, expect), dtype


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", ["float32", "float64", "complex64", "int64", "uint16"])
def test_direct_form_and_state_machine_meet_in_one_operation(dist, pair, rank, name):
    """Rank 0 sums in the direct form, rank 1 with an async call of the state machine."""
    from hpccomm import _call

    _kernel()
    if pair is None:
        return
    datatype = _datatype(pair, name)
    count = 50001
    base = np.arange(count, dtype=np.float64) % 97
    mine = (base * (rank + 1)).astype(name)
    if name.startswith("complex"):
        mine = mine + 1j * (rank + 2)
    want = (base * 3).astype(name)
    if name.startswith("complex"):
        want = want + 5j
    if rank == 0:
        assert _call.sum_in_place(pair, "all_reduce", mine.ctypes.data, count,
                                  mine.nbytes, datatype, None, mine, mine)
    else:
        dist.all_reduce(mine, group=pair, async_op=True).wait()
    assert np.array_equal(mine, want)


@pytest.mark.mpi(min_size=2)
def test_a_late_peer_hands_the_direct_form_to_the_state_machine(dist, pair, rank):
    from hpccomm.backends.shm import pair as shm_pair

    _kernel()
    if pair is None:
        return
    datatype = _datatype(pair, np.float32)
    arr = np.full(300000, rank + 1.0, np.float32)
    if rank == 1:
        time.sleep(50 * shm_pair.SLICE_S)  # far past rank 0's spin
    started = pair.cpu.sum_in_place_at(arr.ctypes.data, arr.size, datatype, None)
    if rank == 0:
        assert started is not None, "rank 0 should have handed the operation back"
    if started is not None:
        test, _, keep = started
        deadline = time.monotonic() + 20
        while not test():
            assert time.monotonic() < deadline, "the handed-back operation never finished"
        assert keep is not None
    assert (arr == 3.0).all()
    dist.all_reduce(arr, group=pair)  # the group goes on
    assert (arr == 6.0).all()


@pytest.mark.mpi(min_size=2)
def test_is_completed_never_waits_in_the_kernel_but_wait_does(dist, pair, rank):
    from hpccomm.backends.shm.algorithms import AllReduce

    _kernel()
    if pair is None:
        return
    _datatype(pair, np.float64)
    arr = np.full(100000, rank + 1.0)
    calls = []
    original = AllReduce.wait_pair

    def recorded(op, slice_s, yield_every):
        calls.append(slice_s)
        return original(op, slice_s, yield_every)
    AllReduce.wait_pair = recorded
    try:
        if rank == 1:
            time.sleep(0.2)
        work = dist.all_reduce(arr, group=pair, async_op=True)
        if rank == 0:
            assert not any(work.is_completed() for _ in range(20))  # the peer sleeps
            assert calls == [], "is_completed waited for the peer"
        work.wait()
        if rank == 0:
            assert calls, "the wait did not wait in the kernel"
    finally:
        AllReduce.wait_pair = original
    assert (arr == 3.0).all()


@pytest.mark.mpi(min_size=2)
def test_a_mismatch_in_the_direct_form_raises_instead_of_hanging(dist, rank, size):
    from hpccomm import _call

    _kernel()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HPCCOMM_SHM_MIN_BYTES", "1")
        group = dist.new_group([0, 1], timeout=5)
    try:
        if rank < 2:
            dtype = np.float32 if rank == 0 else np.float64
            datatype = _datatype(group, dtype)
            arr = np.ones(20000, dtype)
            start = time.monotonic()
            with pytest.raises(dist.DistError) as info:
                _call.sum_in_place(group, "all_reduce", arr.ctypes.data, arr.size, arr.nbytes,
                                   datatype, None, arr, arr)
            assert time.monotonic() - start < 5
            text = str(info.value)
            assert type(info.value) in (dist.DistDesyncError, dist.DistTimeoutError), text
            assert "another operation, dtype or size" in text or "timed out" in text, text
            assert f"rank {rank}" in text, text
    finally:
        dist.destroy_process_group(group)


def test_ranks_without_the_kernel_everywhere_keep_the_numpy_steps():
    """HPCCOMM_SHM_KERNEL=0 on one rank only: the group runs the NumPy steps on both."""
    done = run_job([sys.executable, CASE], 2, limit=120, clean=(
        "HPCCOMM_DISTRIBUTED_DEBUG", "HPCCOMM_TRACE_DIR", "HPCCOMM_SHM", "HPCCOMM_SHM_KERNEL"))
    output = done.output
    lines = sorted(line for line in output.splitlines() if line.startswith("RESULT "))
    if any("no-kernel-built" in line for line in lines):
        pytest.skip("hpccomm's C helper backends/shm/_pair.c is not built")
    assert done.code == 0, output
    assert lines == ["RESULT rank=0 kernel=False sum=ok",
                     "RESULT rank=1 kernel=False sum=ok"], output
