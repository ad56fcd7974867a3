"""What the GPU check needs, found or missing, in this interpreter (run by run_gpu_check.sh).

Usage: python gpu/preflight.py OUT.json

Prints one line per component ("have" or "MISSING", and why) and writes the facts as
JSON. Required: mpi4py, pytest, pytest-mpi, CuPy, NCCL (as hpccomm's NCCL backend loads
it) and at least one GPU; optional: torch and ml_dtypes. Exit status: 0 when nothing
required is missing, else 1, after a last line listing what is missing.
"""
import importlib
import json
import platform
import sys


def version_of(name):
    module = importlib.import_module(name)
    return str(getattr(module, "__version__", "installed"))


def main(path):
    facts = {"host": platform.node(), "python": f"{platform.python_version()} "
                                                f"({sys.executable})"}
    missing = []

    def have(key, value):
        facts[key] = value
        print(f"[preflight] have {key}: {value}")

    def lack(key, why, required=True):
        facts[key] = f"missing: {why}"
        print(f"[preflight] {'MISSING' if required else 'optional, not here:'} {key}: {why}")
        if required:
            missing.append(key)

    for key, module in (("mpi4py", "mpi4py"), ("pytest", "pytest"),
                        ("pytest-mpi", "pytest_mpi")):
        try:
            have(key, version_of(module))
        except Exception as exc:
            lack(key, f"{type(exc).__name__}: {exc}")
    for key in ("torch", "ml_dtypes"):
        try:
            value = version_of(key)
            if key == "torch":
                torch = sys.modules["torch"]
                value += (f", CUDA {torch.version.cuda}, cuda available: "
                          f"{torch.cuda.is_available()}")
            have(key, value)
        except Exception as exc:
            lack(key, f"{type(exc).__name__}: {exc}", required=False)
    try:
        import hpccomm

        have("hpccomm", f"{hpccomm.__version__} ({hpccomm.__path__[0]})")
    except Exception as exc:
        lack("hpccomm", f"{type(exc).__name__}: {exc}")
    gpus = []
    try:
        cupy = importlib.import_module("cupy")
        simulated = getattr(cupy, "SIMULATED", False)
        have("cupy", cupy.__version__ + (" (tests/gpu_sim, a stand-in: no real GPU is "
                                          "checked)" if simulated else ""))
        runtime = cupy.cuda.runtime
        for key, probe in (("cuda_runtime", "runtimeGetVersion"),
                           ("cuda_driver", "driverGetVersion")):
            try:
                have(key, getattr(runtime, probe)())
            except Exception as exc:
                lack(key, f"{type(exc).__name__}: {exc}", required=False)
        try:
            for index in range(runtime.getDeviceCount()):
                name = runtime.getDeviceProperties(index)["name"]
                gpus.append(name.decode() if isinstance(name, bytes) else str(name))
        except Exception as exc:
            print(f"[preflight] counting GPUs failed: {type(exc).__name__}: {exc}")
    except Exception as exc:
        lack("cupy", f"{type(exc).__name__}: {exc} (pip install hpccomm[gpu] or "
                     f"hpccomm[gpu-cuda13])")
    if "cupy" not in missing:
        try:
            from hpccomm.backends.cuda import nccl, nccl_lib

            have("nccl", ".".join(map(str, nccl.version())))
            have("nccl_library", nccl_lib.status())
        except Exception as exc:
            from hpccomm.backends.cuda import nccl_lib

            lack("nccl", f"{type(exc).__name__}: {exc}; {nccl_lib.status()}")
    facts["gpus"] = gpus
    if gpus:
        have("GPUs", f"{len(gpus)}: {', '.join(gpus)}")
    else:
        lack("GPUs", "none visible (CUDA_VISIBLE_DEVICES? driver?)" if "cupy" not in missing
             else "cannot count without CuPy")
    facts["missing"] = missing
    with open(path, "w") as handle:
        json.dump(facts, handle, indent=2, default=str)
        handle.write("\n")
    if missing:
        print(f"[preflight] missing, required: {', '.join(missing)}")
        return 1
    print("[preflight] everything required is here")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
