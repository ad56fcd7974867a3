"""Every MPI library, every call pattern: correct results, and a timeout that holds.

The MPI backend starts operations as nonblocking calls, or, where the library's table
says so (:mod:`hpccomm.backends.mpi.gate`), gates large synchronous ones: a signature
exchange polled under the deadline, then the blocking call. These tests run under
whichever MPI the suite runs on (``tests/run.sh`` runs it on MPICH, then Open MPI, then
Intel MPI) and force gating on with ``HPCCOMM_MPI_GATED`` so both patterns are checked
on every library.
"""
import functools
import os
import re
import sys
import textwrap

import numpy as np
import pytest

import helpers
from helpers import ROOT, run_job
from helpers import result_lines as results

from hpccomm.backends.mpi import gate as mpi_gate

#: A case of tests/scripts/call_pattern_case.py as its own job.
run_case = functools.partial(helpers.run_case, "call_pattern_case.py")
KiB = 1024


# -- the table ------------------------------------------------------------------------------
def test_each_library_has_a_row_and_unknown_ones_stay_nonblocking():
    assert mpi_gate.family("Open MPI") == "openmpi"
    assert mpi_gate.family("MPICH") == "mpich"
    assert mpi_gate.family("Intel MPI") == "intel"
    assert mpi_gate.family("Some MPI") == "other"
    plain = mpi_gate.gated_from("Some MPI", environ={})
    assert set(plain) == set(mpi_gate.CALLS.values())
    assert all(limit == mpi_gate.NEVER for limit in plain.values())


def test_mpich_gates_only_its_large_reduce_scatter():
    table = mpi_gate.gated_from("MPICH", environ={})
    assert table.pop("Ireduce_scatter_block") == 1024 * KiB
    assert all(limit == mpi_gate.NEVER for limit in table.values())


def test_the_environment_overrides_the_table():
    every = mpi_gate.gated_from("MPICH", environ={"HPCCOMM_MPI_GATED": "all=256K"})
    assert set(every.values()) == {256 * KiB}
    some = mpi_gate.gated_from("Open MPI", environ={"HPCCOMM_MPI_GATED":
                                                    "all_reduce=64K, broadcast=1M"})
    assert some["Iallreduce"] == 64 * KiB and some["Ibcast"] == 1024 * KiB
    assert some["Iallgather"] == mpi_gate.NEVER  # only what the override names
    off = mpi_gate.gated_from("Open MPI", environ={"HPCCOMM_MPI_GATED": "off"})
    assert all(limit == mpi_gate.NEVER for limit in off.values())
    # a malformed override warns, naming the variable, and the library's table applies
    with pytest.warns(RuntimeWarning, match=r"HPCCOMM_MPI_GATED='allreduce=1K' is malformed: "
                                            r"unknown operation 'allreduce'.*table for Open MPI"):
        typo = mpi_gate.gated_from("Open MPI", environ={"HPCCOMM_MPI_GATED": "allreduce=1K"})
    assert typo == mpi_gate.gated_from("Open MPI", environ={})


# -- gated calls give the same results ---------------------------------------------------------
@pytest.fixture
def gated_group(dist, monkeypatch):
    """A group whose synchronous collectives are all gated from 1 byte, and a count of the
    blocking calls made through gates."""
    from hpccomm.backends.mpi import communicator

    monkeypatch.setattr(communicator, "_GATED_FROM", {name: 1 for name in mpi_gate.CALLS.values()})
    blocking = []
    finish = mpi_gate.Gated.finish

    def counted(self):
        if self.block:
            blocking.append(self.call.__name__)
        return finish(self)
    monkeypatch.setattr(mpi_gate.Gated, "finish", counted)
    monkeypatch.setenv("HPCCOMM_SHM_SMALL", "0")  # small messages through MPI, gated
    group = dist.new_group()
    yield group, blocking
    dist.destroy_process_group(group)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", ["sync", "async", "async on rank 0 only"])
