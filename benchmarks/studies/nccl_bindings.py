"""Which Python binding of NCCL to call: CuPy's ``cupy.cuda.nccl``, NVIDIA's ``nccl4py``
(its low-level ``nccl.bindings.nccl``) or ``ctypes`` over ``libnccl.so.2``.

Two questions, answered from what is installed, into ``docs/results/nccl_bindings.md``
(and ``.csv``):

* **What each binds** of what a communicator's life needs: creation with a config
  (``blocking = 0`` for a creation that can be polled and aborted on a deadline), split,
  shrink, creation from several roots, the asynchronous error query, abort, revoke.
  CuPy and nccl4py are asked by their names; ``ctypes`` binds whatever the loaded
  library exports (``dlsym``).
* **What a call costs**: the same ``ncclAllReduce`` (1024 float32) through each binding,
  each call timed alone (``perf_counter_ns``), the bindings interleaved in blocks, the
  median per binding. Two modes:

  - ``--stub`` (any machine, no GPU): the library is a stub compiled here (``gcc``)
    whose every call returns ``ncclSuccess`` at once, loaded first under the name
    ``libnccl.so.2``, so that CuPy and nccl4py both bind it; what is left is the
    binding's own cost (argument conversion, the call, the status check). Its creation
    and split block for a while instead, as NCCL's bootstrap does, to show whether
    other Python threads run meanwhile (a timer on a blocking creation needs that);
  - on a GPU (the default): one 1-rank communicator made by CuPy, the same handle given
    to nccl4py (``Comm(handle)``) and to ``ctypes``, the call enqueued on one stream
    (synchronized between blocks, untimed): the per-call cost with the real NCCL.

Run (``pip install cupy-cuda12x nvidia-nccl-cu12 nccl4py`` in the environment)::

    python benchmarks/studies/nccl_bindings.py --stub
    python benchmarks/studies/nccl_bindings.py            # on a GPU machine
"""
import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import interleaved, result, write_csv  # noqa: E402

#: The C functions a communicator's life needs, and what each is for.
LIFE = [
    ("ncclCommInitRankConfig", "creation with a config (blocking = 0: polled, abortable)"),
    ("ncclCommSplit", "split from a parent"),
    ("ncclCommShrink", "shrink after a failure (NCCL 2.27)"),
    ("ncclCommInitRankScalable", "creation from several roots (NCCL 2.23)"),
    ("ncclCommGetAsyncError", "asynchronous error / creation state"),
    ("ncclCommAbort", "abort"),
    ("ncclCommRevoke", "revoke (NCCL 2.28)"),
]
#: Where CuPy and nccl4py show each (``None``: not bound).
CUPY = {"ncclCommInitRankConfig": "NcclCommunicator(..., use_config) with NcclConfig",
        "ncclCommSplit": "NcclCommunicator.commSplit",
        "ncclCommGetAsyncError": "NcclCommunicator.check_async_error",
        "ncclCommAbort": "NcclCommunicator.abort"}
NCCL4PY = {"ncclCommInitRankConfig": "comm_init_rank_config", "ncclCommSplit": "comm_split",
           "ncclCommShrink": "comm_shrink", "ncclCommInitRankScalable":
           "comm_init_rank_scalable", "ncclCommGetAsyncError": "comm_get_async_error",
           "ncclCommAbort": "comm_abort", "ncclCommRevoke": "comm_revoke"}

#: Milliseconds the stub's creation functions take (they block, as NCCL's bootstrap does).
CREATION_MS = 300
#: The stub: creation blocks for :data:`CREATION_MS`, every other call returns at once.
STUB = r"""
#include <unistd.h>
int ncclGetVersion(int *version) { *version = %d; return 0; }
const char *ncclGetErrorString(int result) { return "stub"; }
const char *ncclGetLastError(void *comm) { return ""; }
int ncclCommGetAsyncError(void *comm, int *state) { *state = 0; return 0; }
""" + "".join(f"int {name}(void) {{ usleep({CREATION_MS * 1000}); return 0; }}\n"
              for name in ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommSplit")
              ) + "".join(f"int {name}(void) {{ return 0; }}\n" for name in (
    "ncclAllGather", "ncclAllReduce", "ncclBcast", "ncclBroadcast", "ncclCommAbort",
    "ncclCommCount", "ncclCommCuDevice", "ncclCommDestroy",
    "ncclCommInitAll", "ncclCommShrink", "ncclCommInitRankScalable", "ncclCommRevoke",
    "ncclCommFinalize", "ncclCommUserRank", "ncclGetUniqueId", "ncclGroupEnd",
    "ncclGroupStart", "ncclRecv", "ncclReduce", "ncclReduceScatter", "ncclSend"))


def load_stub(folder: str, version: int) -> str:
    """Compile and load (globally) the stub :data:`STUB` as ``libnccl.so.2``."""
    source, library = os.path.join(folder, "stub.c"), os.path.join(folder, "libnccl.so.2")
    with open(source, "w") as f:
        f.write(STUB % version)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wl,-soname,libnccl.so.2", "-o",
                    library, source], check=True)
    ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    return library


