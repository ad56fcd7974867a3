"""Run MPI tests against the C helpers built with AddressSanitizer and
UndefinedBehaviorSanitizer, and with warnings as errors.

The helpers (``_small.c``, ``_pair.c``, ``_direct.c``) read and write shared memory and
other processes' buffers by address: an overrun or a misaligned access there corrupts
another rank's data silently. This script

1. copies the package and the tests into ``.test-reports/sanitize-<pid>/`` (the working
   tree's own build stays as it is);
2. builds the helpers there with ``-fsanitize=address,undefined
   -fno-sanitize-recover=undefined -Wall -Wextra -Werror``: a warning, or a helper that
   fails to build, fails the run (the normal install builds them as optional);
3. runs ``tests/run_suite.py`` from the copy with the sanitizers' runtimes preloaded into
   every process (Python itself is not built with them), so the first invalid access
   aborts its rank, and the run fails. The sanitizers write their reports to files (a
   test's captured stderr would lose them with the process), printed at the end: any
   report fails the run.

Usage: python tests/sanitize.py [run_suite.py arguments: --ranks 2,4 --no-serial FILES]
"""
import os
import shutil
import subprocess
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
         "-fno-omit-frame-pointer", "-g", "-O1", "-Wall", "-Wextra", "-Werror"]
#: Every helper setup.py builds, as a path under the copy.
HELPERS = ["hpccomm/backends/mpi/_direct", "hpccomm/backends/shm/_pair",
           "hpccomm/backends/shm/_small"]
#: The sanitizers' settings: leaks are Python's own business (its allocator keeps
#: memory); any error ends the process at once; reports go to files under {reports}.
OPTIONS = {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1:"
                           "log_path={reports}/asan",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:log_path={reports}/ubsan"}


def runtimes(compiler: str) -> list:
    """The shared runtimes of the sanitizers, as the compiler that builds the helpers
    names them."""
    found = []
    for name in ("libasan.so", "libubsan.so"):
        path = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True,
                              text=True, check=True).stdout.strip()
        if not os.path.isabs(path) or not os.path.exists(path):
            sys.exit(f"sanitize.py: {compiler} has no {name} (install gcc's sanitizer "
                     f"runtimes, e.g. libasan8 and libubsan1)")
        found.append(path)
    return found


def copy_tree(target: str) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
    for name in ("hpccomm", "tests"):
        shutil.copytree(os.path.join(ROOT, name), os.path.join(target, name), ignore=ignore)
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), target)


def build(target: str) -> None:
    env = dict(os.environ, CFLAGS=" ".join(FLAGS), LDFLAGS=" ".join(FLAGS[:2]))
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                          cwd=target, env=env, capture_output=True, text=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    missing = [h for h in HELPERS if not os.path.exists(os.path.join(target, h + suffix))]
    if done.returncode or missing:
        print(done.stdout + done.stderr)
        sys.exit(f"sanitize.py: the C helpers did not build with {' '.join(FLAGS)}"
                 f"{': missing ' + ', '.join(missing) if missing else ''}")


def check_loaded(target: str, env: dict) -> None:
    """The copy's helpers are what Python imports, with the runtime loaded."""
    probe = ("import hpccomm.backends.shm._small as s, hpccomm.backends.shm._pair as p, "
             "hpccomm.backends.mpi._direct as d; print(s.__file__, p.__file__, d.__file__); "
             "print('libasan' in open('/proc/self/maps').read())")
    done = subprocess.run([sys.executable, "-c", probe], cwd=target, env=env,
                          capture_output=True, text=True)
    lines = done.stdout.split("\n")
    if done.returncode or not all(path.startswith(target) for path in lines[0].split()) \
            or lines[1] != "True":
        sys.exit(f"sanitize.py: the sanitized helpers are not the ones loaded:\n"
                 f"{done.stdout}{done.stderr}")


def main() -> int:
    target = os.path.join(ROOT, ".test-reports", f"sanitize-{os.getpid()}")
    reports = os.path.join(target, "reports")
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(reports)
    try:
        copy_tree(target)
        build(target)
        compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
        env = dict(os.environ, LD_PRELOAD=" ".join(runtimes(compiler)),
                   **{name: value.format(reports=reports) for name, value in OPTIONS.items()})
        check_loaded(target, env)
        print(f"sanitize.py: helpers built with {' '.join(FLAGS)}; runtimes preloaded",
              flush=True)
        code = subprocess.run([sys.executable, os.path.join(target, "tests", "run_suite.py"),
                               *sys.argv[1:]], cwd=target, env=env).returncode
        found = sorted(os.listdir(reports))
        for name in found:
            with open(os.path.join(reports, name), errors="replace") as handle:
                print(f"----- sanitizer report {name} -----\n{handle.read()[-20000:]}")
        if found:
            print(f"FAILED sanitizers: {len(found)} report(s) above")
        return code or (1 if found else 0)
    finally:
        shutil.rmtree(target, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
