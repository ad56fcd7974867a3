"""The direct forms of the C helper ``_mpi_direct``, a blocking in-place SUM all-reduce
and a blocking send or receive: where they apply, their MPI errors, and the values they
compute and move on NumPy buffers."""
import numpy as np
import pytest
from mpi4py import MPI

from hpccomm.backends.mpi import direct as mpi_direct

pytestmark = [pytest.mark.mpi(min_size=1),
              pytest.mark.skipif(not mpi_direct.available(),
                                 reason="the C helper _mpi_direct is not built (no C "
                                        "compiler at install) or HPCCOMM_MPI_DIRECT=0")]


@pytest.fixture(autouse=True)
def small_messages_through_mpi(monkeypatch):
    """The groups made here send small messages through MPI, where the direct form is
    MPI's (on one node they would take the shared-memory small channel)."""
    monkeypatch.setenv("HPCCOMM_SHM_SMALL", "0")


def test_its_types_are_the_unstaged_sums(dist):
    cpu = dist.group.WORLD.cpu
    types = cpu.direct_types
    assert np.dtype(np.float32) in types and np.dtype(np.int64) in types
    # staged in float32 (rounding like torch) or summed logically: never direct
    assert np.dtype(np.float16) not in types and np.dtype(bool) not in types


def test_it_stops_where_shared_memory_or_a_gate_starts(dist, size):
    from hpccomm.backends.shm.communicator import SharedMemoryCommunicator

    cpu = dist.group.WORLD.cpu
    assert 0 < cpu.direct_below <= 2 ** 31 - 1
    gate = cpu.gated_from.get("Iallreduce", float("inf"))
    if isinstance(cpu, SharedMemoryCommunicator) and cpu.kernel_types:
        assert cpu.mpi_direct_below <= gate  # it sends sizes past a gate the general way
    else:
        if isinstance(cpu, SharedMemoryCommunicator):
            assert cpu.direct_below <= cpu.min_reduce
        assert cpu.direct_below <= gate


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_sums_every_rank_in_place(dist, rank, size, dtype):
    pg = dist.new_group(list(range(size)))
    x = (np.arange(10) % 4 + rank).astype(dtype)
    if x.dtype not in pg.cpu.direct_types:  # Open MPI: its 8- and 16-bit sums saturate
        dist.destroy_process_group(pg)
        from hpccomm.backends.mpi import communicator as mpi
        assert mpi._SATURATING_SUMS and x.dtype.itemsize <= 2, x.dtype
        pytest.skip(f"{x.dtype} has no direct form with this MPI library (its own 8- and "
                    f"16-bit sums saturate, so hpccomm sums them in int64)")
    datatype = pg.cpu.direct_types[x.dtype]
    assert pg.cpu.sum_in_place_at(x.ctypes.data, x.size, datatype, 1.0) is None
    expected = (np.arange(10) % 4 * size + sum(range(size))).astype(dtype)
    np.testing.assert_array_equal(x, expected)
    dist.destroy_process_group(pg)


def test_an_mpi_error_names_the_operation_rank_and_group(dist, rank, size):
    """The helper reports an MPI error code as RuntimeError(code) (invalid handles crash
    MPI libraries built without argument checks, so the failure is injected here)."""
    from hpccomm import _call
    from hpccomm.errors import DistBackendError

    pg = dist.new_group(list(range(size)))
    cpu = pg.cpu

    def failing(*args):
        raise RuntimeError(MPI.ERR_TYPE)
    real, cpu._direct_sum = cpu._direct_sum, failing
    x = np.ones(4, np.float32)
    with pytest.raises(DistBackendError) as caught:
        _call.sum_in_place(pg, "all_reduce", x.ctypes.data, x.size, x.nbytes,
                           cpu.direct_types[x.dtype], None, x, x)
    message = str(caught.value)
    assert f"all_reduce on rank {rank}/{size} of group '{pg.group_name}'" in message
    assert isinstance(caught.value.__cause__, MPI.Exception)
    assert caught.value.__cause__.Get_error_code() == MPI.ERR_TYPE
    cpu._direct_sum = real  # nothing was started: the group still sums, directly too
    assert _call.sum_in_place(pg, "all_reduce", x.ctypes.data, x.size, x.nbytes,
                              cpu.direct_types[x.dtype], None, x, x)
    np.testing.assert_array_equal(x, np.full(4, size, np.float32))
    dist.destroy_process_group(pg)


