"""Collectives against NumPy references, at every rank count the suite runs (1, 2, 4).

Each rank builds its input from its rank so the expected result is computable locally.
Roots are parametrized over the first and last rank so non-zero roots are exercised.
Every test runs on three groups, as mpi4py's tests loop over communicators: the
default group, all ranks in reverse order (group rank 0 is the last global rank), and
this rank's half of the world; ``rank``, ``size`` and roots are ranks of that group.
"""
import numpy as np
import pytest

pytestmark = pytest.mark.mpi(min_size=1)


class On:
    """The group a test's collectives run on, with this rank's place in it."""

    def __init__(self, dist, kind):
        world = dist.get_world_size()
        if kind == "world":
            self.group = None
        elif kind == "reversed":
            self.group = dist.new_group(list(range(world))[::-1], sort_ranks=False)
        else:  # this rank's half of the world, from one split
            cut = (world + 1) // 2
            halves = [half for half in (list(range(cut)), list(range(cut, world))) if half]
            self.group = dist.split_group(split_ranks=halves)
        self.kind = kind
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        assert self.rank >= 0 and self.size >= 1, (kind, self.rank, self.size)

    def __repr__(self):
        return f"<{self.kind}: rank {self.rank} of {self.size}>"


@pytest.fixture(scope="module", params=["world", "reversed", "halves"])
def on(request, world):
    import hpccomm as dist

    chosen = On(dist, request.param)
    yield chosen
    if chosen.group is not None and dist.is_initialized():
        dist.destroy_process_group(chosen.group)


@pytest.fixture
def rank(on):
    """This rank's rank in the group the test runs on."""
    return on.rank


@pytest.fixture
def size(on):
    """The size of the group the test runs on."""
    return on.size

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8, np.int16, np.float16,
          np.complex64, np.complex128]


def finish(work, async_op):
    if async_op:
        assert work is not None
        work.wait()
        assert work.is_completed() and work.is_success()
    else:
        assert work is None


def local(rank, shape=(5,), dtype=np.float64):
    return (np.arange(np.prod(shape)).reshape(shape) + rank + 1).astype(dtype)


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_sum(dist, on, rank, size, dtype, async_op):
    x = local(rank, (3, 4), dtype)
    expected = sum(local(r, (3, 4), dtype).astype(np.complex128) for r in range(size))
    finish(dist.all_reduce(x, async_op=async_op, group=on.group), async_op)
    assert x.dtype == dtype
    np.testing.assert_allclose(x.astype(np.complex128), expected, rtol=1e-3)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16])
def test_small_integer_sums_wrap_as_torch_does(dist, on, rank, size, dtype):
    """Sums past the type's range wrap around (torch's integer semantics), at lengths
    where Open MPI 5's vectorized sums saturate instead; reduce_scatter and reduce too."""
    top = np.iinfo(dtype).max
    for count in (1, 64, 1000):
        x = np.full(count, top - rank, dtype)
        expected = np.add.reduce([np.full(count, top - r, dtype) for r in range(size)],
                                 dtype=dtype)
        dist.all_reduce(x, group=on.group)
        assert np.array_equal(x, expected), (count, x[:2], expected[:2])
        part = np.empty(count, dtype)
        dist.reduce_scatter_tensor(part, np.tile(np.full(count, top - rank, dtype), size),
                                   group=on.group)
        assert np.array_equal(part, expected), (count, part[:2], expected[:2])
        y = np.full(count, top - rank, dtype)
        dist.reduce(y, group_dst=0, group=on.group)
        if rank == 0:
            assert np.array_equal(y, expected), (count, y[:2], expected[:2])


@pytest.mark.parametrize("op,reference", [
    ("PRODUCT", lambda xs: np.prod(xs, axis=0)),
    ("MIN", lambda xs: np.min(xs, axis=0)),
    ("MAX", lambda xs: np.max(xs, axis=0)),
])
def test_all_reduce_ops(dist, on, rank, size, op, reference):
    x = np.array([rank + 1, 7 - rank, 2], dtype=np.int64)
    expected = reference(np.stack([[r + 1, 7 - r, 2] for r in range(size)]))
    dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=on.group)
    np.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("op,reference", [
    ("BAND", np.bitwise_and.reduce), ("BOR", np.bitwise_or.reduce),
    ("BXOR", np.bitwise_xor.reduce)])
