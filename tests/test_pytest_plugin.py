"""The pytest plugin for users' MPI tests: fixtures, rank-0 output, lockstep, sizes.

The MPI tests here use the plugin's own fixtures (``hpccomm_world``, ``hpccomm_dist``,
``hpccomm_tmp_path``) the way a user's test would. The serial tests run pytest on a
user's test file under ``mpiexec`` (or a serial pytest that starts its own jobs, for
``parallel(nprocs=...)``) and check what reaches the terminal: one verdict per test
with lockstep, a failing or hanging rank named, the session going on after it.
"""
import importlib.metadata
import json
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import run_job
from launcher_env import without_launcher

ROOT = Path(__file__).resolve().parents[1]
USER_TESTS = """\
import pytest

@pytest.mark.mpi(min_size=2)
def test_user(hpccomm_dist, hpccomm_tmp_path):
    rank = hpccomm_dist.get_rank()
    (hpccomm_tmp_path / f"from-{rank}").write_text("x")
    hpccomm_dist.barrier()
    print(f"USER-OUTPUT-OF-RANK-{rank}")
    assert len(list(hpccomm_tmp_path.iterdir())) == hpccomm_dist.get_world_size()
"""


def _plugin_args():
    """``-p hpccomm.pytest_plugin`` only where the entry point is not installed."""
    registered = any(ep.value == "hpccomm.pytest_plugin"
                     for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if registered else ["-p", "hpccomm.pytest_plugin"]


def _pytest(tmp_path, tests, options, ranks=2, timeout=180):
    """pytest on the user's test file ``tests`` under ``mpiexec -n ranks`` (``None``:
    a serial pytest), in ``tmp_path``."""
    (tmp_path / "test_user.py").write_text(tests)
    return run_job([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--color=no",
                    *_plugin_args(), *options, "test_user.py"], ranks, cwd=tmp_path,
                   clean=("SLURM_*", "PYTEST_*"), limit=timeout,
                   # COLUMNS: the same report whatever the caller's terminal width
                   env={"PYTHONPATH": str(ROOT), "COLUMNS": "100"})


def _run_user_tests(tmp_path, *options):
    return _pytest(tmp_path, USER_TESTS, ["-q", "-s", "--with-mpi", *options])


# -- the fixtures, under MPI ------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_world_fixture_is_the_default_group(hpccomm_world, hpccomm_dist):
    assert hpccomm_dist.is_initialized()
    assert hpccomm_world is hpccomm_dist.group.WORLD
    assert hpccomm_world.size() == hpccomm_dist.get_world_size()
    ranks = [None] * hpccomm_dist.get_world_size()
    hpccomm_dist.all_gather_object(ranks, hpccomm_dist.get_rank())
    assert ranks == list(range(hpccomm_dist.get_world_size()))


@pytest.mark.mpi(min_size=2)
def test_tmp_path_is_one_directory_for_all_ranks(hpccomm_dist, hpccomm_tmp_path):
    size, rank = hpccomm_dist.get_world_size(), hpccomm_dist.get_rank()
    paths = [None] * size
    hpccomm_dist.all_gather_object(paths, str(hpccomm_tmp_path))
    assert len(set(paths)) == 1
    assert hpccomm_tmp_path.is_dir()
    (hpccomm_tmp_path / f"rank{rank}.txt").write_text(str(rank))
    hpccomm_dist.barrier()
    assert sorted(p.name for p in hpccomm_tmp_path.iterdir()) == sorted(
        f"rank{r}.txt" for r in range(size))


@pytest.mark.mpi(min_size=1)
def test_tmp_path_is_new_for_each_test(hpccomm_dist, hpccomm_tmp_path):
    assert list(hpccomm_tmp_path.iterdir()) == []  # the previous test's files are elsewhere


# -- the plugin seen from outside --------------------------------------------------------
def test_rank0_output_shows_one_rank_and_logs_the_others(tmp_path):
    logs = tmp_path / "logs"
    result = _run_user_tests(tmp_path, "--hpccomm-rank0-output", f"--hpccomm-rank-log-dir={logs}")
    assert result.code == 0, result.stdout + result.stderr
    assert "USER-OUTPUT-OF-RANK-0" in result.stdout
    assert "USER-OUTPUT-OF-RANK-1" not in result.stdout + result.stderr
    assert result.stdout.count("1 passed") == 1
    rank1 = (logs / "rank-1.log").read_text()
    assert "USER-OUTPUT-OF-RANK-1" in rank1 and "1 passed" in rank1
    assert not (logs / "rank-0.log").exists()


def test_without_the_option_every_rank_reports(tmp_path):
    result = _run_user_tests(tmp_path)
    assert result.code == 0, result.stdout + result.stderr
    assert "USER-OUTPUT-OF-RANK-0" in result.stdout and "USER-OUTPUT-OF-RANK-1" in result.stdout
    assert result.stdout.count("1 passed") == 2


def test_plugin_loads_without_mpi_and_registers_its_options():
    code = ("import sys\nimport hpccomm.pytest_plugin\n"
            "print('mpi4py.MPI' in sys.modules)\n")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert loaded.stdout.strip() == "False", loaded.stderr
    helped = subprocess.run([sys.executable, "-m", "pytest", *_plugin_args(), "--help"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    for option in ("--hpccomm-rank0-output", "--hpccomm-rank-log-dir", "--hpccomm-timeout"):
        assert option in helped.stdout
    for option in ("--hpccomm-lockstep", "--hpccomm-test-timeout", "--hpccomm-results"):
        assert option in helped.stdout


WAITING_TEST = """\
import os
import time


def test_waits_for_go():
    open("started", "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists("go") and time.monotonic() < deadline:
        time.sleep(0.01)
"""


def test_a_silenced_rank_keeps_the_launchers_pipe_open_until_it_exits(tmp_path):
    """Rank 1 with rank-0 output: its stdout goes to the null device, but the pipe that
    the launcher reads stays open until the process ends (Open MPI 5.0's prterun can
    hang when a rank closes it early and then exits with a non-zero status)."""
    (tmp_path / "test_user.py").write_text(WAITING_TEST)
    env = without_launcher(("SLURM_", "PYTEST_"))
    env.update(PYTHONPATH=str(ROOT), PMI_RANK="1", PMI_SIZE="2")
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *_plugin_args(), "-q",
         "--hpccomm-rank0-output", "test_user.py"], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert process.poll() is None and time.monotonic() < deadline, \
                process.communicate()
            time.sleep(0.01)
        for pipe in (process.stdout, process.stderr):
            readable, _, _ = select.select([pipe], [], [], 0)
            assert not readable, f"{pipe.read()!r}: the pipe was closed (or written) early"
        (tmp_path / "go").touch()
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0 and out == err == b"", (process.returncode, out, err)


# -- lockstep: one verdict per test, ranks kept in step ----------------------------------
LOCKSTEP_TESTS = """\
import time

import numpy as np


def test_fails_on_rank_1_only(hpccomm_dist):
    assert hpccomm_dist.get_rank() != 1, "rank 1 disagrees"
    hpccomm_dist.all_reduce(np.ones(4))  # the other ranks wait here for rank 1


def test_all_reduce_after_the_failure(hpccomm_dist):
    x = np.ones(4)
    hpccomm_dist.all_reduce(x)
    assert x[0] == hpccomm_dist.get_world_size()


def test_hangs_on_rank_2(hpccomm_dist):
    if hpccomm_dist.get_rank() == 2:
        time.sleep(120)
    hpccomm_dist.barrier()


def test_collectives_after_the_hang(hpccomm_dist):
    x = np.arange(3) + hpccomm_dist.get_rank()
    hpccomm_dist.all_reduce(x)
    objects = [None] * hpccomm_dist.get_world_size()
    hpccomm_dist.all_gather_object(objects, hpccomm_dist.get_rank())
    assert objects == list(range(hpccomm_dist.get_world_size()))
"""
#: Long enough for a loaded CI machine to start the default group in the first test's
#: setup (the timeout covers setup, call and teardown).
TEST_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def lockstep_run(tmp_path_factory):
    """One ``mpiexec -n 4 pytest --hpccomm-test-timeout`` of LOCKSTEP_TESTS, timed."""
    started = time.monotonic()
    where = tmp_path_factory.mktemp("lockstep")
    result = _pytest(where, LOCKSTEP_TESTS, ["-q", f"--hpccomm-test-timeout={TEST_TIMEOUT_S}",
                                             "--hpccomm-results=results.jsonl"], ranks=4)
    return result, time.monotonic() - started, where


def test_lockstep_reports_a_one_rank_failure_once_and_goes_on(lockstep_run):
    result, _, _ = lockstep_run
    out = result.stdout
    assert result.code == 1, out + result.stderr
    assert out.count("FAILED test_user.py::test_fails_on_rank_1_only") == 1, out
    failures = out.split("short test summary info")[0]
    assert failures.count("failed on rank 1 of 4: AssertionError: rank 1 disagrees") == 1, out
    assert "ranks 0, 2 and 3 stopped when it failed there" in out
    assert "2 failed, 2 passed" in out and out.count(" passed") == 2, out  # rank 0 only
    assert "each (test, world size) once: 2 passed, 2 failed" in out


def test_lockstep_timeout_names_the_hung_rank_and_where_it_was(lockstep_run):
    result, seconds, _ = lockstep_run
    out = result.stdout
    assert out.count("FAILED test_user.py::test_hangs_on_rank_2") == 1, out
    assert (f"rank 2 of 4 did not finish within the test's timeout ({TEST_TIMEOUT_S} s); "
            f"ranks 0, 1 and 3 waited for it in hpccomm.barrier") in out, out
    assert "----- rank 2: where it was at the timeout -----" in out
    assert "time.sleep(120)" in out  # rank 2's stack
    assert "test_collectives_after_the_hang" not in out.split("short test summary")[1]
    assert seconds < 100, f"the session took {seconds:.0f} s"


def test_lockstep_writes_the_agreed_outcomes(lockstep_run):
    _, _, where = lockstep_run
    with (where / "results.jsonl").open() as handle:
        records = [json.loads(line) for line in handle]
    assert [(r["nodeid"].split("::")[1], r["outcome"], r["size"]) for r in records] == [
        ("test_fails_on_rank_1_only", "failed", 4),
        ("test_all_reduce_after_the_failure", "passed", 4),
        ("test_hangs_on_rank_2", "failed", 4),
        ("test_collectives_after_the_hang", "passed", 4)]


STUCK_IN_C_TESTS = """\
import numpy as np


def test_stuck_in_c_on_rank_1(hpccomm_dist):
    if hpccomm_dist.get_rank() == 1:
        from mpi4py import MPI
        MPI.COMM_WORLD.Recv(np.empty(1), source=0, tag=999)  # never sent


def test_never_reached(hpccomm_dist):
    hpccomm_dist.barrier()
"""


#: The stuck test's own timeout: the rank is in MPI_Recv within a fraction of a second,
#: and the job then waits three graces more for its report.
STUCK_TIMEOUT_S = 5


def test_lockstep_rank_stuck_in_c_is_reported_and_the_job_ends(tmp_path):
    result = _pytest(tmp_path, STUCK_IN_C_TESTS,
                     ["-q", f"--hpccomm-test-timeout={STUCK_TIMEOUT_S}"], ranks=2, timeout=150)
    out = result.stdout
    assert result.code != 0, out + result.stderr
    assert f"rank 1 of 2 did not finish within the test's timeout ({STUCK_TIMEOUT_S} s)" in out, out
    assert "----- rank 1: never reported" in out
    assert "MPI.COMM_WORLD.Recv(np.empty(1), source=0, tag=999)" in out  # its stack
    assert "Interrupted: rank 1 never reported the outcome" in out
    assert "test_never_reached" not in out


# -- parallel(nprocs=...): several world sizes from one pytest ---------------------------
SIZES_TESTS = """\
import numpy as np
import pytest


@pytest.mark.parallel(nprocs=[1, 2, 4])
def test_sum(hpccomm_dist):
    x = np.ones(3)
    hpccomm_dist.all_reduce(x)
    assert x[0] == hpccomm_dist.get_world_size()


@pytest.mark.parallel(nprocs=[1, 2, 4])
def test_fails_at_four(hpccomm_dist):
    assert hpccomm_dist.get_world_size() < 4 or hpccomm_dist.get_rank() != 3


@pytest.mark.parallel(2)
def test_no_gpu(hpccomm_dist):
    pytest.skip("no GPU on this machine")


def test_serial():
    pass
"""


def test_parallel_marker_from_a_serial_pytest_runs_each_size(tmp_path):
    result = _pytest(tmp_path, SIZES_TESTS, ["-v"], ranks=None)
    out = result.stdout
    assert result.code == 1, out + result.stderr
    for name in ("test_sum", "test_fails_at_four"):
        for n, outcome in ((1, "PASSED"), (2, "PASSED"), (4, "PASSED")):
            if name == "test_fails_at_four" and n == 4:
                outcome = "FAILED"
            assert f"test_user.py::{name}[n={n}] {outcome}" in out, out
    assert "test_user.py::test_no_gpu[n=2] SKIPPED" in out
    assert "test_user.py::test_serial PASSED" in out
    assert "failed on rank 3 of 4" in out
    assert ("each (test, world size) once: 6 passed, 1 failed, 1 skipped" in out
            and "skipped: 1 no GPU" in out), out


#: A user's conftest.py whose ranks, in a job the serial pytest started, never exit
#: after the session (as Open MPI 5.0's prterun sometimes never does): each rank writes
#: its pid first.
LINGERING_CONFTEST = """\
import os
import time


def pytest_unconfigure(config):
    if config.getoption("--hpccomm-results", None):
        with open(f"pid-{os.getpid()}", "w") as record:
            record.write(os.environ["TMPDIR"])
        time.sleep(600)
"""


def test_a_job_that_outlives_its_reports_is_killed_and_its_outcomes_stand(tmp_path):
    (tmp_path / "conftest.py").write_text(LINGERING_CONFTEST)
    tests = SIZES_TESTS.replace("nprocs=[1, 2, 4]", "nprocs=[2]")
    result = _pytest(tmp_path, tests, ["-v", "-k", "test_sum or test_serial",
                                       "--hpccomm-job-exit-grace=3"], ranks=None)
    out = result.stdout
    assert result.code == 0, out + result.stderr
    assert "test_user.py::test_sum[n=2] PASSED" in out, out
    assert "test_user.py::test_serial PASSED" in out, out
    assert ("the job of 2 ranks (" in out and "had not ended 3 s after its last test "
            "reported and was killed; the outcomes it reported stand" in out), out
    pids = [int(path.name.split("-")[1]) for path in tmp_path.glob("pid-*")]
    assert len(pids) == 2, sorted(tmp_path.iterdir())
    alive = _alive_after(pids, seconds=10)
    assert not alive, f"the job's ranks {alive} outlived it"
    # the killed launcher's session files went with the job's own temporary directory
    seen = {path.read_text() for path in tmp_path.glob("pid-*")}
    assert len(seen) == 1, seen
    job_tmp = Path(seen.pop())
    assert job_tmp.parent.name.startswith("hpccomm-parallel-"), job_tmp
    assert not job_tmp.exists(), f"the job's temporary directory {job_tmp} outlived pytest"


def _alive_after(pids, seconds):
    """The processes among ``pids`` still there after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [pid for pid in pids if _running(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _running(pid):
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_lockstep_implies_with_mpi_and_says_so(tmp_path):
    """pytest-mpi skips mpi-marked tests without --with-mpi; under a launcher, lockstep
    (or a test timeout, which implies it) turns it on."""
    tests = USER_TESTS + "\n\ndef test_plain():\n    pass\n"
    result = _pytest(tmp_path, tests, ["-rs", "--hpccomm-lockstep"], ranks=2)
    out = result.stdout
    assert result.code == 0, out + result.stderr
    assert "2 passed" in out and "skipped" not in out, out
    assert "hpccomm: --hpccomm-lockstep implies pytest-mpi's --with-mpi" in out, out  # header
    given = _pytest(tmp_path, tests, ["-q", "--hpccomm-lockstep", "--with-mpi"], ranks=2)
    assert given.code == 0 and "implies" not in given.stdout, given.stdout


def test_parallel_marker_under_mpiexec_runs_the_job_size(tmp_path):
    result = _pytest(tmp_path, SIZES_TESTS, ["-q", "-rs", "--hpccomm-lockstep"], ranks=2)
    out = result.stdout
    assert result.code == 0, out + result.stderr
    assert ("3 passed, 5 skipped" in out and "skipped: 2 needs 1 rank, 2 needs 4 ranks, "
            "1 no GPU" in out), out
