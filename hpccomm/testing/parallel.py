"""``@pytest.mark.parallel(nprocs=[1, 2, 4])``: one test at several world sizes.

The marker is firedrake's (mpi-pytest): ``nprocs`` is a size or a list of sizes
(default 3). Each size becomes an item ``test[n=k]``.

* Under a launcher (``mpiexec -n N pytest``): the items of size N run, the others are
  skipped ("needs k ranks").
* From a serial ``pytest``: the items of each size k run in one job, started the way
  ``hpccomm run`` starts one (:func:`hpccomm.cli.launch.build_command`: mpiexec, or srun in
  a Slurm allocation), with ``--hpccomm-lockstep`` so that the ranks agree on each
  outcome; rank 0 writes the outcomes (``--hpccomm-results``) and this process
  reports them as its own items, exit status included. The job's time limit is the
  sum of its tests' timeouts and a margin. Once every test has reported, the job has
  ``--hpccomm-job-exit-grace`` seconds (:data:`EXIT_GRACE_S`) to end: a launcher that
  outlives it (Open MPI 5.0's ``prterun`` can hang after its ranks have exited) is
  killed with its ranks, the outcomes stand, and a warning says so. Each job has a
  ``TMPDIR`` of its own, removed at the end of the session.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

MARKER = "parallel"
PARAM = "_hpccomm_nprocs"
DEFAULT_NPROCS = (3,)
#: Seconds a job may take beyond its tests' timeouts (start-up, collection, exit).
JOB_MARGIN_S = 120.0
#: Seconds a job may take to end once all its tests have reported.
EXIT_GRACE_S = 30.0
#: Seconds between two looks at a running job.
POLL_S = 0.25
#: Characters of a job's output shown when it ended before reporting a test.
OUTPUT_TAIL = 6000


def sizes(marker: Any) -> Tuple[int, ...]:
    """The world sizes a ``parallel`` marker asks for."""
    if marker.args and marker.kwargs or len(marker.args) > 1 or set(marker.kwargs) - {
            "nprocs"}:
        raise pytest.UsageError(f"@pytest.mark.parallel takes one argument, nprocs (a "
                                f"size or a list of sizes), not {marker.args} {marker.kwargs}")
    value = marker.args[0] if marker.args else marker.kwargs.get("nprocs", DEFAULT_NPROCS)
    found = tuple(value) if isinstance(value, (list, tuple, range)) else (value,)
    if not found or not all(isinstance(k, int) and k >= 1 for k in found):
        raise pytest.UsageError(f"@pytest.mark.parallel(nprocs={value!r}): sizes must be "
                                f"positive integers")
    return found


def parametrize(metafunc: Any) -> None:
    """One item per size of the marker: ``test[n=k]``."""
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    found = sizes(marker)
    metafunc.fixturenames.append(PARAM)
    metafunc.parametrize(PARAM, found, ids=[f"n={k}" for k in found])


def size_of(item: Any) -> Optional[int]:
    """The world size an item runs at, if the marker made it."""
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get(PARAM)


def skip_other_sizes(items: Sequence[Any], world_size: int) -> None:
    """Under a launcher: skip the items of the sizes that this job is not."""
    for item in items:
        wanted = size_of(item)
        if wanted is not None and wanted != world_size:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {wanted} rank{'s' if wanted > 1 else ''} (parallel "
                       f"variant; this job has {world_size})"))


class Launcher:
    """Runs a serial session's parallel items, one job per size, on first demand."""

    def __init__(self, config: Any, test_timeout: float, grace: float, exit_grace: float):
        self.config = config
        self.test_timeout, self.grace, self.exit_grace = test_timeout, grace, exit_grace
        self.results: Dict[str, dict] = {}
        self.ran: Dict[int, str] = {}  # size -> what to say of an item without result
        self.workdir = tempfile.mkdtemp(prefix="hpccomm-parallel-")

    def reports(self, item: Any) -> List[Any]:
        """The reports of one item, from its job's outcome."""
        size = size_of(item)
        if size not in self.ran:
            same = [i for i in item.session.items if size_of(i) == size]
            self.ran[size] = self._run(size, same, item)
        found = self.results.get(item.nodeid)
        if found is None:
            found = {"outcome": "failed", "when": "call", "text": self.ran[size],
                     "duration": 0.0}
        return _reports(item, found)

    def _command(self, size: int, nodeids: List[str], results: str) -> List[str]:
        from ..cli import launch

        config = self.config
        args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--hpccomm-lockstep",
                f"--hpccomm-test-timeout={self.test_timeout:g}",
                f"--hpccomm-results={results}", f"--rootdir={config.rootpath}"]
        if config.inipath is not None:
            args += ["-c", str(config.inipath)]
        timeout = config.getoption("--hpccomm-timeout")
        if timeout is not None:
            args.append(f"--hpccomm-timeout={timeout}")
        plugin = sys.modules[__name__.rsplit(".", 2)[0] + ".pytest_plugin"]
        if config.pluginmanager.get_name(plugin) == plugin.__name__:  # loaded with -p
            args += ["-p", plugin.__name__]
        if config.pluginmanager.hasplugin("pytest_mpi"):
            args.append("--with-mpi")
        return launch.build_command([*args, *nodeids], nprocs=size)

    def _run(self, size: int, items: List[Any], current: Any) -> str:
        """Run ``items`` in a job of ``size`` ranks; their outcomes go to
        :attr:`results`. Returns what to say of an item the job did not report; a job
        that hung after reporting them all is a warning on ``current``."""
        from ..cli.launch import LaunchError

        results = os.path.join(self.workdir, f"n{size}.jsonl")
        output = os.path.join(self.workdir, f"n{size}.out")
        limit = len(items) * (self.test_timeout + 4 * self.grace) + JOB_MARGIN_S
        try:
            command = self._command(size, [i.nodeid for i in items], results)
        except LaunchError as exc:
            return f"cannot start a job of {size} ranks: {exc}"
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
        # A temporary directory of the job's own, removed with the session's: a launcher
        # killed here leaves its session files behind (Open MPI: ompi.<pid>, with a
        # socket named by its pid), and a later launcher given the same pid would fail
        # to start where it finds them.
        env["TMPDIR"] = os.path.join(self.workdir, f"t{size}")
        os.makedirs(env["TMPDIR"], exist_ok=True)
        with open(output, "wb") as out:
            ended, lingered = _wait_job(subprocess.Popen(
                command, cwd=str(self.config.rootpath), env=env, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True), results, len(items),
                limit, self.exit_grace)
        if lingered:
            current.warn(pytest.PytestWarning(f"the job of {size} ranks ({command[0]}) "
                                              f"{ended}; the outcomes it reported stand"))
        for record in _records(results):
            self.results[record["nodeid"]] = record
        with open(output, errors="replace") as handle:
            tail = handle.read()[-OUTPUT_TAIL:]
        return (f"the job of {size} ranks ({' '.join(command[:3])} ...) {ended} before "
                f"this test reported. The end of its output:\n{tail}")

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