def test_all_reduce_bitwise(dist, on, rank, size, op, reference):
    x = np.array([rank + 3, 1 << rank, 0xFF], dtype=np.int32)
    expected = reference(np.stack([[r + 3, 1 << r, 0xFF] for r in range(size)]), axis=0)
    dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=on.group)
    np.testing.assert_array_equal(x, expected)


def test_all_reduce_bool_is_logical(dist, on, rank, size):
    x = np.array([rank == 0, False, True])
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=on.group)
    np.testing.assert_array_equal(x, [True, False, True])
    y = np.array([rank == 0, True])
    dist.all_reduce(y, op=dist.ReduceOp.MIN, group=on.group)
    np.testing.assert_array_equal(y, [size == 1, True])


def test_all_reduce_avg_and_premul_sum(dist, on, rank, size):
    x = np.full(4, float(rank), dtype=np.float32)
    dist.all_reduce(x, op=dist.ReduceOp.AVG, group=on.group)
    np.testing.assert_allclose(x, (size - 1) / 2)
    y = np.full(3, rank + 1.0)
    dist.all_reduce(y, op=dist._make_nccl_premul_sum(0.5), group=on.group)
    np.testing.assert_allclose(y, 0.5 * sum(range(1, size + 1)))


def test_all_reduce_bfloat16(dist, on, rank, size):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes")
    x = np.full(3, rank + 1, dtype=ml_dtypes.bfloat16)
    dist.all_reduce(x, group=on.group)
    assert x.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(x.astype(np.float32), sum(range(1, size + 1)))


def test_all_reduce_zero_d_and_empty(dist, on, rank, size):
    scalar = np.array(float(rank))
    dist.all_reduce(scalar, group=on.group)
    assert scalar.shape == () and scalar == sum(range(size))
    empty = np.empty(0, dtype=np.float32)
    dist.all_reduce(empty, group=on.group)
    assert empty.size == 0


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("where", ["first", "last"])
def test_broadcast(dist, on, rank, size, where, async_op):
    src = 0 if where == "first" else size - 1
    x = local(rank, (2, 3), np.int64)
    finish(dist.broadcast(x, group_src=src, async_op=async_op, group=on.group), async_op)
    np.testing.assert_array_equal(x, local(src, (2, 3), np.int64))


def test_broadcast_group_src(dist, on, rank, size):
    x = np.full(2, rank, dtype=np.float32)
    dist.broadcast(x, group_src=size - 1, group=on.group)
    np.testing.assert_array_equal(x, size - 1)


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("where", ["first", "last"])
def test_reduce(dist, on, rank, size, where, async_op):
    dst = 0 if where == "first" else size - 1
    x = local(rank, (4,), np.float64)
    original = x.copy()
    finish(dist.reduce(x, group_dst=dst, op=dist.ReduceOp.SUM, async_op=async_op,
                       group=on.group), async_op)
    if rank == dst:
        np.testing.assert_allclose(x, sum(local(r, (4,)) for r in range(size)))
    else:
        np.testing.assert_array_equal(x, original)


def test_reduce_avg_leaves_non_root_input(dist, on, rank, size):
    x = np.full(3, float(rank))
    dist.reduce(x, group_dst=0, op=dist.ReduceOp.AVG, group=on.group)
    expected = (size - 1) / 2 if rank == 0 else rank
    np.testing.assert_allclose(x, expected)


@pytest.mark.parametrize("async_op", [False, True])
def test_all_gather(dist, on, rank, size, async_op):
    out = [np.zeros((2, 2), dtype=np.int32) for _ in range(size)]
    finish(dist.all_gather(out, np.full((2, 2), rank, dtype=np.int32), async_op=async_op,
                           group=on.group),
           async_op)
    for r, block in enumerate(out):
        np.testing.assert_array_equal(block, r)


def test_all_gather_uneven(dist, on, rank, size):
    out = [np.zeros(r + 1) for r in range(size)]
    dist.all_gather(out, np.full(rank + 1, float(rank)), group=on.group)
    for r, block in enumerate(out):
        np.testing.assert_array_equal(block, np.full(r + 1, r))


@pytest.mark.parametrize("async_op", [False, True])
def test_all_gather_into_tensor(dist, on, rank, size, async_op):
    out = np.zeros((size, 3), dtype=np.float32)
    finish(dist.all_gather_into_tensor(out, np.full(3, rank, dtype=np.float32),
                                       async_op=async_op, group=on.group), async_op)
    np.testing.assert_array_equal(out, np.repeat(np.arange(size), 3).reshape(size, 3))


