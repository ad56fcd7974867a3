"""Collectives against NumPy references, at every rank count the suite runs (1, 2, 4).

Each rank builds its input from its rank so the expected result is computable locally.
Roots are parametrized over the first and last rank so non-zero roots are exercised.
"""
import numpy as np
import pytest

pytestmark = pytest.mark.mpi(min_size=1)

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
def test_all_reduce_sum(dist, rank, size, dtype, async_op):
    x = local(rank, (3, 4), dtype)
    expected = sum(local(r, (3, 4), dtype).astype(np.complex128) for r in range(size))
    finish(dist.all_reduce(x, async_op=async_op), async_op)
    assert x.dtype == dtype
    np.testing.assert_allclose(x.astype(np.complex128), expected, rtol=1e-3)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16])
def test_small_integer_sums_wrap_as_torch_does(dist, rank, size, dtype):
    """Sums past the type's range wrap around (torch's integer semantics), at lengths
    where Open MPI 5's vectorized sums saturate instead; reduce_scatter and reduce too."""
    top = np.iinfo(dtype).max
    for count in (1, 64, 1000):
        x = np.full(count, top - rank, dtype)
        expected = np.add.reduce([np.full(count, top - r, dtype) for r in range(size)],
                                 dtype=dtype)
        dist.all_reduce(x)
        assert np.array_equal(x, expected), (count, x[:2], expected[:2])
        part = np.empty(count, dtype)
        dist.reduce_scatter_tensor(part, np.tile(np.full(count, top - rank, dtype), size))
        assert np.array_equal(part, expected), (count, part[:2], expected[:2])
        y = np.full(count, top - rank, dtype)
        dist.reduce(y, dst=0)
        if rank == 0:
            assert np.array_equal(y, expected), (count, y[:2], expected[:2])


@pytest.mark.parametrize("op,reference", [
    ("PRODUCT", lambda xs: np.prod(xs, axis=0)),
    ("MIN", lambda xs: np.min(xs, axis=0)),
    ("MAX", lambda xs: np.max(xs, axis=0)),
])
def test_all_reduce_ops(dist, rank, size, op, reference):
    x = np.array([rank + 1, 7 - rank, 2], dtype=np.int64)
    expected = reference(np.stack([[r + 1, 7 - r, 2] for r in range(size)]))
    dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
    np.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("op,reference", [
    ("BAND", np.bitwise_and.reduce), ("BOR", np.bitwise_or.reduce),
    ("BXOR", np.bitwise_xor.reduce)])
def test_all_reduce_bitwise(dist, rank, size, op, reference):
    x = np.array([rank + 3, 1 << rank, 0xFF], dtype=np.int32)
    expected = reference(np.stack([[r + 3, 1 << r, 0xFF] for r in range(size)]), axis=0)
    dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
    np.testing.assert_array_equal(x, expected)


def test_all_reduce_bool_is_logical(dist, rank, size):
    x = np.array([rank == 0, False, True])
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    np.testing.assert_array_equal(x, [True, False, True])
    y = np.array([rank == 0, True])
    dist.all_reduce(y, op=dist.ReduceOp.MIN)
    np.testing.assert_array_equal(y, [size == 1, True])


def test_all_reduce_avg_and_premul_sum(dist, rank, size):
    x = np.full(4, float(rank), dtype=np.float32)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    np.testing.assert_allclose(x, (size - 1) / 2)
    y = np.full(3, rank + 1.0)
    dist.all_reduce(y, op=dist._make_nccl_premul_sum(0.5))
    np.testing.assert_allclose(y, 0.5 * sum(range(1, size + 1)))


def test_all_reduce_bfloat16(dist, rank, size):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes")
    x = np.full(3, rank + 1, dtype=ml_dtypes.bfloat16)
    dist.all_reduce(x)
    assert x.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(x.astype(np.float32), sum(range(1, size + 1)))


def test_all_reduce_zero_d_and_empty(dist, rank, size):
    scalar = np.array(float(rank))
    dist.all_reduce(scalar)
    assert scalar.shape == () and scalar == sum(range(size))
    empty = np.empty(0, dtype=np.float32)
    dist.all_reduce(empty)
    assert empty.size == 0


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("where", ["first", "last"])
def test_broadcast(dist, rank, size, where, async_op):
    src = 0 if where == "first" else size - 1
    x = local(rank, (2, 3), np.int64)
    finish(dist.broadcast(x, src=src, async_op=async_op), async_op)
    np.testing.assert_array_equal(x, local(src, (2, 3), np.int64))


def test_broadcast_group_src(dist, rank, size):
    x = np.full(2, rank, dtype=np.float32)
    dist.broadcast(x, group_src=size - 1)
    np.testing.assert_array_equal(x, size - 1)


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("where", ["first", "last"])
def test_reduce(dist, rank, size, where, async_op):
    dst = 0 if where == "first" else size - 1
    x = local(rank, (4,), np.float64)
    original = x.copy()
    finish(dist.reduce(x, dst=dst, op=dist.ReduceOp.SUM, async_op=async_op), async_op)
    if rank == dst:
        np.testing.assert_allclose(x, sum(local(r, (4,)) for r in range(size)))
    else:
        np.testing.assert_array_equal(x, original)


