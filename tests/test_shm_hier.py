"""Hierarchical all_reduce for groups that span nodes (hpccomm/backends/shm/hier.py):
reduce-scatter through shared memory within each node, MPI across nodes, all-gather
within the node. Groups here are made as two simulated nodes (``HPCCOMM_NODES=2``, also
in the ordinary one-machine runs), or are the default group where the job itself runs
as two nodes. Integer results must equal the exact sum bit for bit, floating ones the
flat MPI path's up to reassociation."""
import os

import numpy as np
import pytest

from helpers import numpy_dtype as dtype_of

pytest.importorskip("ml_dtypes")

COUNTS = [1, 3, 1001, 4099, 1 << 16]  # fewer elements than ranks, odd, many ring slots
#: A dtype of each size and kind (the whole table, helpers.NUMPY_DTYPES, in test_shm.py).
DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64",
          "complex128"]
#: Looser than helpers.RTOL for the half types: the hierarchical sum adds in another order.
RTOL = {"float16": 2e-2, "bfloat16": 5e-2, "float32": 1e-5, "float64": 1e-12,
        "complex128": 1e-12}


@pytest.fixture(scope="module")
def groups(world):
    """``(hierarchical group, flat MPI group)`` of every rank, the first made as two
    nodes of consecutive ranks, sharing memory for every message size."""
    import hpccomm as dist

    ranks = list(range(dist.get_world_size()))
    saved = {k: os.environ.get(k) for k in ("HPCCOMM_NODES", "HPCCOMM_SHM_MIN_BYTES",
                                              "HPCCOMM_SHM")}
    os.environ.update(HPCCOMM_NODES="2", HPCCOMM_SHM_MIN_BYTES="1")
    try:
        hier = dist.new_group(ranks)
        os.environ["HPCCOMM_SHM"] = "0"
        flat = dist.new_group(ranks)
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.update({name: value})
    yield hier, flat
    dist.destroy_process_group(hier)
    dist.destroy_process_group(flat)


def values(name, count, seed):
    rng = np.random.default_rng(seed)
    dtype = dtype_of(name)
    if dtype.kind in "iu":  # 8-bit sums wrap around
        return rng.integers(0, 100, count).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(dtype)
    return rng.uniform(-1, 1, count).astype(dtype)


def exact(dist, flat, data, op):
    """The reduction of every rank's integer ``data`` by NumPy, in ``data``'s dtype."""
    every = np.empty(data.size * flat.size(), data.dtype)
    dist.all_gather_into_tensor(every, data, group=flat)  # moves bytes only
    ufunc = {dist.ReduceOp.SUM: np.add, dist.ReduceOp.MAX: np.maximum,
             dist.ReduceOp.MIN: np.minimum}[op]
    return ufunc.reduce(every.reshape(flat.size(), -1), axis=0, dtype=data.dtype)


@pytest.mark.mpi(min_size=4)
def test_groups_of_two_nodes_of_two_ranks_or_more_are_hierarchical(groups, size):
    from hpccomm.backends.shm.hier import HierarchicalCommunicator

    hier, flat = groups
    assert isinstance(hier.cpu, HierarchicalCommunicator) == (size % 2 == 0)
    assert not isinstance(flat.cpu, HierarchicalCommunicator)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("name", DTYPES)
def test_all_reduce_matches_the_flat_path(groups, dist, rank, size, name):
    hier, flat = groups
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN]
    if name == "complex128":
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.AVG]
    elif dtype_of(name).kind == "f" or name == "bfloat16":
        ops.append(dist.ReduceOp.AVG)
    for op in ops:
        for count in COUNTS:
            data = values(name, count, seed=1000 * rank + count)
            got, want = data.copy(), data.copy()
            dist.all_reduce(got, op=op, group=hier)
            dist.all_reduce(want, op=op, group=flat)
            if name in RTOL:
                np.testing.assert_allclose(got.astype(np.complex128), want.astype(np.complex128),
                                           rtol=RTOL[name], atol=RTOL[name],
                                           err_msg=f"{name} {op} n={count}")
            else:  # integers: the exact result
                assert np.array_equal(got, exact(dist, flat, data, op)), (name, op, count)
            every = np.empty(count * size, got.dtype)
            dist.all_gather_into_tensor(every, got, group=flat)
            rows = every.view(np.uint8).reshape(size, -1)
            assert (rows == rows[0]).all(), f"ranks disagree: {name} {op} n={count}"


@pytest.mark.mpi(min_size=4)
def test_async_and_other_operations_on_a_hierarchical_group(groups, dist, rank, size):
    hier, _ = groups
    bufs = [np.full(5000 + i, float(rank + i)) for i in range(3)]
    works = [dist.all_reduce(b, group=hier, async_op=True) for b in bufs]
    for work in reversed(works):
        work.wait()
    for i, b in enumerate(bufs):
        assert (b == sum(range(size)) + size * i).all()
    out = np.empty(4 * size, np.int64)
    dist.all_gather_into_tensor(out, np.full(4, rank, np.int64), group=hier)  # MPI's
    assert np.array_equal(out, np.repeat(np.arange(size), 4))
    flag = np.array([rank % 2 == 0])
    dist.all_reduce(flag, group=hier)  # booleans: the flat path (logical OR)
    assert flag[0]
