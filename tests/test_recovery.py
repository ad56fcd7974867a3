"""Growing back after a rank is lost: jobs that shrink and grow, as their own jobs.

* The recipes (examples/elastic_grow.py, examples/torch_elastic_grow.py) under Open
  MPI's ULFM: a rank is killed mid-run, the survivors shrink, a spawned replacement
  joins in its place, and the finished weights are, bit for bit, those of a run in which
  nobody died.
* ``grow_group`` on any MPI library, without a failure: the last rank is excluded, and a
  newcomer (spawned, or a job of its own that joins through a directory where the
  library connects jobs) takes its place; numbers, sums, groups, store and state (in
  memory, and a sharded part from the checkpoint on disk).
* A newcomer that never comes is named within the timeout, and the group goes on.

The cases are tests/scripts/grow_case.py.
"""
import functools
import os
import re
import shlex
import sys

import pytest

import doc_recipes
import helpers
from helpers import run_job, start_job
from launcher_env import mpi_vendor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
ULFM = ("--with-ft", "ulfm")
NEWCOMER = 100  # the rank a newcomer reports as (grow_case.NEWCOMER)

#: Intel MPI starts and connects processes only with this; the others ignore it.
DYNAMIC = {"I_MPI_SPAWN": "on"}
run_case = functools.partial(helpers.run_case, "grow_case.py", limit=90,
                             clean=("HPCCOMM_*",), **DYNAMIC)


def _needs_ulfm():
    if mpi_vendor() != "Open MPI":
        pytest.skip(f"ULFM needs Open MPI (`mpirun --with-ft ulfm`); this venv runs "
                    f"{mpi_vendor()}")


def _connects_jobs():
    return mpi_vendor() in ("MPICH", "Intel MPI")  # the latter with I_MPI_SPAWN=on


def _digest(output):
    found = re.findall(r"weights sha256 ([0-9a-f]{64})", output)
    assert len(found) == 1, output
    return found[0]


# -- the recipes: a dead rank replaced, the weights of a run without failure -------------------
#: The command docs/recovery.md shows for the NumPy recipe: the test runs it, at the ranks
#: and with the launcher's options shown there.
PAGE = "docs/recovery.md"
SHOWN = [command for command in doc_recipes.page_commands(PAGE) if "elastic_grow.py" in command]


def test_the_page_shows_the_recipe_run_here():
    assert SHOWN == ["mpirun --with-ft ulfm -n 4 python examples/elastic_grow.py"], SHOWN


def _shown_run():
    """(the launcher's options, ranks) of the page's command, which both recipes run with."""
    words = shlex.split(SHOWN[0])
    assert words[0] == "mpirun" and words[3] == "-n" and words[5] == "python", words
    return tuple(words[1:3]), int(words[4])


@pytest.mark.parametrize("example", ["elastic_grow.py", "torch_elastic_grow.py"])
def test_a_killed_rank_is_replaced_and_training_ends_with_the_same_weights(example):
    _needs_ulfm()
    if example.startswith("torch"):
        pytest.importorskip("torch", reason="torch is not installed: the DDP recipe needs it")
    script = os.path.join(EXAMPLES, example)
    launcher_args, n = _shown_run()
    assert launcher_args == ULFM and n == 4
    runs = {}
    for kill in ("2", "-1"):
        done = run_job([sys.executable, script, "--kill-rank", kill], n,
                       launcher_args=launcher_args, clean=("HPCCOMM_*",), limit=150)
        assert done.code == 0, done.output
        runs[kill] = done.output
    failed = runs["2"]
    assert "rank 2: dying at step 10" in failed or "rank 2: dying at step 13" in failed
    assert re.search(r"rank 2: joined, going on from step 1[03]", failed), failed
    assert re.search(r"back to 4 ranks", failed), failed
    assert "joined" not in runs["-1"]
    assert _digest(failed) == _digest(runs["-1"])