def test_all_gather_into_tensor_in_place(dist, on, rank, size):
    out = np.full(size * 4, -1.0)
    mine = out[rank * 4:(rank + 1) * 4]
    mine[:] = rank
    dist.all_gather_into_tensor(out, mine, group=on.group)
    np.testing.assert_array_equal(out, np.repeat(np.arange(size, dtype=float), 4))


def test_all_gather_into_tensor_input_is_the_output_in_a_group_of_one(dist, on, rank, size):
    alone, _ = dist.new_subgroups(group_size=1)
    buf = np.full(3, float(rank))
    dist.all_gather_into_tensor(buf, buf, group=alone)  # MPI would refuse aliased buffers
    np.testing.assert_array_equal(buf, rank)
    dist.destroy_process_group(alone)


def test_all_gather_into_tensor_overlapping_input_is_copied(dist, on, rank, size):
    out = np.zeros(size * 2 + 1)
    out[1:3] = [rank, rank]  # overlaps the output without being this rank's block
    dist.all_gather_into_tensor(out[:size * 2], out[1:3], group=on.group)
    np.testing.assert_array_equal(out[:size * 2], np.repeat(np.arange(size, dtype=float), 2))


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("where", ["first", "last"])
def test_gather(dist, on, rank, size, where, async_op):
    dst = 0 if where == "first" else size - 1
    gather_list = [np.zeros(3) for _ in range(size)] if rank == dst else None
    finish(dist.gather(np.full(3, float(rank)), gather_list, group_dst=dst, async_op=async_op,
                       group=on.group),
           async_op)
    if rank == dst:
        for r, block in enumerate(gather_list):
            np.testing.assert_array_equal(block, r)


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("where", ["first", "last"])
def test_scatter(dist, on, rank, size, where, async_op):
    src = 0 if where == "first" else size - 1
    items = [np.full((2, 2), r * 10, dtype=np.int64) for r in range(size)] if rank == src else None
    out = np.zeros((2, 2), dtype=np.int64)
    finish(dist.scatter(out, items, group_src=src, async_op=async_op, group=on.group), async_op)
    np.testing.assert_array_equal(out, rank * 10)


def test_scatter_uneven(dist, on, rank, size):
    items = [np.arange(r + 1, dtype=np.float32) for r in range(size)] if rank == 0 else None
    out = np.zeros(rank + 1, dtype=np.float32)
    dist.scatter(out, items, group_src=0, group=on.group)
    np.testing.assert_array_equal(out, np.arange(rank + 1))


@pytest.mark.parametrize("async_op", [False, True])
def test_reduce_scatter(dist, on, rank, size, async_op):
    inputs = [np.full(3, float(rank + r)) for r in range(size)]
    out = np.zeros(3)
    finish(dist.reduce_scatter(out, inputs, async_op=async_op, group=on.group), async_op)
    np.testing.assert_allclose(out, sum(r + rank for r in range(size)))


def test_reduce_scatter_max_uneven(dist, on, rank, size):
    inputs = [np.full(r + 1, rank * 10 + r, dtype=np.int64) for r in range(size)]
    out = np.zeros(rank + 1, dtype=np.int64)
    dist.reduce_scatter(out, inputs, op=dist.ReduceOp.MAX, group=on.group)
    np.testing.assert_array_equal(out, (size - 1) * 10 + rank)


@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX"])
@pytest.mark.parametrize("async_op", [False, True])
def test_reduce_scatter_tensor(dist, on, rank, size, op, async_op):
    full = np.arange(size * 4, dtype=np.float64) * (rank + 1)
    out = np.zeros(4)
    finish(dist.reduce_scatter_tensor(out, full, op=getattr(dist.ReduceOp, op),
                                      async_op=async_op, group=on.group), async_op)
    block = np.arange(rank * 4, (rank + 1) * 4, dtype=np.float64)
    factors = np.arange(1, size + 1)
    expected = {"SUM": block * factors.sum(), "AVG": block * factors.mean(),
                "MAX": block * size}[op]
    np.testing.assert_allclose(out, expected)


