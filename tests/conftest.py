"""Shared fixtures: one initialized default group per test session under mpiexec.

Tests marked ``@pytest.mark.mpi(min_size=N)`` run under ``mpiexec -n N`` with
pytest-mpi's ``--with-mpi``; the ``world`` fixture gives them the default group.
The session timeout is short (60 s) so that a broken test raises instead of hanging.
"""
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
