"""torch's own distributed test suite on hpccomm, as torch's CI ran its MPI backend.

One rank of ``mpiexec -n 3 python torch_suite_case.py MODE``: torch's
``DistributedTest._DistTestBase`` (``torch/testing/_internal/distributed/distributed_test.py``,
shipped in the torch wheel) mixed into a ``TestCase``, after one
``init_process_group(backend="mpi")`` per rank, with ``BACKEND=mpi`` and
``WORLD_SIZE``, ``TEMP_DIR`` (with its ``barrier``, ``test_dir`` and ``init_dir``) set
by the test that starts the job (``tests/test_torch_suite.py``). Nothing of torch's
suite is changed; the tests run one by one, in name order, on every rank.

MODE ``torch_ci``: exactly what torch runs for ``"mpi"``. MODE ``beyond``: the same, with
hpccomm's features declared where torch's suite asks which backends have them
(``DistTestCases``: subgroups, coalesced all_gather, DDP), so that the tests torch skips
for its own ProcessGroupMPI run on hpccomm too.

Between two tests the ranks meet on an MPI communicator of their own and torch's file
barrier starts afresh, so one failing test cannot shift the next one's barriers. Each
test, with that meeting, runs under a time limit (``TORCH_SUITE_TEST_LIMIT``, seconds):
past it the rank prints every thread's stack and exits, which ends the job; the test
that was running is named in ``started-RANK``. Each rank appends one JSON line per test
to ``TEMP_DIR/results-RANK.jsonl``: ``[name, outcome, message, seconds]``, outcome
``passed``, ``failed`` or ``skipped`` (a ``sys.exit`` with one of torch's skip codes,
which its multi-process runner reads as a skip, is a skip here too).
"""
import faulthandler
import json
import os
import sys
import time
import unittest

# Each rank on one CPU, as jobs run in the field (mpiexec -bind-to core, srun): the suite
# checks that every profiler event lasts zero or more µs, and an event that starts on one
# thread and ends on another (as torch's asynchronous events do) takes its two times from
# the CPUs those threads ran on; on a virtual machine whose CPUs' clocks drift apart by
# more than a short operation lasts, an unbound rank's event can last "-158 µs". Set
# before any thread starts, so that every thread of the rank inherits it.
_cpus = sorted(os.sched_getaffinity(0))
_rank = int(os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
os.sched_setaffinity(0, {_cpus[_rank % len(_cpus)]})

MODE = sys.argv[1] if len(sys.argv) > 1 else "torch_ci"
LIMIT = float(os.environ.get("TORCH_SUITE_TEST_LIMIT", "90"))
TEMP_DIR = os.environ["TEMP_DIR"]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import hpccomm.torch  # noqa: E402,F401  (serves backend "mpi")
from torch.testing._internal import common_distributed  # noqa: E402

if MODE == "beyond":  # hpccomm has what torch's suite asks of these backends
    features = common_distributed.DistTestCases.backend_feature
    for feature in ("subgroup", "ddp", "gpu"):
        features[feature] = set(features[feature]) | {"mpi"}
    skips = common_distributed.DistTestCases.skip_collective
    skips["allgather_coalesced"] = set(skips["allgather_coalesced"]) - {"mpi"}

from torch.testing._internal.common_utils import TestCase  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    Barrier, DistributedTest)

dist.init_process_group(backend=os.environ["BACKEND"])
rank = dist.get_rank()

from mpi4py import MPI  # noqa: E402  (MPI is up: hpccomm started it)

harness = MPI.COMM_WORLD.Dup()  # the ranks' own meeting point between two tests


class TestMPI(TestCase, DistributedTest._DistTestBase):
    # what torch's multi-process runner gives each test (some of the suite's tests read them)
    rank = dist.get_rank()
    world_size = int(os.environ["WORLD_SIZE"])


SKIP_CODES = {skip.exit_code: skip.message for skip in common_distributed.TEST_SKIPS.values()}


def outcome(result):
    """``(outcome, message)`` of one test's ``unittest.TestResult``."""
    problems = result.failures + result.errors
    for _, text in problems:
        last = text.strip().splitlines()[-1] if text.strip() else ""
        if last.startswith("SystemExit: "):
            code = last.split(": ", 1)[1].strip()
            if code.isdigit() and int(code) in SKIP_CODES:
                return "skipped", SKIP_CODES[int(code)]
    if problems:
        return "failed", problems[0][1][-3000:]
    if result.skipped:
        return "skipped", str(result.skipped[0][1])
    return "passed", ""


names = sorted(unittest.defaultTestLoader.getTestCaseNames(TestMPI))
only = os.environ.get("TORCH_SUITE_ONLY")
if only:
    names = [name for name in names if any(part in name for part in only.split(","))]
results = open(os.path.join(TEMP_DIR, f"results-{rank}.jsonl"), "w")
for name in names:
    with open(os.path.join(TEMP_DIR, f"started-{rank}"), "w") as started:
        started.write(name)
    faulthandler.dump_traceback_later(LIMIT, exit=True)
    harness.Barrier()
    if rank == 0:  # torch's file barrier afresh, as its multi-process runner does per test
        Barrier.init()
    harness.Barrier()
    Barrier.barrier_id = 0
    result = unittest.TestResult()
    began = time.monotonic()
    TestMPI(name).run(result)
    faulthandler.cancel_dump_traceback_later()
    kind, message = outcome(result)
    results.write(json.dumps([name, kind, message, round(time.monotonic() - began, 2)]) + "\n")
    results.flush()
    if rank == 0:
        print(f"{name}: {kind}", flush=True)
results.close()
faulthandler.dump_traceback_later(LIMIT, exit=True)
harness.Barrier()
harness.Free()
dist.destroy_process_group()