@pytest.mark.parametrize("async_op", [False, True])
def test_reduce_scatter_tensor_into_its_own_input_block(dist, on, rank, size, async_op):
    full = np.arange(size * 3, dtype=np.float64) + rank
    expected = (np.arange(rank * 3, (rank + 1) * 3) * size + sum(range(size))).astype(float)
    out = full[rank * 3:(rank + 1) * 3]  # the output is a view into the input (NCCL style)
    finish(dist.reduce_scatter_tensor(out, full, async_op=async_op, group=on.group), async_op)
    np.testing.assert_allclose(out, expected)


def test_all_to_all_single_in_place(dist, on, rank, size):
    buf = np.array([rank * 100 + j for j in range(size)], dtype=np.int64)
    dist.all_to_all_single(buf, buf, group=on.group)
    np.testing.assert_array_equal(buf, [j * 100 + rank for j in range(size)])


@pytest.mark.parametrize("async_op", [False, True])
def test_all_to_all_single_even(dist, on, rank, size, async_op):
    send = np.array([rank * 100 + j for j in range(size) for _ in range(2)], dtype=np.int32)
    recv = np.zeros_like(send)
    finish(dist.all_to_all_single(recv, send, async_op=async_op, group=on.group), async_op)
    expected = np.array([j * 100 + rank for j in range(size) for _ in range(2)])
    np.testing.assert_array_equal(recv, expected)


def test_all_to_all_single_splits(dist, on, rank, size):
    # rank r sends (j + 1) rows of width 2 to rank j, each row filled with r
    in_splits = [j + 1 for j in range(size)]
    out_splits = [rank + 1] * size
    send = np.full((sum(in_splits), 2), rank, dtype=np.float32)
    recv = np.full((sum(out_splits), 2), -1, dtype=np.float32)
    dist.all_to_all_single(recv, send, out_splits, in_splits, group=on.group)
    expected = np.repeat(np.arange(size, dtype=np.float32), rank + 1)
    np.testing.assert_array_equal(recv[:, 0], expected)
    np.testing.assert_array_equal(recv[:, 1], expected)


@pytest.mark.parametrize("async_op", [False, True])
def test_all_to_all_lists(dist, on, rank, size, async_op):
    inputs = [np.full(j + 1, rank * 10 + j, dtype=np.int64) for j in range(size)]
    outputs = [np.zeros(rank + 1, dtype=np.int64) for _ in range(size)]
    finish(dist.all_to_all(outputs, inputs, async_op=async_op, group=on.group), async_op)
    for j, block in enumerate(outputs):
        np.testing.assert_array_equal(block, j * 10 + rank)


def test_barrier_and_async_barrier(dist, on, rank, size):
    assert dist.barrier(group=on.group) is None
    work = dist.barrier(async_op=True, group=on.group)
    assert work.wait() is True and work.is_completed()


def test_future_then_chains_result(dist, on, rank, size):
    x = np.ones(2)
    work = dist.all_reduce(x, async_op=True, group=on.group)
    doubled = work.get_future().then(lambda fut: fut.value()[0] * 2)
    np.testing.assert_array_equal(doubled.wait(), np.full(2, 2.0 * size))
    assert work.result()[0] is x


def test_many_outstanding_async_ops(dist, on, rank, size):
    arrays = [np.full(8, float(i + rank)) for i in range(16)]
    works = [dist.all_reduce(a, async_op=True, group=on.group) for a in arrays]
    for work in reversed(works):
        work.wait()
    for i, a in enumerate(arrays):
        np.testing.assert_allclose(a, size * i + sum(range(size)))


def test_torch_tensor_is_written_in_place(dist, on, rank, size):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t, group=on.group)
    assert torch.allclose(t, torch.full((3,), float(sum(range(1, size + 1)))))
    b = torch.zeros(2, dtype=torch.int64) + rank
    dist.broadcast(b, group_src=0, group=on.group)
    assert b.tolist() == [0, 0]


def test_buffer_protocol_object(dist, on, rank, size):
    import array
    buf = array.array("d", [rank, 1.0])
    dist.all_reduce(buf, group=on.group)
    assert list(buf) == [sum(range(size)), float(size)]


def test_non_contiguous_input_is_copied(dist, on, rank, size):
    base = np.arange(12, dtype=np.float64).reshape(3, 4) + rank
    out = np.zeros((size, 3))
    dist.all_gather_into_tensor(out, base[:, 0], group=on.group)  # a strided column
    for r in range(size):
        np.testing.assert_array_equal(out[r], np.array([0, 4, 8]) + r)
