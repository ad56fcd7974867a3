"""What the GPU tests run on, written once: the real CuPy and NCCL where the machine has
them, else ``tests/gpu_sim``, a simulated CuPy and NCCL (host memory, each NCCL call done
with MPI) that runs the backend's own code where there is no GPU. The simulation checks
the backend's logic; it proves nothing about CUDA streams or the real NCCL, and it is not
used where a real CuPy is installed.

Cases (the ``case`` fixture a test module makes with :func:`case_fixture`):

* ``numpy-mpi``: NumPy arrays on the MPI backend, runs everywhere.
* ``cupy-nccl`` / ``cupy-mpi``: CuPy arrays on NCCL, and on MPI (CUDA-aware or staged
  through pinned memory). Marked ``gpu``; they skip with a reason unless CuPy, a CUDA
  device and NCCL are present (``gpu/run_gpu_check.sh`` runs them on a GPU machine).
* ``sim-nccl`` / ``sim-mpi``: the same tests on the simulated device.

Fixtures to import into a test module: ``case_groups`` (with a ``case`` fixture) and
``sim`` (the simulated ``cupy`` itself).
"""
import importlib.util
import os
import sys

import numpy as np
import pytest

SIM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_sim")

#: The backend string of a group whose GPU arrays go to NCCL.
GPU = "cpu:mpi,cuda:nccl"


def _gpu_skip_reason():
    if importlib.util.find_spec("cupy") is None:
        return "no CUDA device/CuPy/NCCL here: CuPy is not installed"
    from hpccomm.backends.cuda import nccl

    if not nccl.available():
        return "no CUDA device/CuPy/NCCL here: hpccomm.is_nccl_available() is False"
    return None


#: Why the real-GPU cases skip here (``None``: they run).
GPU_SKIP = _gpu_skip_reason()
#: hpccomm.is_nccl_available() as the machine answers it, before any simulation.
NCCL_AVAILABLE_AT_IMPORT = __import__("hpccomm").is_nccl_available()
REAL_CUPY = importlib.util.find_spec("cupy") is not None
_gpu = [pytest.mark.gpu, pytest.mark.skipif(GPU_SKIP is not None, reason=str(GPU_SKIP))]
_sim = [pytest.mark.skipif(REAL_CUPY, reason="a real CuPy is installed: the cupy-* cases "
                                             "run the backend for real")]
CASES = [
    pytest.param(("numpy", "mpi"), id="numpy-mpi"),
    pytest.param(("cupy", "nccl"), id="cupy-nccl", marks=_gpu),
    pytest.param(("cupy", "mpi"), id="cupy-mpi", marks=_gpu),
    pytest.param(("sim", "nccl"), id="sim-nccl", marks=_sim),
    pytest.param(("sim", "mpi"), id="sim-mpi", marks=_sim),
]
#: The simulated device's cases.
SIM_CASES = [case for case in CASES if case.id.startswith("sim-")]


def _reset_backend_caches():
    from hpccomm.backends.cuda import device as _cuda, nccl, nccl4py_binding

    nccl._available = None
    nccl4py_binding._lib = None
    _cuda._cupy = None
    _cuda.binding.device = None


#: Whether :func:`install_sim` put the simulation on the path (and so takes it off): not
#: when it was there already, as when ``gpu/run_gpu_check.sh --offline`` runs these tests
#: with the simulation standing in for a real CuPy.
_installed = []


def install_sim():
    """Put the simulated CuPy on the path (once per module)."""
    if SIM_PATH not in sys.path:
        sys.path.insert(0, SIM_PATH)
        _installed.append(SIM_PATH)
        _reset_backend_caches()
    import cupy

    assert getattr(cupy, "SIMULATED", False)
    return cupy


def uninstall_sim():
    if _installed:
        _installed.clear()
        sys.path.remove(SIM_PATH)
        for name in [n for n in sys.modules if n.split(".")[0] in ("cupy", "nccl")]:
            del sys.modules[name]
        _reset_backend_caches()


@pytest.fixture(scope="module")
def sim(world):
    """The simulated ``cupy`` (on the path for the module's tests)."""
    if REAL_CUPY:
        pytest.skip("a real CuPy is installed: the simulated device is not used")
    cupy = install_sim()
    yield cupy
    uninstall_sim()


def summed(cupy, dist, group, value):
    """``value`` all-reduced over ``group`` on the (simulated) GPU, as a float."""
    x = cupy.asarray(np.full(3, value, np.float32))
    dist.all_reduce(x, group=group)
    return float(cupy.asnumpy(x)[0])


def parts(size):
    """Two splits of the even and the odd ranks below the last; the last is in none."""
    return [p for p in ([r for r in range(size - 1) if r % 2 == 0],
                        [r for r in range(size - 1) if r % 2 == 1]) if p]


def sim_uuids(uuid=None):
    """Give this rank's simulated device 0 the UUID ``uuid`` (``None``: no UUID)."""
    import cupy

    cupy.cuda.uuids.clear()
    if uuid is not None:
        cupy.cuda.uuids[0] = uuid


@pytest.fixture(scope="module")
def case_groups(world):
    """The module's group of each case, made on first use, destroyed after its tests."""
    groups = {}
    yield groups
    import hpccomm

    for pg in groups.values():
        if hpccomm.is_initialized() and pg.live:
            hpccomm.destroy_process_group(pg)
    uninstall_sim()


class Case:
    """One (array library, backend) combination and its group."""

    def __init__(self, lib, backend, xp, group):
        self.lib, self.backend, self.xp, self.group = lib, backend, xp, group
        self.gpu = lib != "numpy"

    def arr(self, values, dtype=None):
        host = np.asarray(values, dtype=dtype)
        return self.xp.asarray(host) if self.gpu else host.copy()

    def host(self, x):
        return self.xp.asnumpy(x) if self.gpu else np.asarray(x)

    def __repr__(self):
        return f"{self.lib}-{self.backend}"


def case_fixture(params):
    """A ``case`` fixture over ``params`` (some of :data:`CASES`): each test of the module
    runs once per case, on the case's group of the whole world."""

    @pytest.fixture(params=params)
    def case(request, dist, case_groups):
        lib, backend = request.param
        xp = np
        if lib == "sim":
            xp = install_sim()
        elif lib == "cupy":
            import cupy as xp
        key = (lib, backend)
        pg = case_groups.get(key)
        if pg is None or not pg.live:
            spec = "mpi" if backend == "mpi" else GPU
            pg = case_groups[key] = dist.new_group(list(range(dist.get_world_size())),
                                                   backend=spec)
        return Case(lib, backend, xp, pg)

    return case
