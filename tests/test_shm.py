"""The shared-memory path: every op, dtype and reduction against MPI and NumPy.

Two groups of this node's ranks are made side by side (every rank on one machine; half
of them where the job runs as two simulated nodes, since shared memory serves the ranks
of one node): one that takes the shared-memory path
for every message (``HPCCOMM_SHM_MIN_BYTES=1``) with tiny ring slots
(``HPCCOMM_SHM_CHUNK``), so odd sizes cross many chunks and the ring wraps around, or
its small channel up to 4 KiB, and
one with ``HPCCOMM_SHM=0``, plain MPI. Integer and boolean results must equal the exact
reduction bit for bit (NumPy over every rank's gathered input: what a correct MPI
returns), floating ones MPI's up to the order of additions, and every rank of the
shared-memory group must hold the same bits. At one rank the groups are plain MPI
(nothing to share). ``rank`` and ``size`` here are this rank's place in its node's group.
Failure scenarios (a rank that dies mid-collective, one that never comes) run as their
own jobs from tests/scripts/shm_case.py.
"""
import functools
import os
import time

import numpy as np
import pytest

import helpers
from helpers import COMPLEX, INTS, NUMPY_DTYPES, RTOL, environment, result_lines
from helpers import node_rank, node_size  # noqa: F401 (fixtures: rank and size on the node)
from helpers import numpy_dtype as dtype_of

ml_dtypes = pytest.importorskip("ml_dtypes")

#: A case of tests/scripts/shm_case.py as its own job, outside any debug level or
#: shared-memory setting of this process.
run_case = functools.partial(helpers.run_case, "shm_case.py", clean=(
    "HPCCOMM_DISTRIBUTED_DEBUG", "HPCCOMM_TRACE_DIR", "HPCCOMM_SHM"))

SIZES = [1, 7, 1001, 4099]  # one element, odd, and several ring slots at tiny chunks


def ops_for(name):
    import hpccomm as dist

    R = dist.ReduceOp
    if name == "bool" or name in INTS:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]
    premul = dist._make_nccl_premul_sum(0.75)
    if name in COMPLEX:
        return [R.SUM, R.AVG, premul]  # torch refuses PRODUCT, MIN, MAX and bitwise ops
    return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG, premul]


def values(name, count, seed):
    """Inputs that neither overflow floats nor cancel: products stay near 1."""
    rng = np.random.default_rng(seed)
    dtype = dtype_of(name)
    if name == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if name in INTS:
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    real = rng.uniform(0.75, 1.25, count)
    if name in COMPLEX:
        return (real + 1j * rng.uniform(-0.25, 0.25, count)).astype(dtype)
    return real.astype(dtype)


def assert_same(got, want, name, what):
    if name in RTOL:
        np.testing.assert_allclose(got.astype(np.complex128 if name in COMPLEX else np.float64),
                                   want.astype(np.complex128 if name in COMPLEX else np.float64),
                                   rtol=RTOL[name], err_msg=what)
    else:
        assert np.array_equal(got, want), what


@pytest.fixture(scope="module", params=["staged", "in place", "small channel"])
def groups(world, members, request):
    """``(shared-memory group, plain MPI group)``, both of every rank. The shared-memory
    group either copies private arrays into shared memory ("staged": what it does where
    processes cannot read each other's memory) or reads them in place by cross-memory
    attach where the kernel allows it (else it stages too); both take the ring from one
    byte. The third sends messages of up to 4 KiB through the small channel
    (:mod:`hpccomm.backends.shm.small`, whole operations in C) and larger ones the
    default way, so the sizes below cross from one to the other."""
    import hpccomm as dist

    ranks = members
    if request.param == "small channel":
        with environment(HPCCOMM_SHM="1", HPCCOMM_SHM_SMALL="4K"):
            shm = dist.new_group(ranks)
    else:
        cma = "1" if request.param == "in place" else "0"
        with environment(HPCCOMM_SHM="1", HPCCOMM_SHM_MIN_BYTES=1, HPCCOMM_SHM_CHUNK=1024,
                         HPCCOMM_SHM_CMA=cma):
            shm = dist.new_group(ranks)
    with environment(HPCCOMM_SHM="0"):
        plain = dist.new_group(ranks)
    if request.param == "staged" and len(members) > 1:
        assert shm.cpu.pids is None  # HPCCOMM_SHM_CMA=0: no cross-memory attach
    yield shm, plain
    dist.destroy_process_group(shm)
    dist.destroy_process_group(plain)