# -- grow_group on any library -----------------------------------------------------------------
def _check_grown(found, n):
    survivors = list(range(n - 1))
    assert sorted(r for r in found if "rank_now" in found[r]) == survivors + [NEWCOMER]
    for rank in survivors + [NEWCOMER]:
        fields = found[rank]
        assert fields["rank_now"] == str(rank if rank != NEWCOMER else n - 1), fields
        assert fields["size"] == str(n) and fields["sum"] == str(n * (n + 1) // 2), fields
        assert fields["newcomers"] == f"[{n - 1}]" and fields["store"] == "True", fields
        assert fields["state"] == fields["shard"] == "True", fields
    assert found[0]["pair"] == "2" and found[NEWCOMER]["pair"] == "2"


@pytest.mark.parametrize("n", [2, 4, 8])
def test_a_spawned_newcomer_takes_the_vacant_place(n):
    done = run_case("planned", n)
    found = {}
    for rank, fields in done.results:
        found.setdefault(rank, {}).update(fields)
    assert done.code == 0, done.output
    _check_grown(found, n)


@pytest.mark.parametrize("n", [2, 4])
def test_a_job_started_apart_joins_through_a_directory(n, tmp_path):
    if not _connects_jobs():
        pytest.skip(f"{mpi_vendor()} does not connect separately started jobs")
    env = dict(DYNAMIC, HPCCOMM_JOIN=str(tmp_path))
    newcomer = start_job([sys.executable, os.path.join(helpers.SCRIPTS, "grow_case.py"),
                          "planned"], 1, env=env, clean=("HPCCOMM_*",))
    done = helpers.run_job(
        [sys.executable, os.path.join(helpers.SCRIPTS, "grow_case.py"), "join",
         str(tmp_path)], n, limit=90, clean=("HPCCOMM_*",), env=DYNAMIC)
    joined = newcomer.finish(60)
    assert done.code == 0 and joined.code == 0, done.output + joined.output
    found = {}
    for rank, fields in done.results + joined.results:
        found.setdefault(rank, {}).update(fields)
    _check_grown(found, n)
    assert not os.listdir(tmp_path), os.listdir(tmp_path)  # the handle was cleared away


def test_a_newcomer_that_never_comes_is_named_and_the_group_goes_on(tmp_path):
    if mpi_vendor() == "Open MPI":  # spawned, never starting MPI
        done = run_case("never_comes", 2)
        reason = r"did not start MPI within 3\.0 s"
    elif _connects_jobs():  # nobody waits in the join directory
        done = run_job([sys.executable, os.path.join(helpers.SCRIPTS, "grow_case.py"),
                        "never_joins", str(tmp_path)], 2, limit=60, clean=("HPCCOMM_*",),
                       env=DYNAMIC)
        reason = r"no join handle for them appeared in \S+ within 3\.0 s"
    else:
        pytest.skip(f"{mpi_vendor()}: neither case applies")
    found = {}
    for rank, fields in done.results:
        found.setdefault(rank, {}).update(fields)
    if mpi_vendor() == "Open MPI":  # its spawn never returns: no finalize under it (the
        # launcher's exit status then varies), and no crash; the first rank to end so says
        # why (the launcher may stop the other before it says it too)
        assert "Segmentation fault" not in done.output, done.output
        assert done.output.count("is still inside MPI_Comm_spawn") in (1, 2), done.output
    else:
        assert done.code == 0, done.output
    for rank in (0, 1):
        assert found[rank]["type"] == "DistTimeoutError", found[rank]
        assert float(found[rank]["elapsed"]) < 3 + 2, found[rank]
        assert re.search(rf"hpccomm\.grow_group on rank {rank}/2 of group 'WORLD': .*"
                         + reason, found[rank]["error"]), found[rank]
        assert found[rank]["after"] == "2" and found[rank]["size"] == "2", found[rank]


def test_open_mpi_says_to_spawn_instead_of_joining(tmp_path):
    if mpi_vendor() != "Open MPI":
        pytest.skip("only Open MPI's jobs cannot connect")
    done = run_job([sys.executable, os.path.join(helpers.SCRIPTS, "grow_case.py"),
                    "never_joins", str(tmp_path)], 2, limit=60, clean=("HPCCOMM_*",))
    found = {rank: fields for rank, fields in done.results if "type" in fields}
    assert done.code == 0, done.output
    for rank in (0, 1):
        assert found[rank]["type"] == "DistBackendError"
        assert "cannot connect separately started jobs" in found[rank]["error"]
        assert "grow_group(spawn=[...])" in found[rank]["error"]


def test_intel_mpi_says_how_to_turn_dynamic_processes_on():
    if mpi_vendor() != "Intel MPI":
        pytest.skip("only Intel MPI needs I_MPI_SPAWN")
    done = helpers.run_case("grow_case.py", "planned", 2, limit=60, clean=("HPCCOMM_*",))
    assert done.code != 0, done.output
    assert "only when the job runs with I_MPI_SPAWN=on" in done.output, done.output


def test_a_newcomer_that_starts_after_the_deadline_is_told_and_the_group_goes_on():
    if mpi_vendor() != "Open MPI":
        pytest.skip("MPICH and Intel MPI hold their lock through the spawn (the group "
                    "waits for it): docs/recovery.md")
    done = run_case("late", 2)
    found = {}
    for rank, fields in done.results:
        found.setdefault(rank, {}).update(fields)
    assert done.code == 0, done.output
    for rank in (0, 1):
        assert found[rank]["gave_up"] == "DistTimeoutError" and found[rank]["after"] == "2"
    assert "started after the job gave up waiting for it" in found[NEWCOMER]["told"], found
