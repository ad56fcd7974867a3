"""pytest on one rank of an MPI job: XML report per rank, rank > 0 output to a log.

Called by run_suite.py as ``mpiexec -n N python tests/rank_pytest.py REPORTS N pytest-args...``.
"""
import os
import sys

import pytest

RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def main():
    reports, n = sys.argv[1], sys.argv[2]
    rank = next((os.environ[v] for v in RANK_VARS if v in os.environ), "0")
    os.makedirs(reports, exist_ok=True)
    base = os.path.join(reports, f"n{n}-rank{rank}")
    if rank != "0":
        log = os.open(base + ".log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
    code = pytest.main([*sys.argv[3:], f"--junitxml={base}.xml"])
    sys.stdout.flush()
    return 0 if code in (0, 5) else code  # 5: no test ran at this size


if __name__ == "__main__":
    sys.exit(main())
