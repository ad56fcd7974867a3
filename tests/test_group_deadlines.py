"""Group creation cannot hang: MPI's blocking creation calls are preceded by a timed meeting."""
import os
import sys

import pytest

from helpers import run_job

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
        else:  # the first participant itself never came: it is the peer waited for
            assert "with peer 0" in line, line


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
