"""What several test files share: running a case script as its own MPI job, reading its
``RESULT`` lines, and the dtypes NumPy arrays are tested with.

A *case script* (``tests/scripts/*_case.py``) runs one named scenario per job, often one
that ends a rank (a kill, a timeout, an abort), which the test process itself must
survive; each rank reports what it saw as ``RESULT rank=R key=value ...`` lines.
"""
import contextlib
import os
import re
import subprocess
import sys
import time
from typing import Dict, List, NamedTuple, Sequence, Tuple

import numpy as np
import pytest

from launcher_env import mpiexec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")


#: torch's launch variables (torchrun, env://): a job that must find its own rank and
#: rendezvous does not inherit them from the test process.
TORCH_LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT")


def job_env(env: Dict[str, object], clean: Sequence[str] = ()) -> Dict[str, str]:
    """The environment of a job a test starts: this process's, updated with ``env``
    (values made strings), without the variables of ``clean`` that ``env`` does not set."""
    full = dict(os.environ, **{name: str(value) for name, value in env.items()})
    for name in clean:
        if name not in env:
            full.pop(name, None)
    return full


class Job(NamedTuple):
    code: int       # mpiexec's exit status
    output: str     # stdout and stderr of every rank, together
    seconds: float  # wall time of the whole job


def run_case(script: str, case: str, n: int, limit: float = 90, clean: Sequence[str] = (),
             mpiexec_args: Sequence[str] = (), stdin: "str | None" = None, **env) -> Job:
    """``tests/scripts/<script> <case>`` as its own job of ``n`` ranks, killed after
    ``limit`` seconds. ``env``: variables for the job (values made strings); ``clean``:
    variables of this process's environment the job must not inherit unless ``env``
    sets them (a suite run at a debug level must not change what a case sees)."""
    full = job_env(env, clean)
    start = time.monotonic()
    done = subprocess.run([mpiexec(), *mpiexec_args, "-n", str(n), sys.executable,
                           os.path.join(SCRIPTS, script), case], cwd=ROOT, env=full,
                          input=stdin, capture_output=True, text=True, timeout=limit)
    return Job(done.returncode, done.stdout + done.stderr, time.monotonic() - start)


def result_lines(output: str) -> List[Tuple[int, Dict[str, str]]]:
    """``(rank, fields)`` of every ``RESULT rank=R key=value ...`` line, in order. A value
    runs to the next `` key=``, so the last one may hold spaces (an error message); text
    before ``RESULT`` on its line (a debugger's prompt) is skipped. The launcher may
    splice two ranks' lines into one (``...ok=1RESULT rank=0 ...``): each ``RESULT rank=``
    starts a report of its own."""
    found = []
    for line in re.sub(r"(?<!^)(?<!\n)(RESULT rank=)", r"\n\1", output).splitlines():
        line = line[line.find("RESULT "):]
        if line.startswith("RESULT "):
            fields = dict(re.findall(r"(\w+)=(.*?)(?= \w+=|$)", line[len("RESULT "):]))
            del fields["rank"]  # its value may run on: "rank=0 after breakpoint"
            found.append((int(re.search(r"rank=(\d+)", line).group(1)), fields))
    return found


# -- dtypes of NumPy arrays --------------------------------------------------------------------
INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOATS = ["float16", "float32", "float64", "bfloat16"]
COMPLEX = ["complex64", "complex128"]
#: Every dtype hpccomm communicates, by name (bfloat16 needs ml_dtypes).
NUMPY_DTYPES = ["bool"] + INTS + FLOATS + COMPLEX
#: Relative tolerance of a sum computed in another order than NumPy's, per float dtype.
RTOL = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12,
        "complex64": 1e-5, "complex128": 1e-12}


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a name of :data:`NUMPY_DTYPES` (bfloat16 from ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@contextlib.contextmanager
def environment(**values):
    """Set environment variables (``HPCCOMM_*`` settings read when a group is made) for
    the block, then restore them."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update({name: str(value) for name, value in values.items()})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def skip_below_thread_multiple(what: str) -> None:
    """Skip the calling test where MPI runs below ``MPI_THREAD_MULTIPLE`` (the suite's
    run at ``MPI_THREAD_SERIALIZED``): ``what`` needs that level by design."""
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip(f"{what} needs MPI_THREAD_MULTIPLE; this run is below it")


@pytest.fixture(name="rank")
def node_rank(dist, members):
    """This rank's place among its node's ranks (the rank in groups of those ranks). A
    test module that imports it has it as ``rank`` in place of conftest's."""
    return members.index(dist.get_rank())


@pytest.fixture(name="size")
def node_size(members):
    """The number of ranks on this node (the size of groups of those ranks), as ``size``."""
    return len(members)