def exact(dist, plain, data, op):
    """The exact reduction of every rank's ``data`` (integers and booleans), computed by
    NumPy from the gathered inputs: what a correct MPI returns bit for bit. (Open MPI
    5.0's own 8- and 16-bit integer sums were seen to be wrong, so MPI's result is not
    the reference for these.)"""
    from hpccomm.backends.shm.reduce import _ARITH, _LOGICAL

    size = plain.size()
    every = np.empty(data.size * size, data.dtype)
    dist.all_gather_into_tensor(every, data, group=plain)  # moves bytes only
    rows = every.reshape(size, -1)
    ufunc = (_LOGICAL if data.dtype.kind == "b" else _ARITH)[dist.ReduceOp.RedOpType(op)]
    result = rows[0].copy()
    for row in rows[1:]:
        ufunc(result, row, out=result)
    return result


def same_everywhere(dist, plain, arr):
    """Every rank holds the same bytes in ``arr``."""
    mine = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    every = np.empty(mine.size * plain.size(), np.uint8)
    dist.all_gather_into_tensor(every, mine, group=plain)
    rows = every.reshape(plain.size(), -1)
    assert (rows == rows[0]).all(), "ranks disagree on the result"


@pytest.mark.mpi(min_size=1)
def test_groups_take_the_path_they_should(groups, size):
    from hpccomm.backends.shm.communicator import SharedMemoryCommunicator

    from hpccomm.backends.base import ALL_REDUCE, BROADCAST
    from hpccomm.backends.shm import small

    shm, plain = groups
    assert isinstance(shm.cpu, SharedMemoryCommunicator) == (size > 1)
    assert not isinstance(plain.cpu, SharedMemoryCommunicator)
    if size > 1 and small.available():  # the small channel stops where the ring starts
        sizes = shm.cpu.small.sizes
        assert sizes[ALL_REDUCE] == (4096 if shm.cpu.min_reduce > 1 else 0)
        assert sizes[BROADCAST] < shm.cpu.min_bcast


