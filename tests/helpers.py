"""What several test files share: the one way a test starts a job, reading the job's
``RESULT`` lines, and the dtypes NumPy arrays are tested with.

**Starting a job.** Every program a test starts under MPI goes through :func:`run_job`
(or :func:`start_job`, for a test that acts while the job runs): ``run_job(argv, n=4)``
runs ``mpiexec -n 4 argv`` (``argv``: one rank's command line, such as
``[sys.executable, script, case]`` or ``[sys.executable, "-m", "pytest", ...]``) with the
mpiexec that ``hpccomm run`` would use (:func:`launcher_env.find_mpiexec`: the
``HPCCOMM_MPIEXEC`` setting, else the one next to this Python, else ``PATH``);
``n=None`` runs ``argv`` as a plain process (``python -c ...``, ``hpccomm run``, a job
script), with the same time limit and clean-up. The job

* gets this process's environment without any launcher's per-process variables (a test
  that runs under mpiexec itself must not hand its rank to the job), without the
  variables of ``clean``, and with ``env``;
* runs in a session of its own and ends when its last process does (a rank that its
  launcher left behind may still write); its output goes to files, so nothing is lost
  to a pipe that a stray process holds open. Past its time limit the launcher gets
  SIGTERM, then every process of the session is killed, ranks included, and the test
  fails showing the output the job wrote until then (``timeout_ok=True``: the
  :class:`Job` comes back with ``timed_out`` set instead);
* comes back as a :class:`Job`: exit status, stdout and stderr (and both together),
  seconds, and the ``RESULT`` lines of its ranks.

A *case script* (``tests/scripts/*_case.py``) runs one named scenario per job, often one
that ends a rank (a kill, a timeout, an abort), which the test process itself must
survive; each rank reports what it saw as ``RESULT rank=R key=value ...`` lines.
:func:`run_case` runs one.
"""
import contextlib
import dataclasses
import fnmatch
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pytest

from hpccomm.testing.parallel import session_processes
from launcher_env import find_mpiexec, without_launcher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")


#: torch's launch variables (torchrun, env://): a job that must find its own rank and
#: rendezvous does not inherit them from the test process.
TORCH_LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT")
#: Seconds a launcher past its time limit has to end its ranks (and remove its session
#: files) after SIGTERM, before the whole job is killed.
STOP_GRACE_S = 5


def job_env(env: Optional[Mapping[str, object]] = None,
            clean: Sequence[str] = ()) -> Dict[str, str]:
    """The environment of a job a test starts: this process's without a launcher's
    per-process variables and without the variables ``clean`` names (names, or patterns
    such as ``"SLURM_*"``), updated with ``env`` (values made strings; a variable that
    ``env`` sets is never cleaned)."""
    full = {name: value for name, value in without_launcher().items()
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in clean)}
    full.update({name: str(value) for name, value in (env or {}).items()})
    return full


@dataclasses.dataclass
class Job:
    """What a job left. It unpacks as ``code, output, seconds``."""
    code: int         # the launcher's exit status (the process's, without one); -N: signal N
    stdout: str       # every rank's stdout
    stderr: str       # every rank's stderr
    seconds: float    # wall time of the whole job
    timed_out: bool   # killed at its time limit
    command: List[str]

    @property
    def output(self) -> str:
        """stdout, then stderr."""
        return self.stdout + self.stderr

    @property
    def results(self) -> List[Tuple[int, Dict[str, str]]]:
        """The ranks' ``RESULT`` lines, as :func:`result_lines` reads them."""
        return result_lines(self.output)

    def __iter__(self):
        return iter((self.code, self.output, self.seconds))


def _text(data: bytes) -> str:
    """A job's bytes as text, newlines as ``text=True`` reads them (a rank killed
    mid-write may leave bytes that are no UTF-8, or NULs)."""
    text = data.decode("utf-8", "replace").replace("\0", "")
    return text.replace("\r\n", "\n").replace("\r", "\n")


