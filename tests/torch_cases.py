"""What the torch backend's test modules share: torch itself (a module that imports this
one is skipped, saying why, where torch or ``hpccomm.torch`` is missing), the timeout of
the groups they make, torch's default group on each name of the backend
(``torch_world``) with its ``rank`` and ``size``, and
:func:`assert_close`.
"""
import datetime
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install "
                                            "'hpccomm[torch]'); the torch backend is untested")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("hpccomm.torch")

#: The timeout of the torch groups the tests make (``HPCCOMM_TEST_TIMEOUT``, as the
#: suite's own default group).
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("HPCCOMM_TEST_TIMEOUT", "60")))


@pytest.fixture(scope="module", params=["hpccomm", "mpi"])
def torch_world(request):
    """torch's default group on each name of the backend (``"hpccomm"`` through
    ``mpi://``, and torch's own ``"mpi"``), for a module's tests; the name."""
    if request.param == "mpi":
        dist.init_process_group("mpi", timeout=TIMEOUT)
    else:
        dist.init_process_group("hpccomm", init_method="mpi://", timeout=TIMEOUT)
    yield request.param
    dist.destroy_process_group()


@pytest.fixture
def rank(torch_world):
    """This rank in torch's default group (the module's ``torch_world`` fixture)."""
    return dist.get_rank()


@pytest.fixture
def size(torch_world):
    return dist.get_world_size()


def assert_close(actual, expected):
    """``actual`` equals ``expected`` (in ``actual``'s dtype): exactly for integers and
    bool, to round-off for floating and complex dtypes (wider for 16-bit floats)."""
    if actual.dtype is torch.bool or not (actual.is_floating_point() or actual.is_complex()):
        assert torch.equal(actual, expected.to(actual.dtype)), (actual, expected)
    else:
        tol = 2e-2 if actual.dtype in (torch.float16, torch.bfloat16) else 1e-6
        torch.testing.assert_close(actual, expected.to(actual.dtype), rtol=tol, atol=tol)