@pytest.mark.parametrize("shared", [True, False], ids=["ranks share cores", "own cores"])
def test_its_spin_yields_the_core_only_where_ranks_share_cores(dist, rank, size, shared):
    """Where ranks outnumber cores a spin that never yields keeps the awaited rank off
    its core for whole time slices (milliseconds per sum); elsewhere yields only slow
    MPI's progress. The C spin gets the same policy as the general wait."""
    from hpccomm import work

    pg = dist.new_group(list(range(size)))
    cpu = pg.cpu
    passed = []
    real = cpu._direct_sum

    def spy(*args):
        passed.append(args[-1])
        return real(*args)
    saved = work._polls_per_check == work.POLLS_SHARED
    work.set_oversubscribed(shared)
    cpu._direct_sum = spy
    try:
        x = np.full(1000, rank + 1.0)
        for _ in range(20):  # long enough to reach the yield on some rank
            x[:] = rank + 1.0
            assert cpu.sum_in_place_at(x.ctypes.data, x.size, cpu.direct_types[x.dtype],
                                       5.0) is None
    finally:
        cpu._direct_sum = real
        work.set_oversubscribed(saved)
    assert passed == [work.POLLS_SHARED if shared else 0] * 20
    np.testing.assert_array_equal(x, np.full(1000, size * (size + 1) / 2))
    dist.destroy_process_group(pg)


def test_waits_on_mpi_requests_spin_in_c(dist, rank, size, monkeypatch):
    """An operation not complete at its first test is waited for by the C spin (the GIL
    released once per wait, not per test), and completes with the right values: rank 0
    joins late, so the others' waits must spin."""
    import time

    from hpccomm import work
    from hpccomm.backends.mpi import communicator as mpi_backend

    spun = []
    real = work.spin_wait

    def spy(test, seconds):
        done = real(test, seconds)
        spun.append(done)
        return done
    monkeypatch.setattr(work, "spin_wait", spy)
    pg = dist.new_group(list(range(size)))
    x = np.full(64, float(rank + 1))  # small: no gate of a large-message path either
    if rank == 0:
        time.sleep(0.2)
    w = dist.all_reduce(x, op=dist.ReduceOp.MAX, group=pg, async_op=True)
    w.wait()
    np.testing.assert_array_equal(x, np.full(64, float(size)))
    dist.destroy_process_group(pg)
    if rank != 0 and size > 1:
        assert spun and spun[-1] is True, "the wait did not go through the C spin"
    assert mpi_backend._spin_wait(lambda: True, 1.0) is None  # not a request: Python loop


def test_an_mpi_error_in_the_spin_fails_the_work(dist, rank, size, monkeypatch):
    """An MPI error code from the C spin becomes the MPI exception of the failed Work,
    whose error names the operation, rank and group. Rank 0 joins late, so the others'
    waits reach the spin (where the error is injected); their requests, abandoned, still
    complete in MPI once rank 0 has joined."""
    import time

    from hpccomm.backends.mpi import communicator as mpi_backend
    from hpccomm.errors import DistBackendError

    def failing(address, seconds, yield_every):
        raise RuntimeError(MPI.ERR_REQUEST)
    pg = dist.new_group(list(range(size)))
    x = np.ones(8)
    if rank == 0:
        time.sleep(0.2)
        dist.all_reduce(x, group=pg)
    else:
        monkeypatch.setattr(mpi_backend, "_spin_test", failing)
        w = dist.all_reduce(x, group=pg, async_op=True)
        with pytest.raises(DistBackendError) as caught:
            w.wait()
        monkeypatch.undo()
        message = str(caught.value)
        assert message.startswith("all_reduce") and pg.group_name in message, message
        assert f"on rank {rank}/{size}" in message, message
        assert isinstance(caught.value.__cause__, MPI.Exception)
        assert caught.value.__cause__.Get_error_code() == MPI.ERR_REQUEST
    dist.barrier()
    dist.destroy_process_group(pg)


# -- blocking send and receive ---------------------------------------------------------------

def _counting_transfers(monkeypatch):
    """Count the blocking sends and receives that the direct form took."""
    from hpccomm import _call
    from helpers import record_returns

    return record_returns(monkeypatch, (_call, "transfer"), _call.transfer)


