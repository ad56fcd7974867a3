"""hpccomm at each MPI thread level: HPCCOMM_MPI_THREAD_LEVEL picks the level MPI starts
at when hpccomm starts it (unset: mpi4py's, multiple); a level the program gave mpi4py
itself is kept. Below
MPI_THREAD_MULTIPLE the default store is served over TCP (its address agreed over MPI),
and start-up, the store, collectives small and large, object collectives, a new group
and teardown all work. Each case is its own job (tests/scripts/thread_level_case.py)."""
import pytest

from helpers import result_lines, run_case

LEVELS = ["single", "funneled", "serialized", "multiple"]


def _ran(job, ranks):
    found = result_lines(job.output)
    assert job.code == 0 and len(found) == ranks, job.output
    for _, fields in found:
        assert fields.get("ok") == "1", job.output
    return [fields for _, fields in found]


def _store_at(level):
    return "MPIStore" if level == "multiple" else "JobTCPStore"


@pytest.mark.parametrize("level", LEVELS)
def test_the_setting_picks_the_level_and_everything_works_there(level):
    job = run_case("thread_level_case.py", "job", 2, HPCCOMM_MPI_THREAD_LEVEL=level)
    for fields in _ran(job, 2):
        assert (fields["level"], fields["store"]) == (level, _store_at(level)), job.output


def test_unset_is_mpi4py_s_default_multiple():
    job = run_case("thread_level_case.py", "job", 2, clean=["HPCCOMM_MPI_THREAD_LEVEL"])
    for fields in _ran(job, 2):
        assert (fields["level"], fields["store"]) == ("multiple", "MPIStore"), job.output


def test_a_level_the_program_chose_is_kept():
    job = run_case("thread_level_case.py", "program_chose_serialized", 3,
                   clean=["HPCCOMM_MPI_THREAD_LEVEL"])
    for fields in _ran(job, 3):
        assert (fields["level"], fields["store"]) == ("serialized", "JobTCPStore"), job.output


def test_a_store_nobody_can_reach_says_what_to_do():
    job = run_case("thread_level_case.py", "unreachable", 2, limit=60,
                   HPCCOMM_MPI_THREAD_LEVEL="serialized")
    assert job.code != 0 and job.seconds < 40, job.output  # every rank raises, none waits
    assert "rank 1 cannot reach the job's store, which rank 0 serves over TCP" in job.output
    assert "rank(s) [1] cannot reach the job's store" in job.output  # rank 0's error
    assert "at no-such-host.invalid:" in job.output
    assert "set HPCCOMM_MPI_THREAD_LEVEL=multiple" in job.output, job.output
