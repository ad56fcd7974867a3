"""The small-collective channel (backends/shm/small.py, _small.c): what takes it, its two
entries (the synchronous call whole in C, and the started operation the general path
waits for) giving the same bytes, operations in flight past its slots and its queue,
ranks that disagree or never come, and its off switch.

Its results for every operation, dtype and reduction against MPI are tested with the
shared-memory ring's, in tests/test_shm.py (its "small channel" groups). Groups here are
made of this node's ranks, as shared memory serves the ranks of one node; at one rank
there is no channel and the tests say so.
"""
import threading
import time

import numpy as np
import pytest

from helpers import environment
from helpers import node_rank, node_size  # noqa: F401 (fixtures: rank and size on the node)

pytestmark = pytest.mark.mpi(min_size=2)


def taken(group):
    """Operations started on the group's channel so far."""
    return group.cpu.small.kernel.started


def test_small_operations_take_the_channel_and_larger_ones_do_not(dist, small_group, rank,
                                                                  size):
    """One element over the channel's size: two pieces on the channel where it goes in
    pieces (3 ranks on, and the channel to a whole slot), MPI (or the ring) elsewhere; the
    broadcast of that many bytes stays off the channel."""
    from hpccomm.backends.base import ALL_REDUCE, BROADCAST

    sizes = small_group.cpu.small.sizes
    limit = sizes[ALL_REDUCE]
    before = taken(small_group)
    x = np.full(limit // 8, float(rank + 1))
    dist.all_reduce(x, group=small_group)
    assert taken(small_group) == before + 1
    assert (x == size * (size + 1) / 2).all()
    y = np.full(limit // 8 + 1, 1.0)
    dist.all_reduce(y, group=small_group)
    pieces = 2 if small_group.cpu.pieces_to else 0
    assert taken(small_group) == before + 1 + pieces and (y == size).all()
    b = np.full(sizes[BROADCAST] // 8 + 1, float(rank))
    dist.broadcast(b, group_src=0, group=small_group)
    assert taken(small_group) == before + 1 + pieces and (b == 0).all()
    dist.barrier(group=small_group)
    assert taken(small_group) == before + 2 + pieces


@pytest.mark.parametrize("async_op", [False, True], ids=["sync (whole in C)", "async"])
def test_both_entries_give_every_operation_the_same_bytes(dist, small_group, rank, size,
                                                          async_op):
    """Synchronous calls run whole in C; async ones are started and waited for the
    general way. Both speak one protocol, so each gives the reference result."""
    def call(fn, *args, **kwargs):
        work = fn(*args, group=small_group, async_op=async_op, **kwargs)
        if async_op:
            work.wait()
        else:
            assert work is None

    before = taken(small_group)
    x = np.arange(6, dtype=np.int64) * (rank + 1)
    call(dist.all_reduce, x, op=dist.ReduceOp.MAX)
    assert (x == np.arange(6) * size).all()
    b = np.full(5, rank, np.float32)
    call(dist.broadcast, b, group_src=size - 1)
    assert (b == size - 1).all()
    out = np.zeros(3 * size, np.int16)
    call(dist.all_gather_into_tensor, out, np.full(3, rank, np.int16))
    assert (out == np.repeat(np.arange(size), 3)).all()
    rs = np.zeros(2, np.float64)
    call(dist.reduce_scatter_tensor, rs, np.arange(2 * size, dtype=np.float64) + rank)
    assert (rs == size * np.arange(2 * rank, 2 * rank + 2) + size * (size - 1) / 2).all()
    a2a = np.zeros(size, np.uint32)
    call(dist.all_to_all_single, a2a, np.arange(size, dtype=np.uint32) + 100 * rank)
    assert (a2a == 100 * np.arange(size) + rank).all()
    call(dist.barrier)
    assert taken(small_group) == before + 6


def test_operations_in_flight_past_the_slots_and_the_queue(dist, small_group, rank, size):
    """More async operations than slots (a rank waits for its peers' reads before it
    reuses one) and than the queue holds (a start then waits for the oldest), finished
    in reverse order, each with its own result."""
    from hpccomm.backends.shm import _small, small

    count = _small.QUEUE + 3 * small.SLOTS
    xs = [np.full(3, float(rank + i)) for i in range(count)]
    works = [dist.all_reduce(x, group=small_group, async_op=True) for x in xs]
    for work in reversed(works):
        work.wait()
    for i, x in enumerate(xs):
        assert (x == sum(r + i for r in range(size))).all(), i
    assert small_group.cpu.small.kernel.pending() == 0


def test_one_rank_sync_another_async_and_one_strided_input(dist, small_group, rank, size):
    """Each rank picks its entry (sync or async, contiguous or not) on its own; they meet
    on the channel all the same."""
    x = np.full(4, rank + 1.0)
    if rank == 0:
        dist.all_reduce(x, group=small_group, async_op=True).wait()
    else:
        dist.all_reduce(x, group=small_group)
    assert (x == size * (size + 1) / 2).all()
    base = np.arange(8, dtype=np.float32) + 10 * rank
    mine = base[::2] if rank == 0 else base[::2].copy()  # a strided view on rank 0 only
    out = np.zeros(4 * size, np.float32)
    dist.all_gather_into_tensor(out, mine, group=small_group)
    assert (out == np.concatenate([np.arange(0, 8, 2) + 10 * r for r in range(size)])).all()


def test_ranks_that_disagree_get_an_error_naming_both_calls(dist, members, rank, size):
    """Every rank checks the peers' headers: another size or another operation is an
    error on the ranks that see it (MPI would hang or mix the data)."""
    from hpccomm.backends.shm import small

    if not small.available():
        pytest.skip("the C helper _small is not built or HPCCOMM_SHM_SMALL=0")
    with environment(HPCCOMM_SHM="1"):
        group = dist.new_group(members, timeout=10)
    try:
        x = np.ones(2 + (rank == 0), np.float64)  # rank 0: 24 bytes, the others 16
        with pytest.raises(dist.DistDesyncError) as info:
            dist.all_reduce(x, group=group)
        message = str(info.value)
        assert type(info.value) is dist.DistDesyncError, type(info.value)  # not internal
        assert "all_reduce" in message and f"({x.size},) float64" in message, message
        assert f"on rank {rank}/{size} of group '{group.group_name}'" in message, message
        assert "ranks called different collectives" in message
        assert "all_reduce of 24 bytes" in message and "all_reduce of 16 bytes" in message
        with pytest.raises(dist.DistDesyncError, match="stopped the group's shared-memory"):
            dist.all_reduce(x, group=group)  # the group is unusable from then on
    finally:
        dist.destroy_process_group(group)
    with environment(HPCCOMM_SHM="1"):
        group = dist.new_group(members, timeout=10)
    try:
        x = np.ones(2, np.float64)
        with pytest.raises(dist.DistDesyncError, match="ranks called different") as info:
            if rank == 0:
                dist.all_reduce(x, group=group)
            else:
                dist.broadcast(x, group_src=0, group=group)
        other = "broadcast" if rank == 0 else "all_reduce"
        assert f"called {other} of 16 bytes" in str(info.value)
    finally:
        dist.destroy_process_group(group)


def test_a_rank_that_never_comes_is_a_timeout_not_a_hang(dist, members, rank, size):
    from hpccomm.backends.shm import small

    if not small.available():
        pytest.skip("the C helper _small is not built or HPCCOMM_SHM_SMALL=0")
    with environment(HPCCOMM_SHM="1"):
        group = dist.new_group(members, timeout=0.5)
    try:
        if rank != 0:
            start = time.monotonic()
            with pytest.raises(dist.DistTimeoutError, match="timed out") as info:
                dist.all_reduce(np.ones(2), group=group)
            assert time.monotonic() - start < 5
            assert f"rank {rank}/{size}" in str(info.value)
    finally:
        dist.barrier()  # rank 0 waits here until the others have timed out
        dist.destroy_process_group(group)


def test_another_thread_waits_while_one_spins(dist, small_group, rank, size):
    """The synchronous spin releases the GIL after its first microseconds: a Python
    thread runs meanwhile (a store server, a progress thread)."""
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)
    thread = threading.Thread(target=tick)
    thread.start()
    try:
        if rank == 0:
            time.sleep(0.2)  # the others spin meanwhile
        x = np.ones(1)
        dist.all_reduce(x, group=small_group)
        assert x[0] == size
    finally:
        stop.set()
        thread.join()
    if rank != 0:
        assert len(ticks) > 20, "the thread did not run while this rank waited"


def test_off_switch_sends_small_messages_through_mpi(dist, members, rank, size):
    with environment(HPCCOMM_SHM="1", HPCCOMM_SHM_SMALL="0"):
        group = dist.new_group(members)
    try:
        assert group.cpu.small is None and group.cpu.small_run is None
        x = np.full(3, rank + 1)
        dist.all_reduce(x, group=group)
        assert (x == size * (size + 1) // 2).all()
    finally:
        dist.destroy_process_group(group)


def test_work_of_a_destroyed_group_raises_instead_of_touching_its_memory(dist, members,
                                                                         rank, size):
    """Destroying a group closes its channel before its memory goes: a Work still
    pending then fails with an error instead of reading unmapped memory."""
    from hpccomm.backends.shm import small

    if not small.available():
        pytest.skip("the C helper _small is not built or HPCCOMM_SHM_SMALL=0")
    with environment(HPCCOMM_SHM="1"):
        group = dist.new_group(members, timeout=5)
    work = None
    if rank == 0:  # the others never join: it stays pending
        work = dist.all_reduce(np.ones(2), group=group, async_op=True)
    dist.destroy_process_group(group)
    if work is not None:
        with pytest.raises(dist.DistError, match="closed|destroyed"):
            work.wait()


def test_arguments_are_checked_as_on_the_general_path(dist, small_group, rank, size):
    """The channel takes only NumPy arrays (other buffers go the general way) whose
    dtypes agree; what is wrong meets the general path's checks and their errors, with
    nothing sent."""
    before = taken(small_group)
    out = np.empty(4 * size, np.float32)  # the same bytes as 2 float64 per rank
    with pytest.raises(dist.DistValueError, match="dtype"):
        dist.all_gather_into_tensor(out, np.ones(2, np.float64), group=small_group)
    with pytest.raises(dist.DistValueError, match="NumPy or CuPy array"):
        dist.all_reduce([1.0, 2.0], group=small_group)
    with pytest.raises(dist.DistValueError, match="read-only"):
        frozen = np.ones(2)
        frozen.flags.writeable = False
        dist.all_reduce(frozen, group=small_group)
    # elements not divisible by the group, though their bytes are (8 x (2 size + 1))
    count = 2 * size + 1 if size % 2 == 0 else 2 * size + 2
    with pytest.raises(dist.DistValueError, match="divisible by the group size"):
        dist.all_to_all_single(np.zeros(count), np.ones(count), group=small_group)
    with pytest.raises(dist.DistValueError, match="read-only"):  # the root's own buffer
        frozen = np.ones(2)
        frozen.flags.writeable = False
        dist.broadcast(frozen, group_src=0, group=small_group)
    with pytest.raises(dist.DistValueError, match="ReduceOp"):  # a bool is an int to C
        dist.all_reduce(np.ones(2), op=False, group=small_group)
    assert taken(small_group) == before
    x = np.ones(2)
    dist.all_reduce(x, group=small_group)  # the channel is still in step on every rank
    assert (x == size).all() and taken(small_group) == before + 1


def test_a_checked_broadcast_takes_the_channel_from_a_read_only_root(dist, small_group,
                                                                     rank, size):
    """Once the general path has checked a call, whether the channel takes it depends
    only on what every rank shares: broadcast_object_list's root hands over read-only
    bytes, and the other ranks' writable buffers must meet them on the channel."""
    box = [{"from": 0, "data": list(range(50))}] if rank == 0 else [None]
    dist.broadcast_object_list(box, group_src=0, group=small_group)
    assert box[0] == {"from": 0, "data": list(range(50))}


# -- all_reduce in pieces (3 ranks on) -----------------------------------------------------------
def _pieced(group):
    """Skip where the group's channel does not take large all_reduces in pieces."""
    if not group.cpu.pieces_to:
        pytest.skip(f"no all_reduce in pieces at {group.size()} ranks with this library "
                    f"(from 3 ranks, where the channel takes a whole slot)")
    from hpccomm.backends.base import ALL_REDUCE
    return group.cpu.small.sizes[ALL_REDUCE]


def test_async_pieces_and_other_operations_keep_one_order(dist, small_group, rank, size):
    """Several async all_reduces in pieces, a broadcast and small sums between them, waited
    for in reverse order: every rank starts the same channel operations in the same order,
    so all complete with the reference values."""
    limit = _pieced(small_group)
    count = 3 * limit // 8 + 5  # three pieces and a short one
    arrays = [np.full(count, float(rank + i)) for i in range(3)]
    small = [np.full(4, rank, np.int64) for _ in range(3)]
    b = np.full(count, float(rank))
    works = []
    for i in range(3):
        works.append(dist.all_reduce(arrays[i], group=small_group, async_op=True))
        works.append(dist.all_reduce(small[i], group=small_group, async_op=True))
    works.append(dist.broadcast(b, group_src=size - 1, group=small_group, async_op=True))
    for work in reversed(works):
        work.wait()
    total = size * (size - 1) / 2
    for i in range(3):
        assert (arrays[i] == total + size * i).all()
        assert (small[i] == total).all()
    assert (b == size - 1).all()


def test_every_form_of_a_sum_takes_the_pieces(dist, small_group, rank, size):
    """The direct form (a torch tensor's synchronous sum) and the general call of NumPy
    take the same path: ranks using either one at once meet in the same pieces."""
    from hpccomm import _call

    limit = _pieced(small_group)
    x = np.full(2 * limit // 8 + 3, float(rank + 1))
    before = taken(small_group)
    direct = rank % 2 and _call.sum_in_place(  # as hpccomm.torch calls it, falling back
        small_group, "all_reduce", x.ctypes.data, x.size, x.nbytes,
        small_group.cpu.direct_types[x.dtype], None, x, x)
    if not direct:  # even ranks; odd ones where the direct form declines (a gated size)
        dist.all_reduce(x, group=small_group)
    assert (x == size * (size + 1) / 2).all()
    assert taken(small_group) == before + 3



@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_reduce_scatter_in_pieces_gives_the_reference_bytes(dist, small_group, rank, size,
                                                            async_op):
    """A block a few times the channel's, in pieces of every rank's block: each dtype and
    reduction the channel takes gives what NumPy gives reducing the ranks' inputs in rank
    order, bit for bit; also with the output a view of the input's own block."""
    from hpccomm.backends.base import REDUCE_SCATTER

    _pieced(small_group)
    limit = small_group.cpu.small.sizes[REDUCE_SCATTER]
    R = dist.ReduceOp
    cases = [("float64", R.SUM, np.add), ("float32", R.MAX, np.maximum),
             ("int32", R.SUM, np.add), ("int64", R.BXOR, np.bitwise_xor)]
    for name, op, ufunc in cases:
        dtype = np.dtype(name)
        block = 2 * limit // dtype.itemsize + 7  # two pieces and a short third

        def data(r):
            rng = np.random.default_rng(1000 * r + block)
            if dtype.kind == "f":
                return rng.uniform(-1, 1, block * size).astype(dtype)
            return rng.integers(-1000, 1000, block * size).astype(dtype)
        want = data(0)
        for r in range(1, size):
            want = ufunc(want, data(r))
        want = want[rank * block:(rank + 1) * block]
        before = taken(small_group)
        x = data(rank)
        out = np.empty(block, dtype)
        work = dist.reduce_scatter_tensor(out, x, op=op, group=small_group,
                                          async_op=async_op)
        if async_op:
            work.wait()
        assert taken(small_group) == before + 3, name
        assert np.array_equal(out, want), name
        mine = x[rank * block:(rank + 1) * block]  # into its own block of the input
        work = dist.reduce_scatter_tensor(mine, x, op=op, group=small_group,
                                          async_op=async_op)
        if async_op:
            work.wait()
        assert np.array_equal(mine, want), f"{name}, output in the input"