@pytest.mark.mpi(min_size=2)
def test_default_thresholds_keep_small_messages_and_broadcast_on_mpi(dist, size):
    from hpccomm.backends.mpi import placement
    from hpccomm.backends.shm import communicator as shm, pair

    cpu = dist.group.WORLD.cpu
    if not isinstance(cpu, shm.SharedMemoryCommunicator) or os.environ.get(
            "HPCCOMM_SHM_MIN_BYTES"):
        pytest.skip("the default group does not use the default thresholds here")
    defaults = shm.ring_thresholds(size, placement.crowded(dist.group.WORLD.comm),
                                   pair.available())
    assert (cpu.min_reduce, cpu.min_scatter, cpu.min_gather, cpu.min_bcast) == tuple(
        defaults[op] for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"))
    before = cpu.ops
    small = np.ones(1000)
    dist.all_reduce(small)
    dist.broadcast(np.ones(1 << 20), src=0)  # broadcast: MPI at any size
    assert cpu.ops == before and (small == size).all()
    if cpu.pieces_to:  # from 3 ranks: the channel in pieces up to the ring's 128 MiB
        mid = np.ones(1 << 17)
        dist.all_reduce(mid)
        assert cpu.ops == before and (mid == size).all()
        return
    big = np.ones(cpu.min_reduce // 8 + 1)
    dist.all_reduce(big)
    assert cpu.ops == before + 1 and (big == size).all()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_all_reduce_matches_mpi(groups, dist, rank, name):
    shm, plain = groups
    for op in ops_for(name):
        for count in SIZES:
            data = values(name, count, seed=1000 * rank + count)
            got = data.copy()
            dist.all_reduce(got, op=op, group=shm)
            if name in RTOL:  # floats: MPI's result, to round-off
                want = data.copy()
                dist.all_reduce(want, op=op, group=plain)
            else:
                want = exact(dist, plain, data, op)
            assert_same(got, want, name, f"{name} {op} n={count}")
            same_everywhere(dist, plain, got)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_reduce_scatter_tensor_matches_mpi(groups, dist, rank, size, name):
    shm, plain = groups
    for op in ops_for(name):
        for block in (1, 5, 1027):
            data = values(name, block * size, seed=77 * rank + block)
            got, want = np.empty(block, data.dtype), np.empty(block, data.dtype)
            dist.reduce_scatter_tensor(got, data, op=op, group=shm)
            if name in RTOL:
                dist.reduce_scatter_tensor(want, data, op=op, group=plain)
            else:
                want = exact(dist, plain, data, op)[rank * block:(rank + 1) * block]
            assert_same(got, want, name, f"{name} {op} block={block}")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["int32", "float32", "bfloat16"])
def test_reduce_scatter_list_with_uneven_blocks(groups, dist, rank, size, name):
    shm, plain = groups
    counts = [3 + 1000 * (p % 2) for p in range(size)]
    inputs = [values(name, c, seed=rank * 10 + p) for p, c in enumerate(counts)]
    got = np.empty(counts[rank], dtype_of(name))
    want = np.empty_like(got)
    dist.reduce_scatter(got, inputs, group=shm)
    dist.reduce_scatter(want, inputs, group=plain)
    assert_same(got, want, name, "uneven reduce_scatter")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_all_gather_into_tensor_matches_mpi(groups, dist, rank, size, name):
    shm, plain = groups
    for block in (1, 9, 2053):
        data = values(name, block, seed=rank + block)
        got, want = np.empty(block * size, data.dtype), np.empty(block * size, data.dtype)
        dist.all_gather_into_tensor(got, data, group=shm)
        dist.all_gather_into_tensor(want, data, group=plain)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (name, block)
        # in place: the input is this rank's block of the output
        inplace = np.zeros(block * size, data.dtype)
        inplace[rank * block:(rank + 1) * block] = data
        dist.all_gather_into_tensor(inplace, inplace[rank * block:(rank + 1) * block],
                                    group=shm)
        assert np.array_equal(inplace.view(np.uint8), want.view(np.uint8)), (name, block)


@pytest.mark.mpi(min_size=1)
def test_all_gather_list_with_uneven_sizes(groups, dist, rank, size):
    shm, _ = groups
    sizes = [1 + 700 * p for p in range(size)]
    mine = np.arange(sizes[rank], dtype=np.int64) + 10_000 * rank
    out = [np.empty(n, np.int64) for n in sizes]
    dist.all_gather(out, mine, group=shm)
    for p, n in enumerate(sizes):
        assert np.array_equal(out[p], np.arange(n) + 10_000 * p)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["bool", "int8", "uint64", "float16", "bfloat16",
                                  "complex128"])
def test_broadcast_from_every_root(groups, dist, rank, size, name):
    shm, _ = groups
    for root in range(size):
        for count in SIZES:
            buf = values(name, count, seed=rank * 3 + count)
            expected = values(name, count, seed=root * 3 + count)
            dist.broadcast(buf, group_src=root, group=shm)
            assert np.array_equal(buf.view(np.uint8), expected.view(np.uint8)), (root, count)