class RunningJob:
    """A job started by :func:`start_job`; :meth:`finish` waits for it."""

    def __init__(self, command: List[str], cwd: str, env: Dict[str, str],
                 stdin: Optional[str], capture: bool):
        self.command = command
        self._outputs = [tempfile.TemporaryFile() for _ in range(2)] if capture else []
        source = subprocess.DEVNULL
        if stdin is not None:
            source = tempfile.TemporaryFile()
            source.write(stdin.encode())
            source.seek(0)
        self.started = time.monotonic()
        try:
            self.process = subprocess.Popen(
                command, cwd=cwd, env=env, stdin=source,
                stdout=self._outputs[0] if capture else None,
                stderr=self._outputs[1] if capture else None, start_new_session=True)
        finally:
            if stdin is not None:
                source.close()

    def poll(self) -> Optional[int]:
        """The launcher's exit status, ``None`` while it runs."""
        return self.process.poll()

    def processes(self) -> Optional[List[int]]:
        """The job's live processes: the launcher until it is reaped, and every process of
        its session (its ranks, which may sit in process groups of their own: Open
        MPI's do). ``None`` where there is no ``/proc`` to read them from."""
        leader = self.process.pid
        members = session_processes(leader)
        if members is None:
            return None
        # Only while the launcher is not reaped is its pid certainly still its own.
        return ([leader] if self.process.returncode is None else []) + members

    def kill(self) -> None:
        """SIGKILL every process of the job: the launcher and its ranks."""
        pids = self.processes()
        if pids is None:  # no /proc: the launcher's own process group
            pids = [-self.process.pid] if self.process.returncode is None else []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def finish(self, limit: float, timeout_ok: bool = False) -> Job:
        """Wait up to ``limit`` more seconds for the job to end (the launcher and every
        process it started), and return what it left. Past ``limit`` the launcher gets
        SIGTERM and :data:`STOP_GRACE_S` to end its ranks, then whatever is left of the
        job is killed, and the calling test fails showing the output so far
        (``timeout_ok``: the job comes back with ``timed_out`` set)."""
        deadline = time.monotonic() + limit
        timed_out = False
        try:
            try:
                self.process.wait(timeout=limit)
                # A rank the launcher left behind is still the job's (it may yet write).
                while self.processes() and time.monotonic() < deadline:
                    time.sleep(0.05)
                timed_out = bool(self.processes())
            except subprocess.TimeoutExpired:
                timed_out = True
                self.process.terminate()
                try:
                    self.process.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
        finally:  # also when the test itself is interrupted: the job goes with it
            self.kill()
            self.process.wait()
        seconds = time.monotonic() - self.started
        outputs = []
        for handle in self._outputs:
            handle.seek(0)
            outputs.append(_text(handle.read()))
            handle.close()
        stdout, stderr = outputs or ("", "")
        job = Job(self.process.returncode, stdout, stderr, seconds, timed_out, self.command)
        if timed_out and not timeout_ok:
            pytest.fail(f"{' '.join(self.command)}\nwas killed with its ranks after its "
                        f"time limit of {limit:g} s; its output until then:\n"
                        f"{job.output[-20000:]}", pytrace=False)
        return job


def launch_command(argv: Sequence[str], n: Optional[int] = None,
                   launcher_args: Sequence[str] = ()) -> List[str]:
    """The command line that runs ``argv`` as a job of ``n`` ranks: ``mpiexec
    [launcher_args] -n n argv`` (``n=None``: ``argv`` itself)."""
    command = [str(arg) for arg in argv]
    if n is None:
        if launcher_args:
            raise ValueError("launcher_args without a launcher (n=None)")
        return command
    return [find_mpiexec(), *map(str, launcher_args), "-n", str(n), *command]


def start_job(argv: Sequence[str], n: Optional[int] = None, *,
              env: Optional[Mapping[str, object]] = None, clean: Sequence[str] = (),
              launcher_args: Sequence[str] = (), cwd: "str | os.PathLike" = ROOT,
              stdin: Optional[str] = None, capture: bool = True) -> RunningJob:
    """Start ``argv`` as a job of ``n`` ranks (``mpiexec [launcher_args] -n n argv``;
    ``n=None``: ``argv`` alone, no launcher) in ``cwd``, in a session of its own.
    ``env``/``clean``: as :func:`job_env`. ``stdin``: the text the job reads (else
    nothing). ``capture=False``: its output goes to this process's, not to the
    :class:`Job`."""
    return RunningJob(launch_command(argv, n, launcher_args), str(cwd), job_env(env, clean),
                      stdin, capture)


