"""CMake install as a cluster module: configure, build, install into a temporary prefix,
``module load`` it with Debian's Lmod, import hpccomm from the prefix, run ``ctest``.

A module fixture installs cmake, a C compiler and lmod with apt-get if missing (skipping,
with the reason, where that is impossible) and does the configure/build/install once.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import apt_install_or_skip, job_env, run_job

ROOT = Path(__file__).resolve().parents[1]
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
NEEDED = {"cmake": "cmake", "cc": "gcc", "make": "make"}


def _version():
    from hpccomm import __version__
    return __version__


def _install_or_skip():
    missing = sorted({pkg for tool, pkg in NEEDED.items() if shutil.which(tool) is None})
    if not LMOD_INIT.exists():
        missing.append("lmod")
    if not missing:
        return
    apt_install_or_skip(missing, "the CMake module test")
    if not LMOD_INIT.exists() or shutil.which("cmake") is None:
        pytest.skip(f"installed {missing}, but cmake or Lmod's {LMOD_INIT} is still missing")


#: What the build and the module's shell do not inherit from this process: its launcher,
#: Slurm, pytest and hpccomm settings, its modules, and the PYTHONPATH to this checkout.
CLEAN = ("SLURM_*", "PYTEST_*", "HPCCOMM_*", "LMOD*", "MODULE*", "PYTHONPATH")


def _clean_env():
    return job_env({}, CLEAN)


class Installed:
    def __init__(self, base: Path):
        self.build = base / "build"
        self.prefix = base / "prefix"
        self.version = _version()
        self.modules = self.prefix / "share" / "modulefiles"
        self.site = (self.prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
                     / "site-packages")

    def step(self, *cmd, timeout=300):
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                env=_clean_env())
        assert result.returncode == 0, (f"{cmd} failed:\n{result.stdout[-4000:]}\n"
                                        f"{result.stderr[-4000:]}")
        return result

    def with_module(self, script, timeout=600, cwd="/"):
        """Run bash ``script`` after ``module load hpccomm/<version>``."""
        text = (f"set -e\nsource {LMOD_INIT}\nmodule use {self.modules}\n"
                f"module load hpccomm/{self.version}\n{script}\n")
        return run_job(["bash", "-c", text], clean=CLEAN, limit=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if sys.platform != "linux":
        pytest.skip("the CMake/Lmod test runs on Linux only")
    _install_or_skip()
    if not (Path(sys.executable).with_name("mpicc").exists() or shutil.which("mpicc")):
        pytest.skip("needs the MPI library's C compiler wrapper mpicc (the hello program): "
                    "Intel MPI's runtime wheel impi-rt has none")
    inst = Installed(tmp_path_factory.mktemp("cmake"))
    inst.step("cmake", "-S", str(ROOT), "-B", str(inst.build),
              f"-DPython3_EXECUTABLE={sys.executable}", f"-DCMAKE_INSTALL_PREFIX={inst.prefix}",
              "-DHPCCOMM_TEST_RANKS=1;2", "-DHPCCOMM_TEST_INSTALLED=ON",
              f"-DHPCCOMM_TEST_SELECT={ROOT / 'tests' / 'test_pytest_plugin.py'}")
    inst.step("cmake", "--build", str(inst.build))
    inst.step("cmake", "--install", str(inst.build))
    return inst


def test_install_tree(installed):
    assert (installed.site / "hpccomm" / "__init__.py").is_file()
    backends = installed.site / "hpccomm" / "backends"
    assert (backends / "mpi" / "communicator.py").is_file()
    helpers = (("mpi", "_direct"), ("shm", "_pair"), ("shm", "_small"))
    for family, helper in helpers:  # the C helpers, built
        assert list((backends / family).glob(f"{helper}.*.so")), sorted(backends.rglob("*"))
    dist_info = installed.site / f"hpccomm-{installed.version}.dist-info"
    assert "hpccomm.pytest_plugin" in (dist_info / "entry_points.txt").read_text()
    assert os.access(installed.prefix / "bin" / "hpccomm", os.X_OK)
    assert os.access(installed.prefix / "bin" / "hpccomm-mpi-hello", os.X_OK)
    assert (installed.prefix / "share" / "hpccomm" / "jobscripts" / "slurm_cpu.sbatch").is_file()
    modulefile = (installed.modules / "hpccomm" / f"{installed.version}.lua").read_text()
    assert f'local prefix = "{installed.prefix}"' in modulefile


def test_module_load_imports_hpccomm_from_the_prefix(installed):
    result = installed.with_module(
        "module list 2>&1\necho PYTHONPATH=$PYTHONPATH\necho HPCCOMM=$(command -v hpccomm)\n"
        "python -c 'import hpccomm, importlib.metadata as m; "
        "print(\"FILE\", hpccomm.__file__); print(\"VERSION\", m.version(\"hpccomm\"))'\n"
        "module unload hpccomm\necho AFTER=$PYTHONPATH")
    out = result.stdout
    assert result.code == 0, out + result.stderr
    assert f"hpccomm/{installed.version}" in out
    assert f"PYTHONPATH={installed.site}" in out
    assert f"HPCCOMM={installed.prefix}/bin/hpccomm" in out
    assert f"FILE {installed.site}/hpccomm/__init__.py" in out
    assert f"VERSION {installed.version}" in out
    assert "AFTER=\n" in out  # unloading restores the environment


def test_module_commands_run_a_job(installed):
    result = installed.with_module(
        "hpccomm run -n 2 $HPCCOMM_ROOT/share/hpccomm/jobscripts/hello.py\n"
        "mpiexec -n 2 hpccomm-mpi-hello\nhpccomm info --no-mpi | grep location")
    out = result.stdout
    assert result.code == 0, out + result.stderr
    assert out.count("allreduce sum 1") == 2
    assert "mpi hello: rank 1 of 2" in out
    assert f"location: {installed.site}/hpccomm" in out


def test_ctest_under_the_mpi_launcher(installed):
    result = installed.with_module(f"ctest --test-dir {installed.build} --output-on-failure",
                                   timeout=900)
    out = result.stdout
    assert result.code == 0, out[-6000:] + result.stderr[-2000:]
    assert "100% tests passed" in out
    passed = {line.split()[3] for line in out.splitlines()
              if line.strip().endswith("sec") and "Passed" in line and "Test #" in line}
    assert {"mpi_hello_2", "hello_py_2", "pytest_mpi_1", "pytest_mpi_2",
            "hpccomm_info"} <= passed, out