def loaded_nccl() -> str:
    """The file of the ``libnccl`` mapped into this process."""
    with open("/proc/self/maps") as maps:
        found = {line.split()[-1] for line in maps if "libnccl" in line}
    return ", ".join(sorted(found)) or "none"


def bindings():
    """``(cupy.cuda.nccl, nccl.bindings.nccl or None, ctypes library)``."""
    from hpccomm.backends.cuda import nccl_lib

    nccl_lib.preload()  # the NCCL wheel's library, unless one is loaded already
    from cupy.cuda import nccl as cupy_nccl
    try:
        from nccl.bindings import nccl as nccl4py
    except ImportError:
        nccl4py = None
    try:
        library = ctypes.CDLL(nccl_lib.loaded_path() or "libnccl.so.2")
    except OSError as exc:
        raise SystemExit(f"nccl_bindings: no NCCL library to call here ({exc}); "
                         f"install nvidia-nccl-cu12 (or use --stub with a real CuPy)")
    return cupy_nccl, nccl4py, library


def real_library(stub):
    """The library whose exports the ``ctypes`` column gives: the loaded one, or with
    ``--stub`` the NCCL wheel's (loaded privately beside the stub, only looked into)."""
    from hpccomm.backends.cuda import nccl_lib

    if not stub:
        return ctypes.CDLL(nccl_lib.loaded_path() or "libnccl.so.2"), "the loaded library"
    path = nccl_lib.find_wheel_library()
    if path is None:
        return None, "no NCCL wheel installed"
    library = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    version = ctypes.c_int()
    library.ncclGetVersion(ctypes.byref(version))
    return library, f"the NCCL wheel's library (NCCL {version.value})"


def bound_rows(cupy_nccl, nccl4py, library):
    """One row per function of :data:`LIFE`: how each binding reaches it."""
    def cupy_has(name):
        if name == "ncclCommInitRankConfig":
            fields = [f for f in dir(getattr(cupy_nccl, "NcclConfig", object))
                      if not f.startswith("_")]
            return f"NcclConfig fields: {', '.join(fields) or 'none'}" if fields else None
        where = CUPY.get(name)
        if where is None:
            return None
        owner, _, attr = where.partition(".")
        return where if hasattr(getattr(cupy_nccl, owner.split("(")[0], None), attr) else None
    rows = []
    for name, purpose in LIFE:
        try:
            exported = "yes" if library is not None and getattr(library, name) else "?"
        except AttributeError:
            exported = "no (this library)"
        py4 = NCCL4PY.get(name)
        rows.append({"function": name, "purpose": purpose,
                     "cupy": cupy_has(name) or "no",
                     "nccl4py": py4 if nccl4py is not None and hasattr(nccl4py, py4 or "-")
                     else ("not installed" if nccl4py is None else "no"),
                     "ctypes": exported})
    return rows


def others_run_during(make) -> str:
    """Whether another Python thread runs while ``make()`` blocks in the library (the
    binding releases the GIL there): what a timer on a blocking creation needs."""
    ticks, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(CREATION_MS / 1000 / 10)
    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    time.sleep(CREATION_MS / 1000 / 5)
    before = len(ticks)
    try:
        make()
    except Exception as exc:  # noqa: BLE001 - reported, not raised: a study
        return f"could not tell ({type(exc).__name__}: {exc})"
    finally:
        during = len(ticks) - before
        stop.set()
        thread.join()
    return f"yes ({during} ticks of another thread)" if during >= 5 else \
        f"no ({during} ticks of another thread)"


def creation_rows(cupy_nccl, nccl4py):
    """Whether each binding's creation and split let other threads run (``--stub``)."""
    rows = [{"binding": "cupy.cuda.nccl",
             "creation": others_run_during(
                 lambda: cupy_nccl.NcclCommunicator(2, bytes(128), 0)),
             "split": others_run_during(
                 lambda: cupy_nccl.NcclCommunicator.__new__(
                     cupy_nccl.NcclCommunicator).commSplit(0, 0))}]
    if nccl4py is not None:
        rows.append({"binding": "nccl4py",
                     "creation": others_run_during(lambda: nccl4py.comm_init_rank_config(
                         2, nccl4py.UniqueId(), 0, nccl4py.Config())),
                     "split": others_run_during(lambda: nccl4py.comm_split(
                         nccl4py.Comm(0), 0, 0, nccl4py.Config()))})
    return rows