def test_reduce_avg_leaves_non_root_input(dist, rank, size):
    x = np.full(3, float(rank))
    dist.reduce(x, dst=0, op=dist.ReduceOp.AVG)
    expected = (size - 1) / 2 if rank == 0 else rank
    np.testing.assert_allclose(x, expected)


@pytest.mark.parametrize("async_op", [False, True])
def test_all_gather(dist, rank, size, async_op):
    out = [np.zeros((2, 2), dtype=np.int32) for _ in range(size)]
    finish(dist.all_gather(out, np.full((2, 2), rank, dtype=np.int32), async_op=async_op),
           async_op)
    for r, block in enumerate(out):
        np.testing.assert_array_equal(block, r)


def test_all_gather_uneven(dist, rank, size):
    out = [np.zeros(r + 1) for r in range(size)]
    dist.all_gather(out, np.full(rank + 1, float(rank)))
    for r, block in enumerate(out):
        np.testing.assert_array_equal(block, np.full(r + 1, r))


@pytest.mark.parametrize("async_op", [False, True])
def test_all_gather_into_tensor(dist, rank, size, async_op):
    out = np.zeros((size, 3), dtype=np.float32)
    finish(dist.all_gather_into_tensor(out, np.full(3, rank, dtype=np.float32),
                                       async_op=async_op), async_op)
    np.testing.assert_array_equal(out, np.repeat(np.arange(size), 3).reshape(size, 3))


def test_all_gather_into_tensor_in_place(dist, rank, size):
    out = np.full(size * 4, -1.0)
    mine = out[rank * 4:(rank + 1) * 4]
    mine[:] = rank
    dist.all_gather_into_tensor(out, mine)
    np.testing.assert_array_equal(out, np.repeat(np.arange(size, dtype=float), 4))


def test_all_gather_into_tensor_input_is_the_output_in_a_group_of_one(dist, rank, size):
    alone, _ = dist.new_subgroups(group_size=1)
    buf = np.full(3, float(rank))
    dist.all_gather_into_tensor(buf, buf, group=alone)  # MPI would refuse aliased buffers
    np.testing.assert_array_equal(buf, rank)
    dist.destroy_process_group(alone)


def test_all_gather_into_tensor_overlapping_input_is_copied(dist, rank, size):
    out = np.zeros(size * 2 + 1)
    out[1:3] = [rank, rank]  # overlaps the output without being this rank's block
    dist.all_gather_into_tensor(out[:size * 2], out[1:3])
    np.testing.assert_array_equal(out[:size * 2], np.repeat(np.arange(size, dtype=float), 2))


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("where", ["first", "last"])
def test_gather(dist, rank, size, where, async_op):
    dst = 0 if where == "first" else size - 1
    gather_list = [np.zeros(3) for _ in range(size)] if rank == dst else None
    finish(dist.gather(np.full(3, float(rank)), gather_list, dst=dst, async_op=async_op),
           async_op)
    if rank == dst:
        for r, block in enumerate(gather_list):
            np.testing.assert_array_equal(block, r)


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("where", ["first", "last"])
def test_scatter(dist, rank, size, where, async_op):
    src = 0 if where == "first" else size - 1
    items = [np.full((2, 2), r * 10, dtype=np.int64) for r in range(size)] if rank == src else None
    out = np.zeros((2, 2), dtype=np.int64)
    finish(dist.scatter(out, items, src=src, async_op=async_op), async_op)
    np.testing.assert_array_equal(out, rank * 10)


def test_scatter_uneven(dist, rank, size):
    items = [np.arange(r + 1, dtype=np.float32) for r in range(size)] if rank == 0 else None
    out = np.zeros(rank + 1, dtype=np.float32)
    dist.scatter(out, items, src=0)
    np.testing.assert_array_equal(out, np.arange(rank + 1))


@pytest.mark.parametrize("async_op", [False, True])
def test_reduce_scatter(dist, rank, size, async_op):
    inputs = [np.full(3, float(rank + r)) for r in range(size)]
    out = np.zeros(3)
    finish(dist.reduce_scatter(out, inputs, async_op=async_op), async_op)
    np.testing.assert_allclose(out, sum(r + rank for r in range(size)))


def test_reduce_scatter_max_uneven(dist, rank, size):
    inputs = [np.full(r + 1, rank * 10 + r, dtype=np.int64) for r in range(size)]
    out = np.zeros(rank + 1, dtype=np.int64)
    dist.reduce_scatter(out, inputs, op=dist.ReduceOp.MAX)
    np.testing.assert_array_equal(out, (size - 1) * 10 + rank)


