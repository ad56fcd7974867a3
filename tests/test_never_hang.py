"""Never hang, always explain: timeouts, monitored_barrier, desync detection, flight recorder.

Scenarios that break a group (a skipped collective, absent ranks, an uncaught exception)
run as their own ``mpiexec`` jobs from serial tests (tests/scripts/never_hang_case.py);
desync checks leave the group usable, so they run as ordinary MPI tests.
"""
import functools
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import helpers
from helpers import ROOT, result_lines

#: A case of tests/scripts/never_hang_case.py as its own job; the diagnostics' settings
#: of this process (a suite run at a debug level) reach it only where a test sets them.
run_case = functools.partial(helpers.run_case, "never_hang_case.py", limit=60, clean=(
    "HPCCOMM_DISTRIBUTED_DEBUG", "TORCH_DISTRIBUTED_DEBUG", "HPCCOMM_TRACE_DIR",
    "HPCCOMM_TRACE_BUFFER", "HPCCOMM_NO_ABORT_ON_EXCEPTION"))


def results(output):
    """``{rank: [fields of each of its RESULT lines]}`` (``error=`` is written last)."""
    found = {}
    for rank, fields in result_lines(output):
        found.setdefault(rank, []).append(fields)
    return found


# -- timeouts ------------------------------------------------------------------------------
def test_skipped_collective_names_the_rank_and_dumps(tmp_path):
    timeout = 2.0
    code, output, _ = run_case("skip_collective", 3, CASE_TIMEOUT=timeout,
                               HPCCOMM_TRACE_DIR=tmp_path, HPCCOMM_TRACE_BUFFER=16,
                               HPCCOMM_ROLLCALL_GRACE=0.5)
    assert code == 0, output
    found = results(output)
    assert sorted(found) == [0, 2], output
    for rank in (0, 2):
        fields = found[rank][0]
        assert float(fields["elapsed"]) <= timeout + 2.0, fields
        assert "all_reduce (seq 2)" in fields["error"]
        assert "Global rank 1 never joined" in fields["error"]
        assert "unusable" in fields["error"]
    # the flight recorder: one dump per timed-out rank, naming the lagging rank
    assert sorted(os.listdir(tmp_path)) == ["rank0.json", "rank2.json"]
    dump = json.loads((tmp_path / "rank0.json").read_text())
    assert dump["reason"] == "timeout" and dump["rollcall"]["missing"] == [1]
    assert dump["failed_op"]["op"] == "all_reduce" and dump["failed_op"]["seq"] == 2
    assert [e["state"] for e in dump["entries"]] == ["completed", "timed out"]
    summary = subprocess.run([sys.executable, "-m", "hpccomm.trace", str(tmp_path)],
                             capture_output=True, text=True, cwd=ROOT, timeout=30).stdout
    assert "no dump from ranks [1]" in summary
    assert re.search(r"BEHIND: rank 1: did not reach seq 2", summary), summary


def test_every_operation_honours_its_timeout():
    timeout = 0.3
    code, output, _ = run_case("every_op_times_out", 2, CASE_TIMEOUT=timeout, CASE_SLEEP=10,
                               HPCCOMM_ROLLCALL_GRACE=0.2)
    assert code == 0, output
    lines = results(output)[0]
    assert len(lines) == 17, output
    for fields in lines:
        assert "no error" not in fields, fields
        assert float(fields["elapsed"]) <= timeout + 2.0, fields
        op = fields["op"].split(" ")[0].split(".")[0].split("(")[0]
        assert fields["what"].startswith(op), fields
    # one cause each, in the numbering of the message: a point-to-point call names its
    # peer's missing half, a collective the rank that never joined, a root its global rank
    causes = {fields["op"]: fields["cause"] for fields in lines}
    assert causes["send"] == "Global rank 1 never posted a receive for it (with its tag).", causes
    for op in ("recv", "irecv.wait(timeout)", "recv_object_list"):
        assert causes[op] == "Global rank 1 never sent a message with its tag.", causes
    for op in ("all_reduce", "barrier", "all_to_all_single"):
        assert causes[op].startswith("Global rank 1 never joined"), causes
    whats = {fields["op"]: fields["what"] for fields in lines}
    assert whats["broadcast"].startswith("broadcast (seq 2) from root 1,"), whats


# -- monitored_barrier -----------------------------------------------------------------------
def test_monitored_barrier_names_the_absent_rank():
    code, output, _ = run_case("monitored_absent", 4, CASE_TIMEOUT=1.5, CASE_ABSENT=2)
    assert code == 0, output
    found = results(output)
    assert sorted(found) == [0, 1, 3], output
    for rank, (fields,) in found.items():
        assert fields["error"].startswith("Rank 2 failed to pass monitoredBarrier in 1500 ms")
        assert float(fields["elapsed"]) <= 1.5 + 2.0


