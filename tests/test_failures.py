"""Programs that fail on purpose, as their own jobs under this venv's MPI library.

* No traceback is lost: a rank's uncaught exception (plain, in a thread, under torch's
  own excepthook) must reach the launcher's output before the abort ends the job, in
  every one of many runs (the abort races the launcher's read of the rank's stderr).
* A dead rank (SIGKILL, ``os._exit``) ends the job within a bound, and the output
  names it where the library says who died.
* An NCCL creation that never ends (simulated GPU) ends the job at the group's timeout,
  saying which creation and what to check.
* With ULFM (Open MPI's ``mpirun --with-ft ulfm``) the survivors raise
  ``ProcessFailedError`` naming the dead rank, shrink, agree and go on; without it the
  fault-tolerance calls say how to launch.

The cases are tests/scripts/failure_case.py.
"""
import concurrent.futures
import functools
import os
import re
import sys

import numpy as np
import pytest

import helpers
from helpers import run_job
from launcher_env import mpi_vendor
from hpccomm.stores import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "elastic_data_parallel.py")
#: Runs of each traceback case: the loss was a race seen about once in ten runs. The
#: torch cases run a third as often: the race is in the abort path they share with the
#: others (torch's excepthook only wraps hpccomm's), and each run imports torch (~2 s).
REPEATS = int(os.environ.get("HPCCOMM_TEST_FAILURE_REPEATS", "30"))
#: Jobs at once: the launchers mostly wait, and a loaded machine makes the race likelier.
AT_ONCE = 2
#: A job whose rank died must end long before the cases' group timeout (120 s).
JOB_END_S = 20


#: A case of tests/scripts/failure_case.py as its own job, at none of this process's
#: hpccomm settings.
run_case = functools.partial(helpers.run_case, "failure_case.py", limit=60, clean=("HPCCOMM_*",))
#: Open MPI's launcher arguments for a job with ULFM.
ULFM = ("--with-ft", "ulfm")


def results(output):
    """``{rank: fields}`` from the ``RESULT rank=R t=S key=value...`` lines, a rank's
    lines merged (``error=`` is last on its line)."""
    found = {}
    for line in output.splitlines():
        line = line[line.find("RESULT "):]
        if line.startswith("RESULT "):
            fields = dict(re.findall(r"(\w+)=(.*?)(?= \w+=|$)", line[7:]))
            found.setdefault(int(fields.pop("rank")), {}).update(fields)
    return found


# -- no traceback is lost ----------------------------------------------------------------------
TRACEBACK_CASES = {
    "exception": "ValueError: boom on purpose in rank 1",
    "thread_exception": "ValueError: boom on purpose in a thread of rank 1",
    "torch_mpi_exception": "[rank1]: ValueError: boom on purpose in rank 1",
    "torch_env_exception": "[rank1]: ValueError: boom on purpose in rank 1",
}


def _one_traceback_run(case):
    """``(lost, what happened)``: the job must end (the run's limit bounds it, whatever
    time the start-up took on a busy machine) with the traceback in its output."""
    code, output, elapsed = run_case(case, 2, MASTER_PORT=free_port())
    lost = (code == 0 or TRACEBACK_CASES[case] not in output
            or "aborts the whole job" not in output or "not reached" in output)
    return lost, f"exit {code} after {elapsed:.1f} s:\n{output}"


