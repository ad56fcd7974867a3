"""hpccomm.checkpoint: sharded save/load in one HDF5 file, resharding, atomicity, errors.

MPI tests run inside the suite's mpiexec runs. Serial tests launch this file as a script
under ``mpiexec -n K`` (``python tests/test_checkpoint.py MODE PATH``) to save at 4 ranks
and load at 1, 2, 4 and 8, and to kill a save half-way.
"""
import glob
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np
import pytest

from helpers import run_job, start_job


# -- the state used by the tests: global arrays and their uneven splits ---------------------
def global_array(name, shape, dtype, version=1):
    values = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    values = values * version + zlib.crc32(name.encode()) % 97
    dtype = np.dtype(dtype)
    if dtype == bool:
        return (values % 3 == 0)
    if dtype.kind == "c":
        return (values + 1j * (values % 5)).astype(dtype)
    return values.astype(dtype)


def uneven(n, size, rank):
    """Slice ``rank`` of ``n`` rows: lengths grow with rank (1,2,3,4 of 10 at 4 ranks)."""
    total = size * (size + 1) // 2
    cuts = [round(n * c * (c + 1) / 2 / total) for c in range(size + 1)]
    return slice(cuts[rank], cuts[rank + 1])


def take(array, axis, part):
    index = [slice(None)] * array.ndim
    index[axis] = part
    return array[tuple(index)]


SPECS = {  # name: (global shape, dtype, saved placement: axis or None = replicated)
    "model/w": ((10, 6), np.float64, 0),
    "model/b": ((4, 9), np.int32, 1),
    "model/cplx": ((6,), np.complex128, 0),
    "opt/step": ((), np.int64, None),
    "opt/m/x": ((5, 3), np.float32, None),
    "flags": ((7,), bool, None),
}
OTHER_PLACEMENT = {"model/w": 1, "model/b": None, "model/cplx": 0, "opt/step": None,
                   "opt/m/x": 0, "flags": 0}


def build(rank, size, placement, fill=None, version=1):
    """The nested state dict for this rank; ``fill`` replaces the values (load targets)."""
    from hpccomm.checkpoint import Shard

    state = {}
    for name, (shape, dtype, _) in SPECS.items():
        axis = placement[name]
        value = global_array(name, shape, dtype, version)
        if axis is not None:
            value = take(value, axis, uneven(shape[axis], size, rank))
        value = np.array(value, copy=True)
        if fill is not None:
            value[...] = fill
        leaf = value if axis is None else Shard(value, axis=axis)
        node = state
        *parents, key = name.split("/")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[key] = leaf
    return state


def check(state, rank, size, placement, version=1):
    from hpccomm.checkpoint import Shard

    for name, (shape, dtype, _) in SPECS.items():
        node = state
        for key in name.split("/"):
            node = node[key]
        axis = placement[name]
        got = node.local if isinstance(node, Shard) else node
        want = global_array(name, shape, dtype, version)
        if axis is not None:
            want = take(want, axis, uneven(shape[axis], size, rank))
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert got.dtype == np.dtype(dtype), name


SAVED = {name: spec[2] for name, spec in SPECS.items()}


