"""Many operations in flight at once: torch's test_c10d_gloo.py ``*_stress`` tests
(1000 async operations, all started before any is waited for), on NumPy arrays.

torch waits on each Work's future and reads its value; so do these.
"""
import numpy as np
import pytest

pytestmark = pytest.mark.mpi(min_size=1)

ITERATIONS = 1000


def test_broadcast_stress(dist, rank, size):
    """ProcessGroupGlooTest.test_broadcast_stress."""
    inputs = [np.array([i * size + rank]) for i in range(ITERATIONS)]
    works = [dist.broadcast(inputs[i], src=i % size, async_op=True)
             for i in range(ITERATIONS)]
    for i, work in enumerate(works):
        work.wait()
        assert inputs[i].tolist() == [i * size + i % size], f"iteration {i}"


def test_allreduce_stress(dist, rank, size):
    """ProcessGroupGlooTest.test_allreduce_stress."""
    inputs = [np.array([i + rank]) for i in range(ITERATIONS)]
    futures = [dist.all_reduce(inputs[i], async_op=True).get_future()
               for i in range(ITERATIONS)]
    for i, future in enumerate(futures):
        future.wait()
        assert future.value()[0].tolist() == [i * size + size * (size - 1) // 2], \
            f"iteration {i}"


def test_scatter_stress(dist, rank, size):
    """ProcessGroupGlooTest.test_scatter_stress: every rank is root in every iteration."""
    inputs = [[np.array([i + rank]) for _ in range(size)] for i in range(ITERATIONS)]
    outputs = [[np.array([-1]) for _ in range(size)] for _ in range(ITERATIONS)]
    futures = []
    for i in range(ITERATIONS):
        for root in range(size):
            scatter_list = [e.copy() for e in inputs[i]] if root == rank else None
            work = dist.scatter(outputs[i][root], scatter_list, src=root, async_op=True)
            futures.append(work.get_future())
    for index, future in enumerate(futures):
        future.wait()
        iteration, root = divmod(index, size)
        assert future.value()[0].tolist() == [iteration + root], \
            f"iteration {iteration}, root {root}"


def test_gather_stress(dist, rank, size):
    """ProcessGroupGlooTest.test_gather_stress."""
    inputs = [np.array([i + rank]) for i in range(ITERATIONS)]
    outputs = [[np.array([-1]) for _ in range(size)] for _ in range(ITERATIONS)]
    futures = []
    for i in range(ITERATIONS):
        for root in range(size):
            gather_list = outputs[i] if root == rank else None
            work = dist.gather(inputs[i].copy(), gather_list, dst=root, async_op=True)
            futures.append(work.get_future())
    for index, future in enumerate(futures):
        future.wait()
        iteration, root = divmod(index, size)
        if root == rank:
            assert [out.tolist() for out in future.value()] == \
                [[iteration + j] for j in range(size)], f"iteration {iteration}"


def test_allgather_stress(dist, rank, size):
    """ProcessGroupGlooTest.test_allgather_stress (torch keeps each input alive until
    its operation ends; so does hpccomm, whether or not the caller does)."""
    outputs = [[np.array([-1]) for _ in range(size)] for _ in range(ITERATIONS)]
    futures = [dist.all_gather(outputs[i], np.array([i + rank]), async_op=True).get_future()
               for i in range(ITERATIONS)]
    for i, future in enumerate(futures):
        future.wait()
        assert [out.tolist() for out in future.value()] == [[i + j] for j in range(size)], \
            f"iteration {i}"


def test_reduce_stress(dist, rank, size):
    """ProcessGroupGlooTest.test_reduce_stress."""
    inputs = [np.array([i + rank]) for i in range(ITERATIONS)]
    futures = []
    for i in range(ITERATIONS):
        for root in range(size):
            work = dist.reduce(inputs[i].copy(), dst=root, async_op=True)
            futures.append(work.get_future())
    for index, future in enumerate(futures):
        future.wait()
        iteration, root = divmod(index, size)
        if root == rank:
            assert future.value()[0].tolist() == \
                [iteration * size + size * (size - 1) // 2], f"iteration {iteration}"