def calls(cupy_nccl, nccl4py, library, stub):
    """``(variants, sync, keep)``: one ncclAllReduce through each binding."""
    count, f32, total = 1024, 7, 0  # ncclFloat32, ncclSum
    keep = []
    if stub:
        comm = cupy_nccl.NcclCommunicator.__new__(cupy_nccl.NcclCommunicator)
        handle, send, recv, stream = 0, 4096, 8192, 0
        sync = lambda: None  # noqa: E731
    else:
        import cupy

        comm = cupy_nccl.NcclCommunicator(1, cupy_nccl.get_unique_id(), 0)
        handle = comm.comm
        buf = cupy.zeros(count, dtype=cupy.float32)
        stream_obj = cupy.cuda.Stream(non_blocking=True)
        keep += [buf, stream_obj]
        send = recv = buf.data.ptr
        stream = stream_obj.ptr
        sync = stream_obj.synchronize
    keep.append(comm)
    function = library.ncclAllReduce
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                         ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    function.restype = ctypes.c_int

    def with_ctypes():
        status = function(send, recv, count, f32, total, handle or None, stream or None)
        if status:
            raise RuntimeError(f"ncclAllReduce returned {status}")
    variants = {"(an empty Python call: the timing's own cost)": lambda: None,
                "cupy.cuda.nccl": lambda: comm.allReduce(send, recv, count, f32, total,
                                                         stream),
                "ctypes": with_ctypes}
    if nccl4py is not None:
        wrapped = nccl4py.Comm(handle)
        keep.append(wrapped)
        variants["nccl4py"] = lambda: nccl4py.all_reduce(send, recv, count, f32, total,
                                                         wrapped, stream)
        # what hpccomm calls with HPCCOMM_NCCL_BINDING=nccl4py, and with
        # HPCCOMM_NCCL_NONBLOCKING=1 (each call then followed by one state query)
        from hpccomm.backends.cuda.nccl4py_binding import NcclCommunicator

        for nonblocking in (False, True):
            adopted = NcclCommunicator._adopt(wrapped, nonblocking, None)
            keep.append(adopted)
            name = ("hpccomm's nccl4py binding, nonblocking (+ ncclCommGetAsyncError)"
                    if nonblocking else "hpccomm's nccl4py binding")
            variants[name] = (lambda c: lambda: c.allReduce(send, recv, count, f32, total,
                                                             stream))(adopted)
    return variants, sync, keep


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stub", action="store_true",
                        help="time the bindings on a stub library (no GPU needed)")
    parser.add_argument("--stub-version", type=int, default=23203)
    parser.add_argument("--block", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument("--name", default=None, help="stem of the result files "
                        "(default nccl_bindings_stub or nccl_bindings_gpu)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.stub:
            load_stub(folder, args.stub_version)
        cupy_nccl, nccl4py, library = bindings()
        where = loaded_nccl()
        variants, sync, keep = calls(cupy_nccl, nccl4py, library, args.stub)
        samples = interleaved(variants, sync, args.block, args.blocks, warmup=200)
        exports, exports_of = real_library(args.stub)
        rows = bound_rows(cupy_nccl, nccl4py, exports)
        blocking = creation_rows(cupy_nccl, nccl4py) if args.stub else []
        del keep
    import cupy

    called = (f"a stub library reporting {cupy_nccl.get_version()}" if args.stub
              else f"NCCL {cupy_nccl.get_version()} ({where})")
    versions = (f"CuPy {cupy.__version__}, nccl4py "
                f"{getattr(sys.modules.get('nccl'), '__version__', None) or _dist('nccl4py')}"
                f", called: {called}, Python {sys.version.split()[0]}; the ctypes column: "
                f"{exports_of}")
    mode = ("stub library (each call returns at once, creation after "
            f"{CREATION_MS} ms): the binding's own cost"
            if args.stub else "real NCCL, 1-rank communicator, 4 KiB on one stream")
    stem = args.name or ("nccl_bindings_stub" if args.stub else "nccl_bindings_gpu")
    timing = []
    for name, times in samples.items():
        timing.append({"binding": name, "median_us": round(statistics.median(times) / 1e3, 3),
                       "p10_us": round(sorted(times)[len(times) // 10] / 1e3, 3),
                       "p90_us": round(sorted(times)[len(times) * 9 // 10] / 1e3, 3),
                       "calls": len(times)})
    write_csv(result(stem + ".csv"), timing)
    lines = [f"# NCCL bindings: {mode}", "", versions, "",
             "| binding | median µs per ncclAllReduce call | p10 | p90 | calls |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['binding']} | {r['median_us']:.3f} | {r['p10_us']:.3f} | "
              f"{r['p90_us']:.3f} | {r['calls']} |" for r in timing]
    lines += ["", "| function | for | CuPy | nccl4py | ctypes |", "|---|---|---|---|---|"]
    lines += [f"| `{r['function']}` | {r['purpose']} | {r['cupy']} | {r['nccl4py']} | "
              f"{r['ctypes']} |" for r in rows]
    if blocking:
        lines += ["", f"Other Python threads run while the binding's creation blocks "
                      f"({CREATION_MS} ms in the stub): what a deadline timer needs", "",
                  "| binding | ncclCommInitRank(Config) | ncclCommSplit |", "|---|---|---|"]
        lines += [f"| {r['binding']} | {r['creation']} | {r['split']} |" for r in blocking]
    with open(result(stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def _dist(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return "not installed"


if __name__ == "__main__":
    main()