@pytest.mark.mpi(min_size=2)
def test_blocking_send_and_recv_of_contiguous_arrays_are_direct(dist, rank, size, monkeypatch):
    taken = _counting_transfers(monkeypatch)
    if rank == 0:
        dist.send(np.arange(6, dtype=np.float32), dst=1, tag=4)
    elif rank == 1:
        buf = np.zeros(6, np.float32)
        assert dist.recv(buf, src=0, tag=4) == 0
        np.testing.assert_array_equal(buf, np.arange(6))
    assert taken == ([True] if rank < 2 else [])
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_the_direct_form_takes_every_dtype_by_its_buffer_format(dist, rank, size, monkeypatch):
    """The direct form finds an array's MPI datatype from its buffer's format: every
    NumPy dtype MPI has a type for, under each of its spellings (``l`` and ``q`` are both
    int64 on Linux), goes direct and arrives bit for bit; ml_dtypes' bfloat16 (no buffer
    format) takes the general path and arrives too, and a byte-swapped array meets the
    general path's refusal, not a wrong datatype."""
    import ml_dtypes

    taken = _counting_transfers(monkeypatch)
    codes = "?bBhHiIlLqQefdFD"
    for code in codes:
        sent = (np.arange(5) % 2 if code == "?" else np.arange(5)).astype(code)
        if rank == 0:
            dist.send(sent, dst=1, tag=3)
        elif rank == 1:
            buf = np.zeros(5, code)
            dist.recv(buf, src=0, tag=3)
            assert buf.tobytes() == sent.tobytes(), code
    assert taken == ([True] * len(codes) if rank < 2 else []), taken
    odd = np.arange(3).astype(ml_dtypes.bfloat16)
    if rank == 0:
        dist.send(odd, dst=1)
    elif rank == 1:
        buf = np.zeros(3, odd.dtype)
        dist.recv(buf, src=0)
        assert buf.tobytes() == odd.tobytes()
    if rank < 2:
        with pytest.raises(dist.DistValueError, match=">i4, which cannot be communicated"):
            dist.send(np.arange(3, dtype=">i4"), dst=1 - rank)
    dist.barrier()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.complex128, np.int8,
                                   np.uint16, np.int64, np.bool_])
@pytest.mark.parametrize("layout", ["contiguous", "scalar", "empty", "fortran", "strided"])
def test_sends_arrive_whole_whichever_form_takes_them(dist, rank, size, dtype, layout):
    """The direct form takes C-contiguous arrays; the general path sends the others, in
    logical order, and refuses to receive into them (as torch does)."""
    full = (np.arange(24).reshape(4, 6) % 3).astype(dtype)
    make = {"contiguous": lambda a: a, "scalar": lambda a: np.array(a[1, 1]),
            "empty": lambda a: a[:0], "fortran": np.asfortranarray,
            "strided": lambda a: a[:, ::2]}[layout]
    sent = make(full)
    if rank == 0:
        dist.send(sent, dst=1)
    elif rank == 1:
        buf = np.zeros(sent.shape, dtype)
        dist.recv(buf, src=0)
        np.testing.assert_array_equal(buf, sent)
        if not sent.flags.c_contiguous:
            with pytest.raises(dist.DistValueError, match="C-contiguous"):
                dist.recv(make(np.zeros_like(full)), src=0)
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_a_read_only_receive_buffer_is_refused_by_name(dist, rank, size):
    if rank == 1:
        buf = np.zeros(3)
        buf.flags.writeable = False
        with pytest.raises(dist.DistValueError, match="recv.*read-only"):
            dist.recv(buf, src=0)
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_a_receive_still_running_after_the_spin_is_waited_for(dist, rank, size):
    """A message sent after the C spin's slice arrives through the general wait."""
    import time

    if rank == 0:
        time.sleep(3 * mpi_direct.SLICE_S)
        dist.send(np.full(3, 7.0), dst=1, tag=9)
    elif rank == 1:
        buf = np.zeros(3)
        t0 = time.monotonic()
        dist.recv(buf, src=0, tag=9)
        assert time.monotonic() - t0 >= 2 * mpi_direct.SLICE_S
        np.testing.assert_array_equal(buf, np.full(3, 7.0))
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_a_receive_nobody_sends_times_out_naming_it(dist, rank, size):
    pg = dist.new_group(list(range(size)), timeout=0.3)
    if rank == 1:
        with pytest.raises(dist.DistTimeoutError, match=r"recv.*timed out"):
            dist.recv(np.zeros(2), src=0, group=pg, tag=11)
    dist.barrier()
    dist.destroy_process_group(pg)


@pytest.mark.mpi(min_size=2)
def test_an_mpi_error_of_a_direct_send_names_it(dist, rank, size):
    from hpccomm.errors import DistBackendError

    pg = dist.new_group(list(range(size)))
    cpu = pg.cpu

    def failing(*args):
        raise RuntimeError(MPI.ERR_TAG)
    real, cpu.transfer_now = cpu.transfer_now, failing
    with pytest.raises(DistBackendError) as caught:
        dist.send(np.ones(2), dst=(rank + 1) % size, group=pg)
    assert f"send on rank {rank}/{size} of group '{pg.group_name}'" in str(caught.value)
    assert caught.value.__cause__.Get_error_code() == MPI.ERR_TAG
    cpu.transfer_now = real
    dist.destroy_process_group(pg)
