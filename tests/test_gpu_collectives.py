"""Collectives written once, run over array libraries and backends: NumPy on MPI, CuPy on
NCCL and on MPI where the machine has a GPU, and the simulated device (``sim-nccl``,
``sim-mpi``) everywhere (the cases: ``tests/gpu_cases.py``). What a call makes on the
device and CUDA graph capture are in ``tests/test_gpu_streams.py``; how NCCL
communicators are made, and what a creation that fails says, in
``tests/test_gpu_lifecycle.py``.
"""
import numpy as np
import pytest

from gpu_cases import CASES, GPU, GPU_SKIP, NCCL_AVAILABLE_AT_IMPORT, case_fixture
from gpu_cases import case_groups  # noqa: F401 (a fixture)

pytestmark = pytest.mark.mpi(min_size=1)

case = case_fixture(CASES)


def done(dist, work, async_op):
    """Complete an op the way a caller would; for GPU work, also wait for the device."""
    if async_op:
        assert work is not None
        assert work.wait() is True
        assert work.is_completed()
    else:
        assert work is None


def local(rank, n=6, dtype=np.float32):
    return (np.arange(n) + rank + 1).astype(dtype)


# -- all_reduce ------------------------------------------------------------------------------
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64,
                                   np.uint8, np.int16, np.complex64])
def test_all_reduce_sum(dist, case, rank, size, dtype, async_op):
    x = case.arr(local(rank, dtype=dtype))
    work = dist.all_reduce(x, group=case.group, async_op=async_op)
    done(dist, work, async_op)
    expected = sum(local(r, dtype=np.float64) for r in range(size)).astype(dtype)
    got = case.host(x)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, expected, rtol=1e-3)


@pytest.mark.parametrize("op,ref", [("PRODUCT", np.prod), ("MIN", np.min), ("MAX", np.max),
                                    ("BAND", np.bitwise_and.reduce),
                                    ("BOR", np.bitwise_or.reduce),
                                    ("BXOR", np.bitwise_xor.reduce)])
@pytest.mark.parametrize("dtype", [np.int32, np.int16])
def test_all_reduce_int_ops(dist, case, rank, size, op, ref, dtype):
    rows = [np.array([r + 1, 7 - r, 1 << r, 0x5A], dtype) for r in range(size)]
    x = case.arr(rows[rank])
    dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=case.group)
    expected = ref(np.stack(rows), axis=0).astype(dtype)  # int16 products wrap
    np.testing.assert_array_equal(case.host(x), expected)


@pytest.mark.parametrize("op,ref", [("SUM", np.any), ("MAX", np.any), ("BOR", np.any),
                                    ("PRODUCT", np.all), ("MIN", np.all), ("BAND", np.all),
                                    ("BXOR", lambda s, axis: np.logical_xor.reduce(s, axis))])
def test_all_reduce_bool_is_logical(dist, case, rank, size, op, ref):
    rows = [np.array([True, r == 0, r % 2 == 1, False]) for r in range(size)]
    x = case.arr(rows[rank])
    dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=case.group)
    np.testing.assert_array_equal(case.host(x), ref(np.stack(rows), axis=0))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.complex64])
def test_all_reduce_avg_and_premul_sum(dist, case, rank, size, dtype):
    x = case.arr(local(rank, dtype=dtype))
    dist.all_reduce(x, op=dist.ReduceOp.AVG, group=case.group)
    mean = np.mean([local(r, dtype=np.float64) for r in range(size)], axis=0)
    np.testing.assert_allclose(case.host(x).astype(np.complex128), mean, rtol=1e-3)
    y = case.arr(local(rank, dtype=dtype))
    dist.all_reduce(y, op=dist._make_nccl_premul_sum(0.5), group=case.group)
    np.testing.assert_allclose(case.host(y).astype(np.complex128),
                               0.5 * sum(local(r, dtype=np.float64) for r in range(size)),
                               rtol=1e-3)


def test_all_reduce_complex_product_is_refused_as_in_torch(dist, case, rank, size):
    x = case.arr(np.array([1 + 1j, 2 - 1j], np.complex128))
    with pytest.raises(ValueError, match="not supported on complex"):
        dist.all_reduce(x, op=dist.ReduceOp.PRODUCT, group=case.group)


