"""torch's flight recorder sees hpccomm's groups: every operation is recorded with the
fields torch's analyzer compares across ranks (operation, sizes, dtypes, sequence
numbers, state), dumps are in torch's format (through torch 2.15's own
``_dump_fr_trace(backend=...)`` too), and torch's analyzer
(``torch.distributed.flight_recorder.fr_trace``) finds a mismatch planted across ranks
from the ranks' dump files, and the rank missing from a hung collective.

The MPI tests run in the suite's sessions (2 and 4 ranks) under both names of the
backend; the hang is a job of its own (a timed-out group is unusable).
"""
import os
import pickle
import re
import subprocess
import sys

import shlex

import pytest

import doc_recipes
from torch_cases import TIMEOUT, dist, torch
from torch_cases import rank, size, torch_world  # noqa: F401 (fixtures)

from hpccomm.torch import flight_recorder
from helpers import SCRIPTS, result_lines, run_job

C10D = torch._C._distributed_c10d
#: torch 2.15: its dump functions name the backend whose recorder to read.
PER_BACKEND = hasattr(C10D, "_dump_fr_trace_file")


def recorded(backend, group=None):
    """This rank's dump: through torch's own function where it reads a backend's
    recorder (2.15), else hpccomm's; the entries of ``group`` (default: all)."""
    data = pickle.loads(C10D._dump_fr_trace(backend=backend) if PER_BACKEND
                        else flight_recorder.dump(backend))
    name = None if group is None else group.group_name
    return data, [e for e in data["entries"] if name is None or e["process_group"][0] == name]


#: The recipe docs/torch.md shows: the dumps' variable on the job's command, then
#: torch's analyzer over their folder; the tests run both as shown there.
PAGE = "docs/torch.md"
DUMP, ANALYZER = [shlex.split(command) for command in doc_recipes.page_commands(PAGE)
                  if "TORCH_FR_DUMP_TEMP_FILE=" in command or "flight_recorder.fr_trace" in command]


def test_the_page_shows_the_dump_and_the_analyzer_run_here():
    variable, _, dumps = DUMP[0].partition("=")
    assert variable == "TORCH_FR_DUMP_TEMP_FILE" and DUMP[1:3] == ["mpiexec", "-n"], DUMP
    folder, prefix = os.path.split(dumps)
    assert ANALYZER == ["python", "-m", "torch.distributed.flight_recorder.fr_trace", folder,
                        "-p", prefix], ANALYZER


def analyze(directory, prefix="rank_"):
    """torch's analyzer, as the page runs it, on the dump files in ``directory``: its
    output."""
    argv = [sys.executable] + ANALYZER[1:3] + [str(directory), "-p", prefix]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


@pytest.mark.mpi(min_size=2)
def test_every_operation_is_recorded_with_the_fields_torch_compares(torch_world, rank, size):
    group = dist.new_group(list(range(size)), timeout=TIMEOUT)
    x = torch.ones(2, 3)
    dist.all_reduce(x, group=group)                                   # the direct path
    dist.all_reduce(torch.ones(3, dtype=torch.float64), group=group, async_op=True).wait()
    dist.broadcast(x, src=0, group=group)
    dist.all_gather_into_tensor(torch.zeros(size * 4, dtype=torch.int64),
                                torch.ones(4, dtype=torch.int64), group=group)
    dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * size), group=group)
    dist.all_to_all_single(torch.zeros(size), torch.ones(size), group=group)
    peer = rank ^ 1
    if peer < size:
        (dist.send if rank % 2 == 0 else dist.recv)(x, peer, group=group)
    dist.barrier(group=group)
    with pytest.raises(ValueError):  # refused before anything moved: no entry
        dist.broadcast(x, src=size + 3, group=group)
    data, entries = recorded(torch_world, group)
    lib = flight_recorder.comm_lib(torch_world)
    names = [e["profiling_name"] for e in entries]
    p2p = [f"{lib}:send {rank}->{peer}" if rank % 2 == 0 else f"{lib}:recv {rank}<-{peer}"] \
        if peer < size else []
    assert names == [f"{lib}:{op}" for op in (
        "all_reduce", "all_reduce", "broadcast", "_all_gather_base", "_reduce_scatter_base",
        "all_to_all_single")] + p2p + [f"{lib}:barrier"], names
    assert [e["collective_seq_id"] for e in entries if not e["is_p2p"]] == list(range(1, 8))
    assert [e["p2p_seq_id"] for e in entries if e["is_p2p"]] == [1] * len(p2p)
    assert all(e["state"] == "completed" and e["retired"] for e in entries), entries
    first, second, _, gathered, scattered = entries[:5]
    assert first["input_sizes"] == first["output_sizes"] == [[2, 3]]
    assert first["input_dtypes"] == ["Float"] and second["input_dtypes"] == ["Double"]
    assert gathered["input_sizes"] == [[4]] and gathered["output_sizes"] == [[size * 4]]
    assert gathered["output_dtypes"] == ["Long"]
    assert scattered["input_sizes"] == [[2 * size]] and scattered["output_sizes"] == [[2]]
    assert entries[0]["timeout_ms"] == TIMEOUT.total_seconds() * 1000
    config = data["pg_config"][group.group_name]
    assert config["ranks"] == str(list(range(size))) and entries[0]["process_group"] == (
        group.group_name, config["desc"])
    status = data["pg_status"][str(entries[0]["pg_id"])]
    assert status["last_enqueued_collective"] == status["last_completed_collective"] == 7
    dist.destroy_process_group(group)


