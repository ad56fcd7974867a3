"""Setting up the GPU path, checked without a GPU: the install extras, finding the NCCL
wheel's library, what ``hpccomm info`` says, the shared-GPU error's logic and the
offline GPU check (``gpu/run_gpu_check.sh --offline``) against the simulated CuPy.

The shared-GPU error between real ranks is in ``tests/test_gpu_lifecycle.py``
(2 ranks, simulated devices with chosen UUIDs).
"""
import configparser
import ctypes
import json
import os
import subprocess
import sys

import pytest

from hpccomm.backends.cuda import nccl_lib, shared_gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIM_PATH = os.path.join(ROOT, "tests", "gpu_sim")


def _env(*paths, **extra):
    """This interpreter's environment with PYTHONPATH = the checkout, then ``paths``."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *paths])
    env.update(extra)
    return env


# -- extras ------------------------------------------------------------------------------------
def test_extras_name_the_cuda_12_and_13_wheels():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    extras = config["options.extras_require"]
    wheels = {name: extras[name].split() for name in ("gpu", "gpu-cuda13")}
    assert wheels == {"gpu": ["cupy-cuda12x", "nvidia-nccl-cu12"],
                      "gpu-cuda13": ["cupy-cuda13x", "nvidia-nccl-cu13"]}


# -- finding NCCL ------------------------------------------------------------------------------
def _fake_wheel(root, sub=("nvidia", "nccl", "lib")):
    """A site-packages folder with a dummy ``libnccl.so.2`` where the wheel puts it."""
    folder = root.joinpath(*sub)
    folder.mkdir(parents=True)
    library = folder / "libnccl.so.2"
    library.write_bytes(b"not a library")
    return str(library)


def test_the_finder_finds_the_wheels_library(tmp_path):
    site = tmp_path / "site-packages"
    library = _fake_wheel(site)
    assert nccl_lib.find_wheel_library([str(tmp_path / "elsewhere"), str(site)]) == library
    assert nccl_lib.find_wheel_library([str(tmp_path / "elsewhere")]) is None


def test_the_finder_looks_in_the_cuda_13_folder_last(tmp_path):
    only13 = tmp_path / "a"
    library13 = _fake_wheel(only13, ("nvidia", "cu13", "lib"))
    assert nccl_lib.find_wheel_library([str(only13)]) == library13
    both = tmp_path / "b"
    library = _fake_wheel(both)
    _fake_wheel(both, ("nvidia", "cu13", "lib"))
    assert nccl_lib.candidates([str(both)])[0] == library


def test_the_finder_searches_the_nvidia_package_and_sys_path(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    library = _fake_wheel(site)
    def nvidia_modules():
        return [n for n in sys.modules if n == "nvidia" or n.startswith("nvidia.")]

    for name in nvidia_modules():
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [str(site)])
    try:
        assert nccl_lib.find_wheel_library() == library
    finally:  # the fake "nvidia" package must not outlive the test
        for name in nvidia_modules():
            del sys.modules[name]


@pytest.fixture
def fresh_preload(monkeypatch):
    """``nccl_lib.preload`` as in a new process, with ``ctypes.CDLL`` recorded, never called."""
    loads = []

    def fake_cdll(path, mode=0):
        loads.append((path, mode))
        return object()

    monkeypatch.setattr(nccl_lib, "_status", None)
    monkeypatch.setattr(nccl_lib.ctypes, "CDLL", fake_cdll)
    monkeypatch.setattr(nccl_lib, "loaded_path", lambda: None)
    return loads


def test_preload_loads_the_wheels_library_globally_once(tmp_path, monkeypatch, fresh_preload):
    library = _fake_wheel(tmp_path)
    monkeypatch.setattr(nccl_lib, "find_wheel_library", lambda roots=None: library)
    assert nccl_lib.preload() == f"from the wheel: {library}"
    assert nccl_lib.preload() == nccl_lib.status() == f"from the wheel: {library}"
    assert fresh_preload == [(library, ctypes.RTLD_GLOBAL)]


def test_preload_leaves_a_loaded_nccl_and_a_missing_wheel_alone(monkeypatch, fresh_preload):
    monkeypatch.setattr(nccl_lib, "find_wheel_library", lambda roots=None: None)
    assert nccl_lib.status() == "not loaded yet in this process"
    assert "no NCCL wheel" in nccl_lib.preload() and "LD_LIBRARY_PATH" in nccl_lib.status()
    monkeypatch.setattr(nccl_lib, "_status", None)
    monkeypatch.setattr(nccl_lib, "loaded_path", lambda: "/opt/nccl/lib/libnccl.so.2")
    assert nccl_lib.preload() == "already loaded: /opt/nccl/lib/libnccl.so.2"
    assert fresh_preload == []


def test_preload_reports_a_library_that_does_not_load(tmp_path, monkeypatch):
    library = _fake_wheel(tmp_path)
    monkeypatch.setattr(nccl_lib, "_status", None)
    monkeypatch.setattr(nccl_lib, "loaded_path", lambda: None)
    monkeypatch.setattr(nccl_lib, "find_wheel_library", lambda roots=None: library)

    def refuse(path, mode=0):
        raise OSError(f"{path}: invalid ELF header")

    monkeypatch.setattr(nccl_lib.ctypes, "CDLL", refuse)
    assert nccl_lib.preload().startswith(f"could not load the wheel's {library}")


def test_importing_hpccomm_loads_no_nccl():
    code = ("import sys, hpccomm\nfrom hpccomm.backends.cuda import nccl_lib\n"
            "print(nccl_lib.status(), 'cupy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=_env())
    assert done.stdout.strip() == "not loaded yet in this process False", done.stderr


# -- hpccomm info ------------------------------------------------------------------------------
def _info(*paths, **extra):
    done = subprocess.run([sys.executable, "-m", "hpccomm", "info", "--no-mpi", "--json"],
                          capture_output=True, text=True, timeout=60,
                          env=_env(*paths, **extra))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["CuPy / NCCL / GPUs"]


def test_info_without_cupy_says_so():
    gpu = _info()
    if "not importable" not in gpu["cupy"]:
        pytest.skip("CuPy is installed here")
    assert "hpccomm[gpu]" in gpu["cupy"] and "hpccomm[gpu-cuda13]" in gpu["cupy"]
    assert gpu["NCCL"].startswith("not probed")
    for wheel in ("cupy-cuda12x", "cupy-cuda13x", "nvidia-nccl-cu12", "nvidia-nccl-cu13"):
        assert wheel in gpu


def test_info_reports_the_cuda_nccl_and_cupy_it_loaded():
    gpu = _info(SIM_PATH)
    if "simulated" not in gpu["cupy"]:
        pytest.skip("a real CuPy shadows the simulated one")
    assert gpu["cupy"].startswith("0.0-simulated")
    assert gpu["NCCL"] == "2.21.5"  # the simulation's get_version() 22105
    assert gpu["NCCL split"].startswith("yes: groups split from their parent's"), gpu
    assert "CUDA runtime" in gpu and "CUDA driver" in gpu
    assert gpu["NCCL library"].startswith(("no NCCL wheel", "from the wheel", "already"))
    assert gpu["GPUs"] == ["0: simulated, 1.0 GiB"]


def test_info_says_which_nccl_binding_makes_the_communicators(tmp_path):
    """CuPy's by default; nccl4py when asked, with how creation waits, the ids a large
    group takes and what a shrink does; nccl4py asked for and missing says what to
    install (and the rest of the report goes on)."""
    gpu = _info(SIM_PATH)
    if "simulated" not in gpu["cupy"]:
        pytest.skip("a real CuPy shadows the simulated one")
    assert gpu["NCCL binding"].startswith("CuPy's cupy.cuda.nccl: blocking creation"), gpu
    gpu = _info(SIM_PATH, HPCCOMM_NCCL_NONBLOCKING="1", HPCCOMM_NCCL_RANKS_PER_ROOT="64")
    line = gpu["NCCL binding"]
    for needle in ("nccl4py ", "nonblocking creation: past the group's timeout",
                   "one unique id per 64 ranks (ncclCommInitRankScalable)",
                   "ncclCommShrink needs NCCL 2.27"):  # the simulation's NCCL is 2.21
        assert needle in line, (needle, line)
    assert gpu["NCCL split"].startswith("yes"), gpu
    (tmp_path / "cupy").symlink_to(os.path.join(SIM_PATH, "cupy"))  # and no nccl4py
    gpu = _info(str(tmp_path), HPCCOMM_NCCL_BINDING="nccl4py")
    assert "pip install nccl4py" in gpu.get("NCCL binding", ""), gpu


def test_cuda_versions_read_as_major_minor():
    from hpccomm.cli.info import cuda_version

    assert (cuda_version(13000), cuda_version(12080), cuda_version(0)) == \
        ("13.0", "12.8", "unknown (0)")


# -- the shared-GPU check's logic ------------------------------------------------------------------
UUID = bytes(range(16))


def test_uuids_print_as_nvidia_smi_does():
    assert shared_gpu.format_uuid(UUID) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert shared_gpu.format_uuid(None) == shared_gpu.format_uuid(b"\0" * 16) == ""
    assert shared_gpu.format_uuid("MIG-abc") == "MIG-abc"


def test_an_unreadable_uuid_skips_the_check():
    class Runtime:
        @staticmethod
        def getDeviceProperties(index):
            return {"name": b"old"}

    class NoUuid:
        cuda = type("cuda", (), {"runtime": Runtime})

    class Broken:
        class cuda:
            class runtime:
                @staticmethod
                def getDeviceProperties(index):
                    raise RuntimeError("cudaErrorInvalidDevice")

    assert shared_gpu.device_uuid(NoUuid, 0) == shared_gpu.device_uuid(Broken, 0) == ""
    table = [(0, 0, "h", ""), (1, 0, "h", "")]
    assert shared_gpu.conflicts(table) == []


def test_records_survive_the_exchange():
    me = (12, 3, "node-7.cluster", shared_gpu.format_uuid(UUID))
    record = shared_gpu.encode(me)
    assert record.nbytes == shared_gpu.RECORD_BYTES
    assert shared_gpu.decode(record) == me


def test_the_error_names_ranks_host_device_and_ways_out():
    uuid = shared_gpu.format_uuid(UUID)
    table = [(0, 0, "n1", uuid), (1, 1, "n1", "GPU-b"), (2, 0, "n1", uuid), (3, 0, "n2", "")]
    assert shared_gpu.conflicts(table) == [[0, 2]]
    text = shared_gpu.message(table, shared_gpu.conflicts(table))
    assert text.startswith("hpccomm NCCL backend: NCCL needs one GPU per rank, but ranks 0 "
                           f"and 2 of the group share one GPU: host n1, cuda:0, UUID {uuid}. ")
    for needle in ("NCCL_ERROR_INVALID_USAGE", "ranks per node", "CUDA_VISIBLE_DEVICES",
                   "device_id=", 'backend="mpi"', '"cpu:mpi,cuda:mpi"'):
        assert needle in text
    # a sub-group: world ranks named too; one GPU under two indices
    table = [(4, 0, "n1", "U"), (6, 1, "n1", "U")]
    text = shared_gpu.message(table, shared_gpu.conflicts(table))
    assert "ranks 0 and 1 of the group (world ranks 4 and 6) share one GPU: host n1, " \
           "cuda:0 on rank 0, cuda:1 on rank 1, UUID U" in text


# -- the offline GPU check -------------------------------------------------------------------------
def _offline_check(tmp_path, *paths, **extra):
    env = _env(*paths, PYTHON=sys.executable, GPU_CHECK_OUT=str(tmp_path / "out"),
               GPU_CHECK_RANKS="1", GPU_BENCH_ARGS="--max-bytes 4096 --iters 5 --repeats 2",
               **extra)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return subprocess.run(["bash", os.path.join(ROOT, "gpu", "run_gpu_check.sh"), "--offline"],
                          capture_output=True, text=True, timeout=170, env=env, cwd=str(tmp_path))


def test_the_offline_check_runs_against_the_simulation(tmp_path):
    if subprocess.run([sys.executable, "-c", "import pytest_mpi"]).returncode != 0:
        pytest.skip("pytest-mpi is not installed")
    done = _offline_check(tmp_path, SIM_PATH)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for needle in ("offline:", "[preflight] have mpi4py", "[preflight] have cupy: 0.0-simulated",
                   "[preflight] have nccl: 2.21.5", "[preflight] have GPUs: 1",
                   "everything required is here", "tests at 1 rank(s)", "benchmark at 1 rank(s)",
                   "Overall status: 0"):
        assert needle in out, (needle, out)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| 1 | exit 0: " in summary and " passed" in summary, summary
    assert "check ok" in summary, summary
    facts = json.loads((tmp_path / "out" / "environment.json").read_text())
    assert facts["missing"] == [] and facts["gpus"] == ["simulated"]
    called = os.path.exists(os.path.join(ROOT, "benchmarks", "studies", "gpu_call_cost.py"))
    assert ("call-cost benchmark at 1 rank" in out) is called, out


def test_the_offline_check_lists_what_is_missing(tmp_path):
    done = _offline_check(tmp_path)  # no simulated CuPy on the path
    if "[preflight] have cupy" in done.stdout:
        pytest.skip("CuPy is installed here")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "[preflight] MISSING cupy" in done.stdout
    assert "missing, required: cupy, GPUs" in done.stdout, done.stdout
    assert "tests at" not in done.stdout