def test_bfloat16_sum_avg_premul(dist, case, rank, size):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    base = [np.array([1.0, 2.0, 0.5 * (r + 1), -3.0]) for r in range(size)]
    total = np.sum(base, axis=0)
    for op, expected in [(dist.ReduceOp.SUM, total), (dist.ReduceOp.AVG, total / size),
                         (dist._make_nccl_premul_sum(2.0), 2 * total)]:
        x = case.arr(base[rank].astype(bf16))
        dist.all_reduce(x, op=op, group=case.group)
        got = case.host(x)
        assert got.dtype == np.dtype(bf16)
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=1e-2)


# -- rooted collectives ------------------------------------------------------------------------
@pytest.mark.parametrize("root_last", [False, True])
def test_broadcast_and_reduce(dist, case, rank, size, root_last):
    root = size - 1 if root_last else 0
    x = case.arr(local(rank, dtype=np.float64))
    dist.broadcast(x, src=root, group=case.group)
    np.testing.assert_array_equal(case.host(x), local(root, dtype=np.float64))
    y = case.arr(local(rank, dtype=np.int64))
    work = dist.reduce(y, dst=root, op=dist.ReduceOp.MAX, group=case.group, async_op=True)
    done(dist, work, True)
    expected = local(size - 1, dtype=np.int64) if rank == root else local(rank, dtype=np.int64)
    np.testing.assert_array_equal(case.host(y), expected)


def test_reduce_premul_leaves_non_root_input(dist, case, rank, size):
    x = case.arr(local(rank))
    dist.reduce(x, dst=0, op=dist._make_nccl_premul_sum(3.0), group=case.group)
    if rank == 0:
        np.testing.assert_allclose(case.host(x), 3 * sum(local(r) for r in range(size)))
    else:
        np.testing.assert_array_equal(case.host(x), local(rank))


def test_gather_scatter_uneven(dist, case, rank, size):
    root = size - 1
    mine = case.arr(np.full(rank + 1, rank, np.int32))
    out = [case.arr(np.zeros(r + 1, np.int32)) for r in range(size)] if rank == root else None
    dist.gather(mine, out, dst=root, group=case.group)
    if rank == root:
        for r in range(size):
            np.testing.assert_array_equal(case.host(out[r]), np.full(r + 1, r))
    pieces = ([case.arr(np.arange(r + 2, dtype=np.float32) * 10 + r) for r in range(size)]
              if rank == root else None)
    recv = case.arr(np.zeros(rank + 2, np.float32))
    dist.scatter(recv, pieces, src=root, group=case.group)
    np.testing.assert_array_equal(case.host(recv), np.arange(rank + 2) * 10 + rank)


# -- gathers and reduce_scatter ---------------------------------------------------------------
def test_all_gather_even_uneven_and_in_place(dist, case, rank, size):
    outs = [case.arr(np.zeros(r + 1, np.float16)) for r in range(size)]
    dist.all_gather(outs, case.arr(np.full(rank + 1, rank, np.float16)), group=case.group)
    for r in range(size):
        np.testing.assert_array_equal(case.host(outs[r]), np.full(r + 1, r))
    full = case.arr(np.zeros(3 * size, np.int64))
    dist.all_gather_into_tensor(full, case.arr(local(rank, 3, np.int64)), group=case.group)
    np.testing.assert_array_equal(case.host(full),
                                  np.concatenate([local(r, 3, np.int64) for r in range(size)]))
    inplace = case.arr(np.zeros(2 * size, np.float32))
    inplace[2 * rank:2 * rank + 2] = case.arr(np.full(2, rank + 0.5, np.float32))
    dist.all_gather_into_tensor(inplace, inplace[2 * rank:2 * rank + 2], group=case.group)
    np.testing.assert_array_equal(case.host(inplace), np.repeat(np.arange(size) + 0.5, 2))