@pytest.mark.mpi(min_size=2)
def test_an_operation_in_flight_reads_started_until_it_completes(torch_world, rank, size):
    x = torch.zeros(3)
    if rank == 0:
        work = dist.irecv(x, src=1)
        _, before = recorded(torch_world, dist.group.WORLD)
        dist.barrier()
        work.wait()
        _, after = recorded(torch_world, dist.group.WORLD)
        assert before[-1]["profiling_name"].endswith(":recv 0<-1"), before[-1]
        assert (before[-1]["state"], before[-1]["retired"]) == ("started", False)
        assert (after[-2]["state"], after[-2]["retired"]) == ("completed", True), after[-2]
        active = pickle.loads(flight_recorder.dump(torch_world, only_active=True))["entries"]
        assert active == []
    else:
        dist.barrier()
        if rank == 1:
            dist.send(torch.ones(3), dst=0)


@pytest.mark.mpi(min_size=2)
def test_torch_analyzer_finds_a_mismatch_planted_across_ranks(torch_world, rank, size,
                                                              tmp_path_factory):
    """The last rank broadcasts a tensor of another shape (the same number of elements,
    so MPI carries it): the analyzer finds the broadcast's sizes differ and names the
    culprit (measured against the rank whose dump it reads first: the last rank, or
    every other one)."""
    shared = [str(tmp_path_factory.mktemp("fr")) if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    flight_recorder.reset()
    x = torch.ones(4)
    dist.all_reduce(x)
    dist.broadcast(torch.zeros(2, 3) if rank < size - 1 else torch.zeros(3, 2), src=0)
    dist.all_reduce(x)
    flight_recorder.dump_file(prefix=os.path.join(shared[0], "rank_"))
    dist.barrier()
    if rank == 0:
        found = analyze(shared[0])
        blamed = {int(r) for r in re.findall(r"Culprit rank (\d+); Error type: "
                                               r"SIZE_OR_SYNTAX_MISMATCH", found)}
        assert blamed in ({size - 1}, set(range(size - 1))), found
        assert re.search(r"Expected input sizes: '\[\[(2, 3|3, 2)\]\]' does not match found "
                         r"input sizes: '\[\[(3, 2|2, 3)\]\]'", found), found
        assert "collective: " in found and ":broadcast" in found, found
    dist.barrier()


@pytest.mark.mpi(min_size=2)
def test_recording_follows_torchs_buffer_size(torch_world, size, monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    off = dist.new_group(list(range(size)))
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "3")
    small = dist.new_group(list(range(size)))
    for _ in range(5):
        dist.all_reduce(torch.ones(1), group=off)
        dist.all_reduce(torch.ones(1), group=small)
    assert off._state.trace is None and recorded(torch_world, off)[1] == []
    assert [e["collective_seq_id"] for e in recorded(torch_world, small)[1]] == [3, 4, 5]
    for group in (off, small):
        dist.destroy_process_group(group)


@pytest.mark.mpi(min_size=2)
@pytest.mark.skipif(not PER_BACKEND, reason="torch 2.15 feature (this is torch "
                                            f"{torch.__version__})")
def test_torch_attaches_no_hook_that_would_never_fire(torch_world):
    """hpccomm's groups record themselves (their calls never reach torch's dispatcher,
    where torch's hook fires): torch counts them among the self-recording backends."""
    assert torch_world in dist.distributed_c10d._FR_SELF_RECORDING_BACKENDS
    assert dist.group.WORLD not in dist.distributed_c10d._world.pg_flight_recorder_hooks
    before = len(pickle.loads(C10D._dump_fr_trace(backend="gloo"))["entries"])
    dist.all_reduce(torch.ones(1))
    assert len(pickle.loads(C10D._dump_fr_trace(backend="gloo"))["entries"]) == before
    C10D._reset_fr_trace(backend=torch_world)
    assert recorded(torch_world)[1] == []
    assert flight_recorder.install([torch_world])  # the internals are there; idempotent
    assert not hasattr(C10D._dump_fr_trace.__wrapped__, "hpccomm_served")


# -- a hang, as a job of its own ----------------------------------------------------------------
def test_a_hang_is_dumped_at_the_timeout_and_the_analyzer_names_the_missing_rank(tmp_path):
    """Rank 1 skips an all_reduce; rank 0's times out and, with TORCH_FR_DUMP_TEMP_FILE
    set, writes its dump at that first failure; rank 1 writes its own. The analyzer
    reads the call in flight on rank 0 and names rank 1 as missing."""
    job = run_job([sys.executable, os.path.join(SCRIPTS, "torch_case.py"),
                   "flight_recorder_hang"], 2, limit=90,
                  env={"TORCH_FR_DUMP_TEMP_FILE": tmp_path / "rank_"})
    assert job.code == 0, job.output
    found = {rank: fields for rank, fields in result_lines(job.output)}
    assert "timed out" in found[0]["error"], job.output
    assert sorted(os.listdir(tmp_path)) == ["rank_0", "rank_1"], job.output
    dumped = pickle.loads((tmp_path / "rank_0").read_bytes())["entries"]
    assert [e["state"] for e in dumped] == ["completed", "started"], dumped
    output = analyze(tmp_path)
    assert "missing ranks: {1}" in output, output
    assert "collective state: started" in output, output
