"""Shared fixtures: one initialized default group per test session under mpiexec.

Tests marked ``@pytest.mark.mpi(min_size=N)`` run under ``mpiexec -n N`` with
pytest-mpi's ``--with-mpi``; the ``world`` fixture gives them the default group.
The session timeout is short (60 s) so that a broken test raises instead of hanging.
"""
import math
import os

import pytest

SESSION_TIMEOUT_S = float(os.environ.get("HPCCOMM_TEST_TIMEOUT", "60"))


def _under_mpi(config) -> bool:
    return bool(config.getoption("--with-mpi", default=False))


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
    dealt from the first: 3 dimensions are (2, 2, 2) at 8 ranks, (2, 2, 1) at 4."""
    def shape(ndim):
        dims = [1] * ndim
        for i in range(size.bit_length() - 1):
            dims[i % ndim] *= 2
        dims[0] *= size // math.prod(dims)
        return tuple(dims)
    return shape