@pytest.mark.parametrize("op", ["SUM", "AVG", "BXOR"])
def test_reduce_scatter(dist, case, rank, size, op):
    dtype = np.int32 if op == "BXOR" else np.float32
    rows = [np.arange(2 * size, dtype=dtype) * (r + 1) for r in range(size)]
    reduced = (np.bitwise_xor.reduce(np.stack(rows), axis=0) if op == "BXOR" else
               np.mean(rows, axis=0) if op == "AVG" else np.sum(rows, axis=0))
    out = case.arr(np.zeros(2, dtype))
    dist.reduce_scatter_tensor(out, case.arr(rows[rank]), op=getattr(dist.ReduceOp, op),
                               group=case.group)
    np.testing.assert_allclose(case.host(out), reduced[2 * rank:2 * rank + 2], rtol=1e-5)
    # uneven blocks: rank r gets r + 1 elements
    inputs = [case.arr(np.full(r + 1, rank + 1, dtype)) for r in range(size)]
    out2 = case.arr(np.zeros(rank + 1, dtype))
    dist.reduce_scatter(out2, inputs, op=getattr(dist.ReduceOp, op), group=case.group)
    column = np.array([r + 1 for r in range(size)], dtype)
    expected = (np.bitwise_xor.reduce(column) if op == "BXOR" else
                column.mean() if op == "AVG" else column.sum())
    np.testing.assert_allclose(case.host(out2), np.full(rank + 1, expected), rtol=1e-5)


# -- all_to_all --------------------------------------------------------------------------------
def test_all_to_all_single_and_list(dist, case, rank, size):
    send = case.arr(np.arange(2 * size, dtype=np.int64) + 100 * rank)
    recv = case.arr(np.zeros(2 * size, np.int64))
    dist.all_to_all_single(recv, send, group=case.group)
    expected = np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r for r in range(size)])
    np.testing.assert_array_equal(case.host(recv), expected)
    # uneven: rank r sends j + 1 rows to rank j
    in_splits = [j + 1 for j in range(size)]
    out_splits = [rank + 1] * size
    send = case.arr(np.concatenate([np.full(j + 1, 10 * rank + j) for j in range(size)]))
    recv = case.arr(np.zeros(sum(out_splits), send.dtype))
    dist.all_to_all_single(recv, send, out_splits, in_splits, group=case.group)
    np.testing.assert_array_equal(case.host(recv),
                                  np.concatenate([np.full(rank + 1, 10 * r + rank)
                                                  for r in range(size)]))
    outs = [case.arr(np.zeros(3, np.float32)) for _ in range(size)]
    ins = [case.arr(np.full(3, 10 * rank + j, np.float32)) for j in range(size)]
    dist.all_to_all(outs, ins, group=case.group)
    for r in range(size):
        np.testing.assert_array_equal(case.host(outs[r]), np.full(3, 10 * r + rank))