@pytest.mark.mpi(min_size=1)
def test_non_contiguous_and_multidimensional_inputs(groups, dist, rank, size):
    shm, plain = groups
    base = values("float64", 4 * 3 * size * 2, seed=rank).reshape(4, 3 * size * 2)
    strided = base.reshape(-1)[::2]  # 12 * size elements, not contiguous
    assert not strided.flags.c_contiguous
    got, want = np.empty((4, 3)), np.empty((4, 3))
    dist.reduce_scatter_tensor(got, strided, group=shm)
    dist.reduce_scatter_tensor(want, strided, group=plain)
    assert_same(got, want, "float64", "reduce_scatter of a strided input")
    column = base[:, 1]  # strided view, 4 elements
    out, ref = np.empty((size, 4)), np.empty((size, 4))
    dist.all_gather_into_tensor(out, column, group=shm)
    dist.all_gather_into_tensor(ref, column, group=plain)
    assert np.array_equal(out, ref)
    matrix = values("int32", 6 * 7, seed=rank).reshape(6, 7)
    expect = matrix.copy()
    dist.all_reduce(matrix, group=shm)
    dist.all_reduce(expect, group=plain)
    assert np.array_equal(matrix, expect)


@pytest.mark.mpi(min_size=1)
def test_shared_arrays_are_read_in_place(groups, dist, rank, size):
    import hpccomm.shm

    shm, plain = groups
    grad = hpccomm.shm.empty((3, 1001), np.float32, group=shm)
    assert hpccomm.shm.is_shared(grad, group=shm) == (size > 1)
    assert hpccomm.shm.is_shared(grad[1:], group=shm) == (size > 1)  # a view counts
    assert not hpccomm.shm.is_shared(np.empty(4), group=shm)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX):
        grad[...] = values("float32", grad.size, seed=rank).reshape(grad.shape)
        want = grad.copy()
        dist.all_reduce(grad, op=op, group=shm)
        dist.all_reduce(want, op=op, group=plain)
        assert_same(grad, want, "float32", str(op))
        same_everywhere(dist, plain, grad)
    out = hpccomm.shm.empty(size * 1001, np.int64, group=shm)
    block = out[rank * 1001:(rank + 1) * 1001]
    block[...] = np.arange(1001) + rank
    dist.all_gather_into_tensor(out, block, group=shm)  # in place, read where it lies
    assert np.array_equal(out.reshape(size, 1001), np.arange(1001) + np.arange(size)[:, None])
    source = hpccomm.shm.empty(size * 5, np.float64, group=shm)
    source[...] = np.arange(size * 5) * (rank + 1)
    part = np.empty(5)
    dist.reduce_scatter_tensor(part, source, group=shm)
    assert np.array_equal(part, (np.arange(size * 5) * sum(range(1, size + 1)))[rank * 5:
                                                                                 rank * 5 + 5])
    root_buf = hpccomm.shm.empty(999, np.int16, group=shm)
    root_buf[...] = rank
    dist.broadcast(root_buf, group_src=size - 1, group=shm)
    assert (root_buf == size - 1).all()


@pytest.mark.mpi(min_size=2)
def test_some_ranks_shared_others_private(groups, dist, rank, size):
    import hpccomm.shm

    shm, plain = groups
    shared = hpccomm.shm.empty(2049, np.int32, group=shm)
    buf = shared if rank % 2 == 0 else np.empty(2049, np.int32)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.BXOR):
        buf[...] = values("int32", 2049, seed=rank)
        want = buf.copy()
        dist.all_reduce(buf, op=op, group=shm)
        dist.all_reduce(want, op=op, group=plain)
        assert np.array_equal(buf, want)
    out = np.empty(2049 * size, np.int32)
    dist.all_gather_into_tensor(out, buf, group=shm)
    assert np.array_equal(out, np.tile(want, size))