def test_monitored_barrier_wait_all_ranks_names_both():
    code, output, _ = run_case("monitored_absent", 4, CASE_TIMEOUT=1.5, CASE_ABSENT="1,3",
                               CASE_WAIT_ALL=1)
    assert code == 0, output
    found = results(output)
    assert sorted(found) == [0, 2], output
    for rank, (fields,) in found.items():
        assert fields["error"].startswith("Ranks 1, 3 failed to pass monitoredBarrier")


@pytest.mark.mpi(min_size=1)
def test_monitored_barrier_passes(dist, rank, size):
    assert dist.monitored_barrier(timeout=10) is None
    assert dist.monitored_barrier(timeout=10, wait_all_ranks=True) is None
    x = np.full(2, rank, dtype=np.int64)
    dist.all_reduce(x)  # the group is fine afterwards
    assert x.tolist() == [size * (size - 1) // 2] * 2


# -- uncaught exceptions, breakpoint -----------------------------------------------------------
def test_exception_on_one_rank_ends_the_job_with_its_traceback():
    code, output, elapsed = run_case("uncaught_exception", 2, limit=60, CASE_TIMEOUT=120)
    assert code != 0, output
    assert elapsed < 30, "the job should end long before rank 0's 120 s timeout"
    assert "uncaught exception on rank 1 of 2" in output, (code, output)
    assert "ValueError: boom on purpose in rank 1" in output, (code, output)
    if "MPI_Abort" in output:
        assert output.index("Traceback") < output.index("MPI_Abort")


def test_breakpoint_debugs_one_rank_while_others_wait():
    code, output, _ = run_case("breakpoint_case", 2, stdin="up\np value\nc\n")
    assert code == 0, output
    assert "(Pdb rank 0)" in output and "42" in output
    assert sorted(results(output)) == [0, 1]


# -- desync detection at DETAIL ----------------------------------------------------------------
def _mismatch(dist, rank, kind):
    if kind == "shape":  # same element count, different shape
        dist.all_reduce(np.ones((6,) if rank == 0 else (2, 3)))
    elif kind == "dtype":  # int64 against float64: same byte count
        dist.all_reduce(np.ones(4, dtype=np.int64 if rank == 0 else np.float64))
    elif kind == "op":
        if rank == 0:
            dist.all_reduce(np.ones(4))
        else:
            dist.broadcast(np.ones(4), src=0)
    elif kind == "root":
        dist.broadcast(np.ones(4), src=0 if rank == 0 else 1)
    elif kind == "count":
        dist.all_reduce(np.ones(4 + (rank > 0)))
    elif kind == "reduce op":
        dist.all_reduce(np.ones(4), op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)


@pytest.fixture
def detail(dist):
    before = dist.get_debug_level()
    dist.set_debug_level("DETAIL")
    yield dist
    dist.set_debug_level(before)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind,column", [("shape", "shape"), ("dtype", "dtype"), ("op", "op"),
                                         ("root", "root"), ("count", "count"),
                                         ("reduce op", "reduce op")])
def test_desync_raises_on_every_rank_with_a_table(detail, rank, size, kind, column):
    dist = detail
    with pytest.raises(dist.DistDesyncError) as info:
        _mismatch(dist, rank, kind)
    message = str(info.value)
    assert re.search(r"differing: [^)]*" + column, message), message
    table = message.splitlines()[1:]
    assert table[0].split()[:3] == ["rank", "global", "op"]
    assert len(table) == size + 1
    if kind == "dtype":
        assert "int64" in table[1] and "float64" in table[2]
    if kind == "shape":
        assert "(6,)" in table[1] and "(2, 3)" in table[2]
    if kind == "op":
        assert "all_reduce" in table[1] and "broadcast" in table[2]
    x = np.ones(3)
    dist.all_reduce(x)  # the group stays usable
    assert x.tolist() == [size] * 3


@pytest.mark.mpi(min_size=2)
def test_detail_accepts_legal_differences(detail, rank, size):
    dist = detail
    outs = [np.zeros(r + 1) for r in range(size)]
    dist.all_gather(outs, np.full(rank + 1, float(rank)))  # uneven blocks are legal
    assert [o[0] for o in outs] == list(range(size))
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "pad": "x" * rank})
    assert [o["rank"] for o in objects] == list(range(size))
    rows = np.arange(size * 2, dtype=np.float64)
    out = np.zeros(size * 2)
    dist.all_to_all_single(out, rows, [2] * size, [2] * size)
    gathered = [np.zeros(2) for _ in range(size)] if rank == 0 else None
    dist.gather(np.ones(2), gathered, dst=0)
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_debug_level_set_at_run_time_applies_to_existing_groups(dist, rank, size):
    group = dist.new_group(list(range(size)))
    dist.set_debug_level("DETAIL")
    try:
        with pytest.raises(dist.DistDesyncError):
            dist.all_reduce(np.ones(2 + rank), group=group)
    finally:
        dist.set_debug_level("OFF")
    x = np.ones(2 + rank)  # OFF again: no check (a mismatch would be the caller's bug)
    dist.all_reduce(np.ones(2), group=group)
    dist.destroy_process_group(group)
    assert x.size == 2 + rank


