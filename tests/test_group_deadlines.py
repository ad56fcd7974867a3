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
    if case == "new_group":  # the first member names the member that never came
        leader = next(line for line in waiting if line.startswith("RESULT rank 0 "))
        assert f"with peer {absent}" in leader