@pytest.mark.mpi(min_size=2)
def test_async_operations_overlap_and_finish_in_any_order(groups, dist, rank, size):
    shm, plain = groups
    big = [np.full(3001, float(rank + i)) for i in range(3)]
    works = [dist.all_reduce(b, group=shm, async_op=True) for b in big]
    small = np.full(2, rank, dtype=np.int64)
    mpi_work = dist.all_reduce(small, group=plain, async_op=True)
    gathered = np.empty(3001 * size)
    mine = np.full(3001, float(rank))
    gather_work = dist.all_gather_into_tensor(gathered, mine, group=shm, async_op=True)
    # ranks wait in different orders: a later wait must still drive the earlier work
    if rank % 2:
        order = [mpi_work, gather_work] + works[::-1]
    else:
        order = works + [gather_work, mpi_work]
    for work in order:
        work.wait()
    total = sum(range(size))
    for i, b in enumerate(big):
        assert (b == total + size * i).all()
    assert (small == total).all()
    assert np.array_equal(gathered, np.repeat(np.arange(size, dtype=float), 3001))


@pytest.mark.mpi(min_size=2)
def test_a_rank_blocked_in_mpi_still_does_its_part_of_shared_memory_work(groups, dist, rank,
                                                                        size):
    """Rank 0 waits for a shared-memory all_reduce before it joins an MPI all_reduce, while
    the others are already inside that MPI call: they must keep doing their part of the
    shared-memory operation while they wait, as MPI's progress engine would."""
    shm, plain = groups
    big = np.full(30001, float(rank))  # many 1 KiB ring slots: no rank finishes alone
    work = dist.all_reduce(big, group=shm, async_op=True)
    small = np.ones(1)
    if rank == 0:
        work.wait()
        dist.all_reduce(small, group=plain)
    else:
        dist.all_reduce(small, group=plain)
        assert not work.is_completed() or (big == sum(range(size))).all()
        work.wait()
    assert small[0] == size
    assert (big == sum(range(size))).all()


@pytest.mark.mpi(min_size=2)
def test_memory_barriers_path(dist, members, rank, size):
    """The ``MPI_Win_sync`` barriers that non-x86 processors need, forced on here."""
    ranks = members
    with environment(HPCCOMM_SHM="1", HPCCOMM_SHM_MIN_BYTES=1, HPCCOMM_SHM_CHUNK=512,
                     HPCCOMM_SHM_FENCE=1):
        fenced = dist.new_group(ranks)
    try:
        assert fenced.cpu.ring.fenced
        x = np.arange(5000, dtype=np.int64) * (rank + 1)
        dist.all_reduce(x, group=fenced)
        assert np.array_equal(x, np.arange(5000) * sum(range(1, size + 1)))
        y = np.empty(5000 * size, np.int64)
        dist.all_gather_into_tensor(y, x, group=fenced)
        assert np.array_equal(y, np.tile(x, size))
    finally:
        dist.destroy_process_group(fenced)


@pytest.mark.mpi(min_size=2)
def test_mismatched_sizes_are_an_error_not_a_hang(dist, members, rank, size):
    ranks = members
    with environment(HPCCOMM_SHM="1", HPCCOMM_SHM_MIN_BYTES=1):
        group = dist.new_group(ranks, timeout=10)
    try:
        x = np.ones(100 + rank, np.float32)
        start = time.monotonic()
        with pytest.raises(dist.DistError) as info:
            dist.all_reduce(x, group=group)
        assert time.monotonic() - start < 10
        assert type(info.value) in (dist.DistDesyncError, dist.DistTimeoutError), info.value
        assert any(words in str(info.value) for words in
                   ("ranks called different collectives", "timed out")), info.value
    finally:
        dist.destroy_process_group(group)


def test_the_descriptor_tag_tells_round_sizes_apart():
    """The tag the ring and the two-rank kernel compare stands for the operation's size:
    whole mebibytes (whose low 20 bits are all zero) get tags of their own."""
    from hpccomm.backends.shm import algorithms

    f64 = np.dtype(np.float64)
    tags = [algorithms.tag_of(1, k << 20, f64) for k in range(1, 257)]
    assert len(set(tags)) == len(tags)
    assert algorithms.tag_of(1, 3 << 20, f64) == tags[2]  # the same call, the same tag


