"""torch's reconfigure contract (torch 2.14+) on backend "hpccomm", as jobs of their own.

The program that re-forms a gloo group over a subset of its handles and back runs on
"hpccomm" at 2, 4 and 8 ranks, its handles going through the default store (over MPI,
no TCP); where the MPI library connects separately started jobs, a second job joins the
first through the handles. The cases are tests/scripts/reconfigure_case.py.
"""
import os
import sys

import pytest

import helpers
from helpers import run_job, start_job
from launcher_env import mpi_vendor

torch = pytest.importorskip("torch", reason="torch is not installed")
if not hasattr(torch.distributed, "_reconfigure"):
    pytest.skip(f"torch {torch.__version__} has no reconfigure API (torch 2.14 added it)",
                allow_module_level=True)

CASE = os.path.join(helpers.SCRIPTS, "reconfigure_case.py")


def _results(*jobs):
    found = {}
    for job in jobs:
        for rank, fields in job.results:
            found.setdefault(rank, {}).update(fields)
    return found


@pytest.mark.parametrize("n", [2, 4, 8])
def test_a_group_re_forms_over_a_subset_of_its_handles_and_back(n):
    done = run_job([sys.executable, CASE, "subset_and_back"], n, limit=150,
                   clean=("HPCCOMM_*",))
    assert done.code == 0, done.output
    found = _results(done)
    even = [r for r in range(n) if r % 2 == 0]
    for rank in range(n):
        fields = found[rank]
        if rank in even:
            assert fields["sub_rank"] == str(even.index(rank)), fields
            assert (fields["sub_size"], fields["sub_sum"]) == (str(len(even)),) * 2, fields
        else:
            assert "sub_rank" not in fields, fields
        assert fields["mirror_rank"] == str(n - 1 - rank), fields
        assert fields["mirror_sum"] == str(n * (n - 1) // 2), fields
        assert (fields["set_rank"], fields["set_sum"]) == (str(rank), str(n)), fields
        assert fields["ddp_same"] == "True", fields
        assert "this process's handle is not among the" in fields["outside"], fields


@pytest.mark.parametrize("n", [2])
def test_a_job_started_apart_joins_through_the_handles(n, tmp_path):
    if mpi_vendor() not in ("MPICH", "Intel MPI"):
        pytest.skip(f"{mpi_vendor()} does not connect separately started jobs")
    env = {"CASE_TOTAL": n + 1, "I_MPI_SPAWN": "on"}  # Intel MPI connects only with it
    second = start_job([sys.executable, CASE, "join", str(tmp_path)], 1,
                       env=dict(env, CASE_PART="second"), clean=("HPCCOMM_*",))
    first = run_job([sys.executable, CASE, "join", str(tmp_path)], n, env=env, limit=120,
                    clean=("HPCCOMM_*",))
    second = second.finish(60)
    assert first.code == 0 and second.code == 0, first.output + second.output
    found = _results(first, second)
    for rank in list(range(n)) + [100]:
        fields = found[rank]
        assert fields["joined_rank"] == str(rank if rank < 100 else n), fields
        assert fields["joined_size"] == fields["joined_sum"] == str(n + 1), fields