# -- point to point ----------------------------------------------------------------------------
@pytest.mark.mpi(min_size=2)
def test_send_recv_ring_and_batch(dist, case, rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    if rank % 2 == 0:
        dist.send(case.arr(local(rank)), dst=right, group=case.group)
        got = case.arr(np.zeros(6, np.float32))
        assert dist.recv(got, src=left, group=case.group) == left
    else:
        got = case.arr(np.zeros(6, np.float32))
        assert dist.recv(got, src=left, group=case.group) == left
        dist.send(case.arr(local(rank)), dst=right, group=case.group)
    np.testing.assert_array_equal(case.host(got), local(left))
    out = case.arr(np.zeros(4, np.int16))
    ops = [dist.P2POp(dist.irecv, out, left, case.group),
           dist.P2POp(dist.isend, case.arr(np.full(4, rank, np.int16)), right, case.group)]
    works = dist.batch_isend_irecv(ops)
    for work in works:
        work.wait()
    np.testing.assert_array_equal(case.host(out), np.full(4, left))


@pytest.mark.mpi(min_size=2)
def test_p2p_before_any_collective(dist, case, rank, size):
    """A fresh group whose first GPU call is a send/recv between one pair."""
    backend = "mpi" if case.backend == "mpi" else GPU
    pg = dist.new_group(list(range(size)), backend=backend)
    try:
        pairs = size - size % 2
        if rank < pairs:
            peer = rank + 1 if rank % 2 == 0 else rank - 1
            buf = case.arr(np.full(5, rank, np.float64))
            if rank % 2 == 0:
                dist.send(buf, dst=peer, group=pg)
            else:
                dist.recv(buf, src=peer, group=pg)
                np.testing.assert_array_equal(case.host(buf), np.full(5, peer))
        x = case.arr(np.ones(3, np.float32))
        dist.all_reduce(x, group=pg)
        np.testing.assert_array_equal(case.host(x), np.full(3, size))
    finally:
        dist.destroy_process_group(pg)


# -- Work and futures --------------------------------------------------------------------------
def test_work_future_and_result(dist, case, rank, size):
    x = case.arr(np.full(4, rank + 1, np.float32))
    work = dist.all_reduce(x, group=case.group, async_op=True)
    fut = work.get_future()
    value = fut.wait()
    assert len(value) == 1 and value[0] is x
    assert work.is_completed() and work.is_success()
    np.testing.assert_array_equal(case.host(x), np.full(4, size * (size + 1) / 2))


def test_nccl_recv_needs_a_source(dist, case, rank, size):
    if case.backend != "nccl":
        pytest.skip("NCCL-only restriction")
    with pytest.raises(dist.DistError, match="any source"):
        dist.recv(case.arr(np.zeros(1, np.float32)), group=case.group)


# -- pure helpers (no device needed) ------------------------------------------------------------
def test_reduction_plans_cover_what_nccl_lacks():
    import types

    from hpccomm.backends.cuda.nccl_plan import make_plan

    nccl = types.SimpleNamespace(
        NCCL_SUM=0, NCCL_PROD=1, NCCL_MAX=2, NCCL_MIN=3, NCCL_AVG=4, NCCL_INT8=0,
        NCCL_UINT8=1, NCCL_INT32=2, NCCL_UINT32=3, NCCL_INT64=4, NCCL_UINT64=5,
        NCCL_FLOAT16=6, NCCL_FLOAT32=7, NCCL_FLOAT64=8, NCCL_BFLOAT16=9)
    op = __import__("hpccomm").ReduceOp
    plan = make_plan(nccl, np.dtype(np.complex64), op.SUM, True)
    assert (plan.mode, plan.nccl_type, plan.unit) == ("native", 7, np.dtype(np.float32))
    assert make_plan(nccl, np.dtype(np.complex64), op.PRODUCT, True).mode == "gather"
    assert make_plan(nccl, np.dtype(np.int32), op.BXOR, True).mode == "gather"
    assert make_plan(nccl, np.dtype(bool), op.SUM, True).nccl_op == nccl.NCCL_MAX
    assert make_plan(nccl, np.dtype(bool), op.BAND, True).nccl_op == nccl.NCCL_MIN
    staged = make_plan(nccl, np.dtype(np.int16), op.SUM, True)
    assert staged.mode == "stage" and staged.stage == np.dtype(np.int32)
    assert make_plan(nccl, np.dtype(np.float32), op.AVG, True)[2:] == (4, np.dtype("f4"), None,
                                                                        False)
    old = make_plan(nccl, np.dtype(np.float32), op.AVG, False)  # NCCL < 2.10: sum, divide
    assert old.nccl_op == nccl.NCCL_SUM and old.divide


def test_bfloat16_bit_conversions_round_to_nearest_even():
    from hpccomm.backends.cuda import device as _cuda

    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.array([1.0, -2.5, 3.14159, 1e-3, 65504.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8],
                      np.float32)
    bits = _cuda.float32_to_bf16_bits(np, values)
    np.testing.assert_array_equal(bits, values.astype(ml_dtypes.bfloat16).view(np.uint16))
    back = _cuda.bf16_bits_to_float32(np, bits)
    np.testing.assert_array_equal(back, values.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert _cuda.float32_to_bf16_bits(np, np.array([np.nan], np.float32))[0] == 0x7FC0


def test_device_choice_is_fixed_by_device_id_or_local_rank():
    from hpccomm.backends.cuda import device as _cuda

    assert _cuda.choose_device(None, 5, 4) == 1
    assert _cuda.choose_device(2, 0, 4) == 2
    with pytest.raises(Exception, match="out of range"):
        _cuda.choose_device(4, 0, 4)
    with pytest.raises(Exception, match="no CUDA device"):
        _cuda.choose_device(None, 0, 0)


def test_nccl_available_matches_the_machine():
    """True only with CuPy, a visible device and NCCL; False here without them."""
    assert NCCL_AVAILABLE_AT_IMPORT is (GPU_SKIP is None)