@pytest.mark.mpi(min_size=2)
def test_sizes_a_mebibyte_apart_are_told_apart(dist, members, rank):
    """1 MiB against 2 MiB on the shared-memory paths is a DistDesyncError on every rank,
    not one rank's sum of mixed data while another waits for the rest."""
    with environment(HPCCOMM_SHM="1", HPCCOMM_SHM_MIN_BYTES=1):
        group = dist.new_group(members, timeout=10)
    try:
        x = np.ones((2 if rank == 1 else 1) << 17)  # float64: 1 or 2 MiB (rank: on the node)
        with pytest.raises(dist.DistDesyncError, match="ranks called different"):
            dist.all_reduce(x, group=group)
    finally:
        dist.destroy_process_group(group)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("async_op", [False, True])
def test_a_mismatch_shows_the_user_one_error(dist, members, rank, async_op):
    """The error of differing calls is the DistDesyncError alone: the backend's own
    CallsDiffer it was made from is neither its cause nor its context, so the user's
    traceback does not show hpccomm's internals twice."""
    with environment(HPCCOMM_SHM="1", HPCCOMM_SHM_MIN_BYTES=1):
        group = dist.new_group(members, timeout=10)
    try:
        x = np.ones(100 + rank, np.float32)
        with pytest.raises(dist.DistError) as info:
            work = dist.all_reduce(x, group=group, async_op=async_op)
            if async_op:
                work.wait()
        if type(info.value) is dist.DistDesyncError:  # else the rank saw no peer's call
            assert info.value.__cause__ is None and info.value.__suppress_context__, (
                repr(info.value.__cause__ or info.value.__context__))
            # the group is unusable: a later call says so, as the same kind of error,
            # naming its operation, rank and group like any other
            with pytest.raises(dist.DistDesyncError) as again:
                dist.all_reduce(x, group=group)
            assert (f"hpccomm.all_reduce with shape ({x.size},) float32 on rank {rank}/"
                    in str(again.value)), again.value
            assert "an earlier operation stopped" in str(again.value), again.value
    finally:
        dist.destroy_process_group(group)


@pytest.mark.mpi(min_size=1)
def test_switched_off_and_empty_fall_back(dist, members, size):
    import hpccomm.shm

    with environment(HPCCOMM_SHM="0"):
        off = dist.new_group(members)
    try:
        arr = hpccomm.shm.empty((2, 3), np.float64, group=off)
        assert arr.shape == (2, 3) and not hpccomm.shm.is_shared(arr, group=off)
        arr[...] = 1
        dist.all_reduce(arr, group=off)
        assert (arr == size).all()
    finally:
        dist.destroy_process_group(off)


# -- failures, each in its own job -------------------------------------------------------------


def results(output):
    """``{rank: fields}`` of the RESULT lines (one per rank)."""
    return dict(result_lines(output))


def test_a_rank_lost_mid_collective_makes_the_others_raise_and_its_kill_leaves_no_segment():
    timeout = 3.0
    code, output, _ = run_case("killed", 3, CASE_TIMEOUT=timeout, HPCCOMM_ROLLCALL_GRACE=0.3)
    found = results(output)
    assert sorted(found) == [0, 2], output
    backing = set()
    for rank, fields in found.items():
        assert fields["error"] == "DistTimeoutError", fields
        assert float(fields["elapsed"]) <= timeout + 2.0, fields
        for path in fields["segments"].split(","):
            assert path.endswith("(deleted)"), f"segment still named while in use: {path}"
            backing.add(path[:-len("(deleted)")])
    assert "signal 9" in output or code != 0, output  # rank 1 really was killed
    left = [path for path in backing if os.path.exists(path)]
    assert backing and not left, f"segments left behind: {left}"


def test_a_rank_that_never_comes_makes_every_shared_op_raise():
    timeout = 1.0
    code, output, _ = run_case("absent", 2, CASE_TIMEOUT=timeout, HPCCOMM_ROLLCALL_GRACE=0.3)
    assert code == 0, output
    fields = results(output)[0]
    assert fields["raised"] == "all_reduce,reduce_scatter_tensor,all_gather_into_tensor,broadcast"
    assert float(fields["slowest"]) <= timeout + 2.0, fields
