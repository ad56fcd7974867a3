"""Dtypes and reduction ops: torch's test_c10d_common.py (AbstractCommTest dtype tests,
ReduceOpTest) and the complex denylist of distributed_c10d.supports_complex, on NumPy.

The ``*_coalesced`` calls of the dtype-mismatch test are not ported (see NOT_PORTED.md).
"""
import copy
import pickle

import numpy as np
import pytest

import hpccomm
from hpccomm import ReduceOp

ALL_OPS = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX,
           ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


@pytest.mark.mpi(min_size=2)
def test_tensor_dtype_mismatch(dist, rank, size):
    """CommTest.test_tensor_dtype_mismatch: mixed dtypes are a ValueError, raised on every
    rank before anything is sent (so the group stays usable)."""
    tensor = np.ones((2, 2), dtype=np.float32) * 7
    tensor_h = tensor.astype(np.float16)
    tensor_list = [np.zeros((2, 2), dtype=np.float32) for _ in range(size)]
    tensor_list_h = list(tensor_list)
    tensor_list_h[1] = tensor_list_h[1].astype(np.float16)
    calls = [lambda: dist.all_gather(tensor_list_h, tensor),
             lambda: dist.all_gather(tensor_list, tensor_h),
             lambda: dist.reduce_scatter(tensor, tensor_list_h),
             lambda: dist.reduce_scatter(tensor_h, tensor_list),
             lambda: dist.all_to_all_single(tensor_h, tensor),
             lambda: dist.all_to_all(tensor_list_h, tensor_list),
             lambda: dist.all_to_all(tensor_list, tensor_list_h),
             lambda: dist.scatter(tensor, tensor_list_h),
             lambda: dist.gather(tensor_h, tensor_list),
             lambda: dist.gather(tensor, tensor_list_h),
             lambda: dist.scatter(tensor_h, tensor_list)]
    for call in calls:
        with pytest.raises(ValueError):
            call()
    x = np.ones(1)
    dist.all_reduce(x)  # nothing half-sent: the group still works
    assert x[0] == size


@pytest.mark.mpi(min_size=1)
def test_tensor_dtype_complex(dist, rank, size):
    """CommTest.test_tensor_dtype_complex: complex arrays meet arrays of their element
    type (torch views complex tensors as real)."""
    rng = np.random.default_rng(rank)
    tensor = rng.random(2, dtype=np.float32)
    tensor_c = tensor.view(np.complex64)
    tensor_list = [np.zeros(2, dtype=np.float32) for _ in range(size)]
    tensor_list_c = list(tensor_list)
    tensor_list_c[min(1, size - 1)] = np.zeros(1, dtype=np.complex64)
    expected = [np.random.default_rng(r).random(2, dtype=np.float32) for r in range(size)]
    for outputs, value in [(tensor_list, tensor), (tensor_list, tensor_c),
                           (tensor_list_c, tensor), (tensor_list_c, tensor_c)]:
        dist.all_gather(outputs, value)
        for out, want in zip(outputs, expected):
            np.testing.assert_array_equal(out.view(np.float32), want)


@pytest.mark.mpi(min_size=1)
def test_bool_tensors(dist, rank, size):
    """CommTest.test_bool_tensors."""
    tensor = np.array([1, 0, 0, 1], dtype=bool)
    zeros = np.zeros(4, dtype=bool)
    outensor = zeros if rank > 0 else tensor.copy()
    dist.broadcast(outensor, src=0)
    np.testing.assert_array_equal(outensor, tensor)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_denylist(dist, rank, size, dtype):
    """distributed_c10d.supports_complex: MAX, MIN, PRODUCT, BAND, BOR and BXOR raise
    ValueError on complex tensors; SUM and AVG work."""
    for op in (ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT, ReduceOp.BAND, ReduceOp.BOR,
               ReduceOp.BXOR):
        with pytest.raises(ValueError, match="complex"):
            dist.all_reduce(np.ones(2, dtype=dtype), op=op)
    x = np.full(2, 1 + 2j, dtype=dtype) * (rank + 1)
    dist.all_reduce(x, op=ReduceOp.SUM)
    np.testing.assert_allclose(x, np.full(2, (1 + 2j) * size * (size + 1) / 2))
    y = np.full(2, 1 + 2j, dtype=dtype) * (rank + 1)
    dist.all_reduce(y, op=ReduceOp.AVG)
    np.testing.assert_allclose(y, np.full(2, (1 + 2j) * (size + 1) / 2), rtol=1e-6)


def test_op_isinstance_of_reduceop():
    """ReduceOpTest.test_op_isinstance_of_reduceop."""
    for reduce_op in ALL_OPS:
        assert isinstance(reduce_op, ReduceOp)
    for scale in (np.float64(1.0), 2.0):
        assert isinstance(hpccomm._make_nccl_premul_sum(scale), ReduceOp)
        premul_sum = ReduceOp.PREMUL_SUM(scale)
        assert isinstance(premul_sum, ReduceOp)
        assert premul_sum.factor == scale


def test_reduceop_copyable():
    """ReduceOpTest.test_reduceop_copyable."""
    for reduce_op in ALL_OPS:
        assert copy.copy(reduce_op) == reduce_op
        assert copy.deepcopy(reduce_op) == reduce_op
        assert copy.copy(ReduceOp(reduce_op)) == reduce_op
        assert copy.deepcopy(ReduceOp(reduce_op)) == reduce_op
    for scale in (np.float64(1.0), 2.0):
        reduce_op = hpccomm._make_nccl_premul_sum(scale)
        assert copy.copy(reduce_op) == reduce_op
        assert copy.deepcopy(reduce_op) == reduce_op


def test_reduceop_pickle():
    """ReduceOpTest.test_reduceop_pickle."""
    for reduce_op in ALL_OPS:
        pickle.loads(pickle.dumps(reduce_op))
        orig = ReduceOp(reduce_op)
        assert pickle.loads(pickle.dumps(orig)) == orig
    for scale in (np.float64(1.0), 2.0):
        reduce_op = hpccomm._make_nccl_premul_sum(scale)
        assert pickle.loads(pickle.dumps(reduce_op)) == reduce_op


def test_reduceop_equal():
    """ReduceOpTest.test_reduceop_equal (torch's last assertion, RedOpType != ReduceOp,
    is its own TODO; hpccomm's enum members compare equal to a plain ReduceOp of them)."""
    not_reduceop = "abc"
    for reduce_op in ALL_OPS:
        reduce_op_obj = ReduceOp(reduce_op)
        assert reduce_op_obj == reduce_op_obj
        assert reduce_op_obj == reduce_op
        assert reduce_op_obj != not_reduceop
        assert reduce_op != not_reduceop
        assert None not in (reduce_op, reduce_op_obj)
        assert not_reduceop not in (reduce_op, reduce_op_obj)