def run_job(argv: Sequence[str], n: Optional[int] = None, *, limit: float = 90,
            timeout_ok: bool = False, **options) -> Job:
    """Run ``argv`` as a job of ``n`` ranks (``n=None``: as a plain process) and return
    what it left (see the module's docstring); ``limit``: its time limit in seconds.
    ``options``: those of :func:`start_job` (``env``, ``clean``, ``launcher_args``,
    ``cwd``, ``stdin``, ``capture``)."""
    return start_job(argv, n, **options).finish(limit, timeout_ok)


def run_case(script: str, case: str, n: int, limit: float = 90, clean: Sequence[str] = (),
             launcher_args: Sequence[str] = (), stdin: Optional[str] = None, **env) -> Job:
    """``tests/scripts/<script> <case>`` as its own job of ``n`` ranks, killed after
    ``limit`` seconds. ``env``: variables for the job (values made strings); ``clean``:
    variables of this process's environment the job must not inherit unless ``env``
    sets them (a suite run at a debug level must not change what a case sees)."""
    return run_job([sys.executable, os.path.join(SCRIPTS, script), case], n, limit=limit,
                   env=env, clean=clean, launcher_args=launcher_args, stdin=stdin)


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


def record_returns(monkeypatch, target, real):
    """Put a stand-in for ``real`` at ``target`` (a monkeypatch target: a dotted path, or
    an ``(object, name)`` pair) that calls it and records what each call returned; the
    list of those values."""
    returned = []

    def recorded(*args):
        value = real(*args)
        returned.append(value)
        return value
    if isinstance(target, tuple):
        monkeypatch.setattr(*target, recorded)
    else:
        monkeypatch.setattr(target, recorded)
    return returned


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


def apt_install_or_skip(packages: Sequence[str], what: str) -> None:
    """Install the Debian ``packages`` with apt-get, or skip the calling test saying why:
    not root, no apt-get, or the install failed (its last words). ``what``: what needs
    them, for the message."""
    needs = f"{what} needs {', '.join(packages)}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"{needs}: not root or no apt-get to install them")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True,
                       timeout=300, check=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                        *packages], env=env, capture_output=True, timeout=600, check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        output = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"{needs}: apt-get install failed: "
                    f"{output.decode(errors='replace')[-500:]}")


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


# -- the small channel ---------------------------------------------------------------------
#: every_channel_operation's split all_reduce: above the split size from 3 ranks on.
SPLIT_BYTES = 64 * 1024


def every_channel_operation(dist, group, n, me, rounds):
    """Each operation the channel takes, sync and async, several times round the slots;
    returns how many channel operations that was."""
    channel = group.cpu.small
    started = channel.kernel.started
    works, checks = [], []
    for i in range(rounds):
        small = np.full(3, float(me + i))
        works.append(dist.all_reduce(small, group=group, async_op=i % 2 == 1))
        checks.append((small, np.full(3, n * (n - 1) / 2 + n * i)))
        split = np.full(SPLIT_BYTES // 8, float(me + 1))
        dist.all_reduce(split, group=group)
        assert (split == n * (n + 1) / 2).all()
        b = np.full(5, me, np.int32)
        dist.broadcast(b, group_src=i % n, group=group)
        assert (b == i % n).all()
        out = np.zeros(2 * n, np.int64)
        dist.all_gather_into_tensor(out, np.full(2, me + i, np.int64), group=group)
        assert (out == np.repeat(np.arange(n) + i, 2)).all()
        rs = np.zeros(4)
        dist.reduce_scatter_tensor(rs, np.arange(4.0 * n) + me, group=group)
        assert (rs == n * np.arange(4.0 * me, 4.0 * me + 4) + n * (n - 1) / 2).all()
        a2a = np.zeros(n, np.uint16)
        dist.all_to_all_single(a2a, np.arange(n, dtype=np.uint16) + 100 * me, group=group)
        assert (a2a == 100 * np.arange(n) + me).all()
        dist.barrier(group=group)
    for work in works:
        if work is not None:
            work.wait()
    for got, want in checks:
        assert (got == want).all()
    return channel.kernel.started - started


def tree_group(dist, ranks):
    """A group of ``ranks`` whose channel's hand-off is a tree of radix 2 from 3 ranks."""
    with environment(HPCCOMM_SHM="1", HPCCOMM_SHM_TREE="3", HPCCOMM_SHM_TREE_RADIX="2"):
        return dist.new_group(ranks, timeout=60)
