"""Group creation cannot hang: MPI's blocking creation calls are preceded by a timed meeting."""
import os
import sys

import pytest

from helpers import result_lines, run_case, run_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "group_creation_case.py")

ABSENT = {"new_group": 1, "split": 2, "mesh": 0}


@pytest.mark.parametrize("case", sorted(ABSENT))
def test_a_rank_missing_from_group_creation_becomes_a_timeout(case):
    result = run_job([sys.executable, SCRIPT, case], 3, limit=90)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT")]
    absent = ABSENT[case]
    assert f"RESULT rank {absent} no error" in lines, result.output
    waiting = [line for line in lines if not line.startswith(f"RESULT rank {absent} ")]
    assert len(waiting) == 2, result.output
    for line in waiting:
        assert "timeout after" in line and "waiting for" in line
        assert float(line.split("timeout after ")[1].split("s")[0]) < 2.0 + 2.0
    for line in waiting:
        if absent != 0:  # the first participant names the one that never came, to all
            assert f"global rank {absent} never came" in line, line
        else:  # the first participant itself never came: it never answered
            assert "global rank 0, the first participant, did not answer" in line, line


def test_a_user_barrier_never_pairs_with_a_group_s_hidden_meeting():
    """Half the ranks make a DeviceMesh group (its Cartesian communicator meets the
    world first) while the others call a barrier on the world: the meeting is on
    reserved tags, so the barrier cannot pair with it. Every rank raises a timeout
    naming the ranks that did not come, none returns and none waits past the
    deadline in MPI's blocking creation call."""
    result = run_job([sys.executable, SCRIPT, "mesh_vs_barrier"], 4, limit=90)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT")]
    assert len(lines) == 4 and not any("no error" in line for line in lines), result.output
    for line in lines:
        assert float(line.split("timeout after ")[1].split("s")[0]) < 2.0 + 2.0, line
    meeting = [line for line in lines if line.startswith(("RESULT rank 0 ", "RESULT rank 2 "))]
    barrier = [line for line in lines if line.startswith(("RESULT rank 1 ", "RESULT rank 3 "))]
    for line in meeting:
        assert "DeviceMesh" in line and "global ranks [1, 3] never came" in line, line
    for line in barrier:
        assert "barrier" in line and "Global ranks 0, 2 never joined" in line, line


#: Grace past a creation's timeout within which every rank must have its error (the
#: meeting's verdict grace, with room for a busy machine).
GRACE_S = 2.5


@pytest.mark.parametrize("case,other", [
    ("members", "new_group(ranks=[0, 2])"),
    ("kinds", "split_group(split_ranks=[[0, 1, 2]]) of group 'WORLD'")])
def test_ranks_that_come_to_make_different_groups_all_get_a_desync_error(case, other):
    """Ranks 0 and 1 call new_group([0, 1, 2]) while rank 2 calls another creation
    (other members, or split_group) under a 2 s timeout: each meeting says what it
    meets for, so every rank raises DistDesyncError at once, naming each rank's call,
    instead of entering MPI's blocking creation with different arguments."""
    job = run_case("creation_mistakes_case.py", case, 3, limit=45)
    found = dict(result_lines(job.output))
    assert sorted(found) == [0, 1, 2], job.output
    for rank, fields in found.items():
        assert fields["type"] == "DistDesyncError", (rank, job.output)
        # found by the meeting, not by a timeout (that would be a DistTimeoutError); the
        # bound is every creation's: the timeout and the meeting's grace, on a busy machine too
        assert float(fields["elapsed"]) < 2.0 + GRACE_S, (rank, fields)
        error = fields["error"]
        for needle in (f"on rank {rank}/3 of group 'WORLD'",
                       "global ranks 0 and 1 came for new_group(ranks=[0, 1, 2])",
                       f"global rank 2 came for {other}", "nothing was created"):
            assert needle in error, (needle, error)
    assert job.code == 0, job.output


def test_a_retry_after_a_timed_out_creation_works_on_every_rank():
    """Rank 2 comes 3.5 s late to new_group([0, 1, 2]) with a 2 s timeout: ranks 0 and 1
    raise a timeout naming it, and rank 2 one naming rank 0, which never answered, each
    within the timeout and the grace. Then all three meet at a barrier and call it
    again: the first meeting left nothing posted that could take the second one's
    messages, so the retry makes the group on every rank."""
    job = run_case("creation_mistakes_case.py", "retry", 3, limit=60)
    found = dict(result_lines(job.output))
    assert sorted(found) == [0, 1, 2], job.output
    for rank, fields in found.items():
        assert fields["type"] == "DistTimeoutError", (rank, job.output)
        late = 3.5 if rank == 2 else 0.0
        assert float(fields["elapsed"]) < late + 2.0 + GRACE_S, (rank, fields)
        error = fields["error"]
        assert f"hpccomm.new_group on rank {rank}/3 of group 'WORLD'" in error, error
        if rank == 2:
            assert "global rank 0, the first participant, did not answer" in error, error
        else:
            assert "global rank 2 never came within 2.0 s" in error, error
        assert fields["again"] == "ok", (rank, job.output)
    assert job.code == 0, job.output
