"""Shared fixtures: one initialized default group per test session under mpiexec.

Tests marked ``@pytest.mark.mpi(min_size=N)`` run under ``mpiexec -n N`` with
pytest-mpi's ``--with-mpi``; the ``world`` fixture gives them the default group.
The session timeout is short (60 s) so that a broken test raises instead of hanging,
and once a test has timed out the tests after it fail at once instead of each waiting
for the broken group in turn.
"""
import os

import pytest

SESSION_TIMEOUT_S = float(os.environ.get("HPCCOMM_TEST_TIMEOUT", "60"))


#: The test whose timeout left the default group unusable (a timeout abandons the
#: group's pending operations, so later tests on it could only time out in turn).
_BROKEN_BY = []


def _under_mpi(config) -> bool:
    return bool(config.getoption("--with-mpi", default=False))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None and not _BROKEN_BY:
        from hpccomm.errors import DistTimeoutError

        if call.excinfo.errisinstance(DistTimeoutError):
            _BROKEN_BY.append(item.nodeid)


@pytest.fixture(scope="session")
def world(request):
    """The default process group, created once per session (under mpiexec)."""
    import hpccomm as dist

    if not dist.is_initialized():
        dist.init_process_group(timeout=SESSION_TIMEOUT_S)
    yield dist.group.WORLD
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def dist(world):
    """``hpccomm`` with the default group initialized (re-initialized if a test tore it down)."""
    import hpccomm

    if _BROKEN_BY:  # fail at once rather than time out again
        pytest.fail(f"not run: the default group is unusable since {_BROKEN_BY[0]} timed "
                    f"out", pytrace=False)
    if not hpccomm.is_initialized():
        hpccomm.init_process_group(timeout=SESSION_TIMEOUT_S)
    return hpccomm


@pytest.fixture
def rank(dist):
    return dist.get_rank()


@pytest.fixture
def size(dist):
    return dist.get_world_size()


@pytest.fixture
def mesh_shape(size):
    """``mesh_shape(ndim)``: the world's ranks as ``ndim`` mesh dimensions, factors of 2
    dealt from the first, any odd rest to the first: 3 dimensions are (2, 2, 2) at 8
    ranks, (2, 2, 1) at 4, (3, 1, 1) at 3."""
    def shape(ndim):
        dims, rest, i = [1] * ndim, size, 0
        while rest % 2 == 0:
            dims[i % ndim] *= 2
            rest, i = rest // 2, i + 1
        dims[0] *= rest
        return tuple(dims)
    return shape


@pytest.fixture(scope="module")
def members(world):
    """The global ranks of this rank's node, in order (as hpccomm places them)."""
    from mpi4py import MPI

    from hpccomm.backends.mpi import placement

    node = placement.node_comm(world.comm)
    try:
        mine = node.Get_group()
        ours = world.comm.Get_group()
        try:
            return list(MPI.Group.Translate_ranks(mine, list(range(node.Get_size())), ours))
        finally:
            mine.Free()
            ours.Free()
    finally:
        node.Free()


@pytest.fixture
def small_group(dist, members):
    """A group of this node's ranks, made with shared memory on: the small channel at
    its default sizes (skipped on a node of one rank, or without the C helper)."""
    from helpers import environment
    from hpccomm.backends.shm import small

    if len(members) < 2:
        pytest.skip("one rank on this node: no shared memory to share")
    if not small.available():
        pytest.skip("the C helper _small is not built (no C compiler at install) or "
                    "HPCCOMM_SHM_SMALL=0")
    with environment(HPCCOMM_SHM="1"):
        group = dist.new_group(members, timeout=20)
    assert group.cpu.small is not None, "a group of one node's ranks has no small channel"
    yield group
    dist.destroy_process_group(group)