def _records(results: str) -> List[dict]:
    """The complete lines of a job's results file (rank 0 appends one per test)."""
    try:
        with open(results) as handle:
            text = handle.read()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def _wait_job(process: "subprocess.Popen[bytes]", results: str, count: int,
              limit: float, exit_grace: float) -> Tuple[str, bool]:
    """Wait for a job (its own session) to end; kill it with its ranks after ``limit``
    seconds, or ``exit_grace`` seconds after its ``count`` tests have all reported.
    Returns how the job ended and whether it was killed after reporting them all."""
    deadline = time.monotonic() + limit
    reported = False
    try:
        while True:
            try:
                return f"ended with exit status {process.wait(timeout=POLL_S)}", False
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if not reported and len(_records(results)) >= count:
                reported, deadline = True, min(deadline, now + exit_grace)
            if now >= deadline:
                break
    finally:  # a deadline passed, or pytest was interrupted: the job goes with it
        if process.returncode is None:
            _kill_session(process.pid)
            process.wait()
    if reported:
        return (f"had not ended {exit_grace:g} s after its last test reported and was "
                f"killed"), True
    return f"was killed after {limit:.0f} s (its tests' timeouts and a margin)", False


def session_processes(sid: int) -> Optional[List[int]]:
    """The live processes of session ``sid`` other than its leader: a launcher started
    with ``start_new_session`` has its ranks there, which may sit in process groups of
    their own (Open MPI's do). ``None`` where there is no ``/proc`` to read them from."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    found = []
    for entry in entries:
        if entry.isdigit() and int(entry) != sid:
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            if int(fields[3]) == sid and fields[0] != "Z":  # state ppid pgrp session
                found.append(int(entry))
    return found


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``, its leader included."""
    members = session_processes(sid)
    pids = [-sid] if members is None else [sid] + members  # no /proc: the leader's group
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _reports(item: Any, record: dict) -> List[Any]:
    """setup/call/teardown reports of ``item`` saying ``record``'s outcome."""
    from _pytest.reports import TestReport

    keywords = dict.fromkeys(item.keywords, 1)

    def report(when: str, outcome: str, longrepr: Any = None, duration: float = 0.0) -> Any:
        return TestReport(item.nodeid, item.location, keywords, outcome, longrepr, when,
                          duration=duration)

    outcome, when = record["outcome"], record.get("when", "call")
    if outcome == "skipped":
        path, line, _ = item.location
        reason = record.get("skip") or "Skipped"
        return [report("setup", "skipped", (path, (line or 0) + 1, reason)),
                report("teardown", "passed")]
    if outcome == "failed" and when == "setup":
        return [report("setup", "failed", record["text"]), report("teardown", "passed")]
    if outcome == "failed" and when == "teardown":
        return [report("setup", "passed"), report("call", "passed"),
                report("teardown", "failed", record["text"])]
    return [report("setup", "passed"),
            report("call", outcome, record["text"] if outcome == "failed" else None,
                   record.get("duration", 0.0)),
            report("teardown", "passed")]
