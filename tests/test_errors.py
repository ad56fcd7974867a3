"""Bad input gets a clear error naming rank, group, operation and what was wrong."""
import numpy as np
import pytest

import hpccomm

pytestmark = pytest.mark.mpi(min_size=1)


def test_bitwise_op_on_float_names_op_and_dtype(dist, rank):
    with pytest.raises(hpccomm.DistValueError) as info:
        dist.all_reduce(np.ones(2), op=dist.ReduceOp.BAND)
    message = str(info.value)
    assert "all_reduce" in message and f"rank {rank}" in message and "WORLD" in message
    assert "BAND" in message and "float64" in message


def test_avg_on_integers_and_minmax_on_complex(dist):
    with pytest.raises(hpccomm.DistValueError, match="AVG needs a floating"):
        dist.all_reduce(np.ones(2, dtype=np.int32), op=dist.ReduceOp.AVG)
    with pytest.raises(hpccomm.DistValueError, match="complex"):
        dist.all_reduce(np.ones(2, dtype=np.complex64), op=dist.ReduceOp.MAX)
    with pytest.raises(hpccomm.DistValueError, match="factor"):
        dist.all_reduce(np.ones(2), op=dist.ReduceOp.PREMUL_SUM)
    with pytest.raises(hpccomm.DistValueError, match="ReduceOp"):
        dist.all_reduce(np.ones(2), op="sum")


def test_unsupported_dtype_and_types(dist):
    with pytest.raises(hpccomm.DistValueError, match="cannot be communicated"):
        dist.broadcast(np.array([object()]), src=0)
    with pytest.raises(hpccomm.DistValueError, match="expected a NumPy or CuPy array"):
        dist.all_reduce([1.0, 2.0])


def test_output_must_be_contiguous_and_writable(dist):
    with pytest.raises(hpccomm.DistValueError, match="not C-contiguous"):
        dist.all_reduce(np.ones((4, 4))[:, 0])
    read_only = np.ones(3)
    read_only.flags.writeable = False
    with pytest.raises(hpccomm.DistValueError, match="read-only"):
        dist.all_reduce(read_only)


def test_size_and_dtype_mismatches(dist, size):
    with pytest.raises(hpccomm.DistValueError, match="group size x input size"):
        dist.all_gather_into_tensor(np.zeros(size * 3 + 1), np.zeros(3))
    with pytest.raises(hpccomm.DistValueError, match="expected float64"):
        dist.all_gather_into_tensor(np.zeros(size * 3), np.zeros(3, dtype=np.float32))
    with pytest.raises(hpccomm.DistValueError, match="one per rank"):
        dist.all_gather([np.zeros(1)] * (size + 1), np.zeros(1))
    with pytest.raises(hpccomm.DistValueError, match="group size x output size"):
        dist.reduce_scatter_tensor(np.zeros(2), np.zeros(2 * size + 1))
    with pytest.raises(hpccomm.DistValueError, match="split sizes"):
        dist.all_to_all_single(np.zeros(size), np.zeros(size), [1] * size, [2] * size)


def test_bad_roots(dist, size):
    with pytest.raises(hpccomm.DistValueError, match="src .* not a member"):
        dist.broadcast(np.zeros(1), src=size)
    with pytest.raises(hpccomm.DistValueError, match="required"):
        dist.broadcast(np.zeros(1))
    with pytest.raises(hpccomm.DistValueError, match="out of range"):
        dist.reduce(np.zeros(1), group_dst=size)
    with pytest.raises(hpccomm.DistValueError, match="gather_list is required"):
        dist.gather(np.zeros(1), None, dst=dist.get_rank())


def test_double_init_is_an_error(dist):
    with pytest.raises(hpccomm.DistValueError, match="already initialized"):
        dist.init_process_group()


def test_errors_are_runtime_and_value_errors(dist):
    with pytest.raises(RuntimeError):
        dist.broadcast(np.zeros(1), src=-5)
    with pytest.raises(ValueError):
        dist.broadcast(np.zeros(1), src=-5)
