"""Every example of PyTorch's "Writing Distributed Applications" tutorial runs to the end
under hpccomm, at the tutorial's rank counts and at 4 ranks.

Each example is its own MPI job (tests/torch_port/tutorial_examples.py), started from a
serial test with a hard time limit, so a hang fails this test alone.
"""
import os
import re
import sys

import pytest
from helpers import run_job
from hpccomm.stores import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "tutorial_examples.py")
LIMIT_S = 90


def run_example(example, n, **env):
    # PYTHONUNBUFFERED would write each piece of the tutorial's multi-argument print()
    # separately, so two ranks' lines could interleave mid-line in the shared pipe.
    done = run_job([sys.executable, SCRIPT, example], n, env=env, limit=LIMIT_S, clean=(
        "SLURM_*", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHONUNBUFFERED"))
    output = done.output
    assert done.code == 0, output
    results = {}
    for line in done.stdout.splitlines():
        found = re.search(r"RESULT rank=(\d+) (.*)", line)
        if found:
            results[int(found.group(1))] = found.group(2)
    assert sorted(results) == list(range(n)), output
    return results, output


@pytest.mark.parametrize("n", [2, 4])
def test_template(n):
    results, _ = run_example("template", n)
    assert all(line == f"template size={n}" for line in results.values())


@pytest.mark.parametrize("example", ["blocking", "nonblocking"])
def test_point_to_point(example):
    """The point-to-point examples are written for the tutorial's two processes."""
    results, output = run_example(example, 2)
    assert results == {0: f"{example} data=1.0", 1: f"{example} data=1.0"}
    assert "Rank  1  has data  1.0" in output


@pytest.mark.parametrize("n", [2, 4])
def test_all_reduce_on_a_group(n):
    """The All-Reduce example: ``new_group([0, 1])`` called by every rank; ranks 2 and 3
    are outside it, get torch's warning, and nobody hangs afterwards."""
    results, output = run_example("all_reduce", n)
    for rank, line in results.items():
        assert line == f"all_reduce data={2.0 if rank < 2 else 1.0} world={float(n)}"
    warned = re.findall(r"Running all_reduce on global rank (\d) which does not belong",
                        output)
    assert sorted(map(int, warned)) == list(range(2, n))


def test_all_reduce_with_the_deprecated_reduce_op():
    results, output = run_example("all_reduce_legacy", 4)
    assert [results[r] for r in range(4)] == ["all_reduce_legacy data=2.0"] * 2 + \
        ["all_reduce_legacy data=1.0"] * 2
    assert "reduce_op is deprecated" in output


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_as_the_tutorial_lists_them(n):
    results, _ = run_example("collectives", n)
    assert set(results.values()) == {"collectives ok"}


@pytest.mark.parametrize("n", [2, 4])
def test_partitioned_dataset(n):
    results, _ = run_example("partition", n)
    assert set(results.values()) == {f"partition samples={1200 // n}"}


@pytest.mark.parametrize("n", [2, 4])
def test_distributed_synchronous_sgd(n):
    """Every replica ends with the same weights and the loss falls by half or more (both
    checked in the example itself)."""
    results, _ = run_example("sgd", n)
    for line in results.values():
        first, last = (float(part.split("=")[1]) for part in line.split()[1:])
        assert last < first / 2


@pytest.mark.parametrize("n", [2, 4])
def test_ring_allreduce(n):
    results, _ = run_example("ring", n)
    expected = 15.0 * n * (n + 1) / 2
    assert set(results.values()) == {f"ring sum={expected}"}


def test_mpi_backend_section():
    """``init_process(0, 0, run, backend='mpi')`` under ``mpirun -n 4``: rank and world
    size come from MPI, as the tutorial says."""
    results, output = run_example("mpi_all_reduce", 4)
    assert [results[r].split()[1] for r in range(4)] == ["data=2.0"] * 2 + ["data=1.0"] * 2
    assert "are ignored since they are assigned by the MPI runtime" in output


@pytest.mark.parametrize("method", ["env", "file", "tcp"])
def test_initialization_methods(tmp_path, method):
    results, _ = run_example(f"init_{method}", 2, CASE_PORT=free_port(),
                             CASE_PATH=tmp_path / "sharedfile")
    store = {"env": "TCPStore", "file": "FileStore", "tcp": "TCPStore"}[method]
    assert set(results.values()) == {f"init_{method} store={store}"}