@pytest.mark.parametrize("case", sorted(TRACEBACK_CASES))
def test_no_traceback_is_lost(case):
    if case.startswith("torch"):
        pytest.importorskip("torch", reason="torch is not installed: the torch excepthook "
                                            "cases need it")
    repeats = max(1, REPEATS // 3) if case.startswith("torch") else REPEATS
    with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
        runs = list(pool.map(_one_traceback_run, [case] * repeats))
    lost = [text for bad, text in runs if bad]
    assert not lost, f"{len(lost)} of {repeats} runs lost the traceback; first:\n{lost[0]}"


# -- a dead rank ends the job ------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_a_dead_rank_ends_the_job_within_a_bound(n, how):
    vendor = mpi_vendor()
    code, output, elapsed = run_case(how, n, limit=JOB_END_S + 30)
    assert elapsed < JOB_END_S and code != 0, (code, elapsed, output)
    # Who says which rank died, by library (docs/never-hang.md, "When a rank dies").
    if vendor == "Open MPI":
        assert re.search(r"process rank 1 with PID|Process name: \[\S+,1\]", output), output
    elif how == "sigkill" and vendor == "MPICH":  # a PID, not always the dead one's
        assert re.search(r"PID \d+ RUNNING AT", output), output
    elif how == "sigkill" and vendor == "Intel MPI":
        assert re.search(r"RANK 1 PID \d+ RUNNING AT", output), output


# -- survivors carry on (ULFM) -----------------------------------------------------------------
def _needs_ulfm():
    if mpi_vendor() != "Open MPI":
        pytest.skip(f"ULFM needs Open MPI (`mpirun --with-ft ulfm`); this venv runs "
                    f"{mpi_vendor()}")


@pytest.mark.parametrize("n", [3, 4])
def test_survivors_name_the_dead_rank_shrink_agree_and_go_on(n):
    _needs_ulfm()
    code, output, _ = run_case("survive", n, launcher_args=ULFM, CASE_TIMEOUT=10)
    found = results(output)
    survivors = [r for r in range(n) if r != 1]
    assert sorted(r for r in found if "failed" in found[r]) == survivors, output
    for rank in survivors:
        assert found[rank]["failed"] == "[1]", found[rank]
        assert float(found[rank]["elapsed"]) < 10 + 2, found[rank]
        assert "global rank 1 has failed" in found[rank]["error"]
    # after the shrink: renumbered, summed, agreed; the last survivor was then excluded
    assert found[survivors[-1]].get("event") == "excluded", output
    for new_rank, rank in enumerate(survivors[:-1]):
        assert found[rank]["new_rank"] == str(new_rank)
        assert found[rank]["sum"] == str(sum(survivors))
        assert found[rank]["agree"] == "[True, False, 6]"
        assert found[rank]["mesh"] == str(n - 1)
        assert found[rank]["planned"] == f"{n - 2},{n - 2}"
    assert code == 0, output


@pytest.mark.parametrize("binding", ["cupy", "nccl4py"])
def test_gpu_survivors_abort_the_old_nccl_communicator_and_go_on(binding):
    """The simulated GPU: after the shrink the survivors' GPU collective works on a
    communicator of their own, and the old one, which holds the dead, was aborted. Through
    CuPy their next GPU collective bootstraps it; through nccl4py on NCCL 2.27 the shrink
    makes it (``ncclCommShrink`` with ``NCCL_SHRINK_ABORT``), with no bootstrap."""
    _needs_ulfm()
    env = {} if binding == "cupy" else {"HPCCOMM_NCCL_BINDING": "nccl4py",
                                        "SIM_NCCL_VERSION": "22703"}
    code, output, _ = run_case("gpu_survive", 3, launcher_args=ULFM, CASE_TIMEOUT=10, **env)
    found = results(output)
    assert sorted(r for r in found if "gpu_sum" in found[r]) == [0, 2], output
    for rank in (0, 2):
        assert found[rank]["aborted"] == "True", found[rank]
        assert found[rank]["gpu_sum"] == "2", found[rank]
        assert (found[rank]["bootstraps"], found[rank]["shrinks"]) == (
            ("1", "[]") if binding == "cupy" else ("0", "[1]")), found[rank]  # SHRINK_ABORT
    assert code == 0, output


@pytest.mark.parametrize("step", ["init", "split"])
def test_an_nccl_creation_that_never_ends_ends_the_job_at_the_timeout(step):
    """Every rank came to make the communicator (the default group's, or a split of it),
    then NCCL's own creation never returns on rank 1 (the simulated GPU stalls it there,
    as a bootstrap that cannot connect would): past the group's timeout the ranks say
    which creation outlived it and what to check, and the job ends; no rank goes on."""
    code, output, elapsed = run_case("gpu_stall", 3, limit=JOB_END_S + 30, CASE_TIMEOUT=30,
                                     CASE_STALL_TIMEOUT=2, SIM_NCCL_STALL=f"{step}:1")
    assert code != 0 and elapsed < JOB_END_S, (code, elapsed, output)
    what = {"init": "(the group's communicator)",
            "split": "(a communicator split from the group's, its 1st (ncclCommSplit))"}
    assert re.search(r"hpccomm NCCL backend, rank \d/3 of its group \(global rank \d\): "
                     r"NCCL communicator creation " + re.escape(what[step]) +
                     r" did not finish within 2 s", output), output
    assert "NCCL_SOCKET_IFNAME" in output and "not reached" not in output, output
    found = results(output)
    made = sorted(r for r in found if found[r].get("made") == "group")
    assert made == ([] if step == "init" else [0, 1, 2]), output


def test_agreements_are_right_beside_threads_that_poll_mpi():
    _needs_ulfm()
    code, output, _ = run_case("agree_beside_a_thread", 3, launcher_args=ULFM, CASE_TIMEOUT=30)
    found = results(output)
    assert sorted(found) == [0, 1, 2], output
    for rank in range(3):
        assert found[rank]["wrong"] == "0", (rank, found[rank])
    assert code == 0, output


def test_torch_survivors_shrink_and_train_again():
    _needs_ulfm()
    pytest.importorskip("torch", reason="torch is not installed: the torch case needs it")
    code, output, _ = run_case("torch_survive", 3, launcher_args=ULFM, limit=120,
                               CASE_TIMEOUT=30)
    found = results(output)
    for new_rank, rank in enumerate([0, 2]):
        assert found[rank]["failed"] == "[1]", output
        assert found[rank]["type"] == "ProcessFailedError"
        assert found[rank]["new_rank"] == str(new_rank) and found[rank]["size"] == "2"
        assert found[rank]["ddp_same_grads"] == "True" and found[rank]["agree"] == "True"
    assert code == 0, output


def test_a_failed_receive_names_the_sender_and_stops_the_others():
    _needs_ulfm()
    code, output, _ = run_case("survive_p2p", 3, launcher_args=ULFM, CASE_TIMEOUT=10)
    found = results(output)
    assert sorted(found) == [0, 2], output
    assert "recv (seq 2) with peer 1" in found[0]["error"]
    assert "barrier (seq 2)" in found[2]["error"]
    for rank in (0, 2):
        assert found[rank]["failed"] == "[1]" and float(found[rank]["elapsed"]) < 12


def test_elastic_example_recovers_under_ulfm():
    _needs_ulfm()
    done = run_job([sys.executable, EXAMPLE], 4, launcher_args=ULFM, clean=("HPCCOMM_*",),
                   limit=120)
    output = done.output
    assert done.code == 0, output
    assert "rank 2: dying at step 13" in output
    assert "going on with 3 ranks" in output
    assert "trained 40 steps, finishing on 3 ranks; the weights match" in output


# -- without ULFM: a clear error, never a silent duplicate --------------------------------------
@pytest.mark.mpi(min_size=2)
def test_without_ulfm_fault_calls_say_how_to_launch(dist, rank, size):
    if dist.is_fault_tolerant():
        pytest.skip("this job runs with ULFM")
    for call in (dist.shrink_group, dist.revoke, lambda: dist.agree(True)):
        with pytest.raises(dist.DistBackendError, match=r"mpirun --with-ft ulfm"):
            call()


@pytest.mark.mpi(min_size=2)
def test_planned_exclusion_works_on_any_mpi(dist, rank, size):
    group = dist.new_group(list(range(size)))
    if rank == size - 1:  # excluded ranks do not call it
        with pytest.raises(dist.DistValueError, match="excluded ranks must not call"):
            dist.shrink_group([size - 1], group=group)
        dist.destroy_process_group(group)
        return
    smaller = dist.shrink_group([size - 1], group=group)
    assert dist.get_process_group_ranks(smaller) == list(range(size - 1))
    assert smaller.rank() == rank
    x = np.ones(2)
    dist.all_reduce(x, group=smaller)
    assert x.tolist() == [size - 1] * 2
    dist.destroy_process_group(smaller)


@pytest.mark.mpi(min_size=1)
def test_shrink_group_checks_its_arguments_as_torch(dist, rank, size):
    for bad, kind in [((1,), TypeError), ([], ValueError), ([size], ValueError),
                      ([0, 0], ValueError), (list(range(size)), ValueError)]:
        with pytest.raises(kind):
            dist.shrink_group(bad)
    with pytest.raises(ValueError, match="shrink_flags"):
        dist.shrink_group([0], shrink_flags=7)
