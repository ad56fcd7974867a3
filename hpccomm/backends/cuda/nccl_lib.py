"""Finding the NCCL library of the ``nvidia-nccl-cu12`` / ``nvidia-nccl-cu13`` wheel.

``cupy.cuda.nccl`` needs ``libnccl.so.2`` to be loadable, and the dynamic loader does
not look inside Python packages: with the wheel installed (``pip install
hpccomm[gpu]`` or ``hpccomm[gpu-cuda13]``) but its ``lib`` folder not on
``LD_LIBRARY_PATH``, CuPy would report NCCL as missing. So before ``cupy.cuda.nccl`` is
first imported (:func:`hpccomm.backends.cuda.nccl.nccl_module`), :func:`preload` loads
the wheel's ``nvidia/nccl/lib/libnccl.so.2`` with ``RTLD_GLOBAL``; the loader then
satisfies CuPy's ``libnccl.so.2`` with it, whatever ``LD_LIBRARY_PATH`` says.

Once per process, and only on the GPU path: ``import hpccomm`` does none of it. A
``libnccl`` already in the process (loaded by torch, or by an earlier import) is left as
it is, and without a wheel the system's search (``LD_LIBRARY_PATH``, ``ldconfig``)
decides, as before.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import threading
from typing import Iterable, List, Optional

#: The library's name as CuPy's NCCL module asks the loader for it.
SONAME = "libnccl.so.2"
#: Where the wheels put it, relative to a ``sys.path`` entry: ``nvidia-nccl-cu12`` and
#: ``nvidia-nccl-cu13`` both use ``nvidia/nccl/lib``; ``nvidia/cu13/lib`` is where the
#: other CUDA 13 wheels put their libraries, looked at last.
WHEEL_DIRS = (os.path.join("nvidia", "nccl", "lib"), os.path.join("nvidia", "cu13", "lib"))
#: The wheels' distribution names (for reports).
WHEELS = ("nvidia-nccl-cu12", "nvidia-nccl-cu13")

_lock = threading.Lock()
_status: Optional[str] = None


def _spec_dirs() -> List[str]:
    """The ``lib`` folders of the importable ``nvidia.nccl`` package (no import of it)."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    return [os.path.join(place, "lib") for place in (spec.submodule_search_locations or [])]


def candidates(roots: Optional[Iterable[str]] = None) -> List[str]:
    """Every existing ``libnccl.so.2`` of an installed NCCL wheel, best first.

    ``roots`` are the folders to look in (as ``sys.path`` entries: ``site-packages``);
    by default the ``nvidia.nccl`` package's own folder, then every ``sys.path`` entry.
    """
    dirs: List[str] = []
    if roots is None:
        dirs.extend(_spec_dirs())
        roots = sys.path
    for root in roots:
        dirs.extend(os.path.join(root or os.curdir, sub) for sub in WHEEL_DIRS)
    found: List[str] = []
    for folder in dirs:
        path = os.path.abspath(os.path.join(folder, SONAME))
        if path not in found and os.path.isfile(path):
            found.append(path)
    return found


def find_wheel_library(roots: Optional[Iterable[str]] = None) -> Optional[str]:
    """The wheel's ``libnccl.so.2`` to load, or ``None`` when no NCCL wheel is installed."""
    found = candidates(roots)
    return found[0] if found else None


def loaded_path() -> Optional[str]:
    """The file of the ``libnccl`` mapped into this process (Linux), or ``None``."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1]
                if os.path.basename(path).startswith("libnccl.so"):
                    return path
    except OSError:
        pass
    return None


def preload() -> str:
    """Load the NCCL wheel's library globally, once; returns how NCCL was found (also
    :func:`status`). Never raises: a failure is reported, and CuPy's own search runs."""
    global _status
    if _status is not None:
        return _status
    with _lock:
        if _status is None:
            _status = _preload()
    return _status


def _preload() -> str:
    already = loaded_path()
    if already:
        return f"already loaded: {already}"
    path = find_wheel_library()
    if path is None:
        return (f"no NCCL wheel ({' or '.join(WHEELS)}) found; {SONAME} is left to the "
                f"system's search (LD_LIBRARY_PATH, ldconfig)")
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        return f"could not load the wheel's {path} ({exc}); {SONAME} is left to the system"
    return f"from the wheel: {path}"


def status() -> str:
    """How NCCL was found, or that nothing was tried yet in this process."""
    return _status or "not loaded yet in this process"
