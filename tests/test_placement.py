"""Where the ranks run, decided once (hpccomm/backends/mpi/placement.py): ranks bound one
per core, unbound, more ranks than CPUs, and simulated nodes, each as its own job under
this venv's MPI library. The poll policy and the shared-memory thresholds follow it."""
import json
import os
import sys

import pytest

from helpers import run_job
from launcher_env import mpi_vendor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASE = os.path.join(ROOT, "tests", "scripts", "placement_case.py")
CPUS = len(os.sched_getaffinity(0))


def binding(kind):
    """``(flags, environment)`` that make the launcher bind ranks to cores (``"core"``)
    or not (``"none"``). Intel MPI pins by default and unpins only through I_MPI_PIN."""
    vendor = mpi_vendor()
    if vendor == "Intel MPI":
        return ["-bind-to", kind], ({"I_MPI_PIN": "0"} if kind == "none" else {})
    if vendor == "Open MPI":  # 4 ranks bound to 2 cores need its permission
        return ["--bind-to", "core:overload-allowed" if kind == "core" else kind], {}
    return ["-bind-to", kind], {}


def job(n, placed=((), {}), **env):
    """Every rank's facts, by rank."""
    flags, extra = placed
    done = run_job([sys.executable, CASE], n, launcher_args=flags, env={**extra, **env},
                   clean=("HPCCOMM_*",), limit=90)
    assert done.code == 0, done.output
    facts = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(f["rank"] for f in facts) == list(range(n)), done.output
    return sorted(facts, key=lambda f: f["rank"])


def expected_threshold(ranks, crowded):
    """all_reduce's shared-memory threshold for a node of ``ranks`` ranks."""
    from hpccomm.backends.shm import communicator as shm, pair

    return shm.ring_thresholds(ranks, crowded, pair.available())["all_reduce"]


@pytest.mark.skipif(CPUS < 2, reason="needs 2 CPUs to bind 2 ranks one per core")
def test_ranks_bound_one_per_core_keep_the_fast_path():
    """Each rank's own mask is one CPU, but the node's ranks have one CPU each: not
    crowded, so the 2-rank kernel threshold and the rare-yield poll loop apply."""
    from hpccomm import work

    for fact in job(2, binding("core")):
        assert len(fact["mask"]) == 1 and fact["bound"], fact
        assert fact["cpus"] == 2 and not fact["crowded"], fact
        assert fact["polls"] == work.POLLS_ALONE
        assert fact["shared_memory"] and fact["min_reduce"] == expected_threshold(2, False)


@pytest.mark.skipif(CPUS < 2, reason="needs 2 CPUs")
def test_unbound_ranks_see_every_cpu():
    for fact in job(2, binding("none")):
        assert not fact["bound"] and fact["cpus"] == CPUS and not fact["crowded"], fact


@pytest.mark.skipif(CPUS >= 4, reason="needs fewer CPUs than 4 ranks")
@pytest.mark.parametrize("kind", ["core", "none"])
def test_more_ranks_than_cpus_is_crowded_bound_or_not(kind):
    from hpccomm import work

    for fact in job(4, binding(kind)):
        assert fact["crowded"] and fact["host_ranks"] == 4, fact
        assert fact["polls"] == work.POLLS_SHARED
        assert fact["min_reduce"] == expected_threshold(4, True)


def test_simulated_nodes_split_the_ranks_in_blocks():
    """HPCCOMM_NODES=2: two nodes of two consecutive ranks for hpccomm's decisions: the
    world spans nodes (no shared memory for it), local ranks count within a node, and
    the machine's crowding still counts every rank on it."""
    for fact in job(4, HPCCOMM_NODES=2):
        assert fact["nodes"] == 2 and fact["local_size"] == 2, fact
        assert fact["local"] == [fact["rank"] % 2, 2], fact
        assert not fact["shared_memory"], fact
        assert fact["host_ranks"] == 4 and fact["crowded"] == (4 > CPUS), fact
