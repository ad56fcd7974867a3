"""pytest plugin for testing hpccomm programs under pytest-mpi (``mpiexec -n N pytest``).

Registered through the ``pytest11`` entry point, so it is active wherever hpccomm is
installed. Loading it never initializes MPI (importing the ``hpccomm`` package does not);
the default group is made only when a test asks for one of the fixtures.

Fixtures (distinct from pytest-mpi's ``mpi_tmp_path`` and from any project's own):

- ``hpccomm_world``: the default process group, initialized once per test session
  (timeout ``--hpccomm-timeout`` seconds) and destroyed at the end of the session.
- ``hpccomm_dist``: the ``hpccomm`` module with the default group initialized.
- ``hpccomm_tmp_path``: one empty directory per test, the same path on every rank
  (created by rank 0 and broadcast). On several nodes, point ``HPCCOMM_TEST_TMPDIR`` at
  a shared file system.

Option ``--hpccomm-rank0-output`` (or ini ``hpccomm_rank0_output = true``): only rank 0
writes to the terminal; other ranks write to ``--hpccomm-rank-log-dir`` (default: the
null device), so the output of ``mpiexec -n 4 pytest`` is read once, not four times.
``--junitxml=report-{rank}.xml``: each rank writes its own report.

Option ``--hpccomm-lockstep`` (ini ``hpccomm_lockstep = true``), under a launcher: after
each test the ranks agree on its outcome; a test that failed on any rank fails on every
rank, and rank 0 reports it once, naming each failing rank with its reason. A rank whose
test failed stops the others' (no rank is left waiting in a collective), and after a
failed test the default group goes on with a fresh communicator, so the next test starts
in step. ``--hpccomm-test-timeout=SECONDS`` (ini ``hpccomm_test_timeout``; implies
lockstep; default: the group timeout) interrupts a test that outlives it, naming the
ranks that did not finish and where each one was. Lockstep implies rank-0 output, and
only rank 0 writes ``--junitxml`` (the agreed outcomes); ``--hpccomm-results=FILE``
writes them as JSON lines. Lockstep also implies pytest-mpi's ``--with-mpi`` (its
``mpi``-marked tests would be skipped without it), and the report header says so. See :mod:`hpccomm.testing.lockstep`.

Marker ``@pytest.mark.parallel(nprocs=[1, 2, 4])``: the test runs at each size, as items
``test[n=k]``; from a serial ``pytest`` the plugin starts one job per size
(:mod:`hpccomm.testing.parallel`); a job still running ``--hpccomm-job-exit-grace``
seconds (default 30) after its last test reported is killed, its outcomes kept, with a
warning. With lockstep or parallel items, a closing line counts each (test, world size)
once and groups the skips by reason.
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from . import settings


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("hpccomm", "hpccomm (MPI tests)")
    group.addoption("--hpccomm-rank0-output", action="store_true", default=None,
                    help="only MPI rank 0 writes to the terminal")
    group.addoption("--hpccomm-rank-log-dir", default=None,
                    help="with --hpccomm-rank0-output: write rank R's output to "
                         "DIR/rank-R.log instead of discarding it")
    group.addoption("--hpccomm-timeout", type=float, default=None,
                    help="timeout in seconds of the session's default group (default 300)")
    group.addoption("--hpccomm-lockstep", action="store_true", default=None,
                    help="under mpiexec: the ranks agree on each test's outcome, stop "
                         "each other's test when one fails, and start each test in step")
    group.addoption("--hpccomm-test-timeout", type=float, default=None, metavar="SECONDS",
                    help="with lockstep (implied): interrupt a test that outlives this, "
                         "naming the ranks that did not finish (default: the group "
                         "timeout)")
    group.addoption("--hpccomm-results", default=None, metavar="FILE",
                    help="with lockstep: rank 0 writes each test's agreed outcome to FILE "
                         "as JSON lines")
    group.addoption("--hpccomm-job-exit-grace", type=float, default=None,
                    metavar="SECONDS",
                    help="from a serial pytest, parallel items: seconds a job may take to "
                         "end after its last test reported before it is killed (default "
                         "30)")
    parser.addini("hpccomm_rank0_output", "only MPI rank 0 writes to the terminal",
                  type="bool", default=False)
    parser.addini("hpccomm_timeout", "timeout in seconds of the session's default group",
                  default="300")
    parser.addini("hpccomm_lockstep", "under mpiexec: the ranks agree on each test's outcome",
                  type="bool", default=False)
    parser.addini("hpccomm_test_timeout", "with lockstep: seconds a test may take",
                  default=None)


def _stated() -> Any:
    """``(rank, size)`` as the launcher states them; ``None`` in a serial session."""
    from hpccomm.launcher_env import launcher_rank

    return launcher_rank()


def _launcher_rank() -> int:
    stated = _stated()
    return stated[0] if stated else 0


def _redirect_other_ranks(config: Any) -> None:
    """With rank-0 output on, send this process's stdout/stderr away unless it is rank 0."""
    wanted = (getattr(config.known_args_namespace, "hpccomm_rank0_output", None)
              or config.getini("hpccomm_rank0_output") or _lockstep_wanted(config, True))
    rank = _launcher_rank()
    if not wanted or rank == 0:
        return
    log_dir = getattr(config.known_args_namespace, "hpccomm_rank_log_dir", None)
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        target = os.path.join(log_dir, f"rank-{rank}.log")
    else:
        target = os.devnull
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    # The launcher's pipes stay open until the process ends, as for any rank: Open MPI
    # 5.0's prterun can hang for ever when a rank closes them early and then exits with
    # a non-zero status.
    _LAUNCHER_PIPES.extend((os.dup(1), os.dup(2)))
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