@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX"])
@pytest.mark.parametrize("async_op", [False, True])
def test_reduce_scatter_tensor(dist, rank, size, op, async_op):
    full = np.arange(size * 4, dtype=np.float64) * (rank + 1)
    out = np.zeros(4)
    finish(dist.reduce_scatter_tensor(out, full, op=getattr(dist.ReduceOp, op),
                                      async_op=async_op), async_op)
    block = np.arange(rank * 4, (rank + 1) * 4, dtype=np.float64)
    factors = np.arange(1, size + 1)
    expected = {"SUM": block * factors.sum(), "AVG": block * factors.mean(),
                "MAX": block * size}[op]
    np.testing.assert_allclose(out, expected)


@pytest.mark.parametrize("async_op", [False, True])
def test_reduce_scatter_tensor_into_its_own_input_block(dist, rank, size, async_op):
    full = np.arange(size * 3, dtype=np.float64) + rank
    expected = (np.arange(rank * 3, (rank + 1) * 3) * size + sum(range(size))).astype(float)
    out = full[rank * 3:(rank + 1) * 3]  # the output is a view into the input (NCCL style)
    finish(dist.reduce_scatter_tensor(out, full, async_op=async_op), async_op)
    np.testing.assert_allclose(out, expected)


def test_all_to_all_single_in_place(dist, rank, size):
    buf = np.array([rank * 100 + j for j in range(size)], dtype=np.int64)
    dist.all_to_all_single(buf, buf)
    np.testing.assert_array_equal(buf, [j * 100 + rank for j in range(size)])


@pytest.mark.parametrize("async_op", [False, True])
def test_all_to_all_single_even(dist, rank, size, async_op):
    send = np.array([rank * 100 + j for j in range(size) for _ in range(2)], dtype=np.int32)
    recv = np.zeros_like(send)
    finish(dist.all_to_all_single(recv, send, async_op=async_op), async_op)
    expected = np.array([j * 100 + rank for j in range(size) for _ in range(2)])
    np.testing.assert_array_equal(recv, expected)


def test_all_to_all_single_splits(dist, rank, size):
    # rank r sends (j + 1) rows of width 2 to rank j, each row filled with r
    in_splits = [j + 1 for j in range(size)]
    out_splits = [rank + 1] * size
    send = np.full((sum(in_splits), 2), rank, dtype=np.float32)
    recv = np.full((sum(out_splits), 2), -1, dtype=np.float32)
    dist.all_to_all_single(recv, send, out_splits, in_splits)
    expected = np.repeat(np.arange(size, dtype=np.float32), rank + 1)
    np.testing.assert_array_equal(recv[:, 0], expected)
    np.testing.assert_array_equal(recv[:, 1], expected)


@pytest.mark.parametrize("async_op", [False, True])
def test_all_to_all_lists(dist, rank, size, async_op):
    inputs = [np.full(j + 1, rank * 10 + j, dtype=np.int64) for j in range(size)]
    outputs = [np.zeros(rank + 1, dtype=np.int64) for _ in range(size)]
    finish(dist.all_to_all(outputs, inputs, async_op=async_op), async_op)
    for j, block in enumerate(outputs):
        np.testing.assert_array_equal(block, j * 10 + rank)


def test_barrier_and_async_barrier(dist, rank, size):
    assert dist.barrier() is None
    work = dist.barrier(async_op=True)
    assert work.wait() is True and work.is_completed()


def test_future_then_chains_result(dist, rank, size):
    x = np.ones(2)
    work = dist.all_reduce(x, async_op=True)
    doubled = work.get_future().then(lambda fut: fut.value()[0] * 2)
    np.testing.assert_array_equal(doubled.wait(), np.full(2, 2.0 * size))
    assert work.result()[0] is x


def test_many_outstanding_async_ops(dist, rank, size):
    arrays = [np.full(8, float(i + rank)) for i in range(16)]
    works = [dist.all_reduce(a, async_op=True) for a in arrays]
    for work in reversed(works):
        work.wait()
    for i, a in enumerate(arrays):
        np.testing.assert_allclose(a, size * i + sum(range(size)))


def test_torch_tensor_is_written_in_place(dist, rank, size):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.allclose(t, torch.full((3,), float(sum(range(1, size + 1)))))
    b = torch.zeros(2, dtype=torch.int64) + rank
    dist.broadcast(b, src=0)
    assert b.tolist() == [0, 0]


def test_buffer_protocol_object(dist, rank, size):
    import array
    buf = array.array("d", [rank, 1.0])
    dist.all_reduce(buf)
    assert list(buf) == [sum(range(size)), float(size)]


def test_non_contiguous_input_is_copied(dist, rank, size):
    base = np.arange(12, dtype=np.float64).reshape(3, 4) + rank
    out = np.zeros((size, 3))
    dist.all_gather_into_tensor(out, base[:, 0])  # a strided column
    for r in range(size):
        np.testing.assert_array_equal(out[r], np.array([0, 4, 8]) + r)
