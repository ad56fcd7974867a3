"""The pytest plugin for users' MPI tests: its fixtures under MPI, rank-0-only output.

The MPI tests here use the plugin's own fixtures (``hpccomm_world``, ``hpccomm_dist``,
``hpccomm_tmp_path``) the way a user's test would. The serial tests run pytest on a
user's test file under ``mpiexec -n 2`` and check what reaches the terminal.
"""
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher_env import mpiexec, without_launcher

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


def _run_user_tests(tmp_path, *options):
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    env = without_launcher(("SLURM_", "PYTEST_"))
    env["PYTHONPATH"] = str(ROOT)
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "pytest", "-q", "-s", "--with-mpi",
           "-p", "no:cacheprovider", *_plugin_args(), *options, "test_user.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)


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
    assert result.returncode == 0, result.stdout + result.stderr
    assert "USER-OUTPUT-OF-RANK-0" in result.stdout
    assert "USER-OUTPUT-OF-RANK-1" not in result.stdout + result.stderr
    assert result.stdout.count("1 passed") == 1
    rank1 = (logs / "rank-1.log").read_text()
    assert "USER-OUTPUT-OF-RANK-1" in rank1 and "1 passed" in rank1
    assert not (logs / "rank-0.log").exists()


def test_without_the_option_every_rank_reports(tmp_path):
    result = _run_user_tests(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
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