#: Duplicates of a redirected rank's original stdout and stderr, held until it exits.
_LAUNCHER_PIPES: list = []


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: Any, parser: Any, args: Any) -> Iterator[None]:
    """Redirect before pytest's output capture saves the terminal's file descriptors."""
    _redirect_other_ranks(early_config)
    yield


def _timeout(config: Any) -> float:
    value = config.getoption("--hpccomm-timeout")
    return float(value if value is not None else config.getini("hpccomm_timeout"))


@pytest.fixture(scope="session")
def hpccomm_world(pytestconfig: Any) -> Iterator[Any]:
    """The default process group over all ranks of the job, once per session."""
    import hpccomm

    created = not hpccomm.is_initialized()
    if created:
        hpccomm.init_process_group(timeout=_timeout(pytestconfig))
    yield hpccomm.group.WORLD
    step = pytestconfig.stash[_SESSION].lockstep
    if step is not None and step.broken:
        return  # a stuck rank would never let the teardown finish; the job is aborted
    if created and hpccomm.is_initialized():
        hpccomm.destroy_process_group()


@pytest.fixture
def hpccomm_dist(hpccomm_world: Any, pytestconfig: Any) -> Any:
    """The ``hpccomm`` module, its default group initialized (again, if a test destroyed it)."""
    import hpccomm

    if not hpccomm.is_initialized():
        hpccomm.init_process_group(timeout=_timeout(pytestconfig))
    return hpccomm


@pytest.fixture
def hpccomm_tmp_path(hpccomm_dist: Any, request: Any, tmp_path_factory: Any) -> Path:
    """An empty directory for this test with the same path on every rank."""
    name = [None]
    base = re.sub(r"\W", "_", request.node.name)[:30]
    if hpccomm_dist.get_rank() == 0:
        shared = settings.TEST_TMPDIR.get()
        if shared:
            os.makedirs(shared, exist_ok=True)
            name[0] = tempfile.mkdtemp(prefix=f"{base}-", dir=shared)
        else:
            name[0] = str(tmp_path_factory.mktemp(base, numbered=True))
    hpccomm_dist.broadcast_object_list(name, src=0)
    path = Path(name[0])
    hpccomm_dist.barrier()
    return path


# -- lockstep, test timeouts, parallel sizes, the closing line ----------------------------
#: Seconds allowed beyond a test's timeout for a late rank to report (and for the
#: teardown of a test that timed out).
GRACE_S = 5.0


class _Session:
    """What the plugin keeps for one session."""

    def __init__(self) -> None:
        self.lockstep: Any = None     # testing.lockstep.Lockstep, under a launcher
        self.launcher: Any = None     # testing.parallel.Launcher, in a serial session
        self.results: Any = None      # path of --hpccomm-results (rank 0)
        self.closing_line = False
        self.started = time.time()
        self.implied = ""             # an option that another one turned on, for the header


_SESSION = pytest.StashKey[_Session]()


def pytest_report_header(config: Any) -> Any:
    implied = config.stash[_SESSION].implied if _SESSION in config.stash else ""
    return f"hpccomm: {implied}" if implied else None


def _lockstep_wanted(config: Any, early: bool = False) -> bool:
    """Whether lockstep is asked for (``--hpccomm-test-timeout`` implies it)."""
    options = config.known_args_namespace if early else config.option
    return bool(getattr(options, "hpccomm_lockstep", None)
                or getattr(options, "hpccomm_test_timeout", None) is not None
                or config.getini("hpccomm_lockstep") or config.getini("hpccomm_test_timeout"))


def _test_timeout(config: Any) -> float:
    value = config.getoption("--hpccomm-test-timeout")
    if value is None:
        value = config.getini("hpccomm_test_timeout") or None
    return float(value) if value is not None else _timeout(config)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers", "parallel(nprocs=3): run the test at each of these world sizes, as items "
                   "test[n=k]; a serial pytest starts one mpiexec per size")
    state = config.stash[_SESSION] = _Session()
    stated = _stated()
    xmlpath = getattr(config.option, "xmlpath", None)  # read by junitxml after this hook
    if xmlpath and "{rank}" in xmlpath:
        config.option.xmlpath = xmlpath.replace("{rank}", str(_launcher_rank()))
    elif xmlpath and stated is not None and stated[0] != 0 and _lockstep_wanted(config):
        config.option.xmlpath = None  # rank 0's report holds the agreed outcomes
    if _lockstep_wanted(config) and stated is not None:
        state.closing_line = True
        if getattr(config.option, "with_mpi", None) is False:
            # pytest-mpi skips its mpi-marked tests without --with-mpi; lockstep means
            # a run under MPI, so it asks for them (the header says so)
            config.option.with_mpi = True
            state.implied = "--hpccomm-lockstep implies pytest-mpi's --with-mpi"