# -- script mode (run under mpiexec by the serial tests) -------------------------------------
def report(line):
    """One line of this rank's, in one write (the launcher may still splice two ranks'
    lines: helpers.result_lines reads them apart)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def script(mode, path):
    import hpccomm as dist
    from hpccomm import checkpoint

    dist.init_process_group(timeout=60)
    rank, size = dist.get_rank(), dist.get_world_size()
    if mode == "save":
        checkpoint.save(build(rank, size, SAVED), path)
    elif mode in ("load", "load-same"):  # "load": the saved placement, then another one
        for placement in (SAVED, OTHER_PLACEMENT)[:2 if mode == "load" else 1]:
            state = build(rank, size, placement, fill=0)
            checkpoint.load(state, path)
            check(state, rank, size, placement)
    elif mode == "slow-save":  # version 2 of the state, each pwrite slowed down
        with open(os.path.join(os.path.dirname(path), f"pid.{rank}"), "w") as out:
            out.write(str(os.getpid()))
        real = os.pwrite

        def slow(fd, data, offset):
            time.sleep(0.5)
            return real(fd, data[:1 << 16], offset)

        os.pwrite = slow
        state = build(rank, size, SAVED, version=2)
        state["big"] = checkpoint.Shard(np.ones((1 << 20,), dtype=np.float64))
        checkpoint.save(state, path)
    elif mode == "save-expect-error":  # every rank reports the error it got
        try:
            checkpoint.save(build(rank, size, SAVED), path)
        except checkpoint.CheckpointError as exc:
            kind = "DistValueError" if isinstance(exc, dist.DistValueError) else "other"
            report(f"RESULT rank={rank} kind={kind} error={exc}")
        else:
            raise AssertionError(f"{path} saved")
    elif mode == "no-h5py":  # as if h5py were not installed
        sys.modules["h5py"] = None  # ``import h5py`` now raises ModuleNotFoundError
        for name, call in (("save", checkpoint.save), ("load", checkpoint.load)):
            try:
                call(build(rank, size, SAVED), path)
            except ImportError as exc:
                kind = "ModuleNotFoundError" if isinstance(exc, ModuleNotFoundError) else \
                    type(exc).__name__
                report(f"RESULT rank={rank} call={name} kind={kind} error={exc}")
            else:
                raise AssertionError(f"{name} ran without h5py")
    elif mode == "expect-error":
        try:
            checkpoint.load(build(rank, size, SAVED, fill=0), path)
        except checkpoint.CheckpointError as exc:
            print("CheckpointError:", exc)
        else:
            raise AssertionError(f"{path} loaded")
    dist.barrier()
    dist.destroy_process_group()
    print(f"OK {mode} rank {rank}/{size}")


def run_script(n, mode, path, limit=180):
    """This file as a script of ``n`` ranks: ``python tests/test_checkpoint.py MODE PATH``."""
    job = run_job([sys.executable, __file__, mode, path], n, limit=limit)
    assert job.code == 0, job.output
    assert job.stdout.count(f"OK {mode}") == n, job.stdout
    return job.stdout


# -- serial tests ----------------------------------------------------------------------------
def test_save_at_4_load_at_1_2_4_8_any_placement(tmp_path):
    path = str(tmp_path / "ckpt.h5")
    run_script(4, "save", path)
    import h5py

    with h5py.File(path, "r") as h5file:
        assert h5file.attrs["world_size"] == 4 and h5file.attrs["complete"]
        assert h5file["model/w"].shape == (10, 6)
        assert list(h5file["model/w"].attrs["lengths"]) == [1, 2, 3, 4]
        assert h5file["opt/m/x"].attrs["placement"] == "replicated"
        np.testing.assert_array_equal(h5file["model/b"][...],
                                      global_array("model/b", (4, 9), np.int32))
    for n in (1, 2, 4, 8):
        run_script(n, "load", path)
    assert [p for p in os.listdir(tmp_path) if "tmp" in p] == []


def test_killed_save_leaves_previous_checkpoint(tmp_path):
    path = str(tmp_path / "ckpt.h5")
    run_script(2, "save", path)
    before = os.path.getmtime(path)
    # A launcher killed with SIGKILL leaves its session files (Open MPI: /tmp/ompi.<pid>
    # with a socket named by its pid): a later launcher that gets the same pid would fail
    # to start, so this one keeps them in a directory of its own (short: socket paths
    # are limited to 108 characters).
    session = tempfile.mkdtemp(prefix="hpccomm-kill-")
    job = start_job([sys.executable, __file__, "slow-save", path], 2, env={"TMPDIR": session})
    try:
        deadline = time.time() + 90
        while time.time() < deadline and not (glob.glob(str(tmp_path / ".ckpt.h5.tmp-*"))
                                               and len(glob.glob(str(tmp_path / "pid.*"))) == 2):
            time.sleep(0.1)
        time.sleep(1.0)  # now inside the slowed-down writes
        assert job.poll() is None, "the save finished before it could be killed"
    finally:
        pids = [int(open(p).read()) for p in glob.glob(str(tmp_path / "pid.*"))]
        job.kill()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        job.finish(limit=30)
        shutil.rmtree(session, ignore_errors=True)
    leftovers = glob.glob(str(tmp_path / ".ckpt.h5.tmp-*"))
    assert leftovers, "the killed save should have left its temporary file"
    assert os.path.getmtime(path) == before
    run_script(1, "load-same", path)  # the previous checkpoint, version 1, intact
    out = run_script(1, "expect-error", leftovers[0])
    assert "incomplete" in out or "not a readable HDF5 file" in out


def test_save_creates_missing_folders(tmp_path):
    """``save(state, "run/deep/ckpt.h5")`` from a fresh directory, at 2 ranks."""
    job = run_job([sys.executable, __file__, "save", "run/deep/ckpt.h5"], 2, limit=180,
                  cwd=tmp_path)
    assert job.code == 0, job.output
    assert job.stdout.count("OK save") == 2, job.output
    assert os.listdir(tmp_path / "run" / "deep") == ["ckpt.h5"]
    run_script(1, "load-same", str(tmp_path / "run" / "deep" / "ckpt.h5"))


def test_save_names_the_folder_it_cannot_create_on_every_rank(tmp_path):
    blocker = tmp_path / "blocked"
    blocker.write_text("a file where the checkpoint's folder should be\n")
    folder = blocker / "sub"
    job = run_job([sys.executable, __file__, "save-expect-error", str(folder / "ckpt.h5")], 2,
                  limit=180)
    assert job.code == 0, job.output
    assert sorted((rank, seen["kind"]) for rank, seen in job.results) == [
        (0, "DistValueError"), (1, "DistValueError")], job.output
    for _, seen in job.results:
        assert f"cannot create the folder '{folder}'" in seen["error"], seen
        assert "(on rank 0 of group" in seen["error"], seen
        assert f"'{blocker}' is in the way" in seen["error"], seen
    assert "Traceback" not in job.output and "Unable to" not in job.output, job.output
    assert blocker.read_text().startswith("a file") and os.listdir(tmp_path) == ["blocked"]


def test_missing_h5py_says_what_to_install(tmp_path):
    path = str(tmp_path / "ckpt.h5")
    job = run_job([sys.executable, __file__, "no-h5py", path], 2, limit=120)
    assert job.code == 0, job.output
    assert sorted((rank, seen["call"], seen["kind"]) for rank, seen in job.results) == [
        (0, "load", "ModuleNotFoundError"), (0, "save", "ModuleNotFoundError"),
        (1, "load", "ModuleNotFoundError"), (1, "save", "ModuleNotFoundError")], job.output
    for _, seen in job.results:
        assert seen["error"].endswith("install it with: pip install 'hpccomm[ckpt]'"), seen
    assert not os.listdir(tmp_path)


def test_runs_place_slices_like_numpy():
    from hpccomm.checkpoint.layout import runs

    full = np.arange(4 * 5 * 6, dtype=np.int16).reshape(4, 5, 6)
    for axis in range(3):
        for start, stop in [(0, 2), (1, 4), (2, full.shape[axis]), (0, full.shape[axis])]:
            part = np.ascontiguousarray(take(full, axis, slice(start, stop)))
            image = bytearray(full.nbytes + 16)
            local = part.reshape(-1).view(np.uint8)
            for file_offset, offset, nbytes in runs(16, full.shape, 2, axis, start, stop):
                image[file_offset:file_offset + nbytes] = local[offset:offset + nbytes].tobytes()
            back = np.frombuffer(bytes(image[16:]), dtype=np.int16).reshape(full.shape)
            np.testing.assert_array_equal(take(back, axis, slice(start, stop)), part)
    assert list(runs(0, (3, 0), 8, 0, 0, 3)) == []


def test_mpio_selections_place_every_rank_slice(tmp_path):
    """The parallel-HDF5 path's per-rank H5Dwrite selections, run rank after rank in one
    process with serial h5py (no MPI-enabled h5py here to run them collectively)."""
    import h5py

    from hpccomm.checkpoint import layout, state, writer

    size = 3
    per_rank = [build(rank, size, SAVED) for rank in range(size)]
    specs = [[(name, state.spec(leaf)) for name, leaf in state.flatten(s, "t")]
             for s in per_rank]
    entries = state.global_entries(specs, "t")
    writers = writer._writers(entries, size)
    assert set(writers) == {name for name, spec in SPECS.items() if spec[2] is None}
    assert len(set(writers.values())) > 1  # replicated entries spread over the ranks
    path = str(tmp_path / "mpio.h5")
    with h5py.File(path, "w") as h5file:
        for entry, (_, leaf) in zip(entries, state.flatten(per_rank[0], "t")):
            if entry.shape == ():
                entry.value = np.asarray(state.array_of(leaf))
        layout.create(h5file, entries, size, size, 0.0)
        for rank in range(size):
            for entry, (_, leaf) in zip(entries, state.flatten(per_rank[rank], "t")):
                mine = writer._my_slice(entry, leaf, rank, writers)
                writer.write_selection(h5file[entry.name], entry, mine)
    layout.mark_complete(path)
    index = layout.read_index(path)["entries"]
    with h5py.File(path, "r") as h5file:
        for name, (shape, dtype, _) in SPECS.items():
            np.testing.assert_array_equal(h5file[name][()], global_array(name, shape, dtype))
            assert index[name].shape == shape


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal(monkeypatch):
    from hpccomm.checkpoint.progress import ENV, Progress

    monkeypatch.delenv(ENV, raising=False)
    tty = _Terminal()
    bar = Progress(4 << 20, "save", stream=tty)
    bar.update(2 << 20)
    bar.update(2 << 20)
    bar.close()
    assert "save: [" in tty.getvalue() and "100%" in tty.getvalue()
    assert tty.getvalue().endswith("\n")
    for stream, enabled in ((io.StringIO(), True), (_Terminal(), False)):
        quiet = Progress(4 << 20, "save", enabled=enabled, stream=stream)
        quiet.update(4 << 20)
        quiet.close()
        assert stream.getvalue() == ""
    # mpiexec pipes rank output: the environment variable forces the bar on (or off)
    for forced, stream, shown in (("1", io.StringIO(), True), ("0", _Terminal(), False)):
        monkeypatch.setenv(ENV, forced)
        bar = Progress(1 << 20, "load", stream=stream)
        bar.update(1 << 20)
        bar.close()
        assert ("load: [" in stream.getvalue()) is shown


def test_import_hpccomm_does_not_import_h5py():
    code = "import sys, hpccomm; import hpccomm.checkpoint; print('h5py' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "False", done.stderr


# -- MPI tests -------------------------------------------------------------------------------
def shared_dir(dist, tmp_path_factory):
    found = [str(tmp_path_factory.mktemp("ckpt")) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(found, src=0)
    return found[0]


@pytest.mark.mpi(min_size=1)
def test_roundtrip_mixed_nested_and_resharded(dist, rank, size, tmp_path_factory):
    from hpccomm import checkpoint

    path = os.path.join(shared_dir(dist, tmp_path_factory), "state.h5")
    checkpoint.save(build(rank, size, SAVED), path)
    for placement in (SAVED, OTHER_PLACEMENT):
        state = build(rank, size, placement, fill=0)
        checkpoint.load(state, path)
        check(state, rank, size, placement)
    # a Shard target reads only its own slice's bytes
    real, counted = os.preadv, []

    def counting(fd, buffers, offset):
        got = real(fd, buffers, offset)
        counted.append(got)
        return got

    os.preadv = counting
    try:
        mine = np.zeros((10, 6), dtype=np.float64)[:, uneven(6, size, rank)].copy()
        checkpoint.load({"model": {"w": checkpoint.Shard(mine, axis=1)}}, path)
    finally:
        os.preadv = real
    assert sum(counted) == mine.nbytes
    np.testing.assert_array_equal(mine, take(global_array("model/w", (10, 6), np.float64), 1,
                                             uneven(6, size, rank)))
    # a non-contiguous target is filled in place too
    target = np.zeros((6, 10), dtype=np.float64).T
    checkpoint.load({"model": {"w": target}}, path)
    np.testing.assert_array_equal(target, global_array("model/w", (10, 6), np.float64))


@pytest.mark.mpi(min_size=4)
def test_subgroup_save_and_load_with_group(dist, rank, size, tmp_path_factory):
    from hpccomm import checkpoint

    folder = shared_dir(dist, tmp_path_factory)
    mine, _ = dist.new_subgroups(2)
    index = rank // 2
    path = os.path.join(folder, f"half{index}.h5")
    grank = mine.rank()
    local = np.arange(3 * (grank + 1), dtype=np.float32) + 100 * index
    checkpoint.save({"x": checkpoint.Shard(local), "id": np.array(index)}, path, group=mine)
    dist.barrier()
    # load the first half's file on all ranks of the world, two rows each
    full = np.concatenate([np.arange(3), np.arange(6)]).astype(np.float32)
    target = np.zeros(9 // size + (1 if rank < 9 % size else 0), dtype=np.float32)
    start = sum(9 // size + (1 if r < 9 % size else 0) for r in range(rank))
    ident = np.array(-1)
    checkpoint.load({"x": checkpoint.Shard(target), "id": ident},
                    os.path.join(folder, "half0.h5"))
    np.testing.assert_array_equal(target, full[start:start + target.size])
    assert int(ident) == 0
    dist.destroy_process_group(mine)


@pytest.mark.mpi(min_size=1)
def test_corrupted_foreign_and_incomplete_files_give_clear_errors(dist, rank, size,
                                                                  tmp_path_factory):
    import h5py

    from hpccomm import checkpoint

    folder = shared_dir(dist, tmp_path_factory)
    good = os.path.join(folder, "good.h5")
    big = {"w": np.arange(50000, dtype=np.float64), "b": np.ones(3)}
    checkpoint.save(big, good)
    data = open(good, "rb").read()
    cases = {  # file name: (bytes or builder, expected words)
        "truncated.h5": (data[:len(data) // 2], "truncated"),
        "header.h5": (b"\0" * 64 + data[64:], "not a readable HDF5 file"),
        "text.h5": (b"this is not a checkpoint\n" * 10, "not a readable HDF5 file"),
        "empty.h5": (b"", "not a readable HDF5 file"),
        "foreign.h5": (None, "not an hpccomm checkpoint"),
        "incomplete.h5": (data, "incomplete"),
    }
    if rank == 0:
        for name, (content, _) in cases.items():
            target = os.path.join(folder, name)
            if content is None:
                with h5py.File(target, "w") as h5file:
                    h5file["w"] = np.zeros(3)
            else:
                with open(target, "wb") as out:
                    out.write(content)
        with h5py.File(os.path.join(folder, "incomplete.h5"), "r+") as h5file:
            h5file.attrs["complete"] = False
    dist.barrier()
    for name, (_, words) in cases.items():
        target = os.path.join(folder, name)
        state = {"w": np.zeros(50000), "b": np.zeros(3)}
        with pytest.raises(checkpoint.CheckpointError, match=words) as caught:
            checkpoint.load(state, target)
        assert target in str(caught.value)
        assert isinstance(caught.value, (dist.DistError, ValueError))
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.load({"w": np.zeros(3)}, os.path.join(folder, "missing.h5"))


@pytest.mark.mpi(min_size=1)
def test_state_mismatches_are_reported(dist, rank, size, tmp_path_factory):
    from hpccomm import checkpoint

    path = os.path.join(shared_dir(dist, tmp_path_factory), "m.h5")
    checkpoint.save({"a": np.zeros((4, 2)), "n": {"b": np.ones(3, dtype=np.int32)}}, path)
    with pytest.raises(checkpoint.CheckpointError, match="no entry 'c'"):
        checkpoint.load({"c": np.zeros(1)}, path)
    with pytest.raises(checkpoint.CheckpointError, match="int32 in the file but int64"):
        checkpoint.load({"n": {"b": np.zeros(3, dtype=np.int64)}}, path)
    with pytest.raises(checkpoint.CheckpointError, match="global shape"):
        checkpoint.load({"a": checkpoint.Shard(np.zeros((1, 2)))}, path) if size != 4 else \
            checkpoint.load({"a": np.zeros((5, 2))}, path)
    with pytest.raises(checkpoint.CheckpointError, match="must be a non-empty string"):
        checkpoint.save({1: np.zeros(1)}, path)
    with pytest.raises(checkpoint.CheckpointError, match="dtype object"):
        checkpoint.save({"o": np.array([None])}, path)
    frozen = np.zeros((4, 2))
    frozen.flags.writeable = False
    with pytest.raises(checkpoint.CheckpointError, match="read-only"):
        checkpoint.load({"a": frozen}, path)
    nested = os.path.join(os.path.dirname(path), "no", "such", "dir", "x.h5")
    checkpoint.save({"a": np.zeros(2)}, nested)  # rank 0 creates the folders
    assert os.path.isfile(nested)
    under_a_file = os.path.join(path, "x.h5")  # path is a file, not a folder
    with pytest.raises(checkpoint.CheckpointError,
                       match=f"cannot create the folder {re.escape(repr(path))}.*on rank 0 "
                             f".*in the way"):
        checkpoint.save({"a": np.zeros(2)}, under_a_file)
    restored = np.zeros((4, 2))
    checkpoint.load({"a": restored}, path)  # the group is still usable after the errors
    assert not restored.any()


@pytest.mark.mpi(min_size=2)
def test_ranks_disagreeing_on_the_state_fail_together(dist, rank, size, tmp_path_factory):
    from hpccomm import checkpoint

    path = os.path.join(shared_dir(dist, tmp_path_factory), "d.h5")
    extra = {"extra": np.zeros(1)} if rank == 1 else {}
    with pytest.raises(checkpoint.CheckpointError, match="rank 1's state has other entries"):
        checkpoint.save({"a": np.zeros(3), **extra}, path)
    shard = np.zeros((2, 3 if rank == 0 else 4))
    with pytest.raises(checkpoint.CheckpointError, match="entry 'w' differs between rank 0"):
        checkpoint.save({"w": checkpoint.Shard(shard, axis=0)}, path)
    replicated = np.full(3, rank, dtype=np.float32 if rank else np.float64)
    with pytest.raises(checkpoint.CheckpointError, match="dtype"):
        checkpoint.save({"r": replicated}, path)
    assert not os.path.exists(path)


@pytest.mark.mpi(min_size=2)
def test_failure_mid_save_keeps_previous_checkpoint(dist, rank, size, tmp_path_factory,
                                                    monkeypatch):
    from hpccomm import checkpoint

    folder = shared_dir(dist, tmp_path_factory)
    path = os.path.join(folder, "keep.h5")
    checkpoint.save({"x": checkpoint.Shard(np.full(1000, rank, dtype=np.int64))}, path)
    if rank == size - 1:
        def broken(fd, data, offset):
            raise OSError(28, "No space left on device (simulated)")

        monkeypatch.setattr(os, "pwrite", broken)
    with pytest.raises(checkpoint.CheckpointError, match=f"rank {size - 1}: OSError"):
        checkpoint.save({"x": checkpoint.Shard(np.full(1000, -7, dtype=np.int64))}, path)
    monkeypatch.undo()
    dist.barrier()
    assert [p for p in os.listdir(folder) if ".tmp-" in p] == []
    target = np.zeros(1000 * size, dtype=np.int64)
    checkpoint.load({"x": target}, path)
    np.testing.assert_array_equal(target, np.repeat(np.arange(size), 1000))


@pytest.mark.mpi(min_size=2)
def test_device_mesh_dimension_group(dist, rank, size, tmp_path_factory):
    mesh_module = pytest.importorskip("hpccomm.device_mesh")
    from hpccomm import checkpoint

    if size % 2:
        pytest.skip("needs an even number of ranks")
    folder = shared_dir(dist, tmp_path_factory)
    mesh = mesh_module.init_device_mesh("cpu", (size // 2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh.get_group("tp")
    dp_index = mesh.get_local_rank("dp")
    path = os.path.join(folder, f"tp{dp_index}.h5")
    local = np.full((2, 3), tp.rank() + 10 * dp_index, dtype=np.float64)
    checkpoint.save({"w": checkpoint.Shard(local, axis=1)}, path, group=tp)
    whole = np.zeros((2, 6))
    checkpoint.load({"w": whole}, path, group=tp)
    np.testing.assert_array_equal(whole[:, :3], 10 * dp_index)
    np.testing.assert_array_equal(whole[:, 3:], 1 + 10 * dp_index)


if __name__ == "__main__":
    script(sys.argv[1], sys.argv[2])
