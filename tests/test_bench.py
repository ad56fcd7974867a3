"""hpccomm.cli.bench's pieces for comparing MPI thread levels: the job plan, and one job's
samples under MPI (structure only: no timing is asserted)."""
import json

import pytest

from hpccomm.cli import bench


def test_every_job_after_the_first_reuses_its_batch_lengths():
    jobs = bench.pairs(lambda r: ["first", str(r)], ["second"], 2)
    assert jobs == [("a", ["first", "0"]), ("b", ["second"]), ("a", ["first", "1"]),
                    ("b", ["second"])]
    plan = bench.job_commands(jobs, "DIR", lambda words: ["launch", *words])
    assert [label for label, _, _ in plan] == ["a", "b", "a", "b"]
    assert plan[0][1] == ["launch", "first", "0", "--samples-out", "DIR/job0.json"]
    for _, command, path in plan[1:]:
        assert command[-4:] == ["--samples-out", path, "--inner-from", "DIR/job0.json"]


@pytest.mark.mpi(min_size=2)
def test_a_job_writes_samples_that_merge_into_rows(dist, tmp_path_factory):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    folder = world.bcast(str(tmp_path_factory.mktemp("bench")) if world.rank == 0 else None)
    ops, sizes = ["all_reduce", "send_recv"], [8, 1024]
    cells = []
    rows = bench.run(ops, sizes, budget=0.005, cells_out=cells)
    assert [(r["op"], r["bytes"]) for r in rows] == [(o, s) for o in ops for s in sizes]
    first = f"{folder}/a.json"
    bench.write_job(first, world, cells, raw_only=False)
    world.Barrier()
    job = bench.read_job(first)
    preset = bench.batch_lengths(job)
    raw_cells = []
    raw = bench.run(ops, sizes, budget=0.005, raw_only=True, preset=preset,
                    cells_out=raw_cells)
    assert all(set(r) >= {"mpi4py_us", "mpi4py_min_us"} and "hpccomm_us" not in r
               for r in raw)
    for cell in raw_cells:  # the raw job took the first job's batch lengths
        key = bench.cell_key(cell["op"], cell["requested"])
        assert cell["inner"] == {"mpi4py": preset[key]["mpi4py"]}
    bench.write_job(f"{folder}/b.json", world, raw_cells, raw_only=True)
    world.Barrier()
    second = bench.read_job(f"{folder}/b.json")
    assert second["raw_only"] and json.dumps(second)  # plain JSON
    assert job["thread_level"] == second["thread_level"] == bench.thread_level_name()
    # a raw job of its own runs at the other level; its samples go to that level's column
    job["thread_level"], second["thread_level"] = "multiple", "serialized"
    merged = bench.merge([job], [second])
    for row in merged:
        for v in ("hpccomm", "mpi4py", bench.SERIALIZED):
            assert row[f"{v}_us"] > 0 and row[f"{v}_min_us"] <= row[f"{v}_us"]
        assert row[f"hpccomm_over_{bench.SERIALIZED}_bw"] > 0
        assert row[f"{bench.SERIALIZED}_rounds"] >= 7