def pytest_generate_tests(metafunc: Any) -> None:
    from .testing import parallel

    parallel.parametrize(metafunc)


def pytest_collection_modifyitems(config: Any, items: Any) -> None:
    from .testing import parallel

    stated = _stated()
    if stated is not None:
        parallel.skip_other_sizes(items, stated[1])
    if any(parallel.size_of(item) is not None for item in items):
        config.stash[_SESSION].closing_line = True


def pytest_collection_finish(session: Any) -> None:
    config = session.config
    state = config.stash[_SESSION]
    if config.option.collectonly:
        return
    stated = _stated()
    if stated is None:
        from .testing import parallel

        if any(parallel.size_of(item) is not None for item in session.items):
            exit_grace = config.getoption("--hpccomm-job-exit-grace")
            state.launcher = parallel.Launcher(
                config, _test_timeout(config), GRACE_S,
                parallel.EXIT_GRACE_S if exit_grace is None else exit_grace)
        return
    if not _lockstep_wanted(config):
        return
    from .testing.lockstep import Lockstep, LockstepError

    try:
        state.lockstep = Lockstep(_test_timeout(config), GRACE_S, _timeout(config))
        state.lockstep.check_collection([item.nodeid for item in session.items],
                                        session.testsfailed)
    except LockstepError as exc:
        raise pytest.UsageError(str(exc)) from None
    state.results = config.getoption("--hpccomm-results")
    if state.results and state.lockstep.rank == 0:
        open(state.results, "w").close()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    state = item.config.stash[_SESSION]
    if state.launcher is None and state.lockstep is None:
        return None
    from .testing import lockstep, parallel

    ihook = item.ihook
    if state.launcher is not None:
        if parallel.size_of(item) is None:
            return None
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for report in state.launcher.reports(item):
            ihook.pytest_runtest_logreport(report=report)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True
    from _pytest.runner import runtestprotocol

    step = state.lockstep
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    step.start_test(item.nodeid)
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    verdict = step.agree(step.outcome(reports))
    lockstep.apply(reports, verdict)
    for report in reports:
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    if state.results and step.rank == 0:
        with open(state.results, "a") as handle:
            handle.write(lockstep.result_record(item.nodeid, reports, step.size) + "\n")
    if step.broken:
        item.session.shouldstop = step.broken
    return True


def _armed(item: Any, phase: str) -> Any:
    """Around one phase of a test: interruptible by the lockstep watchdog."""
    step = item.config.stash[_SESSION].lockstep
    if step is None:
        return (yield)
    step.arm(phase)
    try:
        return (yield)
    finally:
        step.disarm()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: Any) -> Any:
    return (yield from _armed(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: Any) -> Any:
    return (yield from _armed(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: Any, nextitem: Any) -> Any:
    return (yield from _armed(item, "teardown"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    report = yield
    step = item.config.stash[_SESSION].lockstep
    if step is not None and report.failed:
        step.notify_failed(report, call.excinfo)
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: Any, exitstatus: Any) -> Any:
    """After pytest's own summary: close the lockstep, then the closing line."""
    try:
        return (yield)
    finally:
        state = session.config.stash[_SESSION]
        if state.lockstep is not None:
            state.lockstep.close()
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if state.closing_line and reporter is not None:
            reporter.write_sep("=", _closing_line(reporter.stats,
                                                  time.time() - state.started))


def _closing_line(stats: Any, seconds: float) -> str:
    from .testing.outcomes import count_line, skip_reason

    skipped = stats.get("skipped", [])
    counts = {"passed": len(stats.get("passed", [])), "skipped": len(skipped),
              "failed": len(stats.get("failed", [])) + len(stats.get("error", []))}
    reasons: Dict[str, int] = {}
    for report in skipped:
        longrepr = report.longrepr
        why = skip_reason(longrepr[2] if isinstance(longrepr, tuple) else str(longrepr))
        reasons[why] = reasons.get(why, 0) + 1
    return "each (test, world size) once: " + count_line(counts, reasons, seconds)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: Any) -> None:
    state = config.stash.get(_SESSION, None)
    if state is None:
        return
    if state.launcher is not None:
        state.launcher.close()
    step = state.lockstep
    if step is not None and step.broken and step.rank == min(
            r for r in range(step.size) if r not in step.lost):
        step.abort()  # the stuck rank holds the job: end it, after this rank's report