# -- flight recorder -------------------------------------------------------------------------
@pytest.mark.mpi(min_size=1)
def test_flight_recorder_keeps_the_last_n_operations(dist, tmp_path):
    from hpccomm import flight_recorder

    before = flight_recorder.size()
    flight_recorder.enable(4)
    try:
        x = np.ones(8, dtype=np.float32)
        for _ in range(6):
            dist.all_reduce(x)
        work = dist.broadcast(x, src=0, async_op=True)
        work.wait()
        recorded = flight_recorder.entries()
        assert len(recorded) == 4
        assert [e["op"] for e in recorded] == ["all_reduce"] * 3 + ["broadcast"]
        seqs = [e["seq"] for e in recorded]
        assert seqs == sorted(seqs) and seqs[-1] - seqs[0] == 3
        assert all(e["state"] == "completed" and e["duration_s"] >= 0 for e in recorded)
        assert recorded[0]["shape"] == [8] and recorded[0]["dtype"] == "float32"
        path = flight_recorder.dump(str(tmp_path / f"r{dist.get_rank()}.json"))
        assert json.loads(open(path).read())["entries"][-1]["op"] == "broadcast"
    finally:
        flight_recorder.enable(before)


def test_trace_tool_on_handmade_dumps(tmp_path):
    from hpccomm.diagnostics import trace

    def entry(seq, state):
        return {"seq": seq, "op": "all_reduce", "state": state, "group": "WORLD",
                "shape": [4], "dtype": "float64"}
    for rank, seq in ((0, 7), (1, 5), (3, 7)):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({
            "rank": rank, "world_size": 4, "reason": "timeout", "error": "x",
            "groups": {"WORLD": {"ranks": [0, 1, 2, 3], "seq": seq}},
            "entries": [entry(seq - 1, "completed"), entry(seq, "timed out")],
            "rollcall": {"missing": [2]}}))
    summary = trace.summarize(trace.load(str(tmp_path)))
    assert "no dump from ranks [2]" in summary
    behind = summary.split("BEHIND: ")[1]
    assert "rank 1: last op seq 5 < 7" in behind and "rank 2:" in behind
    assert "rank 0:" not in behind and "rank 3:" not in behind
    assert trace.main([str(tmp_path / "empty")]) == 1


# -- debug levels and logging ------------------------------------------------------------------
def test_log_level_matrix():
    from hpccomm.diagnostics.debug import TRACE, effective_log_level
    from hpccomm.types import DebugLevel as D

    assert effective_log_level("ERROR", D.DETAIL) == logging.ERROR
    assert effective_log_level("WARNING", D.INFO) == logging.WARNING
    assert effective_log_level("INFO", D.OFF) == logging.INFO
    assert effective_log_level("INFO", D.INFO) == logging.DEBUG
    assert effective_log_level("INFO", D.DETAIL) == TRACE
    assert effective_log_level(None, D.OFF) is None
    assert effective_log_level(None, D.INFO) == logging.INFO
    with pytest.raises(ValueError):
        effective_log_level("LOUD", D.OFF)


def test_debug_level_from_environment():
    probe = "import hpccomm as d; print(d.get_debug_level().name)"
    for env, expected in (({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, "DETAIL"),
                          ({"HPCCOMM_DISTRIBUTED_DEBUG": "info",
                            "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, "INFO"), ({}, "OFF")):
        full = {k: v for k, v in os.environ.items() if not k.endswith("DISTRIBUTED_DEBUG")}
        out = subprocess.run([sys.executable, "-c", probe], env=dict(full, **env),
                             capture_output=True, text=True, timeout=60).stdout.strip()
        assert out == expected, env


def test_info_level_logs_initialization_facts():
    code = ("import hpccomm as d; d.init_process_group(timeout=10); "
            "d.destroy_process_group()")
    env = dict(os.environ, HPCCOMM_DISTRIBUTED_DEBUG="INFO")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for fact in ("rank 0/1 initialized", "MPI library:", "thread level MPI_THREAD_",
                 "backends", "store", "flight recorder last 2000 ops",
                 "cores: one core per rank (1 rank on"):
        assert fact in done.stderr, (fact, done.stderr)
