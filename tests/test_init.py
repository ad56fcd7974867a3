"""Start-up and shut-down, each case in a fresh process (serial tests run mpiexec)."""
import sys
import textwrap

import pytest

import hpccomm
from helpers import run_job


def run_program(code, n=None, env=None, timeout=60):
    """Run ``code`` in fresh processes (under mpiexec -n N if given), outside any Slurm
    job or torch launch unless ``env`` says so; return the :class:`helpers.Job`."""
    return run_job([sys.executable, "-c", textwrap.dedent(code)], n, env=env,
                   clean=("SLURM_*", "RANK", "WORLD_SIZE"), limit=timeout)


def test_use_before_init_is_a_clear_error():
    result = run_program("""
        import numpy as np, hpccomm as dist
        for call in (lambda: dist.all_reduce(np.ones(1)), dist.get_rank, dist.barrier):
            try:
                call()
            except dist.DistValueError as exc:
                assert "not initialized" in str(exc) and "init_process_group" in str(exc)
            else:
                raise SystemExit("no error")
        assert not dist.is_initialized() and dist.group.WORLD is None
        print("ok")
    """)
    assert result.code == 0, result.stderr
    assert "ok" in result.stdout


def test_import_is_light():
    result = run_program("""
        import sys, hpccomm
        heavy = [m for m in ("mpi4py.MPI", "cupy", "h5py", "torch") if m in sys.modules]
        print("heavy:", heavy)
    """)
    assert result.code == 0, result.stderr
    assert "heavy: []" in result.stdout


def test_singleton_without_launcher_is_a_world_of_one():
    result = run_program("""
        import numpy as np, hpccomm as dist
        dist.init_process_group()
        x = np.arange(3.0)
        dist.all_reduce(x)
        print(dist.get_rank(), dist.get_world_size(), x.tolist())
        dist.destroy_process_group()
    """)
    assert result.code == 0, result.stderr
    assert "0 1 [0.0, 1.0, 2.0]" in result.stdout


def test_destroy_then_init_again_and_mpi4py_first():
    result = run_program("""
        from mpi4py import MPI          # the program initialized MPI itself
        import numpy as np, hpccomm as dist
        for round in range(2):
            dist.init_process_group(timeout=30)
            x = np.ones(1)
            dist.all_reduce(x)
            assert x[0] == MPI.COMM_WORLD.Get_size()
            dist.destroy_process_group()
            assert not dist.is_initialized()
        assert not MPI.Is_finalized()
        MPI.COMM_WORLD.Barrier()        # user's MPI still works
        print("rounds ok", MPI.COMM_WORLD.Get_rank())
    """, n=2)
    assert result.code == 0, result.stderr
    assert result.stdout.count("rounds ok") == 2


def test_a_rank_late_to_destroy_is_no_failure():
    """Rank 1 reaches destroy_process_group() well past the group's timeout after rank 0:
    the default store's collective close finishes when it comes, without a word, and
    both go on (a new init, then exit 0)."""
    result = run_program("""
        import time, hpccomm as dist
        dist.init_process_group(timeout=1)
        rank = dist.get_rank()
        if rank == 1:
            time.sleep(2.5)
        dist.destroy_process_group()
        dist.init_process_group(timeout=30)
        dist.barrier()
        dist.destroy_process_group()
        print("done", rank, flush=True)
    """, n=2)
    assert result.code == 0, result.output
    assert result.stdout.count("done") == 2, result.output
    assert "store" not in result.output, result.output


def test_world_size_env_mismatch_is_reported():
    result = run_program("""
        import hpccomm as dist
        try:
            dist.init_process_group()
        except dist.DistValueError as exc:
            print("error:", exc)
    """, env={"WORLD_SIZE": "4", "RANK": "0"})
    assert "WORLD_SIZE=4 but MPI's world has 1 processes" in result.stdout
    assert "mpiexec" in result.stdout


def test_rank_argument_mismatch_is_reported():
    result = run_program("""
        import hpccomm as dist
        try:
            dist.init_process_group(rank=1, world_size=2)
        except dist.DistValueError as exc:
            print("error:", exc)
    """, n=2)
    assert "rank=1 but this process is MPI rank 0 of 2" in result.stdout


def test_launcher_variables_that_disagree_are_warned_about():
    result = run_program("""
        import warnings, hpccomm as dist
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dist.init_process_group()
        print([str(w.message) for w in caught])
        dist.destroy_process_group()
    """, env={"SLURM_PROCID": "3", "SLURM_NTASKS": "8"})
    assert result.code == 0, result.stderr
    assert "SLURM_PROCID=3, SLURM_NTASKS=8" in result.stdout and "disagree" in result.stdout


def test_env_init_method_needs_master_addr():
    result = run_program("""
        import hpccomm as dist
        try:
            dist.init_process_group(init_method="env://")
        except dist.DistValueError as exc:
            print("error:", exc)
        assert not dist.is_initialized()
    """)
    assert "MASTER_ADDR" in result.stdout


def test_availability_queries():
    assert hpccomm.is_available() and hpccomm.is_mpi_available()
    assert hpccomm.get_default_backend_for_device("cpu") == "mpi"
    assert hpccomm.get_default_backend_for_device("cuda:1") == "nccl"
    assert isinstance(hpccomm.is_nccl_available(), bool)
    with pytest.raises(ValueError):
        hpccomm.get_default_backend_for_device("tpu")


@pytest.mark.parametrize("forced, expected", [("1", "POLLS_SHARED"), ("0", "POLLS_ALONE"),
                                              ("", None)])
def test_waits_yield_often_when_ranks_outnumber_cpus(forced, expected):
    """init measures ranks per node against the CPUs they may use; the env var overrides."""
    result = run_program("""
        import os, hpccomm as dist
        from hpccomm import work
        dist.init_process_group()
        cpus = len(os.sched_getaffinity(0))
        line = (work._polls_per_check, work.POLLS_SHARED, work.POLLS_ALONE, cpus,
                dist.get_world_size())
        os.write(1, (" ".join(map(str, line)) + "\\n").encode())  # one write per line
        dist.destroy_process_group()
    """, n=3, env={"HPCCOMM_OVERSUBSCRIBED": forced})
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    for line in lines:
        polls, shared, alone, cpus, ranks = map(int, line.split())
        if expected is None:  # measured: 3 unpinned ranks against this machine's CPUs
            assert polls == (shared if ranks > cpus else alone)
        else:
            assert polls == {"POLLS_SHARED": shared, "POLLS_ALONE": alone}[expected]
