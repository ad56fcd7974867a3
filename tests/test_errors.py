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
    with pytest.raises(hpccomm.DistValueError, match="src .* not part of group"):
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


def test_failures_on_the_synchronous_path_are_described(dist, rank):
    """A sync call builds no Work; when its poll fails or times out, the error still names
    the operation, its sequence number, the rank and the group (a Work is made then)."""
    from hpccomm import _call
    from hpccomm.group import resolve

    pg = resolve(None, "test")
    x = np.zeros(3, dtype=np.float32)

    def broken():
        raise OSError("link down")

    with pytest.raises(hpccomm.DistBackendError) as info:
        _call.launch(pg, "all_reduce", lambda: (broken, None, None), (), x, False)
    message = str(info.value)
    assert f"all_reduce (seq {pg.seq})" in message and f"rank {rank}/" in message
    assert "shape (3,) float32" in message and "link down" in message
    assert isinstance(info.value.__cause__, OSError)

    alone, _ = dist.new_subgroups(group_size=1)  # no roll call traffic between ranks
    with pytest.raises(hpccomm.DistTimeoutError) as info:
        _call.launch(alone, "broadcast", lambda: (lambda: False, None, None), (), x, False,
                     peer=0, timeout=0.05)
    message = str(info.value)  # the root, a group rank, is named by its global rank
    assert f"broadcast (seq {alone.seq}) from root {rank}," in message
    assert "timed out" in message and "timeout 0.05 s" in message
    assert f"'{alone.group_name}'" in message
    dist.destroy_process_group(alone)

    def copy_out_fails():
        raise ValueError("cannot copy")
    with pytest.raises(hpccomm.DistBackendError, match="cannot copy"):
        _call.launch(pg, "all_gather", lambda: (lambda: True, None, None), (), x, False,
                     after=copy_out_fails)
    done = []
    assert _call.launch(pg, "recv", lambda: (lambda: True, lambda: 7, None), (), x, False,
                        after=lambda: done.append(1)) == 7 and done == [1]
