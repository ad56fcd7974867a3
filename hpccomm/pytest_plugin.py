"""pytest plugin for testing hpccomm programs under pytest-mpi (``mpiexec -n N pytest``).

Registered through the ``pytest11`` entry point, so it is active wherever hpccomm is
installed. Loading it never initializes MPI (importing the ``hpccomm`` package does not);
the default group is made only when a test asks for one of the fixtures.

Fixtures (distinct from pytest-mpi's ``mpi_tmp_path`` and from any project's own):

- ``hpccomm_world``: the default process group, initialized once per test session
  (timeout ``--hpccomm-timeout`` seconds) and destroyed at the end of the session.
- ``hpccomm_dist``: the ``hpccomm`` module with the default group initialized.
- ``hpccomm_tmp_path``: one empty directory per test, the same path on every rank
  (created by rank 0 and broadcast). On several nodes, point ``HPCCOMM_TEST_TMPDIR`` at
  a shared file system.

Option ``--hpccomm-rank0-output`` (or ini ``hpccomm_rank0_output = true``): only rank 0
writes to the terminal; other ranks write to ``--hpccomm-rank-log-dir`` (default: the
null device), so the output of ``mpiexec -n 4 pytest`` is read once, not four times.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

TMPDIR_ENV = "HPCCOMM_TEST_TMPDIR"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("hpccomm", "hpccomm (MPI tests)")
    group.addoption("--hpccomm-rank0-output", action="store_true", default=None,
                    help="only MPI rank 0 writes to the terminal")
    group.addoption("--hpccomm-rank-log-dir", default=None,
                    help="with --hpccomm-rank0-output: write rank R's output to "
                         "DIR/rank-R.log instead of discarding it")
    group.addoption("--hpccomm-timeout", type=float, default=None,
                    help="timeout in seconds of the session's default group (default 300)")
    parser.addini("hpccomm_rank0_output", "only MPI rank 0 writes to the terminal",
                  type="bool", default=False)
    parser.addini("hpccomm_timeout", "timeout in seconds of the session's default group",
                  default="300")


def _launcher_rank() -> int:
    from hpccomm._rank_env import launcher_rank

    stated = launcher_rank(os.environ)
    return stated[0] if stated else 0


def _redirect_other_ranks(config: Any) -> None:
    """With rank-0 output on, send this process's stdout/stderr away unless it is rank 0."""
    wanted = (getattr(config.known_args_namespace, "hpccomm_rank0_output", None)
              or config.getini("hpccomm_rank0_output"))
    rank = _launcher_rank()
    if not wanted or rank == 0:
        return
    log_dir = getattr(config.known_args_namespace, "hpccomm_rank_log_dir", None)
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        target = os.path.join(log_dir, f"rank-{rank}.log")
    else:
        target = os.devnull
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: Any, parser: Any, args: Any) -> Iterator[None]:
    """Redirect before pytest's output capture saves the terminal's file descriptors."""
    _redirect_other_ranks(early_config)
    yield


def _timeout(config: Any) -> float:
    value = config.getoption("--hpccomm-timeout")
    return float(value if value is not None else config.getini("hpccomm_timeout"))


@pytest.fixture(scope="session")
def hpccomm_world(pytestconfig: Any) -> Iterator[Any]:
    """The default process group over all ranks of the job, once per session."""
    import hpccomm

    created = not hpccomm.is_initialized()
    if created:
        hpccomm.init_process_group(timeout=_timeout(pytestconfig))
    yield hpccomm.group.WORLD
    if created and hpccomm.is_initialized():
        hpccomm.destroy_process_group()


@pytest.fixture
def hpccomm_dist(hpccomm_world: Any, pytestconfig: Any) -> Any:
    """The ``hpccomm`` module, its default group initialized (again, if a test destroyed it)."""
    import hpccomm

    if not hpccomm.is_initialized():
        hpccomm.init_process_group(timeout=_timeout(pytestconfig))
    return hpccomm


@pytest.fixture
def hpccomm_tmp_path(hpccomm_dist: Any, request: Any, tmp_path_factory: Any) -> Path:
    """An empty directory for this test with the same path on every rank."""
    name = [None]
    base = re.sub(r"\W", "_", request.node.name)[:30]
    if hpccomm_dist.get_rank() == 0:
        shared = os.environ.get(TMPDIR_ENV)
        if shared:
            os.makedirs(shared, exist_ok=True)
            name[0] = tempfile.mkdtemp(prefix=f"{base}-", dir=shared)
        else:
            name[0] = str(tmp_path_factory.mktemp(base, numbered=True))
    hpccomm_dist.broadcast_object_list(name, src=0)
    path = Path(name[0])
    hpccomm_dist.barrier()
    return path