def test_gated_collectives_give_the_nonblocking_results(dist, rank, size, gated_group, mode):
    """Whether a call waits at once is each rank's own choice (as in torch): where one
    rank does not, every rank takes the nonblocking call, never a blocking call that the
    other's nonblocking one would not match."""
    group, blocking = gated_group
    n, root = 6, size - 1
    async_op = mode == "async" or (mode != "sync" and rank == 0)

    def done(work):
        if async_op:
            work.wait()

    x = np.arange(n, dtype=np.float64) + rank
    done(dist.all_reduce(x, group=group, async_op=async_op))
    np.testing.assert_allclose(x, size * np.arange(n) + size * (size - 1) / 2)
    x = np.full(n, float(rank + 1))
    done(dist.all_reduce(x, op=dist.ReduceOp.AVG, group=group, async_op=async_op))
    np.testing.assert_allclose(x, (size + 1) / 2)
    x = np.full(n, float(rank))
    done(dist.broadcast(x, src=root, group=group, async_op=async_op))
    np.testing.assert_array_equal(x, root)
    x = np.full(n, rank + 1, dtype=np.int64)
    done(dist.reduce(x, dst=root, group=group, async_op=async_op))
    if rank == root:
        np.testing.assert_array_equal(x, size * (size + 1) // 2)
    out = np.zeros(n * size)
    done(dist.all_gather_into_tensor(out, np.full(n, float(rank)), group=group,
                                     async_op=async_op))
    np.testing.assert_array_equal(out, np.repeat(np.arange(size, dtype=float), n))
    parts = [np.zeros(n) for _ in range(size)] if rank == root else None
    done(dist.gather(np.full(n, float(rank)), parts, dst=root, group=group,
                     async_op=async_op))
    if rank == root:
        np.testing.assert_array_equal(np.stack(parts),
                                      np.repeat(np.arange(size, dtype=float), n).reshape(size, n))
    got = np.zeros(n)
    pieces = [np.full(n, float(r)) for r in range(size)] if rank == root else None
    done(dist.scatter(got, pieces, src=root, group=group, async_op=async_op))
    np.testing.assert_array_equal(got, rank)
    out = np.zeros(n)
    done(dist.reduce_scatter_tensor(out, np.arange(n * size, dtype=float), group=group,
                                    async_op=async_op))
    np.testing.assert_array_equal(out, size * np.arange(n * rank, n * (rank + 1)))
    out = np.zeros(n * size)
    done(dist.all_to_all_single(out, np.full(n * size, float(rank)), group=group,
                                async_op=async_op))
    np.testing.assert_array_equal(out, np.repeat(np.arange(size, dtype=float), n))
    if size == 1 or mode != "sync":
        assert blocking == []  # nothing to meet in a group of one; async never blocks
    else:
        assert sorted(set(blocking)) == sorted(mpi_gate.CALLS.values())


# -- the timeout holds, whatever MPI does -------------------------------------------------------
def test_an_absent_rank_gives_every_other_rank_a_timeout():
    """Rank 1 of 4 never joins; every operation, small (nonblocking) and large (gated),
    synchronous and async, raises DistTimeoutError on the others within the timeout plus
    the roll call."""
    timeout, grace = 0.5, 0.1
    code, output, _ = run_case("absent_rank", 4, CASE_TIMEOUT=timeout,
                            CASE_SLEEP=2 * 9 * (timeout + grace) + 3,
                            HPCCOMM_ROLLCALL_GRACE=grace, HPCCOMM_MPI_GATED="all=1K")
    assert code == 0, output
    found = results(output)
    assert sorted({rank for rank, _ in found}) == [0, 2, 3], output
    assert len(found) == 3 * 2 * 9, output  # 3 ranks, 2 sizes, 9 operations
    for rank, fields in found:
        if fields.get("error") == "no error" and fields["op"] in ("gather", "reduce") \
                and rank != 0:
            continue  # a contribution sent straight to the present root may complete
        assert "elapsed" in fields, (rank, fields)
        assert float(fields["elapsed"]) <= timeout + grace + 2.0, (rank, fields)


def test_ranks_in_different_gated_collectives_fail_at_once():
    # both through MPI (from 3 ranks a 1 MiB all_reduce would take the small channel)
    code, output, _ = run_case("different_collectives", 3, CASE_TIMEOUT=30,
                            HPCCOMM_MPI_GATED="all=1K", HPCCOMM_SHM_SMALL="0")
    assert code == 0, output
    found = dict(results(output))
    assert sorted(found) == [0, 1, 2], output
    for rank, fields in found.items():
        assert fields["kind"] == "DistDesyncError", fields  # the ranks called different ones
        assert float(fields["elapsed"]) < 10, fields  # at once, not after the timeout
        assert "different collectives" in fields["error"]
        assert "MPI_Allreduce of 1048576 bytes" in fields["error"]
        assert "MPI_Bcast of 1048576 bytes, root 0" in fields["error"]


def test_a_timed_out_test_does_not_make_the_next_ones_wait(tmp_path):
    """After a test times out on the session's group, the tests after it fail at once."""
    (tmp_path / "conftest.py").write_text(
        open(os.path.join(ROOT, "tests", "conftest.py")).read())
    (tmp_path / "test_broken.py").write_text(textwrap.dedent("""
        import time
        import numpy as np
        import pytest

        @pytest.mark.mpi(min_size=2)
        def test_rank_one_is_late(dist, rank):
            if rank == 1:
                time.sleep(6)  # past the timeout: rank 0 gives up on the group
            dist.all_reduce(np.ones(2))

        @pytest.mark.mpi(min_size=2)
        @pytest.mark.parametrize("i", range(5))
        def test_later(dist, i):
            dist.all_reduce(np.ones(2))
    """))
    done = run_job([sys.executable, "-m", "pytest", "-q", "--color=no", "-p", "no:cacheprovider",
                    "-m", "mpi", "--with-mpi", "--rootdir", str(tmp_path),
                    str(tmp_path / "test_broken.py")], 2, cwd=tmp_path, limit=90,
                   env={"HPCCOMM_TEST_TIMEOUT": "2", "HPCCOMM_ROLLCALL_GRACE": "0.2"})
    elapsed, output = done.seconds, done.output
    assert "not run: the default group is unusable since" in output, output
    # rank 0: the late test fails, the five after it error at once in their fixture
    assert re.search(r"1 failed, 5 errors", output), output
    assert elapsed < 40, output  # five more timeouts would take at least 10 s each rank
